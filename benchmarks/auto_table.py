#!/usr/bin/env python3
"""``auto``'s rule from a device's measurements: the README table and the rule, from bench_advantages' JSON.

  python benchmarks/auto_table.py OUT/bench.json OUT/bench1.json [--long 8192]

Reads the ``--json`` files of ``bench_advantages.py`` (one run per gamma*lambda regime, the device check's
``bench.json`` and ``bench1.json``) and prints, in Markdown: per regime and shape, each GAE method's median
(ms) and its fraction of the device copy's bandwidth, the fastest marked; then the rule those figures give,
per regime (gamma*lambda = 1 or not) and row length (short: T < ``--long``; long: T >= ``--long``): the method
whose time, over the shapes of that cell, has the least geometric mean of its ratio to the fastest. Issue 47:
``auto`` on GPU picks what measured fastest per regime, its rule and table in the README.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable

from bench_advantages import bandwidth_fraction

from prm_jax.kernels import GAE_METHODS

METHODS = tuple(m for m in GAE_METHODS if m != "auto")  # the methods auto chooses among


def table(runs: Iterable[dict]) -> str:
    """The Markdown table of every run's shapes and methods."""
    lines = ["| gamma*lambda | shape | " + " | ".join(METHODS) + " | fastest |",
             "| --- | --- | " + " | ".join("---" for _ in METHODS) + " | --- |"]
    for run in runs:
        regime = "= 1" if run["gamma"] * run["lam"] == 1 else "< 1"
        for res in run["results"]:
            cells = [f"{res[m] * 1e3:.3f} ms ({bandwidth_fraction(res, m):.0%})" if m in res else "-" for m in METHODS]
            lines.append(f"| {regime} | {res['shape']} | " + " | ".join(cells) + f" | {res['fastest']} |")
    return "\n".join(lines)


def rule(runs: Iterable[dict], long: int) -> dict[tuple[bool, bool], str]:
    """Per (gamma*lambda == 1, long rows): the method with the least geometric mean of time / fastest time."""
    ratios: dict[tuple[bool, bool], dict[str, list[float]]] = {}
    for run in runs:
        unit = run["gamma"] * run["lam"] == 1
        for res in run["results"]:
            cell = ratios.setdefault((unit, int(res["shape"].split("x")[1]) >= long), {})
            best = res[res["fastest"]]
            for method in METHODS:
                if method in res:
                    cell.setdefault(method, []).append(res[method] / best)
    return {key: min((m for m, r in cell.items() if len(r) == max(map(len, cell.values()))),
                     key=lambda m: math.fsum(map(math.log, cell[m])))
            for key, cell in sorted(ratios.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="bench_advantages.py --json files")
    parser.add_argument("--long", type=int, default=8192, help="rows of at least this many timesteps are long")
    args = parser.parse_args()
    runs = []
    for path in args.json:
        with open(path) as handle:
            runs.append(json.load(handle))
    backends = sorted({f"{run['backend']} ({', '.join(run['devices'])}), jax {run['jax']}" for run in runs})
    print(f"Measured on {'; '.join(backends)}.\n")
    print(table(runs))
    print("\nThe rule these figures give (auto's choice per regime):\n")
    for (unit, is_long), method in rule(runs, args.long).items():
        print(f"- gamma*lambda {'= 1' if unit else '< 1'}, {'long' if is_long else 'short'} rows "
              f"(T {'>=' if is_long else '<'} {args.long}): `{method}`")


if __name__ == "__main__":
    main()
