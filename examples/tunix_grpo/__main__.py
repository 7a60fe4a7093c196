"""tunix's GRPO learner with prm-jax's process rewards, on CPU in seconds (needs the `tunix` extra).

``python -m examples.tunix_grpo [--steps 8] [--loss grpo|prm_jax_ppo]``: a tiny randomly initialized
transformer (tunix's own test model and vocabulary) learns to say "Tunix". The outcome reward (tunix's
reward function) is 1 when at least half of a completion's 8 tokens are "Tunix"; a prm-jax scorer rewards
each "Tunix" token where it is generated (``--no-process``: outcome only). The same script with your
model, tokenizer, rewards and scorers is a real run.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np
import optax
from flax import nnx
from grain import python as grain
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo.grpo_learner import GRPOConfig
from tunix.rl.rollout import base_rollout
from tunix.tests import test_common as toy  # tunix's own toy transformer and vocabulary

import prm_jax
from prm_jax.integrations import tunix as prm_tunix

TARGET = 14  # "Tunix" in tunix's MockVocab


class SaysTunix(prm_jax.BaseScorer):
    """0.5 on each "Tunix" token of a completion, 0 on the others (``weight=0``: off)."""

    name = "says_tunix"

    async def evaluate(self, interaction, ctx):
        return (np.asarray(interaction.output_tokens) == TARGET).astype(np.float32) * 0.5


def outcome(prompts, completions, **kwargs):
    return [float(text.split().count("Tunix") >= 4) for text in completions]


def make_cluster(steps: int, *, generate: int = 8, prompt: int = 8, cache: int = 32,
                 critic: bool = False) -> rl_cluster_lib.RLCluster:
    """tunix's toy transformer as policy and reference (and, with ``critic``, as the backbone of a value
    model with a score head, for tunix's PPO learner), its vanilla rollout, on one CPU device."""
    vocab = toy.MockVocab()
    model = toy.ModelConfig(vocab_size=vocab.GetPieceSize())
    policy, reference = (toy.ToyTransformer(config=model, rngs=nnx.Rngs(0)) for _ in range(2))
    roles = [rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE, rl_cluster_lib.Role.ROLLOUT]
    value_model = None
    if critic:
        value_model = toy.ToyTransformerWithScoreHead(toy.ToyTransformer(config=model, rngs=nnx.Rngs(1)),
                                                      nnx.Rngs(2))
        roles.append(rl_cluster_lib.Role.CRITIC)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    config = rl_cluster_lib.ClusterConfig(
        role_to_mesh=dict.fromkeys(roles, mesh), rollout_engine="vanilla", offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(actor_optimizer=optax.adam(3e-3), eval_every_n_steps=1000,
                                                        critic_optimizer=optax.adam(3e-3) if critic else None,
                                                        max_steps=steps),
        rollout_config=base_rollout.RolloutConfig(max_tokens_to_generate=generate, max_prompt_length=prompt,
                                                  kv_cache_size=cache, temperature=1.0, seed=0))
    return rl_cluster_lib.RLCluster(actor=policy, critic=value_model, reference=reference, tokenizer=vocab,
                                    cluster_config=config)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(prog="python -m examples.tunix_grpo", description=__doc__)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--loss", choices=("grpo", prm_tunix.LOSS_NAME), default=prm_tunix.LOSS_NAME,
                        help="tunix's grpo loss, or AReaL's clipped loss from prm_jax.losses")
    parser.add_argument("--no-process", action="store_true", help="outcome rewards only (the scorer is off)")
    args = parser.parse_args(argv)
    loss = prm_tunix.register_loss() if args.loss == prm_tunix.LOSS_NAME else "grpo"
    seen: dict[str, list[float]] = {"outcome": [], "tunix_tokens": []}

    def logged_outcome(prompts, completions, **kwargs):
        rewards = outcome(prompts, completions)
        seen["outcome"].append(float(np.mean(rewards)))
        seen["tunix_tokens"].append(float(np.mean([text.split().count("Tunix") for text in completions])))
        return rewards

    prompts = grain.MapDataset.source(["hello world", "My name", "input string", "hello there"] * args.steps)
    judge = SaysTunix(weight=0.0 if args.no_process else 1.0)
    with prm_jax.BlockingRunner(scorers=[judge]) as scorers:           # prm-jax: the scorers' event loop
        learner = prm_tunix.ProcessRewardGRPOLearner(                  # prm-jax: tunix's learner, shaped advantages
            rl_cluster=make_cluster(args.steps), reward_fns=logged_outcome, scorers=scorers,
            algo_config=GRPOConfig(num_generations=4, beta=0.0, policy_loss_fn=loss))
        learner.train(prompts.batch(2).map(lambda batch: {"prompts": batch}))
    print(json.dumps({k: [round(v, 3) for v in values] for k, values in seen.items()}))
    return seen


if __name__ == "__main__":
    main()
