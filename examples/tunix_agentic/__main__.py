"""tunix's agentic (multi-turn) GRPO learner with prm-jax's per-turn process rewards, on CPU in seconds
(needs the `tunix` extra).

``python -m examples.tunix_agentic [--steps 4] [--no-process]``: a tiny randomly initialized transformer
(tunix's own test model and vocabulary) plays a two-turn environment: it answers the task, the
environment replies, it answers again. The outcome (the environment's reward, tunix's trajectory reward)
is 1 only when *both* answers are all "Tunix": a signal too sparse to be met by chance. A prm-jax scorer gives each
assistant turn 0.5 per "Tunix" token, on that turn's tokens (``--no-process``: outcome only). The same
script with your model, tokenizer, environment and scorers is a real run.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
from grain import python as grain
from tunix.rl.agentic.agentic_grpo_learner import GRPOConfig
from tunix.rl.agentic.environments.base_environment import BaseTaskEnv, EnvStepResult

import prm_jax
from examples.tunix_grpo.__main__ import TARGET, SaysTunix, make_cluster  # tunix's toy model, vocabulary, rollout
from prm_jax.integrations import tunix as prm_tunix

TURN_TOKENS = 4  # tokens the model may generate per turn
RESPONSE = 12  # the whole conversation after the prompt: two turns and the environment's reply


class TwoTurnEnv(BaseTaskEnv):
    """Two turns; the reward (at the end) is 1 when both answers are all "Tunix"."""

    def __init__(self, task: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(task, max_steps=2, **kwargs)
        self.answers: list[str] = []

    def _initial_observation(self) -> Any:
        prompt = np.asarray(self.task.get("prompts", "hello world")).reshape(-1)  # (grain batches hold arrays)
        return {"prompts": str(prompt[0])}

    def _step_impl(self, action: Any) -> EnvStepResult:
        text = getattr(action, "action", action)
        self.answers.append(str(text))
        done = self.step_count >= 2
        reward = float(done and all(a.split().count("Tunix") == TURN_TOKENS for a in self.answers))
        return EnvStepResult(observation="hello there", reward=reward, done=done, info={})


class ChatParser:
    """Messages joined by spaces (tunix's MockVocab knows no chat template)."""

    assistant_token = ""

    def parse(self, messages: list[dict[str, str]], add_generation_prompt: bool = False,
              is_first_msg: bool = False) -> str:
        return " ".join(m["content"] for m in messages if m["content"])

    def update_assistant_end_tokens(self, tokens: Any) -> tuple[Any, int]:
        return tokens, 0


class Learner(prm_tunix.ProcessRewardAgenticGRPOLearner):  # type: ignore[misc, name-defined]
    """prm-jax's agentic learner, each turn generating at most ``TURN_TOKENS`` (tunix lets one turn use the
    whole response budget; the toy model never stops by itself) with a seed of its own (tunix's vanilla
    sampler takes the config's one seed, so every one-trajectory call would sample the same tokens; a
    serving engine draws fresh ones)."""

    calls = 0

    def _model_call(self, chat_lists: Any, env: Any = None, max_generation_steps: int | None = None) -> Any:
        steps = TURN_TOKENS if max_generation_steps is None else min(max_generation_steps, TURN_TOKENS)
        self.rl_cluster.cluster_config.rollout_config.seed = self.calls  # (one call at a time: max_concurrency=1)
        self.calls += 1
        return super()._model_call(chat_lists, env, max_generation_steps=steps)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(prog="python -m examples.tunix_agentic", description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no-process", action="store_true", help="outcome rewards only (the scorer is off)")
    args = parser.parse_args(argv)
    seen: dict[str, list[float]] = {"outcome": [], "tunix_share": []}

    prompts = grain.MapDataset.source(["hello world", "My name", "input string", "hello there"] * args.steps)
    judge = SaysTunix(weight=0.0 if args.no_process else 1.0)
    with prm_jax.BlockingRunner(scorers=[judge]) as scorers:           # prm-jax: the scorers' event loop
        learner = Learner(                                             # prm-jax: tunix's agentic learner
            rl_cluster=make_cluster(args.steps, generate=RESPONSE, prompt=24, cache=64), scorers=scorers,
            chat_parser=ChatParser(), env_class=TwoTurnEnv,
            algo_config=GRPOConfig(num_generations=4, beta=0.0, max_response_length=RESPONSE,
                                   use_rollout_logps=False, max_concurrency=1))
        process = learner._process_results

        def recorded(trajectories, *a, **k):
            examples = process(trajectories, *a, **k)
            ids, trained = np.asarray(examples[0].completion_ids), np.asarray(examples[0].completion_mask, bool)
            seen["outcome"].append(float(np.mean([t.traj["trajectory_reward"] for t in trajectories])))
            seen["tunix_share"].append(float((ids[trained] == TARGET).mean()) if trained.any() else 0.0)
            return examples

        learner._process_results = recorded
        learner.train(prompts.batch(2).map(lambda batch: {"prompts": batch}))
    print(json.dumps({k: [round(v, 3) for v in values] for k, values in seen.items()}))
    return seen


if __name__ == "__main__":
    main()
