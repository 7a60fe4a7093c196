"""Three ways to train the cue task's student, from the same rollouts: the outcome alone (GRPO), the teacher
at the loss (AReaL's ``rl_coef * rl + distill_coef * opd``: ``losses.distillation_loss`` on
``credit.distillation_rewards``) and the teacher as a scorer (``TeacherModelScorer``: each generated token's
``log pi_T - log pi_S`` added to the advantages by the additive shaping, verl's policy-gradient distillation).

The teacher is fixed: at each answer it puts ``TEACHER_MARGIN`` logits on the right answer (so it answers a
turn right with probability ``e^3 / (e^3 + 3) = 0.87``, a whole episode 0.66 of the time), where the
outcome alone rewards one episode in 64 at the start.

The two ways of using the teacher give the same update here: one PPO step per batch, on-policy, so the
ratio is 1, no clip binds, and ``-(A + r)`` in the PPO loss is ``-A`` plus the distillation loss's ``-rho
r`` over the same tokens (prm-jax's rules where verl's break (the credit-assignment guide states each): verl's policy-gradient
distillation is the reward
passed as the advantage). They part with several epochs per batch (PPO's clip against the ``rho`` cap of
5) or other coefficients.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import prm_jax
from examples.flax_grpo.env import ANSWER0, CHOICES, CUE0, TURNS, WIDTH, outcome
from examples.flax_grpo.model import Policy
from examples.flax_grpo.train import SPANS, policy_logprobs, sample

CONFIG = Path(__file__).with_name("config.yaml")
MODES = ("outcome", "loss", "reward")
TEACHER_MARGIN = 3.0
RL_COEF, DISTILL_COEF = 1.0, 1.0


def teacher_logits(tokens: jax.Array) -> jax.Array:
    """``[B, T, 4]``: at position ``t``, the teacher's logits of the answer at ``t + 1`` (the right answer to
    the cue at ``t``, for the turn that cue opens)."""
    turn = jnp.clip((jnp.arange(tokens.shape[1]) - 1) // 2, 0, TURNS - 1)[None, :]
    right = (tokens - CUE0 + turn) % CHOICES
    return TEACHER_MARGIN * jax.nn.one_hot(right, CHOICES)


def teacher_on_timesteps(tokens: jax.Array) -> jax.Array:
    """The teacher's log-prob of token ``t + 1`` at timestep ``t`` (as ``policy_logprobs``)."""
    return prm_jax.losses.logprobs_on_timesteps(teacher_logits(tokens), jnp.clip(tokens - ANSWER0, 0, CHOICES - 1))


def teacher_fn():
    """The factory ``config.yaml`` names: the teacher as a ``TeacherModelScorer`` function of whole rows, each
    position's token's log-prob given the tokens before it (``token_logprobs``)."""
    def fn(input_ids, attention_mask, turn_ids):
        ids = jnp.asarray(input_ids)
        return prm_jax.scorers.token_logprobs(teacher_logits(ids), jnp.clip(ids - ANSWER0, 0, CHOICES - 1))
    return fn


@nnx.jit(static_argnames=("config", "mode"))
def update(policy: Policy, optimizer: nnx.Optimizer, batch: dict, config: prm_jax.AdvantageConfig, mode: str):
    adv = prm_jax.compute_advantages(batch, config)
    if mode == "loss":  # the dense reward on timesteps, the student's old log-probs held constant
        rewards = prm_jax.credit.distillation_rewards(teacher_on_timesteps(batch["input_ids"]), adv.logprobs,
                                                      adv.loss_mask)

    def loss_fn(policy):
        logprobs = policy_logprobs(policy, batch["input_ids"])
        rl, _ = prm_jax.losses.ppo_clip_loss(logprobs, adv.logprobs, adv.advantages, adv.loss_mask, eps_clip=0.2)
        if mode != "loss":
            return rl
        opd, _ = prm_jax.losses.distillation_loss(logprobs, adv.logprobs, rewards, adv.loss_mask)
        return RL_COEF * rl + DISTILL_COEF * opd

    value, grads = nnx.value_and_grad(loss_fn)(policy)
    optimizer.update(policy, grads)
    return value


def train(mode: str = "loss", steps: int = 60, seed: int = 0, prompts: int = 16, group: int = 8) -> dict:
    """One student trained ``mode`` way (``MODES``); the per-step success and losses."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    config = prm_jax.load_config(CONFIG)
    if mode != "reward":
        config = dataclasses.replace(config, prm=dataclasses.replace(config.prm, enabled=False))
    policy = Policy(rngs=nnx.Rngs(seed))
    optimizer = nnx.Optimizer(policy, optax.adam(3e-3), wrt=nnx.Param)
    rng, key = np.random.default_rng(seed), jax.random.key(seed)
    rows = prompts * group
    turn_ids = np.tile(np.asarray(prm_jax.kernels.turn_ids_from_spans(SPANS, WIDTH)), (rows, 1))
    fixed = dict(attention_mask=np.tile((np.arange(WIDTH) < WIDTH - 1).astype(np.int32), (rows, 1)),
                 turn_ids=turn_ids, loss_mask=(turn_ids >= 0).astype(np.int32),
                 group_ids=np.repeat(np.arange(prompts, dtype=np.int32), group), is_truncated=np.zeros(rows, bool))
    history: dict = {"success": [], "loss": []}
    with prm_jax.BlockingRunner(config) as teacher:
        for step in range(steps):
            cues = np.repeat(rng.integers(0, CHOICES, size=(prompts, TURNS)), group, axis=0)
            tokens, logprobs = sample(policy, jnp.asarray(cues, jnp.int32), jax.random.fold_in(key, step))
            tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)
            batch = dict(fixed, input_ids=tokens, logprobs=logprobs, rewards=outcome(tokens))
            if teacher.runner.active:  # the teacher's reward per generated token, from the student's log-probs
                batch["token_rewards"] = teacher.score_arrays(tokens, turn_ids, logprobs=logprobs,
                                                              rewards=batch["rewards"])
            history["loss"].append(float(update(policy, optimizer, batch, config.actor, mode)))
            history["success"].append(float(batch["rewards"].mean()))
    return history


def curves(steps: int, seeds: int, out: Path) -> str:
    """Every mode over ``seeds`` seeds: a learning-curve plot at ``out`` and a table of areas under the curve."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {mode: np.stack([train(mode, steps, seed)["success"] for seed in range(seeds)]) for mode in MODES}
    figure, axis = plt.subplots(figsize=(7, 4))
    for mode, run in runs.items():
        smooth = np.stack([np.convolve(r, np.ones(5) / 5, mode="valid") for r in run])
        x = np.arange(smooth.shape[1]) + 5
        axis.plot(x, smooth.mean(0), label={"outcome": "outcome only (GRPO)", "loss": "teacher at the loss (MOPD)",
                                            "reward": "teacher as a scorer (k1 reward): the same update"}[mode],
                linestyle="--" if mode == "reward" else "-")
        axis.fill_between(x, smooth.min(0), smooth.max(0), alpha=0.2)
    axis.axhline(0.66, color="grey", linestyle=":", label="the teacher")
    axis.set(xlabel="step", ylabel="success (5-step mean)", title=f"Distilling the cue task's student, {seeds} seeds")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    lines = ["| mode | " + " | ".join(f"seed {s}" for s in range(seeds)) + " | mean |", "| --- " * (seeds + 2) + "|"]
    for mode, run in runs.items():
        areas = run.mean(axis=1)
        lines.append(f"| {mode} | " + " | ".join(f"{a:.3f}" for a in areas) + f" | {areas.mean():.3f} |")
    return "\n".join(lines)
