"""``python -m examples.flax_grpo [--mode gvpo] [--steps 100] [--seed 0] [--judge python|model]
[--loss ppo_clip]``, or ``--compare`` for every mode."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from examples.flax_grpo.train import LOSSES, MODES, compare, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.flax_grpo", description=__doc__)
    parser.add_argument("--mode", choices=MODES, default="gvpo",
                        help="shaping mode, outcome-only, or a credit mode (tree, pure, decoupled)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare", action="store_true", help="every mode over --seeds seeds, with a plot")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--plot", default="learning_curves.png", help="where --compare writes its figure")
    parser.add_argument("--summary", help="write the run's figures as JSON here")
    parser.add_argument("--judge", choices=("python", "model"), default="python",
                        help="the judge: CueJudge (config.yaml) or the same as a JAX ModelScorer (config_model.yaml)")
    parser.add_argument("--loss", choices=LOSSES, default="ppo_clip",
                        help="the policy loss: AReaL's PPO clip, verl's by loss_mode, or TRL's sequence GSPO")
    args = parser.parse_args(argv)
    if args.compare:
        print(compare(args.steps, args.seeds, Path(args.plot)))
        print(f"wrote {args.plot}")
        return 0
    history = train(args.mode, args.steps, args.seed, judge=args.judge, loss=args.loss)
    print(f"{args.mode}: success over the last 10 steps {sum(history['success'][-10:]) / 10:.2f}")
    if args.summary:
        scored = history["batch"].get("token_rewards")
        shifted = None if scored is None else [row[1:] + [0.0] for row in scored.tolist()]
        Path(args.summary).write_text(json.dumps({
            "success": history["success"], "loss": history["loss"], "diagnostics": history["diagnostics"],
            "advantages": history["advantages"].tolist(), "loss_mask": history["loss_mask"].tolist(),
            "process_rewards_on_timesteps": shifted}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
