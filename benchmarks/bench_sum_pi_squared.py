#!/usr/bin/env python3
"""``credit.sum_pi_squared`` (OTB's input, issue 44.1) against one ``logsumexp`` over the same logits: the
target is 1.5x. Both jitted, timed round-robin in one run (``interleaved_medians``), on ``[rows, vocab]``
float32 logits: ``auto`` (the native kernel on the CPU), and XLA's one-pass and chunked forms (the other
backends' path; the chunked one's memory bounded by the chunk).

  python benchmarks/bench_sum_pi_squared.py [--rows 1024] [--vocab 32000] [--chunk 4096] [--repeats 10]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
from bench_advantages import interleaved_medians

from prm_jax.credit import sum_pi_squared


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    logits = jax.device_put(np.random.default_rng(0).normal(size=(args.rows, args.vocab)).astype(np.float32) * 3)
    lse = jax.jit(lambda z: jax.nn.logsumexp(z, axis=-1))
    fns = {"logsumexp (floor)": lambda: lse(logits).block_until_ready(),
           "sum_pi_squared (auto)": lambda: sum_pi_squared(logits).block_until_ready(),
           "sum_pi_squared, xla": lambda: sum_pi_squared(logits, method="xla").block_until_ready(),
           f"sum_pi_squared, xla, chunk {args.chunk}":
               lambda: sum_pi_squared(logits, chunk=args.chunk, method="xla").block_until_ready()}
    times = interleaved_medians(fns, args.repeats)
    floor = times["logsumexp (floor)"]
    print(f"backend={jax.default_backend()} logits [{args.rows}, {args.vocab}] float32")
    print(f"{'':<32} {'ms':>9} {'/ logsumexp':>12}   (target <= 1.5x)")
    for name, seconds in times.items():
        print(f"{name:<32} {seconds * 1e3:9.2f} {seconds / floor:11.2f}x")


if __name__ == "__main__":
    main()
