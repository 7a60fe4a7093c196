"""The demo: the advantage pipeline on a small bundled batch under each shaping mode.

Run ``python -m prm_jax.demo`` (or ``python3 dev.py demo``). For every row it prints, per timestep, the
shifted loss mask, the process reward ``P`` and the advantages without process rewards and under
``additive``, ``gvpo`` and ``process_weighted`` shaping, with the (unshaped) returns.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources

import numpy as np

from prm_jax import AdvantageConfig, NormConfig, ShapingConfig, compute_advantages, shift_to_next_token

ARRAY_KEYS = ("attention_mask", "loss_mask", "turn_ids", "token_rewards", "logprobs", "ref_logprobs", "rewards",
              "is_truncated")


def load_demo_batch() -> tuple[dict, list[str]]:
    raw = json.loads(resources.files("prm_jax").joinpath("data/demo_batch.json").read_text())
    dtypes = dict(attention_mask=np.int32, loss_mask=np.int32, turn_ids=np.int32, is_truncated=bool)
    batch = {key: np.asarray(raw[key], dtypes.get(key, np.float32)) for key in ARRAY_KEYS}
    return batch, raw["rows"]


def run(kl_ctl: float = 0.0, discount: float = 1.0, gae_lambda: float = 1.0,
        adv_norm: bool = True) -> dict[str, np.ndarray]:
    batch, names = load_demo_batch()
    base = dict(kl_ctl=kl_ctl, discount=discount, gae_lambda=gae_lambda,
                adv_norm=NormConfig("batch", "batch") if adv_norm else None)
    without = compute_advantages({k: v for k, v in batch.items() if k != "token_rewards"}, AdvantageConfig(**base))
    results = {"none": np.asarray(without.advantages), "returns": np.asarray(without.returns),
               "m": np.asarray(without.loss_mask)}
    results["P"] = np.asarray(shift_to_next_token(batch["token_rewards"])) * results["m"]
    for mode in ("additive", "process_weighted"):
        out = compute_advantages(batch, AdvantageConfig(advantage_shaping=ShapingConfig(mode), **base))
        results[mode] = np.asarray(out.advantages)
    # gvpo reads only the sign of P: a turn over budget (P = 0) is marked failed by P - 1 < 0.
    marked = dict(batch, token_rewards=np.where(batch["loss_mask"] == 1, batch["token_rewards"] - 1, 0).astype(np.float32))
    results["gvpo"] = np.asarray(compute_advantages(marked, AdvantageConfig(advantage_shaping=ShapingConfig("gvpo"),
                                                                            **base)).advantages)
    print(f"prm-jax demo: {len(names)} rows, kl_ctl={kl_ctl}, discount={discount}, gae_lambda={gae_lambda}, "
          f"advantage normalization {'batch mean/std' if adv_norm else 'off'}")
    print("columns are timesteps t (the state before token t+1); m is the shifted loss mask; "
          "P the shifted process reward (gvpo gets P - 1)\n")
    columns = ("m", "P", "none", "additive", "gvpo", "process_weighted", "returns")
    for b, name in enumerate(names):
        seqlen = int(batch["attention_mask"][b].sum())
        print(f"row {b}: {name} (outcome reward {batch['rewards'][b]:g}, "
              f"{'truncated' if batch['is_truncated'][b] else 'complete'})")
        widths = [max(len(c), 8) + 2 for c in columns]
        print("   t " + "".join(f"{c:>{w}}" for c, w in zip(columns, widths)))
        for t in range(seqlen):
            print(f"{t:4d} " + "".join(f"{results[c][b, t]:{w}.4f}" for c, w in zip(columns, widths)))
        print()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prm-jax-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--kl-ctl", type=float, default=0.0)
    parser.add_argument("--discount", type=float, default=1.0)
    parser.add_argument("--gae-lambda", type=float, default=1.0)
    parser.add_argument("--no-adv-norm", action="store_true", help="skip batch advantage normalization")
    args = parser.parse_args(argv)
    run(args.kl_ctl, args.discount, args.gae_lambda, not args.no_adv_norm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
