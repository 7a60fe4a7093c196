#!/usr/bin/env python3
"""tunix's PPO advantage estimator (its registered ``gae``) beside prm-jax's (``prm_jax_gae``), on the CPU.

  .venv-tunix/bin/python benchmarks/bench_tunix.py [--shapes 64x1024,64x8192,256x2048] [--repeats 15]

Needs the ``tunix`` extra (``python3 dev.py tunix`` makes ``.venv-tunix``). Both are called as tunix's PPO
learner calls its estimator (keyword arguments, tunix's int32 reward buffer with the score at the last
token, float32 values, an int32 completion mask whose rows end at random lengths), on the same arrays,
interleaved in one run; each call includes its whitening and, for prm-jax, its finiteness check. Prints the
median of each and their ratio.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
from bench_advantages import interleaved_medians
from tunix.rl import function_registry

from prm_jax.integrations import tunix as prm_tunix


def ppo_inputs(rows: int, width: int, rng: np.random.Generator) -> dict:
    lengths = rng.integers(width // 2, width + 1, size=rows)
    mask = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
    rewards = np.zeros((rows, width), np.int32)
    rewards[np.arange(rows), lengths - 1] = rng.integers(0, 2, size=rows)
    values = (rng.normal(size=(rows, width)) * mask).astype(np.float32)
    return {"rewards": jax.device_put(rewards), "values": jax.device_put(values),
            "completion_mask": jax.device_put(mask), "gamma": 1.0, "gae_lambda": 0.95}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="64x1024,64x8192,256x2048")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    names = prm_tunix.register_estimators()
    theirs = function_registry.get_advantage_estimator("gae")
    ours = function_registry.get_advantage_estimator(names["gae"])
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}; medians of {args.repeats} interleaved rounds")
    for shape in args.shapes.split(","):
        rows, width = (int(n) for n in shape.split("x"))
        inputs = ppo_inputs(rows, width, rng)
        medians = interleaved_medians({"tunix gae": lambda inputs=inputs: theirs(**inputs),
                                       names["gae"]: lambda inputs=inputs: ours(**inputs)}, args.repeats)
        print(f"{shape:>10}  tunix gae {medians['tunix gae'] * 1e3:8.3f} ms  {names['gae']} "
              f"{medians[names['gae']] * 1e3:8.3f} ms  tunix / prm-jax = "
              f"{medians['tunix gae'] / medians[names['gae']]:.2f}")


if __name__ == "__main__":
    main()
