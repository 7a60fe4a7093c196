"""The GRPO loop: sample groups in JAX, score the turns with prm-jax, update with compute_advantages inside jit."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import prm_jax
from examples.flax_grpo.env import ANSWER0, ANSWER_POSITIONS, BOS, CHOICES, CUE0, TURNS, WIDTH, outcome
from examples.flax_grpo.model import Policy

CONFIG = Path(__file__).with_name("config.yaml")
CONFIGS = {"python": CONFIG, "model": Path(__file__).with_name("config_model.yaml")}  # --judge
MODES = ("outcome", "additive", "gvpo", "process_weighted", "tree", "pure", "decoupled")
SHAPING = ("additive", "gvpo", "process_weighted")
SPANS = np.array([[[p, p + 1] for p in ANSWER_POSITIONS]], np.int32)  # one generated token per turn


def load(mode: str, judge: str = "python") -> prm_jax.ExperimentConfig:
    """The YAML config with ``mode`` applied: ``outcome`` switches the scorers off; ``process_weighted``
    needs scores in [0, 1], so its judge says 0 (not -1) for a wrong turn, at weight 1. The credit modes of
    issue 22 keep the config's shaping (``gvpo``) and replace a stage: ``tree`` GAE by TreeRL's advantages
    over each group's trees (here every rollout is its own chain); ``pure`` GAE and the group normalization
    by PURE's recipe (min-form turn scores, RLOO, whitening; it shapes nothing, so its shaping is ``additive``,
    the one mode allowed beside it); ``decoupled`` the group normalization by GDPO's
    over the outcome and the judge's total (the judge then shapes nothing: its scores are a reward source)."""
    config = prm_jax.load_config(CONFIGS[judge])
    prm, actor = config.prm, config.actor
    if mode == "outcome":
        prm = dataclasses.replace(prm, enabled=False)
    elif mode == "process_weighted":
        wrong = {"factory_kwargs": {"wrong": 0.0}} if judge == "model" else {"wrong": 0.0}
        prm = dataclasses.replace(prm, scorers=tuple(dataclasses.replace(s, weight=1.0, kwargs={**s.kwargs, **wrong})
                                                     for s in prm.scorers))
    if mode in SHAPING:
        actor = dataclasses.replace(actor, advantage_shaping=dataclasses.replace(actor.advantage_shaping, mode=mode))
    elif mode == "tree":
        actor = dataclasses.replace(actor, credit_assignment={"mode": "tree"})
    elif mode == "pure":  # PURE shapes nothing: the config's gvpo is refused beside it, additive is its no-op
        actor = dataclasses.replace(actor, credit_assignment={"mode": "pure"}, reward_norm=None,
                                    advantage_shaping=dataclasses.replace(actor.advantage_shaping, mode="additive"))
    elif mode == "decoupled":
        actor = dataclasses.replace(actor, reward_norm={"mode": "decoupled"})
    return dataclasses.replace(config, prm=prm, actor=actor)


@nnx.jit
def sample(policy: Policy, cues: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Rows ``[BOS, c0, a0, c1, a1, c2, a2, PAD]``: each answer sampled from the policy given the row so far.
    Returns the tokens and the behaviour log-probs on positions (a token's log-prob at its own position)."""
    rows = cues.shape[0]
    tokens = jnp.zeros((rows, WIDTH), jnp.int32).at[:, 0].set(BOS)
    tokens = tokens.at[:, ANSWER_POSITIONS - 1].set(CUE0 + cues)
    logprobs = jnp.zeros((rows, WIDTH), jnp.float32)
    for turn, position in enumerate(ANSWER_POSITIONS):
        logits = policy(tokens)[:, position - 1]
        choice = jax.random.categorical(jax.random.fold_in(key, turn), logits)
        tokens = tokens.at[:, position].set(ANSWER0 + choice)
        logprobs = logprobs.at[:, position].set(jnp.take_along_axis(jax.nn.log_softmax(logits), choice[:, None], 1)[:, 0])
    return tokens, logprobs


def policy_logprobs(policy: Policy, tokens: jax.Array) -> jax.Array:
    """On timesteps: at ``t`` the log-prob of token ``t + 1`` (meaningful where the next token is an answer;
    the policy's logits are over the answers, so tokens become answer indices first)."""
    return prm_jax.losses.logprobs_on_timesteps(policy(tokens), jnp.clip(tokens - ANSWER0, 0, CHOICES - 1))


# The policy losses the example can train with (``--loss``): AReaL's PPO clip (the default), verl's by their
# ``policy_loss.loss_mode`` names, and TRL's sequence-level GSPO; with the options a loss needs (clip_cov's
# random choice of tokens drawn with one fixed key: the example's steps are deterministic).
LOSSES = ("ppo_clip", *prm_jax.losses.POLICY_LOSS_MODES, "gspo_sequence")
LOSS_OPTIONS = {"dro": {"dro_beta": 1e-3}, "clip_cov": {"key": jax.random.key(0)}}


def policy_loss(name: str, logprobs: jax.Array, old: jax.Array, advantages: jax.Array, mask: jax.Array) -> jax.Array:
    """The loss ``name`` (``LOSSES``) of the policy's log-probs against the rollout's."""
    if name == "ppo_clip":
        loss, _ = prm_jax.losses.ppo_clip_loss(logprobs, old, advantages, mask, eps_clip=0.2)
    elif name == "gspo_sequence":  # TRL's loss takes one advantage per sequence: the row's mean over its tokens
        per_row = jnp.sum(advantages * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
        loss, _ = prm_jax.losses.gspo_sequence_loss(logprobs, old, per_row, mask)
    else:
        loss, _ = prm_jax.losses.policy_loss(logprobs, old, advantages, mask, mode=name, **LOSS_OPTIONS.get(name, {}))
    return loss


@nnx.jit(static_argnames=("config", "loss"))
def update(policy: Policy, optimizer: nnx.Optimizer, batch: dict, config: prm_jax.AdvantageConfig,
           loss: str = "ppo_clip"):
    """One policy-gradient step on the batch's advantages (GRPO: no critic, group-normalized outcome
    rewards), with the loss ``loss`` (``LOSSES``; PPO clip by default)."""
    adv = prm_jax.compute_advantages(batch, config)  # config is static: one compile

    def loss_fn(policy):
        return policy_loss(loss, policy_logprobs(policy, batch["input_ids"]), adv.logprobs, adv.advantages,
                           adv.loss_mask)

    value, grads = nnx.value_and_grad(loss_fn)(policy)
    optimizer.update(policy, grads)
    return value, adv.advantages, adv.loss_mask, adv.diagnostics


def train(mode: str = "gvpo", steps: int = 100, seed: int = 0, prompts: int = 16, group: int = 8,
          progress: bool = True, judge: str = "python", loss: str = "ppo_clip") -> dict:
    """Trains one policy; returns the per-step success, losses and the last step's arrays. ``judge``:
    ``python`` (``CueJudge``, one call per turn) or ``model`` (the same judge as a JAX model scorer);
    ``loss``: one of ``LOSSES``."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    config = load(mode, judge)
    policy = Policy(rngs=nnx.Rngs(seed))
    optimizer = nnx.Optimizer(policy, optax.adam(3e-3), wrt=nnx.Param)
    rng = np.random.default_rng(seed)
    key = jax.random.key(seed)
    rows = prompts * group
    fixed = dict(attention_mask=np.tile((np.arange(WIDTH) < WIDTH - 1).astype(np.int32), (rows, 1)),
                 turn_ids=np.tile(np.asarray(prm_jax.kernels.turn_ids_from_spans(SPANS, WIDTH)), (rows, 1)),
                 group_ids=np.repeat(np.arange(prompts, dtype=np.int32), group), is_truncated=np.zeros(rows, bool))
    fixed["loss_mask"] = (fixed["turn_ids"] >= 0).astype(np.int32)
    if mode == "tree":  # each rollout is its own chain of TURNS nodes; the group's chains are one forest
        fixed["node_ids"] = np.arange(rows * TURNS, dtype=np.int32).reshape(rows, TURNS)
        fixed["node_parents"] = np.where(np.arange(rows * TURNS) % TURNS == 0, -1,
                                         np.arange(rows * TURNS) - 1).astype(np.int32)
    history: dict = {"success": [], "loss": []}
    with prm_jax.BlockingRunner(config) as judge:
        for step in range(steps):
            cues = np.repeat(rng.integers(0, CHOICES, size=(prompts, TURNS)), group, axis=0)  # one prompt per group
            tokens, logprobs = sample(policy, jnp.asarray(cues, jnp.int32), jax.random.fold_in(key, step))
            tokens = np.asarray(tokens)
            batch = dict(fixed, input_ids=tokens, logprobs=np.asarray(logprobs), rewards=outcome(tokens))
            if judge.runner.active:
                scores = judge.score_arrays(tokens, fixed["turn_ids"], rewards=batch["rewards"])
                if mode == "decoupled":  # the judge's total is GDPO's second reward source
                    batch["reward_sources"] = scores.sum(axis=1, keepdims=True)
                else:
                    batch["token_rewards"] = scores
            value, advantages, mask, diagnostics = update(policy, optimizer, batch, config.actor, loss)
            history["success"].append(float(batch["rewards"].mean()))
            history["loss"].append(float(value))
            if progress:
                _bar(step + 1, steps, history)
    history.update(batch=batch, advantages=np.asarray(advantages), loss_mask=np.asarray(mask),
                   diagnostics={k: float(v) for k, v in diagnostics.items()})
    return history


def _bar(done: int, total: int, history: dict, width: int = 30) -> None:
    filled = width * done // total
    recent = np.mean(history["success"][-10:])
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] step {done}/{total}  success {history['success'][-1]:.2f}"
                     f" (last 10: {recent:.2f})  loss {history['loss'][-1]:+.4f}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def compare(steps: int, seeds: int, out: Path) -> str:
    """Every mode over ``seeds`` seeds: a learning-curve plot and a markdown table of areas under the curve."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {}
    for mode in MODES:
        for seed in range(seeds):
            start = time.perf_counter()
            curves[mode, seed] = np.array(train(mode, steps, seed, progress=False)["success"])
            print(f"{mode:>16} seed {seed}: area {curves[mode, seed].mean():.3f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    figure, axis = plt.subplots(figsize=(7, 4))
    for mode in MODES:
        runs = np.stack([curves[mode, s] for s in range(seeds)])
        smooth = np.stack([np.convolve(r, np.ones(5) / 5, mode="valid") for r in runs])
        x = np.arange(smooth.shape[1]) + 5
        axis.plot(x, smooth.mean(0), label=mode)
        axis.fill_between(x, smooth.min(0), smooth.max(0), alpha=0.2)
    axis.set(xlabel="step", ylabel="success (5-step mean)", title=f"GRPO on the 3-turn cue task, {seeds} seeds")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    header = "| mode | " + " | ".join(f"seed {s}" for s in range(seeds)) + " | mean |"
    lines = [header, "| --- " * (seeds + 2) + "|"]
    for mode in MODES:
        areas = [curves[mode, s].mean() for s in range(seeds)]
        lines.append(f"| {mode} | " + " | ".join(f"{a:.3f}" for a in areas) + f" | {np.mean(areas):.3f} |")
    return "\n".join(lines)
