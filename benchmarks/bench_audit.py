"""The credit auditor's cost (issue 59.6): the whole suite for one configuration, against the minute it must fit
in before a training job, in one run.

  python benchmarks/bench_audit.py [--repeats 3] [--only RLOO]

For each configuration (GRPO, RLOO, turn_rloo): the first audit in a fresh process (the pipeline compiled once a
problem: what ``prm-jax audit`` pays) and the median of ``--repeats`` more (compiled), each split into the
pipeline's share (``compute_advantages`` over every enumerated group, and its compilation) and the enumeration's
(responses, probabilities, the true gradient, the per-token gradients and their sums). Prints the ratio to 60 s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import prm_jax
from prm_jax import audit

CONFIGS = {
    "GRPO, seq-mean-token-mean": ({"reward_norm": {"mean_level": "group", "std_level": "group"}}, "seq-mean-token-mean"),
    "RLOO, seq-mean-token-sum": ({"reward_norm": {"mean_level": "group", "std_level": None, "mean_leave1out": True}},
                                 "seq-mean-token-sum"),
    "turn_rloo, seq-mean-token-sum": ({"credit_assignment": {"mode": "turn_rloo"}}, "seq-mean-token-sum"),
}
BUDGET_S = 60.0


def timed_audit(settings, aggregation) -> tuple[float, float]:
    """``(wall, pipeline)`` seconds of one audit of the whole suite."""
    spent = [0.0]
    original = audit._grouped_advantages

    def pipeline(*args, **kwargs):
        start = time.perf_counter()
        out = original(*args, **kwargs)
        out.block_until_ready()
        spent[0] += time.perf_counter() - start
        return out

    audit._grouped_advantages = pipeline
    try:
        start = time.perf_counter()
        audit.audit(audit.built_in_config(settings), aggregation)
        return time.perf_counter() - start, spent[0]
    finally:
        audit._grouped_advantages = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", help="the configurations whose name starts with this (default: all)")
    args = parser.parse_args()
    print(f"prm-jax {prm_jax.__version__}: the audit suite ({len(audit.SUITE)} problems) for one configuration, "
          f"against {BUDGET_S:.0f} s")
    print(f"{'configuration':<32} {'first (s)':>10} {'pipeline':>9} {'enum.':>7} {'warm (s)':>9} {'pipeline':>9} "
          f"{'enum.':>7} {'first/60s':>10}")
    for name, (settings, aggregation) in CONFIGS.items():
        if args.only and not name.startswith(args.only):
            continue
        first, first_pipeline = timed_audit(settings, aggregation)
        warm = [timed_audit(settings, aggregation) for _ in range(args.repeats)]
        wall = statistics.median(w for w, _ in warm)
        pipe = statistics.median(p for _, p in warm)
        print(f"{name:<32} {first:>10.2f} {first_pipeline / first:>9.0%} {1 - first_pipeline / first:>7.0%} "
              f"{wall:>9.2f} {pipe / wall:>9.0%} {1 - pipe / wall:>7.0%} {first / BUDGET_S:>10.3f}")


if __name__ == "__main__":
    main()
