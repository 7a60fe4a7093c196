"""The fused advantage pipeline: outcome rewards, KL, GAE, normalization and process-reward shaping.

``compute_advantages`` takes a padded batch and returns everything on *timesteps* (see ``alignment``).
Rollout-side arrays (``loss_mask``, ``logprobs``, ``turn_ids``, ``token_rewards``) come on *positions*, as
exported, and are shifted here; model outputs (``values``, ``ref_logprobs``, ``prox_logprobs``) come out
of a forward pass already on timesteps and are not shifted (AReaL's alignment). In order:

1. outcome reward: optional overlong penalty; ``r = clip((r + reward_bias) * reward_scaling, +-reward_clip)``;
   optional ``reward_norm`` over the ``[B]`` vector.
2. shift the rollout-side arrays to timesteps; the shifted mask is ``m``. The old log-probs are the
   recomputed ``prox_logprobs`` when given, else the shifted behaviour ``logprobs``; they and the
   reference log-probs are zeroed where ``m = 0``.
3. ``kl_rewards = -kl_ctl * clamp(kl, -10, 10)`` on active timesteps, 0 at timestep ``seqlen - 1``.
   Without ``ref_logprobs`` the reference log-prob is 0 (AReaL's rule; a warning once per trace when
   ``kl_ctl != 0``).
4. truncation: ``is_truncated`` when given, else ``seqlen == T`` (with a warning: it mislabels a row that
   ends exactly at the padded width). The outcome reward goes to timestep ``max(seqlen - 2, 0)``, or 0
   there for truncated rows under ``mask_no_eos_with_zero``, which also zeroes their process rewards.
5. process rewards ``P = shifted(token_rewards) * m``: kept for shaping (``token_rewards_as_adv``), or
   folded: each turn's uniform reward is added once, at the timestep predicting its last token.
6. GAE (``gae`` or ``turn_gae``) with bootstrap ``V[seqlen - 1]`` on truncated rows; λ is the batch's
   per-row ``gae_lambda``, the config's λ function of the rows' lengths, or its float. At turn level
   the KL rewards are added to the advantages after GAE instead of entering the turn rewards, and
   timesteps outside every turn get advantage 0 (plus their KL reward) and return ``V_t``.
7. ``returns = advantages + values`` before normalization and shaping; ``tot_rewards`` = task rewards
   plus KL rewards (at both levels).
8. optional ``adv_norm`` over active timesteps.
9. shaping with ``P`` (``shaping``); returns and ``tot_rewards`` are never shaped.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from prm_jax.kernels import _checks, lambda_fn
from prm_jax.kernels.alignment import shift_to_next_token
from prm_jax.kernels.gae import (
    DEFAULT_BLOCK_SIZE,
    GAE_METHODS,
    GAEMethod,
    gae_core,
    resolve_method,
    turn_gae_core,
    turn_ids_check,
    turn_segments,
    turn_sums,
)
from prm_jax.kernels.gigpo import GiGPOConfig, gigpo_core, host_anchor_ids, step_group_counts
from prm_jax.kernels.kl import KL_ESTIMATORS, KLEstimator, kl_rewards
from prm_jax.kernels.lambda_fn import GAELambdaContext
from prm_jax.kernels.normalization import (
    GroupLayout,
    NormConfig,
    group_ids_check,
    group_layout,
    group_sizes_check,
    member_counts_check,
    normalize_core,
)
from prm_jax.kernels.shaping import (
    ShapingConfig,
    ShapingMode,
    process_range_check,
    shape_core,
    warn_gvpo_without_penalty,
)
from prm_jax.validation import ConfigError, finite_number, from_mapping, integer, short_repr

REQUIRED_KEYS = ("attention_mask", "loss_mask", "logprobs", "rewards")
OPTIONAL_KEYS = ("values", "ref_logprobs", "prox_logprobs", "token_rewards", "turn_ids", "is_truncated",
                 "gae_lambda", "group_sizes", "group_member_counts", "group_ids", "turn_rewards", "anchor_ids")
TimestepUnit = Literal["token", "turn"]
TIMESTEP_UNITS: tuple[TimestepUnit, ...] = ("token", "turn")


class AdvantageOutput(NamedTuple):
    """All ``[B, T]`` float32 on timesteps."""

    advantages: jax.Array
    returns: jax.Array
    kl_rewards: jax.Array
    tot_rewards: jax.Array
    loss_mask: jax.Array  # shifted, 0/1
    logprobs: jax.Array   # shifted, 0 where the shifted loss mask is 0
    # Scalars as arrays: "checks/<name>" violation counts (with check_values), and with
    # ``AdvantageConfig(diagnostics=True)`` the statistics that explain a mode that does not learn.
    diagnostics: dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """Actor settings of the advantage pipeline, with AReaL's field names and defaults.

    Hashable: it is a static argument of the jitted pipeline, so equal configs never retrace.
    ``gae_lambda`` is a float, or (AReaL's dynamic λ) a dotted path to a jittable function of the rows'
    lengths with ``gae_lambda_kwargs`` (see ``prm_jax.kernels.lambda_fn``; AReaL's built-in paths work).
    ``reward_norm`` is AReaL's actor-side outcome normalization (unbiased std, eps 1e-5 by default); the
    export's ``normalize_rewards`` is the proxy-side one (population std + 1e-8): use one, not both.
    Beyond AReaL: ``gae_method``/``gae_block_size`` choose the scan, ``max_turns`` bounds turns per row for
    turn-level GAE (default ``T``), ``check_values=False`` skips the value checks on the hot path (their
    reductions and the device sync).
    """

    discount: float = 1.0
    gae_lambda: float | str = 1.0
    gae_lambda_kwargs: Any = ()
    kl_ctl: float = 0.1
    kl_estimator: KLEstimator = "k1"
    reward_bias: float = 0.0
    reward_scaling: float = 1.0
    reward_clip: float = 20.0
    mask_no_eos_with_zero: bool = False
    token_rewards_as_adv: bool = True
    gae_timestep_unit: TimestepUnit = "token"
    reward_norm: NormConfig | None = None
    adv_norm: NormConfig | None = None
    advantage_shaping: ShapingConfig = ShapingConfig()
    overlong_reward_penalty: bool = False
    overlong_tokens: int | None = None
    overlong_penalty_factor: float | None = None
    max_new_tokens: int | None = None
    gae_method: GAEMethod = "auto"
    gae_block_size: int = DEFAULT_BLOCK_SIZE
    max_turns: int | None = None
    check_values: bool | Literal["callback"] = True
    credit_assignment: GiGPOConfig | None = None
    diagnostics: bool = False

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        set_("discount", finite_number("discount", self.discount, minimum=0.0, maximum=1.0))
        if isinstance(self.gae_lambda, str):
            set_("gae_lambda_kwargs", _frozen_kwargs(self.gae_lambda_kwargs))
            try:
                lambda_fn.validate(self.gae_lambda, dict(self.gae_lambda_kwargs))
            except (ValueError, TypeError) as err:
                raise ConfigError("gae_lambda", f"({self.gae_lambda}): {err}") from None
        else:
            set_("gae_lambda", finite_number("gae_lambda", self.gae_lambda, minimum=0.0, maximum=1.0))
            set_("gae_lambda_kwargs", ())  # ignored for a float, as in AReaL
        set_("kl_ctl", finite_number("kl_ctl", self.kl_ctl))
        set_("reward_bias", finite_number("reward_bias", self.reward_bias))
        set_("reward_scaling", finite_number("reward_scaling", self.reward_scaling))
        set_("reward_clip", finite_number("reward_clip", self.reward_clip, minimum=0.0))
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ConfigError("kl_estimator", f"must be one of {KL_ESTIMATORS}, got {short_repr(self.kl_estimator)}")
        if not (self.check_values is True or self.check_values is False or self.check_values == "callback"):
            raise ConfigError("check_values", f"must be true, false or 'callback', got {short_repr(self.check_values)}")
        for key in ("mask_no_eos_with_zero", "token_rewards_as_adv", "overlong_reward_penalty", "diagnostics"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(key, f"must be a bool, got {short_repr(getattr(self, key))}")
        if self.gae_timestep_unit not in TIMESTEP_UNITS:
            raise ConfigError("gae_timestep_unit",
                              f"must be one of {TIMESTEP_UNITS}, got {short_repr(self.gae_timestep_unit)}")
        set_("reward_norm", NormConfig.from_value(self.reward_norm, "reward_norm"))
        set_("adv_norm", NormConfig.from_value(self.adv_norm, "adv_norm"))
        set_("advantage_shaping", ShapingConfig.from_value(self.advantage_shaping))
        set_("credit_assignment", _credit_assignment(self.credit_assignment))
        mode = self.advantage_shaping.mode
        if mode in ("gvpo", "process_weighted") and not self.token_rewards_as_adv:
            raise ConfigError("token_rewards_as_adv", f"must be true: advantage_shaping.mode={mode!r} shapes with "
                                                      "direct process rewards")
        if mode == "process_weighted" and self.mask_no_eos_with_zero:
            raise ConfigError("mask_no_eos_with_zero", "must be false with advantage_shaping.mode='process_weighted'")
        if self.gae_method not in GAE_METHODS:
            raise ConfigError("gae_method", f"must be one of {GAE_METHODS}, got {short_repr(self.gae_method)}")
        if self.gae_method == "cumsum" and (isinstance(self.gae_lambda, str)
                                            or self.discount * self.gae_lambda != 1.0):
            raise ConfigError("gae_method", "'cumsum' needs discount * gae_lambda == 1 (a float gae_lambda)")
        integer("gae_block_size", self.gae_block_size, minimum=1)
        if self.max_turns is not None:
            integer("max_turns", self.max_turns, minimum=1)
        if self.overlong_reward_penalty:
            try:
                overlong = integer("overlong_tokens", self.overlong_tokens, minimum=1)
                integer("max_new_tokens", self.max_new_tokens, minimum=overlong)
            except ConfigError as err:
                raise ConfigError(err.key, f"{err.problem} (with overlong_reward_penalty)") from None
            set_("overlong_penalty_factor", finite_number("overlong_penalty_factor",
                                                          self.overlong_penalty_factor, minimum=0.0))


def _credit_assignment(value: Any) -> GiGPOConfig | None:
    """``None``, a ``GiGPOConfig`` or AReaL-style ``{mode: gigpo, ...}``."""
    if value is None or isinstance(value, GiGPOConfig):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError("credit_assignment", f"must be a mapping with mode: gigpo, got {type(value).__name__}")
    fields = dict(value)
    if fields.pop("mode", None) != "gigpo":
        raise ConfigError("credit_assignment.mode", f"must be 'gigpo', got {short_repr(value.get('mode'))}")
    return from_mapping(GiGPOConfig, fields, "credit_assignment")


def _frozen_kwargs(kwargs: Any) -> tuple[tuple[str, Any], ...]:
    """``gae_lambda_kwargs`` as sorted ``(name, value)`` pairs, so the config stays hashable."""
    if kwargs is None:
        return ()
    items = kwargs.items() if isinstance(kwargs, Mapping) else kwargs
    try:
        pairs = tuple(sorted((str(k), v) for k, v in items))
        hash(pairs)
    except (TypeError, ValueError):
        raise ConfigError("gae_lambda_kwargs", "must be a mapping of names to hashable values (numbers, strings), "
                                               f"got {short_repr(kwargs)}") from None
    return pairs


def _outcome_rewards(rewards, raw_active, real_rows, config: AdvantageConfig, groups_of):
    dtype = rewards.dtype
    if config.overlong_reward_penalty:
        # Validated by AdvantageConfig: all three are set with the penalty on.
        max_new, tokens, factor = config.max_new_tokens, config.overlong_tokens, config.overlong_penalty_factor
        assert max_new is not None and tokens is not None and factor is not None
        response_length = jnp.sum(raw_active.astype(dtype), axis=1)
        exceed = response_length - (max_new - tokens)
        rewards = rewards + jnp.minimum(-exceed / tokens * factor, 0.0)
    rewards = jnp.clip((rewards + config.reward_bias) * config.reward_scaling, -config.reward_clip,
                       config.reward_clip)
    if config.reward_norm is not None:
        # Every real row counts (one without generated tokens too, as in AReaL); padding rows (no
        # attention at all) do not, and come out as 0.
        rewards = normalize_core(rewards[:, None], real_rows[:, None], config.reward_norm,
                                 groups_of(config.reward_norm))[:, 0]
    return rewards


def _fold_turn_rewards(process, active, turn_ids):
    """Folds uniform per-turn rewards into one reward at each turn's last timestep, with a uniformity check.

    A turn is a run of adjacent active timesteps (with equal turn ids when ``turn_ids`` is given).
    """
    zero = jnp.zeros((), process.dtype)
    same_turn_next = active & shift_to_next_token(active, fill=False)
    if turn_ids is not None:
        same_turn_next = same_turn_next & (turn_ids == shift_to_next_token(turn_ids, fill=-1))
    uneven = same_turn_next & (process != shift_to_next_token(process, fill=0))
    flat = jnp.argmax(uneven.ravel())
    row, step = flat // process.shape[1], flat % process.shape[1]
    check = _checks.ValueCheck(
        "turn_rewards_not_uniform", _checks.violations(uneven),
        lambda row, step: "token_rewards_as_adv=False folds one reward per turn into GAE, so token_rewards must "
                          f"be uniform over each turn's generated tokens; row {int(row)} changes value at timestep "
                          f"{int(step)}", row, step)
    is_last = active & ~same_turn_next
    return jnp.where(is_last, process, zero), check


class Timesteps(NamedTuple):
    """The batch on timesteps: rollout-side arrays shifted, model outputs as given; ``None`` when absent."""

    active: jax.Array               # [B, T] bool, the shifted loss mask m
    logprobs: jax.Array             # [B, T] old log-probs (recomputed ones when given), 0 where m = 0
    ref_logprobs: jax.Array | None  # [B, T] reference log-probs, 0 where m = 0
    turn_ids: jax.Array | None      # [B, T] int32, -1 in the last column
    process: jax.Array | None       # [B, T] process rewards P, 0 where m = 0
    values: jax.Array               # [B, T] (0 without a critic)


def _to_timesteps(batch: Mapping[str, jax.Array], raw_active: jax.Array, dtype) -> Timesteps:
    zero = jnp.zeros((), dtype)
    active = shift_to_next_token(raw_active, fill=False)

    def masked(x):
        return jnp.where(active, x, zero)

    def position_float(key):
        return masked(shift_to_next_token(_checks.as_float(f"batch[{key!r}]", batch[key], dtype)))

    def timestep_float(key):
        return _checks.as_float(f"batch[{key!r}]", batch[key], dtype)

    logprobs = (masked(timestep_float("prox_logprobs")) if "prox_logprobs" in batch
                else position_float("logprobs"))
    return Timesteps(
        active=active, logprobs=logprobs,
        ref_logprobs=masked(timestep_float("ref_logprobs")) if "ref_logprobs" in batch else None,
        turn_ids=(shift_to_next_token(_checks.as_int("batch['turn_ids']", batch["turn_ids"]), fill=-1)
                  if "turn_ids" in batch else None),
        process=position_float("token_rewards") if "token_rewards" in batch else None,
        values=timestep_float("values") if "values" in batch else jnp.zeros(active.shape, dtype))


def _kl(steps: Timesteps, seqlen: jax.Array, config: AdvantageConfig) -> jax.Array:
    """KL rewards; without reference log-probs the reference is 0 (AReaL), so k1 gives ``kl_ctl * logp``."""
    ref = jnp.zeros_like(steps.logprobs) if steps.ref_logprobs is None else steps.ref_logprobs
    kl = kl_rewards(steps.logprobs, ref, steps.active, kl_ctl=config.kl_ctl, estimator=config.kl_estimator)
    step = lax.broadcasted_iota(jnp.int32, kl.shape, 1)
    return jnp.where(step == (seqlen - 1)[:, None], jnp.zeros((), kl.dtype), kl)


def _truncation(batch: Mapping[str, jax.Array], seqlen: jax.Array, width: int) -> jax.Array:
    if "is_truncated" in batch:
        return _checks.as_mask("batch['is_truncated']", batch["is_truncated"])
    return seqlen == width  # AReaL's fallback (compute_advantages warns)


def _lambda_context(steps: Timesteps, config: AdvantageConfig) -> GAELambdaContext:
    tokens = jnp.sum(steps.active, axis=1, dtype=jnp.int32)
    if steps.turn_ids is None:
        turns = jnp.zeros_like(tokens)
    else:
        # Ids never decrease along a row (checked), so a new turn starts where an active id exceeds
        # every earlier active id.
        seen = lax.cummax(jnp.where(steps.active, steps.turn_ids, -1), axis=1)
        before = jnp.concatenate([jnp.full_like(seen[:, :1], -1), seen[:, :-1]], axis=1)
        turns = jnp.sum(steps.active & (steps.turn_ids > before), axis=1, dtype=jnp.int32)
    return GAELambdaContext(effective_token_lengths=tokens, turn_counts=turns,
                            timestep_lengths=tokens if config.gae_timestep_unit == "token" else turns)


def _gae_lambda(batch: Mapping[str, jax.Array], steps: Timesteps, config: AdvantageConfig, dtype,
                checks: list) -> jax.Array:
    """λ: the batch's per-row ``gae_lambda [B]``, else the config's function of lengths, else its float."""
    if "gae_lambda" in batch:
        lam = _checks.as_float("batch['gae_lambda']", batch["gae_lambda"], dtype)
    elif isinstance(config.gae_lambda, str):
        lam = lambda_fn.resolve(config.gae_lambda)(_lambda_context(steps, config), **dict(config.gae_lambda_kwargs))
        _checks.check_shape(f"the λ returned by {config.gae_lambda}", lam, steps.active.shape[:1], "the batch axis")
        lam = _checks.as_float(f"the λ returned by {config.gae_lambda}", lam, dtype)
    else:
        return jnp.asarray(config.gae_lambda, dtype)
    outside = ~((lam >= 0) & (lam <= 1))  # NaN is outside too
    row, _, value = _checks.first_flagged(outside[:, None], lam[:, None])
    checks.append(_checks.ValueCheck(
        "gae_lambda_out_of_range", _checks.violations(outside),
        lambda row, value: f"per-row gae_lambda must be finite and in [0, 1]; row {int(row)} has "
                                             f"{float(value)!r}", row, value))
    return lam


def _check_batch_shapes(batch: Mapping[str, jax.Array], config: AdvantageConfig) -> tuple[int, int]:
    """Trace-time checks of every key's shape; returns ``(B, T)``."""
    _checks.check_rank("batch['attention_mask']", batch["attention_mask"], 2)
    shape = jnp.shape(batch["attention_mask"])
    for key in ("loss_mask", "logprobs", "values", "ref_logprobs", "prox_logprobs", "token_rewards", "turn_ids"):
        if key in batch:
            _checks.check_shape(f"batch[{key!r}]", batch[key], shape, "attention_mask")
    for key in ("rewards", "is_truncated", "gae_lambda", "group_ids"):
        if key in batch:
            _checks.check_shape(f"batch[{key!r}]", batch[key], shape[:1], "the batch axis")
    for key in ("group_sizes", "group_member_counts"):
        if key in batch:
            _checks.check_rank(f"batch[{key!r}]", batch[key], 1)
    if (config.gae_timestep_unit == "turn" or config.credit_assignment is not None) and "turn_ids" not in batch:
        raise ValueError("gae_timestep_unit='turn' and credit_assignment need batch['turn_ids']")
    for key in ("turn_rewards", "anchor_ids"):
        if key in batch:
            _checks.check_rank(f"batch[{key!r}]", batch[key], 2)
            if jnp.shape(batch[key])[0] != shape[0]:
                raise ValueError(f"batch[{key!r}] must be [B, K] with B = {shape[0]}, got {jnp.shape(batch[key])}")
    return shape[0], shape[1]


def _batch_checks(batch: Mapping[str, jax.Array], num_rows: int) -> list[_checks.ValueCheck]:
    """Value checks of the inputs themselves: masks are bool or 0/1, groups add up."""
    checks = [*_checks.mask_check("batch['attention_mask']", batch["attention_mask"]),
              *_checks.mask_check("batch['loss_mask']", batch["loss_mask"])]
    if "is_truncated" in batch:
        checks += _checks.mask_check("batch['is_truncated']", batch["is_truncated"])
    if "group_sizes" in batch:
        checks.append(group_sizes_check(batch["group_sizes"], num_rows))
    elif "group_ids" in batch:
        checks.append(group_ids_check(batch["group_ids"], num_rows))
    if "group_member_counts" in batch:
        checks.append(member_counts_check(batch["group_member_counts"]))
    return checks


def _finite_inputs_checks(batch: Mapping[str, jax.Array], steps: Timesteps, last_value: jax.Array,
                          truncated: jax.Array, dtype) -> list[_checks.ValueCheck]:
    """Every float input is finite where it is used: on trained timesteps, and a truncated row's bootstrap
    value ``V[seqlen - 1]`` (one NaN there would reach every advantage through batch normalization)."""
    checks = [_checks.finite_check("batch['values']", steps.values, steps.active),
              _checks.finite_check("batch['values'] (the bootstrap value V[seqlen - 1] of a truncated row)",
                                   last_value, truncated, key="values_bootstrap")]
    behaviour = (shift_to_next_token(_checks.as_float("batch['logprobs']", batch["logprobs"], dtype))
                 if "prox_logprobs" in batch else steps.logprobs)  # prox_logprobs replaced them in steps
    checks.append(_checks.finite_check("batch['logprobs']", behaviour, steps.active))
    for key, array in (("prox_logprobs", steps.logprobs), ("ref_logprobs", steps.ref_logprobs),
                       ("token_rewards", steps.process)):
        if key in batch and array is not None:
            checks.append(_checks.finite_check(f"batch[{key!r}]", array, steps.active))
    return checks


def _sequence_lengths(attention_mask: jax.Array) -> jax.Array:
    """``seqlen = sum(attention_mask)`` per row, summed as given: no converted copy of the mask."""
    attention = jnp.asarray(attention_mask)
    _checks.check_mask_dtype("batch['attention_mask']", attention)
    if attention.dtype == jnp.bool_:
        return jnp.count_nonzero(attention, axis=1).astype(jnp.int32)
    return jnp.sum(attention, axis=1, dtype=jnp.int32)


def _task_rewards(outcome: jax.Array, process: jax.Array | None, steps: Timesteps, seqlen: jax.Array,
                  truncated: jax.Array, config: AdvantageConfig, checks: list) -> tuple[jax.Array, jax.Array | None]:
    """Steps 4-5: the outcome reward at timestep ``max(seqlen - 2, 0)`` (0 for truncated rows under
    ``mask_no_eos_with_zero``, which also clears their process rewards), plus folded turn rewards."""
    zero = jnp.zeros((), outcome.dtype)
    if config.mask_no_eos_with_zero:
        outcome = jnp.where(truncated, zero, outcome)
        if process is not None:
            process = jnp.where(truncated[:, None], zero, process)
    step = lax.broadcasted_iota(jnp.int32, steps.active.shape, 1)
    task = jnp.where(step == jnp.maximum(seqlen - 2, 0)[:, None], outcome[:, None], zero)
    if process is not None and not config.token_rewards_as_adv:
        folded, uniform_check = _fold_turn_rewards(process, steps.active, steps.turn_ids)
        checks.append(uniform_check)
        task = task + folded
    return task, process


def _gigpo_advantages(batch: Mapping[str, jax.Array], outcome: jax.Array, process: jax.Array | None,
                      steps: Timesteps, real_rows: jax.Array, config: AdvantageConfig,
                      groups: GroupLayout | None, checks: list) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GiGPO in place of GAE: per-turn advantages broadcast to each turn's active timesteps, and the step
    groups' counts (``step_group_counts``) for the diagnostics.

    Step rewards are ``batch['turn_rewards'] [B, K]`` when given, else the sum of each turn's process
    rewards; anchors are ``batch['anchor_ids'] [B, K]`` (none: one step group per GRPO group).
    """
    assert config.credit_assignment is not None and steps.turn_ids is not None
    width = steps.active.shape[1]
    num_turns = (jnp.shape(batch["turn_rewards"])[1] if "turn_rewards" in batch
                 else jnp.shape(batch["anchor_ids"])[1] if "anchor_ids" in batch else config.max_turns or width)
    in_turn, segment = turn_segments(steps.active, steps.turn_ids, num_turns)
    counts = turn_sums(steps.active.astype(outcome.dtype), in_turn, segment, num_turns)
    if "turn_rewards" in batch:
        step_rewards = _checks.as_float("batch['turn_rewards']", batch["turn_rewards"], outcome.dtype)
        checks.append(_checks.finite_check("batch['turn_rewards']", step_rewards, counts > 0, axis="turn"))
    else:
        step_rewards = (turn_sums(process, in_turn, segment, num_turns) if process is not None
                        else jnp.zeros(counts.shape, outcome.dtype))
    anchors = _checks.as_integer("batch['anchor_ids']", batch["anchor_ids"]) if "anchor_ids" in batch else None
    row_group, num_groups = ((groups.row_group, groups.num_groups) if groups is not None
                             else (jnp.zeros(outcome.shape, jnp.int32), 1))
    per_turn = gigpo_core(step_rewards, counts > 0, anchors, outcome, row_group, num_groups,
                          config.credit_assignment, real_rows)
    safe = jnp.clip(steps.turn_ids, 0, num_turns - 1)
    advantages = jnp.where(in_turn, jnp.take_along_axis(per_turn.advantages, safe, axis=1),
                           jnp.zeros((), outcome.dtype))
    return advantages, step_group_counts(per_turn.step_group_sizes)


def _advantages_and_returns(task: jax.Array, kl: jax.Array, steps: Timesteps, bootstrap: jax.Array,
                            lam: jax.Array, config: AdvantageConfig, method: GAEMethod) -> tuple[jax.Array, jax.Array]:
    """Steps 6-7: GAE over tokens (with the KL rewards inside) or over turns (KL added afterwards)."""
    gamma = jnp.asarray(config.discount, task.dtype)
    if config.gae_timestep_unit == "token":
        return gae_core(task + kl, steps.values, steps.active, gamma, lam, bootstrap, method, config.gae_block_size)
    # KL stays token-local: added to the advantages, part of neither the recurrence nor the returns.
    assert steps.turn_ids is not None  # turn level needs turn_ids (checked with the shapes)
    width = steps.active.shape[1]
    advantages, returns = turn_gae_core(task, steps.values, steps.active, steps.turn_ids, gamma, lam, bootstrap,
                                        config.max_turns or width, method)
    return advantages + kl, returns


GRPO_GROUPS = NormConfig("group", "group")


def _groups_of(batch: Mapping[str, jax.Array], num_rows: int, norm: NormConfig) -> GroupLayout | None:
    if not norm.uses_groups:
        return None
    return group_layout(num_rows, norm, batch.get("group_sizes"), batch.get("group_member_counts"),
                        batch.get("group_ids"))


def _pipeline(batch: Mapping[str, jax.Array], config: AdvantageConfig, method: GAEMethod,
              variants: tuple[ShapingConfig, ...] = ()):
    num_rows, width = _check_batch_shapes(batch, config)
    dtype = _checks.accumulation_dtype(*(batch[k] for k in ("logprobs", "rewards", "values", "ref_logprobs",
                                                             "prox_logprobs", "token_rewards") if k in batch))
    checks = _batch_checks(batch, num_rows)
    seqlen = _sequence_lengths(batch["attention_mask"])
    # A position outside the attention mask is never trained, whatever its loss mask says (padding).
    raw_active = (_checks.as_mask("batch['loss_mask']", batch["loss_mask"])
                  & _checks.as_mask("batch['attention_mask']", batch["attention_mask"]))
    groups_of = functools.partial(_groups_of, batch, num_rows)
    grpo_groups = groups_of(GRPO_GROUPS) if "group_sizes" in batch or "group_ids" in batch else None
    rewards = _checks.as_float("batch['rewards']", batch["rewards"], dtype)
    checks.append(_checks.finite_check("batch['rewards']", rewards))
    outcome = _outcome_rewards(rewards, raw_active, seqlen > 0, config, groups_of)          # 1
    steps = _to_timesteps(batch, raw_active, dtype)                                          # 2
    if steps.turn_ids is not None and (config.gae_timestep_unit == "turn" or isinstance(config.gae_lambda, str)):
        checks.append(turn_ids_check(steps.turn_ids, steps.active, config.max_turns or width))
    kl = _kl(steps, seqlen, config)                                                          # 3
    truncated = _truncation(batch, seqlen, width)
    task, process = _task_rewards(outcome, steps.process, steps, seqlen, truncated, config, checks)  # 4-5
    last_value = jnp.take_along_axis(steps.values, jnp.clip(seqlen - 1, 0, width - 1)[:, None], axis=1)[:, 0]
    bootstrap = jnp.where(truncated, last_value, jnp.zeros((), dtype))
    checks += _finite_inputs_checks(batch, steps, last_value, truncated, dtype)
    lam = _gae_lambda(batch, steps, config, dtype, checks)
    step_groups: dict[str, jax.Array] = {}
    if config.credit_assignment is not None:                                                 # 6-7 GiGPO
        advantages, step_groups = _gigpo_advantages(batch, outcome, process, steps, seqlen > 0, config, grpo_groups,
                                                     checks)
        advantages = advantages + kl
        returns = advantages + steps.values
    else:
        advantages, returns = _advantages_and_returns(task, kl, steps, bootstrap, lam, config, method)  # 6-7
    if config.adv_norm is not None:                                                          # 8
        advantages = normalize_core(advantages, steps.active, config.adv_norm, groups_of(config.adv_norm))
    unshaped = advantages
    if process is not None and config.token_rewards_as_adv:                                  # 9
        if config.advantage_shaping.mode == "process_weighted":
            checks.append(process_range_check(process, steps.active))
        advantages = shape_core(advantages, process, steps.active, config.advantage_shaping)
    output = AdvantageOutput(advantages=advantages, returns=returns, kl_rewards=kl, tot_rewards=task + kl,
                             loss_mask=steps.active.astype(dtype), logprobs=steps.logprobs,
                             diagnostics={**_diagnostics(advantages, unshaped, process, steps.active, grpo_groups,
                                                         config), **step_groups})
    # The same normalized advantages under other shapings (one GAE for all), each with its range check.
    extras = tuple((shape_core(unshaped, process, steps.active, shaping),
                    process_range_check(process, steps.active).count > 0 if shaping.mode == "process_weighted"
                    else jnp.zeros((), jnp.bool_))
                   for shaping in variants if process is not None)
    # Checks that are not returned are compiled out with their reductions.
    return output, (checks if config.check_values else []), unshaped, extras


def _diagnostics(advantages: jax.Array, unshaped: jax.Array, process: jax.Array | None, active: jax.Array,
                 groups: GroupLayout | None, config: AdvantageConfig) -> dict[str, jax.Array]:
    """Scalars that explain a mode that does not learn (``config.diagnostics``); under ``gvpo`` the share of
    negative process rewards always (the host warns when it is 0: gvpo reads only the sign)."""
    count = jnp.sum(active, dtype=jnp.int32)
    n = jnp.maximum(count, 1).astype(advantages.dtype)

    def share(flags: jax.Array) -> jax.Array:
        return jnp.sum(active & flags, dtype=jnp.int32).astype(advantages.dtype) / n

    gvpo = process is not None and config.token_rewards_as_adv and config.advantage_shaping.mode == "gvpo"
    out = {"process/negative_share": share(process < 0)} if gvpo and process is not None else {}
    if not config.diagnostics:
        return out
    nonzero = active & (advantages != 0)
    out.update({"active_timesteps": count, "nonzero_advantage_share": share(advantages != 0),
                "shaping_changed_share": share(advantages != unshaped)})
    row_group, num_groups = (groups.row_group, groups.num_groups) if groups is not None else (
        jnp.zeros(active.shape[:1], jnp.int32), 1)
    group_active = jax.ops.segment_sum(jnp.sum(active, axis=1, dtype=jnp.int32), row_group, num_segments=num_groups)
    group_nonzero = jax.ops.segment_sum(jnp.sum(nonzero, axis=1, dtype=jnp.int32), row_group, num_segments=num_groups)
    out["groups"] = jnp.sum(group_active > 0, dtype=jnp.int32)
    out["zero_advantage_groups"] = jnp.sum((group_active > 0) & (group_nonzero == 0), dtype=jnp.int32)
    if process is not None:
        safe = jnp.where(active, process, 0.0)
        mean = jnp.sum(safe) / n
        anywhere = count > 0
        out.update({"process/mean": mean,
                    "process/std": jnp.sqrt(jnp.sum(jnp.where(active, (process - mean) ** 2, 0.0)) / n),
                    "process/min": jnp.where(anywhere, jnp.min(jnp.where(active, process, jnp.inf)), 0.0),
                    "process/max": jnp.where(anywhere, jnp.max(jnp.where(active, process, -jnp.inf)), 0.0),
                    "process/negative_share": share(process < 0), "process/zero_share": share(process == 0),
                    "process/positive_share": share(process > 0),
                    "process/outside_unit_share": share(~((process >= 0) & (process <= 1)))})
    return out


_pipeline_jit = jax.jit(_pipeline, static_argnames=("config", "method", "variants"))


def _static_unit_discount(batch: Mapping[str, Any], config: AdvantageConfig) -> bool:
    """``gamma * lam == 1`` known before tracing: one float λ for every row."""
    return ("gae_lambda" not in batch and not isinstance(config.gae_lambda, str)
            and config.discount * config.gae_lambda == 1.0)


def _warn_about_fallbacks(batch: Mapping[str, Any], config: AdvantageConfig) -> None:
    if "is_truncated" not in batch:
        warnings.warn("batch has no 'is_truncated'; falling back to seqlen == width, which also marks a "
                      "complete row that exactly fills the padded width as truncated", stacklevel=3)
    if "ref_logprobs" not in batch and config.kl_ctl != 0:
        warnings.warn("batch has no 'ref_logprobs' but kl_ctl != 0: the KL reward uses a zero reference "
                      "log-prob (AReaL's rule), i.e. it rewards or penalizes the log-probs themselves",
                      stacklevel=3)


def _batch_arrays(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The keys the pipeline reads; host anchor ids wider than JAX's integers made dense (exact) first."""
    arrays = {key: batch[key] for key in REQUIRED_KEYS + OPTIONAL_KEYS if batch.get(key) is not None}
    if "anchor_ids" in arrays:
        arrays["anchor_ids"] = host_anchor_ids(arrays["anchor_ids"])
    return arrays


def compute_advantages(batch: Mapping[str, Any], config: AdvantageConfig = AdvantageConfig()) -> AdvantageOutput:
    """Advantages and returns for a padded batch, as one fused jitted computation.

    Args:
      batch: mapping with, on positions (raw, as exported, right-padded):
        ``attention_mask [B, T]``, ``loss_mask [B, T]``, ``logprobs [B, T]``, ``rewards [B]``; optionally
        ``token_rewards [B, T]`` and ``turn_ids [B, T]`` int (positions); ``values [B, T]``,
        ``ref_logprobs [B, T]`` and ``prox_logprobs [B, T]`` (timesteps: model outputs);
        ``is_truncated [B]`` bool, ``gae_lambda [B]`` (per-row lambda, overrides the config),
        ``group_sizes [G]`` int (consecutive groups of varying size for group-level normalization) and
        ``group_member_counts [G]`` int (logical rollouts per group when one spans several rows), or
        instead of ``group_sizes`` ``group_ids [B]`` int (a group id per row in ``[0, B)``, -1 for a
        padding row: one shape for any number of groups; ``pack_branches`` emits it). Rows without any
        attention (padding rows) never count in reward normalization. Other keys (``input_ids``, ...)
        are ignored.
      config: ``AdvantageConfig``, a static argument.

    Returns:
      ``AdvantageOutput``; see the module docstring for each step. ``output.diagnostics`` holds the
      value checks' violation counts (``"checks/<name>"``, unless ``check_values`` is False) and, with
      ``config.diagnostics``, the statistics listed in the README.

    Raises:
      ValueError: on bad shapes (at trace time), and, when called eagerly with ``check_values`` on, on
        process rewards outside [0, 1] under ``process_weighted``, non-uniform turn rewards when folding,
        ``group_sizes`` that are not positive or do not sum to ``B``, bad ``group_ids``,
        ``group_member_counts`` below 1, a per-row λ outside [0, 1], or turn ids that break AReaL's rules
        (turn-level GAE or a λ function). Under an outer ``jit`` nothing is raised and no host round trip
        is paid: the counts come back in ``output.diagnostics``; ``check_values="callback"`` raises there
        too, from a host callback when the computation runs.
    """
    if not isinstance(config, AdvantageConfig):
        raise TypeError(f"config must be an AdvantageConfig, got {type(config).__name__}")
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of arrays, got {type(batch).__name__}")
    missing = [key for key in REQUIRED_KEYS if batch.get(key) is None]
    if missing:
        raise ValueError(f"batch is missing required keys {missing}")
    arrays = _batch_arrays(batch)
    _warn_about_fallbacks(arrays, config)
    method = resolve_method(config.gae_method, unit_discount=_static_unit_discount(arrays, config),
                            sharded=jax.device_count() > 1)
    output, checks, _, _ = _pipeline_jit(arrays, config=config, method=method)
    return _settle_checks(output, checks, config)


def _settle_checks(output: AdvantageOutput, checks: list[_checks.ValueCheck],
                   config: AdvantageConfig) -> AdvantageOutput:
    """Eagerly: raise on a failed check, and warn once when gvpo sees no negative process reward. Under a
    trace: the counts go into the diagnostics (a host callback raises only with ``check_values='callback'``)."""
    if not config.check_values:
        return output
    _checks.raise_value_checks(checks, callback=config.check_values == "callback")
    negative = output.diagnostics.get("process/negative_share")
    if negative is not None and not _checks.is_traced(negative) and float(negative) == 0:
        warn_gvpo_without_penalty(stacklevel=3)
    return output._replace(diagnostics={**output.diagnostics, **_checks.check_counts(checks)})


def compute_advantage_variants(batch: Mapping[str, Any], config: AdvantageConfig,
                               modes: Sequence[ShapingMode]) -> tuple[AdvantageOutput, dict[str, jax.Array | str]]:
    """``compute_advantages`` plus the same advantages under other shaping modes, from one GAE.

    GAE and normalization do not depend on the shaping mode, so they run once; each mode in ``modes``
    (with the config's other shaping settings) shapes the same normalized advantages. Returns the
    configured output and ``{"none": unshaped advantages, mode: shaped advantages, ...}``; a mode the
    config or the batch rules out (``process_weighted`` with ``mask_no_eos_with_zero``, or process rewards
    outside [0, 1]) maps to a string saying why. Needs direct process rewards (``token_rewards`` in the
    batch and ``token_rewards_as_adv``).
    """
    if "token_rewards" not in batch or not config.token_rewards_as_adv:
        raise ValueError("compute_advantage_variants needs batch['token_rewards'] and token_rewards_as_adv: true")
    variants: list[ShapingConfig] = []
    refused: dict[str, jax.Array | str] = {}
    for mode in modes:
        try:
            dataclasses.replace(config, advantage_shaping=dataclasses.replace(config.advantage_shaping, mode=mode))
            variants.append(dataclasses.replace(config.advantage_shaping, mode=mode))
        except ValueError as err:
            refused[mode] = f"n/a: {err}"
    arrays = _batch_arrays(batch)
    _warn_about_fallbacks(arrays, config)
    method = resolve_method(config.gae_method, unit_discount=_static_unit_discount(arrays, config),
                            sharded=jax.device_count() > 1)
    output, checks, unshaped, extras = _pipeline_jit(arrays, config=config, method=method, variants=tuple(variants))
    output = _settle_checks(output, checks, config)
    shaped: dict[str, jax.Array | str] = {"none": unshaped}
    for shaping, (advantages, out_of_range) in zip(variants, extras):
        shaped[shaping.mode] = ("n/a: process_weighted needs process rewards in [0, 1]" if bool(out_of_range)
                                else advantages)
    return output, {**shaped, **refused}
