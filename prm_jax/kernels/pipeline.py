"""The fused advantage pipeline: outcome rewards, KL, GAE, normalization and process-reward shaping.

``compute_advantages`` takes a padded batch on *positions* (raw, unshifted, as exported) and returns
everything on *timesteps* (see ``alignment``). In order:

1. outcome reward: optional overlong penalty; ``r = clip((r + reward_bias) * reward_scaling, +-reward_clip)``;
   optional ``reward_norm`` over the ``[B]`` vector.
2. shift ``loss_mask``, ``logprobs``, ``ref_logprobs``, ``turn_ids``, ``token_rewards`` to timesteps; the
   shifted mask is ``m`` and the log-probs are zeroed where ``m = 0``.
3. ``kl_rewards = -kl_ctl * clamp(kl, -10, 10)`` on active timesteps, 0 at timestep ``seqlen - 1``; 0
   everywhere when the batch has no ``ref_logprobs`` (no reference policy).
4. truncation: ``is_truncated`` when given, else ``seqlen == T`` (with a warning: it mislabels a row that
   ends exactly at the padded width). The outcome reward goes to timestep ``max(seqlen - 2, 0)``, or 0
   there for truncated rows under ``mask_no_eos_with_zero``, which also zeroes their process rewards.
5. process rewards ``P = shifted(token_rewards) * m``: kept for shaping (``token_rewards_as_adv``), or
   folded: each turn's uniform reward is added once, at the timestep predicting its last token.
6. GAE (``gae`` or ``turn_gae``) with bootstrap ``V[seqlen - 1]`` on truncated rows. At turn level the KL
   rewards are added to the advantages after GAE instead of entering the turn rewards.
7. ``returns = advantages + values`` before normalization and shaping.
8. optional ``adv_norm`` over active timesteps.
9. shaping with ``P`` (``shaping``); returns and ``tot_rewards`` are never shaped.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from prm_jax.kernels import _checks
from prm_jax.kernels.alignment import shift_to_next_token
from prm_jax.kernels.gae import DEFAULT_BLOCK_SIZE, GAE_METHODS, gae_core, resolve_method, turn_gae_core
from prm_jax.kernels.kl import KL_ESTIMATORS, kl_rewards
from prm_jax.kernels.normalization import (NormConfig, check_group_sizes, group_index, group_sizes_check,
                                           normalize_core)
from prm_jax.kernels.shaping import ShapingConfig, process_range_check, shape_core

REQUIRED_KEYS = ("attention_mask", "loss_mask", "logprobs", "rewards")
OPTIONAL_KEYS = ("values", "ref_logprobs", "token_rewards", "turn_ids", "is_truncated", "gae_lambda",
                 "group_sizes")
TIMESTEP_UNITS = ("token", "turn")


class AdvantageOutput(NamedTuple):
    """All ``[B, T]`` float32 on timesteps."""

    advantages: jax.Array
    returns: jax.Array
    kl_rewards: jax.Array
    tot_rewards: jax.Array
    loss_mask: jax.Array  # shifted, 0/1
    logprobs: jax.Array   # shifted, 0 where the shifted loss mask is 0


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """Actor settings of the advantage pipeline, with AReaL's field names and defaults.

    Hashable: it is a static argument of the jitted pipeline, so equal configs never retrace. Beyond
    AReaL: ``gae_method``/``gae_block_size`` choose the scan, ``max_turns`` bounds turns per row for
    turn-level GAE (default ``T``), ``check_values=False`` skips the value checks on the hot path (their
    reductions and the device sync).
    """

    discount: float = 1.0
    gae_lambda: float = 1.0
    kl_ctl: float = 0.1
    kl_estimator: str = "k1"
    reward_bias: float = 0.0
    reward_scaling: float = 1.0
    reward_clip: float = 20.0
    mask_no_eos_with_zero: bool = False
    token_rewards_as_adv: bool = True
    gae_timestep_unit: str = "token"
    reward_norm: NormConfig | None = None
    adv_norm: NormConfig | None = None
    advantage_shaping: ShapingConfig = ShapingConfig()
    overlong_reward_penalty: bool = False
    overlong_tokens: int | None = None
    overlong_penalty_factor: float | None = None
    max_new_tokens: int | None = None
    gae_method: str = "auto"
    gae_block_size: int = DEFAULT_BLOCK_SIZE
    max_turns: int | None = None
    check_values: bool = True

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        set_("discount", _checks.finite_number("discount", self.discount, minimum=0.0, maximum=1.0))
        set_("gae_lambda", _checks.finite_number("gae_lambda", self.gae_lambda, minimum=0.0, maximum=1.0))
        set_("kl_ctl", _checks.finite_number("kl_ctl", self.kl_ctl))
        set_("reward_bias", _checks.finite_number("reward_bias", self.reward_bias))
        set_("reward_scaling", _checks.finite_number("reward_scaling", self.reward_scaling))
        set_("reward_clip", _checks.finite_number("reward_clip", self.reward_clip, minimum=0.0))
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        for key in ("mask_no_eos_with_zero", "token_rewards_as_adv", "overlong_reward_penalty", "check_values"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key} must be a bool, got {getattr(self, key)!r}")
        if self.gae_timestep_unit not in TIMESTEP_UNITS:
            raise ValueError(f"gae_timestep_unit must be one of {TIMESTEP_UNITS}, got {self.gae_timestep_unit!r}")
        set_("reward_norm", NormConfig.from_value(self.reward_norm, "reward_norm"))
        set_("adv_norm", NormConfig.from_value(self.adv_norm, "adv_norm"))
        set_("advantage_shaping", ShapingConfig.from_value(self.advantage_shaping))
        mode = self.advantage_shaping.mode
        if mode in ("gvpo", "process_weighted") and not self.token_rewards_as_adv:
            raise ValueError(f"advantage_shaping.mode={mode!r} shapes with direct process rewards and needs "
                             "token_rewards_as_adv: true")
        if mode == "process_weighted" and self.mask_no_eos_with_zero:
            raise ValueError("advantage_shaping.mode='process_weighted' rejects mask_no_eos_with_zero: true")
        if self.gae_method not in GAE_METHODS:
            raise ValueError(f"gae_method must be one of {GAE_METHODS}, got {self.gae_method!r}")
        if self.gae_method == "cumsum" and self.discount * self.gae_lambda != 1.0:
            raise ValueError("gae_method='cumsum' needs discount * gae_lambda == 1")
        if isinstance(self.gae_block_size, bool) or not isinstance(self.gae_block_size, int) or self.gae_block_size < 1:
            raise ValueError(f"gae_block_size must be an integer >= 1, got {self.gae_block_size!r}")
        if self.max_turns is not None and (not isinstance(self.max_turns, int) or self.max_turns < 1):
            raise ValueError(f"max_turns must be None or an integer >= 1, got {self.max_turns!r}")
        if self.overlong_reward_penalty:
            if not isinstance(self.overlong_tokens, int) or self.overlong_tokens < 1:
                raise ValueError(f"overlong_tokens must be an integer >= 1 with overlong_reward_penalty, got "
                                 f"{self.overlong_tokens!r}")
            set_("overlong_penalty_factor", _checks.finite_number("overlong_penalty_factor",
                                                                  self.overlong_penalty_factor, minimum=0.0))
            if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < self.overlong_tokens:
                raise ValueError(f"max_new_tokens must be an integer >= overlong_tokens with "
                                 f"overlong_reward_penalty, got {self.max_new_tokens!r}")


def _outcome_rewards(rewards, raw_active, config: AdvantageConfig, groups_of):
    dtype = rewards.dtype
    if config.overlong_reward_penalty:
        response_length = jnp.sum(raw_active.astype(dtype), axis=1)
        exceed = response_length - (config.max_new_tokens - config.overlong_tokens)
        rewards = rewards + jnp.minimum(-exceed / config.overlong_tokens * config.overlong_penalty_factor, 0.0)
    rewards = jnp.clip((rewards + config.reward_bias) * config.reward_scaling, -config.reward_clip,
                       config.reward_clip)
    if config.reward_norm is not None:
        ones = jnp.ones(rewards.shape + (1,), jnp.bool_)
        rewards = normalize_core(rewards[:, None], ones, config.reward_norm, *groups_of(config.reward_norm))[:, 0]
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
    failed = jnp.any(uneven)
    flat = jnp.argmax(uneven.ravel())
    row, step = flat // process.shape[1], flat % process.shape[1]
    check = _checks.ValueCheck(
        failed, lambda row, step: "token_rewards_as_adv=False folds one reward per turn into GAE, so "
                                  "token_rewards must be uniform over each turn's generated tokens; row "
                                  f"{int(row)} changes value at timestep {int(step)}", row, step)
    is_last = active & ~same_turn_next
    return jnp.where(is_last, process, zero), check


def _pipeline(batch: Mapping[str, jax.Array], config: AdvantageConfig):
    _checks.check_rank("batch['attention_mask']", batch["attention_mask"], 2)
    shape = jnp.shape(batch["attention_mask"])
    num_rows, width = shape
    for key in ("loss_mask", "logprobs", "values", "ref_logprobs", "token_rewards", "turn_ids"):
        if key in batch:
            _checks.check_shape(f"batch[{key!r}]", batch[key], shape, "attention_mask")
    for key in ("rewards", "is_truncated", "gae_lambda"):
        if key in batch:
            _checks.check_shape(f"batch[{key!r}]", batch[key], (num_rows,), "the batch axis")
    if "group_sizes" in batch:
        _checks.check_rank("batch['group_sizes']", batch["group_sizes"], 1)
    if config.gae_timestep_unit == "turn" and "turn_ids" not in batch:
        raise ValueError("gae_timestep_unit='turn' needs batch['turn_ids']")

    dtype = _checks.accumulation_dtype(*(batch[k] for k in ("logprobs", "rewards", "values", "ref_logprobs",
                                                             "token_rewards") if k in batch))
    zero = jnp.zeros((), dtype)
    raw_active = _checks.as_mask("batch['loss_mask']", batch["loss_mask"])
    # seqlen = sum(attention_mask) (SPEC 1), summed as given: no converted copy of the mask.
    attention = jnp.asarray(batch["attention_mask"])
    _checks.check_mask_dtype("batch['attention_mask']", attention)
    seqlen = (jnp.count_nonzero(attention, axis=1).astype(jnp.int32) if attention.dtype == jnp.bool_
              else jnp.sum(attention, axis=1, dtype=jnp.int32))
    step = lax.broadcasted_iota(jnp.int32, shape, 1)
    checks = []

    if "group_sizes" in batch:
        checks.append(group_sizes_check(batch["group_sizes"], num_rows))

    def groups_of(norm: NormConfig) -> tuple[jax.Array | None, int]:
        return group_index(num_rows, norm, batch.get("group_sizes")) if norm.uses_groups else (None, 1)

    # 1. outcome rewards
    outcome = _outcome_rewards(_checks.as_float("batch['rewards']", batch["rewards"], dtype), raw_active, config,
                               groups_of)

    # 2. positions -> timesteps
    active = shift_to_next_token(raw_active, fill=False)
    logprobs = jnp.where(active, shift_to_next_token(_checks.as_float("batch['logprobs']", batch["logprobs"],
                                                                      dtype)), zero)
    has_reference = "ref_logprobs" in batch
    ref_logprobs = (jnp.where(active, shift_to_next_token(_checks.as_float(
        "batch['ref_logprobs']", batch["ref_logprobs"], dtype)), zero) if has_reference else None)
    turn_ids = (shift_to_next_token(_checks.as_int("batch['turn_ids']", batch["turn_ids"]), fill=-1)
                if "turn_ids" in batch else None)
    has_process = "token_rewards" in batch
    process = (jnp.where(active, shift_to_next_token(_checks.as_float(
        "batch['token_rewards']", batch["token_rewards"], dtype)), zero) if has_process else None)

    # 3. KL rewards
    # Without reference log-probs there is no reference policy and no KL penalty.
    if has_reference:
        kl = kl_rewards(logprobs, ref_logprobs, active, kl_ctl=config.kl_ctl, estimator=config.kl_estimator)
        kl = jnp.where(step == (seqlen - 1)[:, None], zero, kl)
    else:
        kl = jnp.zeros(shape, dtype)

    # 4. truncation and the outcome reward's timestep
    if "is_truncated" in batch:
        truncated = _checks.as_mask("batch['is_truncated']", batch["is_truncated"])
    else:
        warnings.warn("batch has no 'is_truncated'; falling back to seqlen == width, which also marks a "
                      "complete row that exactly fills the padded width as truncated", stacklevel=4)
        truncated = seqlen == width
    if config.mask_no_eos_with_zero:
        outcome = jnp.where(truncated, zero, outcome)
        if has_process:
            process = jnp.where(truncated[:, None], zero, process)
    outcome_step = jnp.maximum(seqlen - 2, 0)
    gae_rewards = jnp.where(step == outcome_step[:, None], outcome[:, None], zero)

    # 5. process rewards: direct (kept for shaping) or folded into the GAE rewards
    if has_process and not config.token_rewards_as_adv:
        folded, uniform_check = _fold_turn_rewards(process, active, turn_ids)
        checks.append(uniform_check)
        gae_rewards = gae_rewards + folded

    # 6-7. GAE and returns
    values = (_checks.as_float("batch['values']", batch["values"], dtype) if "values" in batch
              else jnp.zeros(shape, dtype))
    last_value = jnp.take_along_axis(values, jnp.clip(seqlen - 1, 0, width - 1)[:, None], axis=1)[:, 0]
    bootstrap = jnp.where(truncated, last_value, zero)
    per_row_lambda = "gae_lambda" in batch
    lam = (_checks.as_float("batch['gae_lambda']", batch["gae_lambda"], dtype) if per_row_lambda
           else jnp.asarray(config.gae_lambda, dtype))
    method = resolve_method(config.gae_method, unit_discount=not per_row_lambda
                            and config.discount * config.gae_lambda == 1.0)
    gamma = jnp.asarray(config.discount, dtype)
    if config.gae_timestep_unit == "token":
        gae_rewards = gae_rewards + kl
        advantages, returns = gae_core(gae_rewards, values, active, gamma, lam, bootstrap, method,
                                       config.gae_block_size)
    else:
        num_turns = config.max_turns or width
        advantages, returns = turn_gae_core(gae_rewards, values, active, turn_ids, gamma, lam, bootstrap,
                                            num_turns, method)
        advantages = advantages + kl

    # 8. advantage normalization
    if config.adv_norm is not None:
        advantages = normalize_core(advantages, active, config.adv_norm, *groups_of(config.adv_norm))

    # 9. shaping with direct process rewards
    if has_process and config.token_rewards_as_adv:
        if config.advantage_shaping.mode == "process_weighted":
            checks.append(process_range_check(process, active))
        advantages = shape_core(advantages, process, active, config.advantage_shaping)

    output = AdvantageOutput(advantages=advantages, returns=returns, kl_rewards=kl, tot_rewards=gae_rewards,
                             loss_mask=active.astype(dtype), logprobs=logprobs)
    # Checks that are not returned are compiled out with their reductions.
    return output, checks if config.check_values else []


_pipeline_jit = jax.jit(_pipeline, static_argnames=("config",))


def compute_advantages(batch: Mapping[str, Any], config: AdvantageConfig = AdvantageConfig()) -> AdvantageOutput:
    """Advantages and returns for a padded batch, as one fused jitted computation.

    Args:
      batch: mapping with, on positions (raw, as exported, right-padded):
        ``attention_mask [B, T]``, ``loss_mask [B, T]``, ``logprobs [B, T]``, ``rewards [B]``; optionally
        ``values [B, T]`` (on timesteps, as a critic emits them), ``ref_logprobs [B, T]``,
        ``token_rewards [B, T]``, ``turn_ids [B, T]`` int, ``is_truncated [B]`` bool, ``gae_lambda [B]``
        (per-row lambda, overrides the config) and ``group_sizes [G]`` int (consecutive groups of varying
        size for group-level normalization). Other keys (``input_ids``, ...) are ignored.
      config: ``AdvantageConfig``, a static argument.

    Returns:
      ``AdvantageOutput``; see the module docstring for each step.

    Raises:
      ValueError: on bad shapes (at trace time), and, unless ``config.check_values`` is False, on
        process rewards outside [0, 1] under ``process_weighted``, non-uniform turn rewards when folding,
        or ``group_sizes`` that are not positive or do not sum to ``B``. Under an outer ``jit`` these value
        checks raise when the computation runs.
    """
    if not isinstance(config, AdvantageConfig):
        raise TypeError(f"config must be an AdvantageConfig, got {type(config).__name__}")
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of arrays, got {type(batch).__name__}")
    missing = [key for key in REQUIRED_KEYS if batch.get(key) is None]
    if missing:
        raise ValueError(f"batch is missing required keys {missing}")
    arrays = {key: batch[key] for key in REQUIRED_KEYS + OPTIONAL_KEYS if batch.get(key) is not None}
    if "group_sizes" in arrays and not _checks.is_traced(arrays["group_sizes"]):
        check_group_sizes(arrays["group_sizes"], jnp.shape(arrays["attention_mask"])[0])
    output, checks = _pipeline_jit(arrays, config=config)
    if config.check_values:
        _checks.raise_value_checks(checks)
    return output
