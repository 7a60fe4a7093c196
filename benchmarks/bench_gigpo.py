#!/usr/bin/env python3
"""GiGPO against the reference-style Python loop and against compute_advantages on the same batch.

  python benchmarks/bench_gigpo.py [--rows 1024] [--turns 32] [--width 4096] [--group 8] [--repeats 10]

Prints, from one run: the per-turn GiGPO kernel (``prm_jax.kernels._gigpo``) against a dict-and-loop implementation
written the way verl-agent's reads (target: >= 100x faster), and ``compute_advantages`` with
``credit_assignment: gigpo`` against plain ``compute_advantages`` (GAE) on the same [B, T] batch (target:
within 2x).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import numpy as np

import prm_jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import reference  # the float64 dict-and-loop GiGPO of the tests
from bench_advantages import interleaved_medians, median_seconds


def make_batch(rows, turns, width, group, seed=0):
    rng = np.random.default_rng(seed)
    span = width // turns
    t = np.arange(width)[None]
    turn_ids = np.where((t % span) < span * 3 // 4, t // span, -1).astype(np.int32)
    turn_ids = np.broadcast_to(turn_ids, (rows, width)).copy()
    loss_mask = (turn_ids >= 0).astype(np.int32)
    batch = dict(attention_mask=np.ones((rows, width), np.int32), loss_mask=loss_mask, turn_ids=turn_ids,
                 logprobs=(-rng.exponential(size=(rows, width))).astype(np.float32),
                 token_rewards=(rng.random((rows, width)) * loss_mask).astype(np.float32),
                 rewards=rng.choice([0.0, 1.0], size=rows).astype(np.float32),
                 is_truncated=np.zeros(rows, bool), group_sizes=np.full(rows // group, group, np.int32),
                 anchor_ids=rng.integers(-1, 64, size=(rows, turns)).astype(np.int32),
                 turn_rewards=rng.normal(size=(rows, turns)).astype(np.float32))
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--turns", type=int, default=32)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--loop-repeats", type=int, default=3, help="runs of the Python loop (median)")
    args = parser.parse_args()
    batch = make_batch(args.rows, args.turns, args.width, args.group)
    mask = np.ones((args.rows, args.turns), bool)
    kernel_inputs = jax.device_put((batch["turn_rewards"], mask, batch["rewards"]))
    anchors, sizes = jax.device_put((batch["anchor_ids"], batch["group_sizes"]))
    kernel = median_seconds(lambda: prm_jax.credit.gigpo(*kernel_inputs, anchor_ids=anchors, group_sizes=sizes).advantages,
                    args.repeats)
    loop = median_seconds(lambda: reference.gigpo(batch["turn_rewards"], mask, batch["rewards"], batch["anchor_ids"],
                                                  batch["group_sizes"].tolist()), args.loop_repeats)
    device_batch = jax.device_put(batch)
    gae_config = prm_jax.AdvantageConfig(kl_ctl=0.0, check_values=False)
    gigpo_config = prm_jax.AdvantageConfig(kl_ctl=0.0, check_values=False, credit_assignment={"mode": "gigpo"})
    timed = interleaved_medians({"plain": lambda: prm_jax.compute_advantages(device_batch, gae_config).advantages,
                                 "gigpo": lambda: prm_jax.compute_advantages(device_batch, gigpo_config).advantages},
                                args.repeats, inner=1)
    plain, with_gigpo = timed["plain"], timed["gigpo"]
    print(f"backend={jax.default_backend()} B={args.rows} K={args.turns} T={args.width} groups of {args.group}")
    print(f"GiGPO kernel [B, K]: {kernel * 1e3:.3f} ms; reference-style Python loop: {loop * 1e3:.0f} ms; "
          f"speedup {loop / kernel:.0f}x (target >= 100x)")
    print(f"compute_advantages with GiGPO: {with_gigpo * 1e3:.2f} ms; plain compute_advantages (GAE): "
          f"{plain * 1e3:.2f} ms; ratio {with_gigpo / plain:.2f} (target <= 2)")


if __name__ == "__main__":
    main()
