"""``python -m examples.flax_distill [--steps 60] [--seeds 2] [--plot learning_curves.png]``: a student per
way of using the teacher (outcome only, at the loss, as a scorer), their learning curves and a table;
``--mode loss --steps 30`` trains one."""

from __future__ import annotations

import argparse
from pathlib import Path

from examples.flax_distill.train import MODES, curves, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.flax_distill", description=__doc__)
    parser.add_argument("--mode", choices=MODES, help="train one student this way (default: all, with curves)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="distill_curves.png", help="where the curves go")
    args = parser.parse_args(argv)
    if args.mode:
        history = train(args.mode, args.steps, args.seed)
        print(f"{args.mode}: success over the last 10 steps {sum(history['success'][-10:]) / 10:.2f}")
        return 0
    print(curves(args.steps, args.seeds, Path(args.plot)))
    print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
