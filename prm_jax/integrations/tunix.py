"""Process rewards in tunix's GRPO learner (``google-tunix``, tested with the version pinned by the
``tunix`` extra).

tunix's ``GRPOLearner`` gives each completion one reward and one advantage; its GRPO loss also takes a
``[B, C]`` advantage per completion token. (``ProcessRewardAgenticGRPOLearner`` does the same for tunix's
multi-turn agentic learner: see its docstring.) ``ProcessRewardGRPOLearner`` keeps everything of tunix's step
(sampling, reference and old log-probs, its reward functions, metrics, the loss) and replaces the
advantages: prm-jax's scorers score each completion, and ``compute_advantages`` turns tunix's outcome
rewards plus the process rewards into ``[B, C]`` advantages, which tunix's own loss then uses.

Where it hooks in, and why there: tunix's GRPO learner calls its advantage estimator with the ``[B]``
rewards and the group size only, so it cannot receive token rewards. The learner therefore overrides
``GRPOLearner._generate_and_compute_advantage`` (it calls tunix's own, then swaps the advantages in the
``TrainExample`` it returns) and ``_compute_rewards`` (to keep the outcome rewards tunix computed). Both
are private methods of tunix: if a tunix release stops calling ``_compute_rewards`` exactly once per
``_generate_and_compute_advantage``, or changes the example's layout, the step raises a ``RuntimeError``
saying so instead of training on something else.

The layout (tunix's rollout arrays -> prm-jax's batch, ``rollout_from_tunix``): tunix left-pads prompts
(``prompt_ids [B, P]``) and right-pads completions (``completion_ids [B, C]``, EOS stripped); a pad token
sampled inside a completion leaves a hole in ``completion_mask`` (not trained, still part of the
sequence). prm-jax's batch puts each row's prompt first and its completion right after, right-padded
(``[B, P + C]``), attends from the first prompt token to the completion's last real token, and trains
the tokens of ``completion_mask``. Completion token ``j`` of row ``b`` sits at position ``p_b + j``
(``p_b``: the prompt's length), and its advantage lives on the timestep before it, ``p_b + j - 1``: that
is what ``Rollout.on_completion`` reads back into tunix's ``[B, C]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np

from prm_jax.config import AdvantageConfig
from prm_jax.kernels import compute_advantages
from prm_jax.kernels.gigpo import GiGPOConfig
from prm_jax.kernels.normalization import NormConfig
from prm_jax.kernels.policy_loss import LossAggMode
from prm_jax.kernels.shaping import ShapingConfig
from prm_jax.kernels.verl_losses import PolicyLossMode
from prm_jax.runtime.arrays import ScoredArrays
from prm_jax.runtime.blocking import BlockingRunner
from prm_jax.runtime.trajectory import TOKEN_ID_RANGE, stray_token_id
from prm_jax.validation import integer_dtype, one_of

TESTED_TUNIX = "0.1.7"  # keep equal to the pin of the `tunix` extra in pyproject.toml


def grpo_config(shaping: ShapingConfig = ShapingConfig(), **overrides: Any) -> AdvantageConfig:
    """An ``AdvantageConfig`` that gives tunix's ``grpo`` advantages when there are no process rewards.

    tunix's estimator is ``(r - group mean) / (unbiased group std + 1e-6)`` of the outcome rewards, the same
    for every token: here the outcome reward is normalized the same way within each group
    (``reward_norm``), and GAE with ``discount = gae_lambda = 1`` and no values carries it to every trained
    token, with no KL reward (tunix puts its KL term in the loss, ``beta``). ``shaping`` says how process
    rewards reshape those advantages; ``overrides`` are other ``AdvantageConfig`` fields.
    """
    settings: dict[str, Any] = dict(kl_ctl=0.0, discount=1.0, gae_lambda=1.0, adv_norm=None,
                                    reward_norm=NormConfig("group", "group", std_unbiased=True, eps=1e-6),
                                    advantage_shaping=shaping)
    settings.update(overrides)
    return AdvantageConfig(**settings)


@dataclasses.dataclass(frozen=True)
class Rollout:
    """A tunix rollout in prm-jax's layout: each row's prompt, then its completion, right-padded.

    Attributes:
      input_ids: ``[B, P + C]`` int32 tokens (0 after the completion, where nothing attends).
      attention_mask: ``[B, P + C]`` bool, from the first prompt token to the completion's last real token.
      loss_mask: ``[B, P + C]`` bool, tunix's ``completion_mask`` at the completion's positions.
      turn_ids: ``[B, P + C]`` int32, 0 on the completion up to its last real token (one turn, holes
        included, so a scorer sees the whole completion), -1 elsewhere; or, with ``turns="runs"``, ``k``
        on the ``k``-th run of trained tokens and -1 elsewhere.
      prompt_lengths: ``[B]`` int32, ``p_b``.
      completion_width: ``C``.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    loss_mask: np.ndarray
    turn_ids: np.ndarray
    prompt_lengths: np.ndarray
    completion_width: int

    def batch(self, rewards: Any, *, group_size: int, token_rewards: Any = None) -> dict[str, np.ndarray]:
        """``compute_advantages``' batch: these arrays (``turn_ids`` included: every stage that reads turns sees
        the rollout's, never runs of the loss mask), the outcome ``rewards [B]``, ``group_sizes`` for groups of
        ``group_size`` consecutive rows (tunix's ``num_generations``) and, when given, ``token_rewards [B, P + C]``."""
        rows = self.input_ids.shape[0]
        outcome = np.asarray(rewards, np.float32)
        if outcome.shape != (rows,):
            raise ValueError(f"rewards must have shape ({rows},) (one per completion), got {outcome.shape}")
        if group_size < 1 or rows % group_size:
            raise ValueError(f"group_size must divide the {rows} rows, got {group_size}")
        batch = dict(input_ids=self.input_ids, attention_mask=self.attention_mask, loss_mask=self.loss_mask,
                     turn_ids=self.turn_ids, logprobs=np.zeros(self.input_ids.shape, np.float32), rewards=outcome,
                     is_truncated=np.zeros(rows, bool), group_sizes=np.full(rows // group_size, group_size, np.int32))
        if token_rewards is not None:
            batch["token_rewards"] = np.asarray(token_rewards, np.float32)
        return batch

    def on_completion(self, timesteps: Any) -> jnp.ndarray:
        """``[B, C]`` from a ``[B, P + C]`` array on timesteps (advantages): completion token ``j`` of row ``b``
        gets timestep ``p_b + j - 1``, the one that predicts it."""
        steps = jnp.asarray(timesteps)
        if steps.shape != self.input_ids.shape:
            raise ValueError(f"timesteps must have the rollout's shape [B, P + C] = {self.input_ids.shape}, got "
                             f"{steps.shape}")
        index = self.prompt_lengths[:, None] - 1 + np.arange(self.completion_width)[None, :]
        return jnp.take_along_axis(steps, jnp.asarray(index), axis=1)


TurnLayout = Literal["completion", "runs"]


def rollout_from_tunix(prompt_ids: Any, prompt_mask: Any, completion_ids: Any, completion_mask: Any, *,
                       turns: TurnLayout = "completion") -> Rollout:
    """prm-jax's layout of tunix's rollout arrays (``TrainExample`` fields): see the module docstring.

    Args:
      prompt_ids: ``[B, P]`` int, left-padded prompts.
      prompt_mask: ``[B, P]`` bool, the prompts' real tokens (each prompt needs at least one).
      completion_ids: ``[B, C]`` int, right-padded completions.
      completion_mask: ``[B, C]`` bool, the completion tokens tunix trains.
      turns: ``"completion"``: the whole completion is turn 0 (``GRPOLearner``'s one completion);
        ``"runs"``: turn ``k`` is the ``k``-th run of trained tokens (the agentic learner's assistant
        turns, between the environment's tokens, which get -1).
    """
    prompts, completions = np.asarray(prompt_ids), np.asarray(completion_ids)
    prompt_real, trained = np.asarray(prompt_mask).astype(bool), np.asarray(completion_mask).astype(bool)
    for name, array, like in (("prompt_ids", prompts, None), ("completion_ids", completions, None),
                              ("prompt_mask", prompt_real, prompts), ("completion_mask", trained, completions)):
        if array.ndim != 2 or (like is not None and array.shape != like.shape):
            raise ValueError(f"{name} must be [B, {'P' if 'prompt' in name else 'C'}]"
                             f"{'' if like is None else ' like its ids'}, got shape {array.shape}")
    if prompts.shape[0] != completions.shape[0]:
        raise ValueError(f"prompt_ids has {prompts.shape[0]} rows and completion_ids {completions.shape[0]}")
    for name, ids in (("prompt_ids", prompts), ("completion_ids", completions)):
        integer_dtype(name, ids.dtype)
        bad = stray_token_id(ids)  # (int32 in the batch: never wrapped)
        if bad is not None:
            row = int(np.argwhere(ids == bad)[0][0])
            raise ValueError(f"{name} must hold token ids in {TOKEN_ID_RANGE}; row {row} holds {bad}")
    width_p = prompts.shape[1]
    width_c = completions.shape[1]
    # Left padding: a prompt starts at its first real token and runs to the last column (a pad id inside a
    # prompt stays a prompt token); a prompt whose last column is a pad is right-padded, and refused.
    leading_pads = np.where(prompt_real.any(axis=1), np.argmax(prompt_real, axis=1), width_p)
    lengths = (width_p - leading_pads).astype(np.int32)
    if (lengths == 0).any():
        raise ValueError(f"every prompt needs a token (its completion's first token is predicted from it); row "
                         f"{int(np.argmin(lengths))} has none")
    right_padded = ~prompt_real[:, -1]
    if right_padded.any():
        raise ValueError(f"prompt_mask must be left-padded (tunix's layout: pads first, then the prompt up to the last "
                         f"column); row {int(np.argmax(right_padded))} ends with a pad (right-padded)")
    # The completion's extent: up to its last trained token (a trailing pad is padding, an inner one a hole).
    extent = np.where(trained.any(axis=1), width_c - np.argmax(trained[:, ::-1], axis=1), 0)
    # Shift each row left by its leading pads: position t reads column t + pads of [prompt | completion].
    joined = np.concatenate([prompts, completions], axis=1)
    trained_joined = np.concatenate([np.zeros_like(prompt_real), trained], axis=1)
    positions = np.arange(width_p + width_c)[None, :]
    source = np.minimum(positions + leading_pads[:, None], width_p + width_c - 1)
    inside = positions < (lengths + width_c)[:, None]
    input_ids = np.where(inside, np.take_along_axis(joined, source, axis=1), 0).astype(np.int32)
    completion_part = (positions >= lengths[:, None]) & (positions < (lengths + extent)[:, None])
    loss_mask = inside & np.take_along_axis(trained_joined, source, axis=1)
    if turns == "runs":
        starts = loss_mask & ~np.pad(loss_mask, ((0, 0), (1, 0)))[:, :-1]
        turn_ids = np.where(loss_mask, np.cumsum(starts, axis=1) - 1, -1)
    else:
        one_of("turns", turns, get_args(TurnLayout))
        turn_ids = np.where(completion_part, 0, -1)
    return Rollout(
        input_ids=input_ids,
        attention_mask=positions < (lengths + extent)[:, None],
        loss_mask=loss_mask,
        turn_ids=turn_ids.astype(np.int32),
        prompt_lengths=lengths,
        completion_width=width_c)


def process_advantages(rollout: Rollout, rewards: Any, *, group_size: int, config: AdvantageConfig,
                       token_rewards: Any = None) -> tuple[jnp.ndarray, dict[str, Any]]:
    """tunix's ``[B, C]`` advantages from its outcome ``rewards [B]`` and prm-jax's ``token_rewards
    [B, P + C]`` (``None``: outcome only), and ``compute_advantages``' diagnostics."""
    output = compute_advantages(rollout.batch(rewards, group_size=group_size, token_rewards=token_rewards), config)
    return rollout.on_completion(output.advantages), output.diagnostics


def default_ctx(prompts: Sequence[str], completions: Sequence[str]) -> list[Mapping[str, Any]]:
    """Each row's scorer context: ``{"prompt": text, "completion": text}`` (tunix's strings)."""
    return [{"prompt": p, "completion": c} for p, c in zip(prompts, completions)]


LOSS_NAME = "prm_jax_ppo"  # GRPOConfig(policy_loss_fn=LOSS_NAME) after register_loss()
_AGG_MODES: dict[str, LossAggMode] = {"token-mean": "token-mean", "sequence-mean-token-mean": "seq-mean-token-mean",
              "seq-mean-token-sum": "seq-mean-token-sum"}  # tunix's names -> prm_jax.losses' (and verl's)


def tunix_ppo_loss(model: Any, train_example: Any, algo_config: Any, pad_id: int, eos_id: int,
                   **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """tunix's policy-loss interface around ``prm_jax.losses.ppo_clip_loss`` (AReaL's clipped loss).

    The per-token log-probs come from tunix (``common.compute_per_token_logps``, completion token ``j`` at
    column ``j``, the advantages' layout); ``epsilon``, ``epsilon_high``, ``epsilon_c`` (the dual clip) and
    ``loss_agg_mode`` are read from tunix's ``GRPOConfig``. tunix's KL term (``beta``) is not part of
    AReaL's loss: ``beta`` must be 0 (a KL penalty goes into the rewards with ``kl_ctl`` instead).
    """
    from prm_jax import losses

    logprobs, proximal, advantages, mask = _tunix_loss_inputs(LOSS_NAME, model, train_example, algo_config, pad_id,
                                                              eos_id)
    loss, stats = losses.ppo_clip_loss(
        logprobs, proximal, advantages, mask,
        eps_clip=algo_config.epsilon, eps_clip_higher=getattr(algo_config, "epsilon_high", None),
        c_clip=getattr(algo_config, "epsilon_c", None), loss_agg_mode=_AGG_MODES[algo_config.loss_agg_mode])
    return loss, {"kl": 0.0, "pg_loss": loss, "pg_clipfrac": stats.clip_fraction,
                  "pg_clipfrac_lower": stats.dual_clip_fraction, "ppo_kl": stats.approx_kl,
                  "is_ratio/mean": stats.importance_weight}


def register_loss() -> str:
    """Registers ``tunix_ppo_loss`` in tunix's policy-loss registry (once) and returns its name, for
    ``GRPOConfig(policy_loss_fn=...)``."""
    from tunix.rl import function_registry

    try:
        function_registry.get_policy_loss_fn(LOSS_NAME)
    except LookupError:  # not registered yet
        function_registry.register_policy_loss_fn(LOSS_NAME)(tunix_ppo_loss)
    return LOSS_NAME


# Every policy loss of prm_jax.losses under verl's mode names, and prm-jax's advantage estimators that fit
# tunix's interfaces, by name in tunix's FunctionRegistry (register_losses, register_estimators):
# GRPOConfig(policy_loss_fn="prm_jax_cispo", advantage_estimator="prm_jax_group_norm"),
# PPOConfig(advantage_estimator="prm_jax_gae").
LOSS_PREFIX = "prm_jax_"
ESTIMATOR_NAME = "prm_jax_group_norm"  # GRPO's interface: [B] rewards, the group size
GAE_ESTIMATOR_NAME = "prm_jax_gae"  # PPO's: [B, C] rewards, values and mask, gamma, gae_lambda


def tunix_policy_loss(mode: PolicyLossMode, **options: Any) -> Callable[..., tuple[Any, dict[str, Any]]]:
    """tunix's policy-loss interface around ``prm_jax.losses.policy_loss(..., mode=mode, **options)`` (verl's
    loss of that ``loss_mode``, its options with verl's names: ``clip_ratio_low``, ``dro_beta``, a
    ``key`` for ``clip_cov``, ...; an option the loss does not take is refused when the loss first runs).

    As ``tunix_ppo_loss``: tunix's per-token log-probs, ``old_per_token_logps`` (or the log-probs,
    stopped: on-policy) as the proximal ones, a ``[B]`` advantage broadcast over the completion, tunix's
    ``loss_agg_mode`` (its three names mapped to verl's; ``geo_mean``, GMPO, aggregates each sequence itself
    and ignores it), and ``beta`` must be 0.
    """
    from prm_jax import losses

    aggregates = "loss_agg_mode" in losses.policy_loss_options(mode)  # (geo_mean aggregates per sequence itself)
    name = f"{LOSS_PREFIX}{mode}"

    def loss_fn(model: Any, train_example: Any, algo_config: Any, pad_id: int, eos_id: int,
                **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        logprobs, proximal, advantages, mask = _tunix_loss_inputs(name, model, train_example, algo_config, pad_id,
                                                                  eos_id, aggregates=aggregates)
        aggregation = {"loss_agg_mode": _AGG_MODES[algo_config.loss_agg_mode]} if aggregates else {}
        loss, stats = losses.policy_loss(logprobs, proximal, advantages, mask, mode=mode, **aggregation, **options)
        return loss, {"kl": 0.0, "pg_loss": loss, "pg_clipfrac": stats.pg_clipfrac,
                      "pg_clipfrac_lower": stats.pg_clipfrac_lower, "ppo_kl": stats.ppo_kl}

    loss_fn.__name__ = name
    return loss_fn


def _tunix_loss_inputs(name: str, model: Any, train_example: Any, algo_config: Any, pad_id: int, eos_id: int, *,
                       aggregates: bool = True) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(logprobs, proximal, advantages [B, C], mask)`` of a tunix ``TrainExample`` (see ``tunix_ppo_loss``),
    after the checks of tunix's config every loss ``name`` makes: no KL term, and (where it ``aggregates``
    by ``loss_agg_mode``) one of the three aggregations both sides name."""
    from flax import nnx
    from tunix.rl import common

    if algo_config.beta != 0.0:
        raise ValueError(f"{name} has no KL term: set GRPOConfig(beta=0.0), got beta={algo_config.beta}")
    if aggregates and algo_config.loss_agg_mode not in _AGG_MODES:
        raise ValueError(f"{name} aggregates as {sorted(_AGG_MODES)}, got {algo_config.loss_agg_mode!r}")

    graphdef, state = nnx.split(model)
    logprobs = common.compute_per_token_logps(
        graphdef, state, prompt_tokens=train_example.prompt_ids, completion_tokens=train_example.completion_ids,
        pad_id=pad_id, eos_id=eos_id, stop_gradient=False, temperature=algo_config.temperature).astype(jnp.float32)
    old = train_example.old_per_token_logps
    proximal = jax.lax.stop_gradient(logprobs) if old is None else jnp.asarray(old, jnp.float32)
    advantages = jnp.asarray(train_example.advantages, jnp.float32)
    if advantages.ndim == 1:
        advantages = jnp.broadcast_to(advantages[:, None], logprobs.shape)
    return logprobs, proximal, advantages, jnp.asarray(train_example.completion_mask, jnp.bool_)


def register_losses(**options: Mapping[str, Any]) -> dict[str, str]:
    """Registers every loss of ``prm_jax.losses.POLICY_LOSS_MODES`` in tunix's policy-loss registry as
    ``prm_jax_<mode>`` (``tunix_policy_loss``), and AReaL's PPO clip as ``prm_jax_ppo`` (``register_loss``);
    ``options``: a mode's options, by mode (``dro={"dro_beta": 1e-3}``; ``clip_cov`` defaults to a fixed
    key). Registering again replaces them (tunix logs that). Returns ``{mode: registered name}``."""
    import jax.random
    from tunix.rl import function_registry

    from prm_jax import losses

    unknown = sorted(set(options) - set(losses.POLICY_LOSS_MODES))
    if unknown:
        raise ValueError(f"no policy loss named {unknown}; the modes are {losses.POLICY_LOSS_MODES}")
    defaults: dict[str, dict[str, Any]] = {"clip_cov": {"key": jax.random.key(0)}, "dro": {"dro_beta": 1e-3}}
    names = {"ppo_clip": register_loss()}
    for mode in losses.POLICY_LOSS_MODES:
        names[mode] = f"{LOSS_PREFIX}{mode}"
        function_registry.register_policy_loss_fn(names[mode])(
            tunix_policy_loss(mode, **{**defaults.get(mode, {}), **dict(options.get(mode, {}))}))
    return names


def group_norm_advantages(rewards: Any, num_generations: int) -> np.ndarray:
    """tunix's advantage-estimator interface (``rewards [B]``, consecutive groups of ``num_generations``)
    around AReaL's group normalization (``NormConfig("group", "group")``: the group's mean, its unbiased
    std, ``eps`` 1e-5; a group of one gives 0): what ``compute_advantages`` does to outcome rewards."""
    from prm_jax.kernels.normalization import normalize

    rewards = np.asarray(rewards, np.float32)
    if num_generations < 1 or rewards.shape[0] % num_generations:
        raise ValueError(f"{rewards.shape[0]} rewards do not split into groups of num_generations={num_generations}")
    sizes = np.full(rewards.shape[0] // num_generations, num_generations, np.int32)
    return np.asarray(normalize(rewards, norm=NormConfig("group", "group"), group_sizes=sizes))


def gae_advantages(rewards: Any, values: Any, completion_mask: Any, gamma: float,
                   gae_lambda: float) -> tuple[jax.Array, jax.Array]:
    """tunix's PPO advantage-estimator interface (the arguments of its ``gae``: ``[B, C]`` rewards, values
    and ``completion_mask``, ``gamma``, ``gae_lambda``) around prm-jax's GAE kernel (``prm_jax.kernels.gae``,
    the native CPU kernel where it is built) and verl's whitening (``normalization.whiten``).

    As tunix's ``gae``: a token outside ``completion_mask`` carries the advantage and the next value unchanged
    (no bootstrap after the last token); the returns are ``advantages + values`` before whitening; the
    advantages are whitened over the trained tokens (their mean and unbiased variance, ``eps`` 1e-8). Where
    it differs, on purpose: a token outside the mask gets advantage 0 (tunix whitens it too; its loss masks
    it out), and a batch with one trained token gets 0 (tunix's ``n / (n - 1)`` makes it NaN). A
    ``ValueError`` where the advantages or the returns are not finite in float32 (an overflow, or a NaN in).
    """
    from prm_jax.kernels import gae

    out = gae(rewards, values, completion_mask, gamma=gamma, lam=gae_lambda)
    advantages, finite = _whiten_jit(out.advantages, out.returns, completion_mask)
    if not bool(finite):
        raise ValueError(f"{GAE_ESTIMATOR_NAME}: the advantages or the returns are not finite in float32 (the "
                         "rewards or values hold a NaN or overflow it)")
    return advantages, out.returns


@jax.jit
def _whiten_jit(advantages: jax.Array, returns: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The whitened advantages, and whether they and the returns are finite (one program)."""
    from prm_jax.kernels.normalization import whiten

    whitened = whiten(advantages, jnp.asarray(mask) != 0)
    return whitened, jnp.isfinite(whitened).all() & jnp.isfinite(returns).all()


def register_estimators() -> dict[str, str]:
    """Registers prm-jax's advantage estimators that fit tunix's interfaces in its advantage-estimator
    registry and returns ``{kind: registered name}``: ``group_norm_advantages`` as ``prm_jax_group_norm``
    (``GRPOConfig(advantage_estimator=...)``) and ``gae_advantages`` as ``prm_jax_gae``
    (``PPOConfig(advantage_estimator=...)``). (prm-jax's per-token and per-turn estimators need the
    rollout's tokens and turns, which neither interface passes: they run through
    ``ProcessRewardGRPOLearner`` and ``ProcessRewardAgenticGRPOLearner``.)"""
    from tunix.rl import function_registry

    estimators = {"group_norm": (ESTIMATOR_NAME, group_norm_advantages), "gae": (GAE_ESTIMATOR_NAME, gae_advantages)}
    for name, estimator in estimators.values():
        function_registry.register_advantage_estimator(name)(estimator)
    return {kind: name for kind, (name, _) in estimators.items()}


class _RecordsOutcomes:
    """What both learners hook in tunix's ``_compute_rewards``: each call's prompts, completions and rewards,
    recorded while ``_recording()`` is open (per thread: tunix's producer may run in one of its own)."""

    _step: threading.local

    def _compute_rewards(self, prompts: Any, completions: Any, mode: Any, *args: Any, **kwargs: Any) -> Any:
        rewards = super()._compute_rewards(prompts, completions, mode, *args, **kwargs)  # type: ignore[misc]
        outcomes = getattr(self._step, "outcomes", None)
        if outcomes is not None:
            outcomes.append((list(prompts), list(completions), np.asarray(rewards, np.float32)))
        return rewards

    @contextlib.contextmanager
    def _recording(self) -> Iterator[list[tuple[list[str], list[str], np.ndarray]]]:
        if not hasattr(self, "_step"):
            self._step = threading.local()
        outcomes: list[tuple[list[str], list[str], np.ndarray]] = []
        self._step.outcomes = outcomes
        try:
            yield outcomes
        finally:
            self._step.outcomes = None


def _scored(scorers: BlockingRunner, rollout: Rollout, ctx: Sequence[Mapping[str, Any]], on_error: str,
            what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(token_rewards [B, P + C], failed [B])``: the scorers' rewards of each row's turns, 0 on a row whose
    scoring failed (it trains on nothing); with ``on_error="raise"`` the first failure raises, naming the row
    (a ``what``: completion, trajectory)."""
    scored: ScoredArrays = scorers.score_arrays(  # type: ignore[assignment]  # on_error='mask'
        rollout.input_ids, rollout.turn_ids, attention_mask=rollout.attention_mask, ctx=list(ctx), on_error="mask")
    failed = np.asarray(scored.failed, bool)
    if on_error == "raise" and failed.any():
        row = int(np.argmax(failed))
        raise RuntimeError(f"scoring {what} {row} failed: {scored.errors[row]}")
    return np.where(failed[:, None], 0.0, scored.token_rewards).astype(np.float32), failed


def _reward_metrics(token_rewards: np.ndarray, loss_mask: np.ndarray, failed: np.ndarray) -> dict[str, Any]:
    """The metrics both learners log: failed rows, and the mean process reward on the trained tokens (a
    failed row's count as 0)."""
    return {"prm/failed_rows": (int(failed.sum()), np.sum),
            "prm/process_reward_mean": (float(np.mean(token_rewards[loss_mask])) if loss_mask.any() else 0.0,
                                        np.mean)}


def _learner_class() -> type:
    """``ProcessRewardGRPOLearner``, built on first use so that importing this module needs no tunix."""
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner

    class ProcessRewardGRPOLearner(_RecordsOutcomes, grpo_learner.GRPOLearner):
        """tunix's ``GRPOLearner`` whose advantages come from prm-jax: outcome plus process rewards.

        Args (beyond ``GRPOLearner``'s):
          scorers: a ``prm_jax.BlockingRunner`` (yours to open and close) whose scorers score each
            completion as one turn; its input is the prompt's tokens.
          advantage_config: how rewards become advantages; default ``grpo_config()`` (tunix's ``grpo``
            advantages plus additive process rewards).
          ctx: ``(prompts, completions) -> one mapping per row`` given to the scorers; default
            ``default_ctx`` (the texts).
          on_error: ``"mask"`` (default): a completion a scorer failed on is dropped from the loss (its
            ``completion_mask`` row is cleared; its outcome reward still counts in its group's statistics)
            and counted in the ``prm/failed_rows`` metric; ``"raise"``: the step raises.
        """

        def __init__(self, *args: Any, scorers: BlockingRunner, advantage_config: AdvantageConfig | None = None,
                     ctx: Callable[[Sequence[str], Sequence[str]], Sequence[Mapping[str, Any]]] = default_ctx,
                     on_error: str = "mask", **kwargs: Any):
            one_of("on_error", on_error, ("mask", "raise"))
            super().__init__(*args, **kwargs)
            self.scorers = scorers
            self.advantage_config = advantage_config or grpo_config()
            self.ctx = ctx
            self.on_error = on_error

        def _generate_and_compute_advantage(self, training_input: Any,
                                            mode: Any = rl_cluster_lib.Mode.TRAIN) -> Any:
            with self._recording() as outcomes:
                example = super()._generate_and_compute_advantage(training_input, mode)
            if len(outcomes) != 1:
                raise RuntimeError(
                    f"tunix's GRPOLearner called _compute_rewards {len(outcomes)} times in one "
                    f"_generate_and_compute_advantage (prm-jax's hook expects once; tested with tunix "
                    f"{TESTED_TUNIX}): the process-reward advantages would not match this step")
            prompts, completions, rewards = outcomes[0]
            rows = int(np.shape(example.completion_ids)[0])
            if np.shape(example.advantages) != (rows,) or rewards.shape != (rows,):
                raise RuntimeError(
                    f"tunix's GRPOLearner returned advantages of shape {np.shape(example.advantages)} and "
                    f"rewards of shape {rewards.shape} for {rows} completions (prm-jax's hook expects one "
                    f"each; tested with tunix {TESTED_TUNIX})")
            rollout = rollout_from_tunix(example.prompt_ids, example.prompt_mask, example.completion_ids,
                                         example.completion_mask)
            token_rewards, failed = _scored(self.scorers, rollout, self.ctx(prompts, completions), self.on_error,
                                            "completion")
            advantages, diagnostics = process_advantages(rollout, rewards, group_size=self.algo_config.num_generations,
                                                         config=self.advantage_config, token_rewards=token_rewards)
            self.rl_cluster.buffer_metrics({
                **_reward_metrics(token_rewards, rollout.loss_mask, failed),
                "prm/rows_off_trained_timesteps": (int(diagnostics["outcome/rows_off_trained_timesteps"]), np.sum),
            }, mode=mode)
            completion_mask = jnp.asarray(example.completion_mask) & jnp.asarray(~failed)[:, None]
            return example.replace(advantages=advantages.astype(jnp.float32), completion_mask=completion_mask)

    return ProcessRewardGRPOLearner


# tunix's agentic learner: the environment's per-step rewards, which its "Token" trajectories leave out, are
# recorded by the trajectory engine below under these keys (one entry per step with assistant tokens).
STEP_REWARDS_KEY = "prm_jax_step_rewards"
STEP_STATES_KEY = "prm_jax_step_states"  # the observation each step answered ("" for the first: the task's)
EnvRewards = Literal["none", "process", "gigpo"]


def default_agentic_ctx(trajectory: Mapping[str, Any]) -> Mapping[str, Any]:
    """A trajectory's scorer context: ``{"conversation": its messages}`` (tunix's ``conversation_text``;
    ``ctx["messages"]`` is the runner's own, the turn's messages)."""
    return {"conversation": list(trajectory.get("conversation_text") or [])}


def _step_engine_class(base: type) -> type:
    """tunix's trajectory engine ``base`` whose ``"Token"`` trajectories also carry each step's environment
    reward (``STEP_REWARDS_KEY``) and the observation it answered (``STEP_STATES_KEY``)."""

    class StepRewardEngine(base):
        async def collect(self, mode: str = "Conversation") -> Any:
            result = await super().collect(mode)
            if mode == "Token" and isinstance(result, dict):
                steps = list(self.agent.trajectory.steps)
                taken = [k for k, step in enumerate(steps)
                         if getattr(step, "assistant_tokens", None) is not None and len(step.assistant_tokens) > 0]
                result[STEP_REWARDS_KEY] = [float(steps[k].reward or 0.0) for k in taken]
                result[STEP_STATES_KEY] = ["" if k == 0 else repr(steps[k - 1].observation) for k in taken]
            return result

    StepRewardEngine.__name__ = f"StepReward{base.__name__}"
    return StepRewardEngine


def _state_ids(states: Sequence[Sequence[str]], turns: int) -> np.ndarray:
    """``[B, turns]`` int64 anchor ids: equal observations get equal ids (-1 past a row's steps)."""
    index: dict[str, int] = {}
    out = np.full((len(states), turns), -1, np.int64)
    for row, row_states in enumerate(states):
        for k, state in enumerate(row_states[:turns]):
            out[row, k] = index.setdefault(state, len(index))
    return out


def _agentic_learner_class() -> type:
    """``ProcessRewardAgenticGRPOLearner``, built on first use (importing this module needs no tunix)."""
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.agentic import agentic_grpo_learner
    from tunix.rl.agentic import utils as agentic_utils

    class ProcessRewardAgenticGRPOLearner(_RecordsOutcomes, agentic_grpo_learner.GRPOLearner):
        """tunix's agentic ``GRPOLearner`` whose advantages come from prm-jax: ``[B, C]`` per token.

        The turns are the runs of each trajectory's ``conversation_masks`` (its assistant tokens; the
        environment's tokens are not trained and get no reward); the outcome is the reward tunix computed
        for the trajectory (its ``_compute_rewards``); process rewards come from ``scorers`` (each row's turns,
        ``ctx(trajectory)`` as its context) and, with ``env_rewards``, from the environment's own reward of each
        step: ``"process"`` adds it to the turn's process reward (on every token of the turn), ``"gigpo"``
        gives it to GiGPO as the turn's step reward, with the observation the step answered as its anchor
        state (``advantage_config`` must then name ``credit_assignment: gigpo``).

        Args (beyond tunix's ``GRPOLearner``'s):
          scorers: a ``prm_jax.BlockingRunner`` (yours to open and close), or None (no scorer).
          advantage_config: how rewards become advantages; default ``grpo_config()`` (tunix's ``grpo``
            advantages when no process reward is given, plus additive process rewards).
          env_rewards: ``"none"`` (default), ``"process"`` or ``"gigpo"`` (above).
          ctx: ``trajectory dict -> mapping`` given to the scorers; default ``default_agentic_ctx``.
          on_error: ``"mask"`` (default): a trajectory a scorer failed on is dropped from the loss (its
            outcome still counts in its group's statistics) and counted in ``prm/failed_rows``; ``"raise"``.

        Hooks: ``_process_results`` (tunix's own runs first; its ``[G]`` advantages are replaced) and
        ``_compute_rewards`` (to keep the outcome it computed); with ``env_rewards``, the orchestrator's
        trajectory engine. All private to tunix: where a release stops calling them as 0.1.7 does, the step
        raises a ``RuntimeError`` saying so instead of training on something else.
        """

        def __init__(self, *args: Any, scorers: BlockingRunner | None = None,
                     advantage_config: AdvantageConfig | None = None, env_rewards: EnvRewards = "none",
                     ctx: Callable[[Mapping[str, Any]], Mapping[str, Any]] = default_agentic_ctx,
                     on_error: str = "mask", **kwargs: Any):
            one_of("on_error", on_error, ("mask", "raise"))
            one_of("env_rewards", env_rewards, get_args(EnvRewards))
            config = advantage_config or grpo_config()
            if (env_rewards == "gigpo") != isinstance(config.plan.estimator, GiGPOConfig):
                raise ValueError("env_rewards='gigpo' and advantage_config's credit_assignment: gigpo go together "
                                 f"(got env_rewards={env_rewards!r} and estimator "
                                 f"{type(config.plan.estimator).__name__})")
            super().__init__(*args, **kwargs)
            self.scorers, self.advantage_config, self.env_rewards = scorers, config, env_rewards
            self.ctx, self.on_error = ctx, on_error

        def _build_orchestrator(self) -> Any:
            orchestrator = super()._build_orchestrator()
            if self.env_rewards != "none":
                if not isinstance(getattr(orchestrator, "engine_cls", None), type):
                    raise RuntimeError(f"tunix's RolloutOrchestrator has no engine_cls (prm-jax records the "
                                       f"environment's step rewards there; tested with tunix {TESTED_TUNIX})")
                orchestrator.engine_cls = _step_engine_class(orchestrator.engine_cls)
            return orchestrator

        def _process_results(self, trajectories: list[Any], mode: Any = rl_cluster_lib.Mode.TRAIN,
                             expected_step: int | None = None) -> list[Any]:
            with self._recording() as outcomes:
                examples = super()._process_results(trajectories, mode=mode, expected_step=expected_step)
            rows = len(trajectories)
            if len(outcomes) != 1 or len(examples) != 1 or outcomes[0][2].shape != (rows,) \
                    or np.shape(examples[0].advantages) != (rows,):
                raise RuntimeError(
                    f"tunix's agentic GRPOLearner computed rewards {len(outcomes)} times and returned "
                    f"{len(examples)} examples for a group of {rows} (prm-jax's hook expects one each, one "
                    f"reward and one advantage per trajectory; tested with tunix {TESTED_TUNIX})")
            example = examples[0]
            width = int(np.shape(example.completion_ids)[1])
            trained = np.stack([agentic_utils.right_pad(item.traj.get("conversation_masks"), width, 0)[:width]
                                for item in trajectories]).astype(bool)  # (before tunix's degenerate masking)
            rollout = rollout_from_tunix(example.prompt_ids, example.prompt_mask, example.completion_ids, trained,
                                         turns="runs")
            advantages, failed, metrics = self._advantages(rollout, outcomes[0][2], [item.traj for item in trajectories])
            completion_mask = trained & ~failed[:, None]
            if self.algo_config.degenerate_group_masking and np.allclose(np.asarray(advantages)[trained], 0.0):
                completion_mask = np.zeros_like(completion_mask)
            self.rl_cluster.buffer_metrics_async(metrics, mode=mode, step=expected_step)
            return [example.replace(advantages=advantages.astype(jnp.float32),
                                    completion_mask=jnp.asarray(completion_mask, jnp.asarray(example.completion_mask).dtype))]

        def _advantages(self, rollout: Rollout, outcome: np.ndarray,
                        trajectories: Sequence[Mapping[str, Any]]) -> tuple[jnp.ndarray, np.ndarray, dict[str, Any]]:
            rows = rollout.input_ids.shape[0]
            turns = rollout.turn_ids.max(axis=1) + 1  # [B] assistant turns of each row
            token_rewards = np.zeros(rollout.input_ids.shape, np.float32)
            failed = np.zeros(rows, bool)
            if self.scorers is not None:
                token_rewards, failed = _scored(self.scorers, rollout, [self.ctx(t) for t in trajectories],
                                                self.on_error, "trajectory")
            extra: dict[str, np.ndarray] = {}
            if self.env_rewards != "none":
                width = max(int(turns.max(initial=0)), 1)
                steps = np.zeros((rows, width), np.float32)
                for row, (trajectory, row_turns) in enumerate(zip(trajectories, turns.tolist())):
                    recorded = trajectory.get(STEP_REWARDS_KEY)
                    if row_turns == 0:
                        continue  # nothing trained (tunix masked the trajectory out): nothing to place
                    if recorded is None or len(recorded) != row_turns:
                        raise RuntimeError(
                            f"trajectory {row} has {row_turns} assistant turns in its conversation_masks and "
                            f"{'no' if recorded is None else len(recorded)} recorded step rewards (env_rewards="
                            f"{self.env_rewards!r} records them in the learner's trajectory engine; tested with "
                            f"tunix {TESTED_TUNIX})")
                    steps[row, :row_turns] = recorded
                if self.env_rewards == "process":
                    on_turn = np.take_along_axis(steps, np.maximum(rollout.turn_ids, 0), axis=1)
                    token_rewards = token_rewards + np.where(rollout.turn_ids >= 0, on_turn, 0.0).astype(np.float32)
                else:
                    extra = {"turn_rewards": steps,
                             "turn_reward_mask": np.arange(width)[None, :] < turns[:, None],
                             "anchor_ids": _state_ids([t.get(STEP_STATES_KEY, []) for t in trajectories], width)}
            batch = rollout.batch(outcome, group_size=rows, token_rewards=token_rewards if (
                self.scorers is not None or self.env_rewards == "process") else None)
            batch.update(extra)
            output = compute_advantages(batch, self.advantage_config)
            metrics = {**_reward_metrics(token_rewards, rollout.loss_mask, failed),
                       "prm/turns_mean": (float(np.mean(turns)), np.mean)}
            return rollout.on_completion(output.advantages), failed, metrics

    return ProcessRewardAgenticGRPOLearner


def __getattr__(name: str) -> Any:
    builders = {"ProcessRewardGRPOLearner": _learner_class, "ProcessRewardAgenticGRPOLearner": _agentic_learner_class}
    if name in builders:
        learner = builders[name]()
        globals()[name] = learner
        return learner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
