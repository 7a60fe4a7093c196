"""Steps 1-5 of ``compute_advantages``: the outcome rewards, the batch on timesteps, the KL rewards,
truncation, λ and where the outcome reward goes (the module docstring of ``prm_jax.kernels._advantages``
lists every step). The configurable stages among them (the outcome's normalization, the process transform)
run from their declarations (``StageSpec.run``); what is here is the same for every plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from prm_jax.kernels import _checks
from prm_jax.kernels._alignment import shift_to_next_token
from prm_jax.kernels._kl import kl_rewards
from prm_jax.kernels._plan import KLStage, LambdaFunction, OutcomeStage, TaskRewardStage, TimestepUnit
from prm_jax.kernels._turns import TurnSteps, fold_turn_rewards, turn_counts
from prm_jax.kernels.gae_lambda import GAELambdaContext


class Timesteps(NamedTuple):
    """The batch on timesteps: rollout-side arrays shifted, model outputs as given; ``None`` when absent."""

    active: jax.Array               # [B, T] bool, the shifted loss mask m
    logprobs: jax.Array             # [B, T] old log-probs (recomputed ones when given), 0 where m = 0
    ref_logprobs: jax.Array | None  # [B, T] reference log-probs, 0 where m = 0
    turn_ids: jax.Array | None      # [B, T] int32, -1 in the last column
    process: jax.Array | None       # [B, T] process rewards P, 0 where m = 0
    values: jax.Array               # [B, T] (0 without a critic)


def outcome_rewards(rewards: jax.Array, raw_active: jax.Array, stage: OutcomeStage) -> jax.Array:
    """Step 1 up to the normalization (the stage's ``norm`` runs from its declaration): DAPO's overlong
    penalty, then ``clip((r + bias) * scaling, +-clip)``."""
    if stage.overlong is not None:
        max_new, tokens, factor = stage.overlong.max_new_tokens, stage.overlong.overlong_tokens, stage.overlong.factor
        response_length = jnp.sum(raw_active.astype(rewards.dtype), axis=1)
        exceed = response_length - (max_new - tokens)
        rewards = rewards + jnp.minimum(-exceed / tokens * factor, 0.0)
    return jnp.clip((rewards + stage.bias) * stage.scaling, -stage.clip, stage.clip)


def sequence_lengths(attention_mask: jax.Array) -> jax.Array:
    """``seqlen = sum(attention_mask)`` per row, summed as given: no converted copy of the mask."""
    attention = jnp.asarray(attention_mask)
    _checks.check_mask_dtype("batch['attention_mask']", attention)
    if attention.dtype == jnp.bool_:
        return jnp.count_nonzero(attention, axis=1).astype(jnp.int32)
    return jnp.sum(attention, axis=1, dtype=jnp.int32)


def to_timesteps(batch: Mapping[str, jax.Array], raw_active: jax.Array, dtype: Any) -> Timesteps:
    """Step 2: the rollout-side arrays shifted to timesteps, the model outputs read as given."""
    zero = jnp.zeros((), dtype)
    active = shift_to_next_token(raw_active, fill=False)

    def masked(x: jax.Array) -> jax.Array:
        return jnp.where(active, x, zero)

    def position_float(key: str) -> jax.Array:
        return masked(shift_to_next_token(_checks.as_float(f"batch[{key!r}]", batch[key], dtype)))

    def timestep_float(key: str) -> jax.Array:
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


def kl_step(steps: Timesteps, seqlen: jax.Array, stage: KLStage) -> jax.Array:
    """Step 4: the KL rewards (the estimate clamped to ``+-stage.clamp``); without reference log-probs the
    reference is 0 (AReaL), so k1 gives ``kl_ctl * logp``. With ``kl_ctl = 0`` there is no KL term, and the
    reference log-probs are not read."""
    if stage.kl_ctl == 0:
        return jnp.zeros_like(steps.logprobs)
    ref = jnp.zeros_like(steps.logprobs) if steps.ref_logprobs is None else steps.ref_logprobs
    kl = kl_rewards(steps.logprobs, ref, steps.active, kl_ctl=stage.kl_ctl, estimator=stage.estimator,
                    clamp=stage.clamp)
    step = lax.broadcasted_iota(jnp.int32, kl.shape, 1)
    return jnp.where(step == (seqlen - 1)[:, None], jnp.zeros((), kl.dtype), kl)


def truncation(batch: Mapping[str, jax.Array], seqlen: jax.Array, width: int) -> jax.Array:
    """``is_truncated`` when given, else ``seqlen == T`` (AReaL's fallback; ``compute_advantages`` warns)."""
    if "is_truncated" in batch:
        return _checks.as_mask("batch['is_truncated']", batch["is_truncated"])
    return seqlen == width


def _lambda_context(steps: Timesteps, unit: TimestepUnit, turns: TurnSteps | None) -> GAELambdaContext:
    tokens = jnp.sum(steps.active, axis=1, dtype=jnp.int32)
    counts = jnp.zeros_like(tokens) if turns is None else turn_counts(turns)
    return GAELambdaContext(effective_token_lengths=tokens, turn_counts=counts,
                            timestep_lengths=tokens if unit == "token" else counts)


def step_lambda(batch: Mapping[str, jax.Array], steps: Timesteps, plan_lam: float | LambdaFunction, dtype: Any,
               turns: TurnSteps | None, checks: list[_checks.ValueCheck]) -> jax.Array:
    """λ: the batch's per-row ``gae_lambda [B]``, else the plan's function of lengths, else its float."""
    who = "batch['gae_lambda']"
    if "gae_lambda" in batch:
        lam = _checks.as_float(who, batch["gae_lambda"], dtype)
    elif isinstance(plan_lam, LambdaFunction):
        who = f"the λ returned by {plan_lam.name}"
        lam = plan_lam.fn(_lambda_context(steps, plan_lam.unit, turns), **dict(plan_lam.kwargs))
        _checks.check_shape(who, lam, steps.active.shape[:1], "the batch axis")
        lam = _checks.as_float(who, lam, dtype)
    else:
        return jnp.asarray(plan_lam, dtype)
    outside = ~((lam >= 0) & (lam <= 1))  # NaN is outside too
    row, _, value = _checks.first_flagged(outside[:, None], lam[:, None])
    checks.append(_checks.ValueCheck(
        "gae_lambda_out_of_range", _checks.violations(outside),
        lambda row, value: f"per-row gae_lambda must be finite and in [0, 1] ({who}); row {int(row)} has "
                           f"{float(value)!r}", row, value))
    return lam


def task_rewards(outcome: jax.Array, process: jax.Array | None, steps: Timesteps, outcome_at: jax.Array,
                 truncated: jax.Array, stage: TaskRewardStage, turns: TurnSteps | None, method: str,
                 checks: list[_checks.ValueCheck]) -> tuple[jax.Array, jax.Array | None, jax.Array]:
    """Step 5: the outcome reward at timestep ``max(seqlen - 2, 0)`` (0 for truncated rows under
    ``mask_no_eos_with_zero``, which also clears their process rewards), plus folded turn rewards; and the
    ``[B]`` outcome every estimator reads (the same zeros: GiGPO, tree, PURE and PRIME honour it too)."""
    zero = jnp.zeros((), outcome.dtype)
    if stage.mask_truncated:
        outcome = jnp.where(truncated, zero, outcome)
        if process is not None:
            process = jnp.where(truncated[:, None], zero, process)
    task = jnp.where(outcome_at, outcome[:, None], zero)
    if process is not None and stage.fold_process:
        assert turns is not None  # the plan reads turns when it folds
        folded, uniform_check = fold_turn_rewards(process, steps.active, turns, method)
        checks.append(uniform_check)
        task = task + folded
    return task, process, outcome
