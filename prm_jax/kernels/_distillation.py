"""On-policy distillation (on-policy distillation as verl computes it (verl-project/verl @ 1dda039b,
verl/trainer/distillation/losses.py) and AReaL's MOPD (areal/trainer/mopd/loss.py); prm-jax's rules where verl's break (the
credit-assignment guide states each)): a teacher's log-probs of the student's own sampled tokens as a
dense token reward, AReaL's capped surrogate loss on it, and verl's supervised distillation losses.

- ``distillation_rewards``: ``r_t = sum_j w_j log pi_Tj(y_t) - W sg(log pi_theta(y_t))`` at trained tokens (0
  elsewhere), ``W = sum_j w_j``; the weights raw, as AReaL's multi-teacher form, or divided by ``W``
  (``normalize_teacher_weights``); an optional clip applied at trained tokens only (AReaL clips every entry,
  so a bound excluding 0 moved the padding's 0 into the loss). Only the ``k1`` reward is a policy-gradient
  reward: ``k2``, ``k3`` and ``abs`` are never positive, so a token the teacher prefers would be pushed down
  (verl's PG mode with them); they are refused here and offered as supervised losses.
- ``distillation_loss``: AReaL's ``-rho r`` with ``rho = min(exp(l - l_old), cap)`` under stop-gradient (cap 5),
  summed over trained tokens and divided by ``max(#normalization tokens, 1)``; its gradient is ``-rho r / D``.
  It composes with any policy loss: ``rl_coef * rl_loss + distill_coef * distillation_loss`` (verl's PG-OPD is
  ``k1`` rewards passed as advantages to its PPO loss).
- ``supervised_distillation_loss``: verl's estimators ``D(l, l_T)`` (``k1``, ``abs``, ``k2``, ``k3``),
  optionally clamped, aggregated by ``loss_agg_mode`` and differentiated through the estimator.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax._validation import boolean, finite_number, one_of
from prm_jax.kernels import _checks
from prm_jax.kernels._policy_loss import (
    AggMode,
    GlobalBatch,
    aggregate,
    check_token_arrays,
    checked_global_batch,
    global_batch_checks,
)

DistillationEstimator = Literal["k1", "abs", "k2", "k3", "k3+"]
#: verl's distillation estimators (``supervised_distillation_loss``); ``distillation_rewards`` takes ``k1``.
DISTILLATION_ESTIMATORS: tuple[DistillationEstimator, ...] = get_args(DistillationEstimator)
_NOT_A_REWARD = ("is never positive, so as a policy-gradient reward it pushes down the tokens the teacher prefers "
                 "(verl's PG distillation with it); use supervised_distillation_loss(estimator={!r}) instead, or "
                 "the k1 reward")


class DistillationStats(NamedTuple):
    """``reverse_kl``: the mean of ``-rho r`` over trained tokens; ``capped``: the share whose ratio hit the cap;
    and the value checks' violation counts.

    Attributes:
        reverse_kl: The mean of ``-rho r`` over trained tokens.
        capped: The share of trained tokens whose ratio hit the cap.

    Example:
        >>> logprobs = np.log(np.array([[0.5, 0.5]], np.float32))
        >>> rewards = np.array([[0.2, -0.1]], np.float32)          # log pi_teacher - log pi_student, per token
        >>> _, stats = prm_jax.losses.distillation_loss(logprobs, logprobs, rewards, np.ones((1, 2), bool))
        >>> round(float(stats.reverse_kl), 4), float(stats.capped)
        (-0.05, 0.0)
    """

    reverse_kl: jax.Array
    capped: jax.Array
    checks: dict[str, jax.Array] = {}


def _teacher_weights(weights: Sequence[float] | None, teachers: int) -> tuple[float, ...]:
    if weights is None:
        return (1.0,) * teachers
    values = tuple(finite_number(f"weights[{i}]", w, positive=True) for i, w in enumerate(weights))
    if len(values) != teachers:
        raise ValueError(f"weights has {len(values)} entries for {teachers} teachers (teacher_logprobs [K, B, T])")
    return values


def reward_bounds(reward_min: Any, reward_max: Any) -> tuple[float | None, float | None]:
    """The distillation reward's optional clip, as floats: finite numbers (or None), ``reward_min <=
    reward_max``; the one rule of ``distillation_rewards`` and the teacher scorers."""
    low, high = (None if b is None else finite_number(name, b)
                 for name, b in (("reward_min", reward_min), ("reward_max", reward_max)))
    if low is not None and high is not None and low > high:
        raise ValueError(f"reward_min ({reward_min}) must not exceed reward_max ({reward_max})")
    return low, high


def distillation_rewards(teacher_logprobs: ArrayLike, logprobs: ArrayLike, loss_mask: ArrayLike,
                         weights: Sequence[float] | None = None, *, normalize_teacher_weights: bool = False,
                         reward_min: float | None = None, reward_max: float | None = None,
                         estimator: DistillationEstimator = "k1") -> jax.Array:
    """The dense on-policy distillation reward of each trained token (module docstring).

    Args:
      teacher_logprobs: ``[K, B, T]`` (or ``[B, T]``: one teacher) each teacher's log-prob of the sampled token.
      logprobs: ``[B, T]`` the student's log-probs of the same tokens (held constant: stop-gradient).
      loss_mask: ``[B, T]`` the trained tokens.
      weights: ``K`` finite weights > 0 (default 1 each), raw unless ``normalize_teacher_weights``.
      reward_min, reward_max: an optional clip of the reward, at trained tokens only.
      estimator: ``k1`` only (the others are named and refused: module docstring).
      normalize_teacher_weights: whether the teachers' weights are divided by their sum (AReaL's raw weights
        otherwise).

    Returns:
      ``[B, T]`` float32 (float64 for float64 inputs), 0 where untrained.

    Raises:
      ValueError: a refused estimator, bad weights or shapes, or (eagerly) a non-finite log-prob at a trained
        token.

    The worked example of on-policy distillation as verl computes it (verl-project/verl @ 1dda039b,
    verl/trainer/distillation/losses.py) and AReaL's MOPD (areal/trainer/mopd/loss.py) (two teachers, one token):

    >>> r = prm_jax.credit.distillation_rewards(np.array([[[-0.5]], [[-2.0]]]), np.array([[-1.0]]),
    ...                                         np.array([[True]]), weights=[0.3, 0.7])
    >>> round(float(r[0, 0]), 4)
    -0.55
    """
    one_of("estimator", estimator, DISTILLATION_ESTIMATORS)
    if estimator != "k1":
        raise ValueError(f"distillation_rewards(estimator={estimator!r}): {estimator} "
                         + _NOT_A_REWARD.format(estimator))
    boolean("normalize_teacher_weights", normalize_teacher_weights, config=False)
    bounds = reward_bounds(reward_min, reward_max)
    check_token_arrays(logprobs, loss_mask=loss_mask)
    teachers = np.shape(teacher_logprobs)
    if len(teachers) == 2:
        _checks.check_shape("teacher_logprobs", teacher_logprobs, np.shape(logprobs), "logprobs")
        teacher_logprobs = jnp.asarray(teacher_logprobs)[None]
    elif len(teachers) != 3 or tuple(teachers[1:]) != tuple(np.shape(logprobs)):
        raise ValueError(f"teacher_logprobs must be [K, B, T] with [B, T] = {np.shape(logprobs)}, got {teachers}")
    return _checks.checked(_rewards_jit, teacher_logprobs, logprobs, loss_mask,
                           weights=_teacher_weights(weights, np.shape(teacher_logprobs)[0]),
                           normalize=normalize_teacher_weights, bounds=bounds)


@functools.partial(jax.jit, static_argnames=("weights", "normalize", "bounds"))
def _rewards_jit(teacher_logprobs, logprobs, loss_mask, *, weights, normalize, bounds):
    dtype = _checks.accumulation_dtype(teacher_logprobs, logprobs)
    mask = _checks.as_mask("loss_mask", loss_mask)
    zero = jnp.zeros((), dtype)
    teacher = _checks.as_float("teacher_logprobs", teacher_logprobs, dtype)
    student = lax.stop_gradient(_checks.as_float("logprobs", logprobs, dtype))
    checks = [_checks.finite_check("logprobs", jnp.where(mask, student, zero), mask),
              *[_checks.finite_check(f"teacher_logprobs[{k}]", jnp.where(mask, teacher[k], zero), mask,
                                     key=f"teacher_logprobs_{k}") for k in range(teacher.shape[0])],
              *_checks.mask_check("loss_mask", loss_mask)]
    teacher = jnp.where(mask[None], teacher, zero)
    student = jnp.where(mask, student, zero)
    w = jnp.asarray(weights, dtype)
    scored = jnp.tensordot(w, teacher, axes=1)
    total = math.fsum(weights)
    rewards = scored / max(total, 1e-8) - student if normalize else scored - jnp.asarray(total, dtype) * student
    low, high = bounds
    if low is not None or high is not None:
        rewards = jnp.clip(rewards, low, high)
    return jnp.where(mask, rewards, zero), checks


def distillation_loss(logprobs: ArrayLike, old_logprobs: ArrayLike, rewards: ArrayLike, loss_mask: ArrayLike, *,
                      importance_ratio_cap: float = 5.0, normalization_mask: ArrayLike | None = None
                      ) -> tuple[jax.Array, DistillationStats]:
    """AReaL's on-policy distillation loss (module docstring): ``sum(-rho r) / max(#normalization tokens, 1)``.

    Args:
      logprobs: ``[B, T]`` the student's current log-probs (the gradient flows through them).
      old_logprobs: ``[B, T]`` the log-probs the tokens were sampled with.
      rewards: ``[B, T]`` ``distillation_rewards``' (held constant).
      loss_mask: ``[B, T]`` the trained tokens.
      importance_ratio_cap: ``rho``'s cap, a finite number > 0 (AReaL's 5).
      normalization_mask: ``[B, T]`` the tokens the sum is divided by (default ``loss_mask``; a filter's
        pre-filter mask keeps the dropped tokens in the denominator).

    Returns:
      ``(loss, DistillationStats)``. Combine with an RL loss: ``rl_coef * rl + distill_coef * loss``.

    Example:
        >>> logprobs = np.log(np.array([[0.5, 0.5]], np.float32))
        >>> rewards = np.array([[0.2, -0.1]], np.float32)
        >>> loss, _ = prm_jax.losses.distillation_loss(logprobs, logprobs, rewards, np.ones((1, 2), bool))
        >>> round(float(loss), 4)
        -0.05
    """
    cap = finite_number("importance_ratio_cap", importance_ratio_cap, positive=True)
    check_token_arrays(logprobs, old_logprobs=old_logprobs, rewards=rewards, loss_mask=loss_mask,
                       normalization_mask=normalization_mask)
    return _checks.checked(_loss_jit, logprobs, old_logprobs, rewards, loss_mask, normalization_mask,
                           log_cap=math.log(cap), on_trace="counts")


@functools.partial(jax.jit, static_argnames=("log_cap",))
def _loss_jit(logprobs, old_logprobs, rewards, loss_mask, normalization_mask, *, log_cap):
    dtype = _checks.accumulation_dtype(logprobs, old_logprobs, rewards)
    mask = _checks.as_mask("loss_mask", loss_mask)
    zero = jnp.zeros((), dtype)
    given, checks = _checks.finite_floats({"logprobs": logprobs, "old_logprobs": old_logprobs, "rewards": rewards},
                                          mask, dtype)
    logp = given["logprobs"]
    old, reward = lax.stop_gradient(given["old_logprobs"]), lax.stop_gradient(given["rewards"])
    checks += _checks.mask_check("loss_mask", loss_mask)
    log_ratio = lax.stop_gradient(logp) - old
    rho = jnp.exp(jnp.minimum(log_ratio, log_cap))
    carrier = jnp.exp(logp - lax.stop_gradient(logp))  # 1, with the score function's gradient on logp
    per_token = jnp.where(mask, -rho * reward * carrier, zero)
    norm = mask if normalization_mask is None else _checks.as_mask("normalization_mask", normalization_mask)
    count = jnp.maximum(jnp.sum(norm, dtype=jnp.int32), 1).astype(dtype)
    active = jnp.maximum(jnp.sum(mask, dtype=jnp.int32), 1).astype(dtype)
    stats = DistillationStats(lax.stop_gradient(jnp.sum(per_token)) / active,
                              jnp.sum(mask & (log_ratio >= log_cap), dtype=jnp.int32).astype(dtype) / active)
    return _checks.counted(jnp.sum(per_token) / count, stats, checks)


def distillation_estimate(logprobs: jax.Array, teacher_logprobs: jax.Array, estimator: DistillationEstimator
                          ) -> jax.Array:
    """verl's ``kl_penalty`` estimators of the student against the teacher, per token: ``k1`` ``l - l_T``,
    ``abs`` ``|l - l_T|``, ``k2`` ``(l - l_T)^2 / 2``, ``k3`` ``clamp(e^x - x - 1, +-10)`` with ``x =
    clamp(l_T - l, +-20)``, and ``k3+`` (verl's ``+`` suffix): ``k3``'s value with ``k2``'s gradient, ``d D / d l
    = l - l_T`` (``k2 + stop_gradient(k3 - k2)``)."""
    d = logprobs - teacher_logprobs
    if estimator == "k1":
        return d
    if estimator == "abs":
        return jnp.abs(d)
    k2 = 0.5 * d * d
    if estimator == "k2":
        return k2
    x = jnp.clip(-d, -20.0, 20.0)
    k3 = jnp.clip(jnp.expm1(x) - x, -10.0, 10.0)
    if estimator == "k3+":
        return k2 + lax.stop_gradient(k3 - k2)
    return k3


def supervised_distillation_loss(logprobs: ArrayLike, teacher_logprobs: ArrayLike, loss_mask: ArrayLike, *,
                                 estimator: DistillationEstimator = "k3", loss_max_clamp: float | None = None,
                                 loss_agg_mode: AggMode = "token-mean", dp_size: int = 1,
                                 batch_num_tokens: Any = None, global_batch_size: Any = None) -> jax.Array:
    """verl's supervised distillation loss: ``D(l, l_T)`` (``distillation_estimate``), clamped to
    ``+-loss_max_clamp`` when given, aggregated by ``loss_agg_mode`` (verl's five, with the global batch info
    of the policy losses) and differentiated through the estimator (the teacher held constant).

    Args:
        teacher_logprobs: ``[B, T]`` the teacher's log-probs of the same tokens (held constant).
        estimator: verl's divergence estimator of ``D(l, l_T)``: ``k1``, ``k2``, ``k3``, ...
            (``distillation_estimate``).
        loss_max_clamp: The per-token loss is clamped to ``[-loss_max_clamp, loss_max_clamp]``; ``None``: not clamped.

    Example:
        >>> student, teacher = np.log(np.array([[0.5, 0.25]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> loss = prm_jax.losses.supervised_distillation_loss(student, teacher, np.ones((1, 2), bool), estimator="k1")
        >>> round(float(loss), 4)
        -0.3466
    """
    one_of("estimator", estimator, DISTILLATION_ESTIMATORS)
    clamp = None if loss_max_clamp is None else finite_number("loss_max_clamp", loss_max_clamp, positive=True)
    check_token_arrays(logprobs, teacher_logprobs=teacher_logprobs, loss_mask=loss_mask)
    counts = checked_global_batch(loss_agg_mode, dp_size, batch_num_tokens, global_batch_size)
    return _checks.checked(_supervised_jit, logprobs, teacher_logprobs, loss_mask, counts.batch_num_tokens,
                           counts.global_batch_size, estimator=estimator, clamp=clamp, loss_agg_mode=loss_agg_mode,
                           dp_size=dp_size, on_trace="callback")


@functools.partial(jax.jit, static_argnames=("estimator", "clamp", "loss_agg_mode", "dp_size"))
def _supervised_jit(logprobs, teacher_logprobs, loss_mask, batch_num_tokens, global_batch_size, *, estimator, clamp,
                    loss_agg_mode, dp_size):
    dtype = _checks.accumulation_dtype(logprobs, teacher_logprobs)
    mask = _checks.as_mask("loss_mask", loss_mask)
    zero = jnp.zeros((), dtype)
    given, checks = _checks.finite_floats({"logprobs": logprobs, "teacher_logprobs": teacher_logprobs}, mask, dtype)
    logp, teacher = given["logprobs"], lax.stop_gradient(given["teacher_logprobs"])
    checks += [*_checks.mask_check("loss_mask", loss_mask),
               *global_batch_checks(mask, GlobalBatch(dp_size, batch_num_tokens, global_batch_size))]
    estimate = distillation_estimate(logp, teacher, estimator)
    if clamp is not None:
        estimate = jnp.clip(estimate, -clamp, clamp)
    loss = aggregate(jnp.where(mask, estimate, zero), mask, loss_agg_mode,
                     global_batch=GlobalBatch(dp_size, batch_num_tokens, global_batch_size))
    return loss, checks
