"""Compile time of ``compute_advantages``' program: the value checks' counts only (what an eager call and a
trainer's jitted step compile first) against the same program with every failed check's search in it
(``_checks.located``: one conditional branch per check; what ``check_values="callback"`` compiles, and
what an eager call compiles again when a check fails). Same plan, same batch, in one run; the ratio of the
medians is printed.

    python benchmarks/bench_compile.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the shared batch maker

from batches import make_batch

from prm_jax.config import AdvantageConfig
from prm_jax.kernels import _advantages as advantages
from prm_jax.kernels import _inputs as inputs

CONFIGS = {
    "default (token GAE)": {},
    "gigpo": {"credit_assignment": {"mode": "gigpo"}},
    "turn GAE, group norm, gvpo": {"gae_timestep_unit": "turn", "reward_norm": {"mean_level": "group",
                                                                                "std_level": "group"},
                                   "advantage_shaping": {"mode": "gvpo"}},
}


def compile_seconds(arrays: dict, plan, locate: bool) -> tuple[float, float]:
    """``(trace and lower, compile)`` seconds, from empty caches."""
    jax.clear_caches()  # a trace and a compile each time, not the in-memory executable
    start = time.perf_counter()
    lowered = advantages._pipeline_jit.lower(arrays, plan=plan, locate=locate)
    middle = time.perf_counter()
    lowered.compile()
    return middle - start, time.perf_counter() - middle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    batch = make_batch(rng, rows=16, width=256, max_turns=6)
    batch["group_sizes"] = np.array([4] * 4, np.int32)
    arrays = inputs.batch_arrays(batch)
    print(f"{'plan':<28} {'lower: counts':>14} {'searches':>9} {'compile: counts':>16} {'searches':>9} {'ratio':>6}")
    for name, fields in CONFIGS.items():
        plan = AdvantageConfig(**fields).plan.with_strategy(arrays)
        counts, searches = [], []
        for _ in range(args.repeats):  # alternating, so the machine's drift falls on both
            counts.append(compile_seconds(arrays, plan, False))
            searches.append(compile_seconds(arrays, plan, True))
        (cl, cc), (sl, sc) = np.median(counts, axis=0), np.median(searches, axis=0)
        print(f"{name:<28} {cl:14.3f} {sl:9.3f} {cc:16.3f} {sc:9.3f} {(cl + cc) / (sl + sc):6.2f}")

if __name__ == "__main__":
    main()
