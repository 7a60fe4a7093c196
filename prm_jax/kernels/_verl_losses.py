"""verl's policy losses beside AReaL's PPO clip (verl's policy losses (verl-project/verl @ 1dda039b,
verl/trainer/ppo/core_algos.py) and TRL's (huggingface/trl @ f2cd5771)), as verl computes them, values and
gradients (issue 33.2): ``vanilla_ppo_loss``, ``gspo_loss`` (and TRL's ``gspo_sequence_loss``),
``geo_mean_loss``, ``dppo_tv_loss``, ``dppo_kl_loss``, ``clip_cov_loss``, ``kl_cov_loss``, ``gpg_loss``,
``dro_loss``, ``cispo_loss`` and ``sapo_loss``, and verl's ``agg_loss`` with its five ``loss_agg_mode``s
(``aggregate``); ``policy_loss(..., mode=)`` selects one by verl's ``policy_loss.loss_mode`` name.

Every loss takes ``ppo_clip_loss``'s argument names (``logprobs``, ``proximal_logprobs``: the old log-probs
the ratio is taken against, ``advantages``, ``loss_mask``, ``loss_agg_mode``) and verl's hyper-parameter
names and defaults, on ``[B, T]`` timesteps; gradients flow through ``logprobs`` only. ``rollout_is_weights``
(verl's optional constant per-token weights) multiply the per-token loss before aggregation.

Conventions kept from verl, to the gradient (torch's gradient rules, as verl's and AReaL's losses get them (torch.clamp: 1
strictly inside, 0 at a bound and beyond; torch.min/max: 1/2 each at a tie)): the log ratio ``d = logprobs -
proximal_logprobs`` is clamped to ``[-20, 20]`` as ``torch.clamp`` does it, passing the gradient only strictly
inside (``_torch_clamp``); a row's token mean divides by ``n_b + 1e-8`` (seq-mean-token-mean); metrics are
``masked_mean`` with ``N + 1e-8``. One rule of prm-jax's own, for every loss: an empty batch (no trained
timestep, or no non-empty row in a sequence mode) gives a loss of 0 with a zero gradient, where verl's
token-mean and sequence modes give NaN.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax._validation import finite_number, integer, one_of
from prm_jax.kernels import _checks
from prm_jax.kernels._policy_loss import (
    AggMode,
    GlobalBatch,
    _clipped_objective,
    aggregate,
    check_token_arrays,
    checked_global_batch,
    global_batch_checks,
)

VerlAggMode = AggMode
#: verl's five ``loss_agg_mode`` names (``core_algos.agg_loss``), derived from ``VerlAggMode``.
VERL_AGG_MODES: tuple[VerlAggMode, ...] = get_args(VerlAggMode)
LOG_RATIO_CLAMP = 20.0  # verl's clamp of the token log ratio (vanilla, sapo, cispo, dppo)
GSPO_LOG_RATIO_CAP = 10.0  # verl's gspo caps the sequence log ratio from above


class PolicyLossStats(NamedTuple):
    """verl's metrics of a policy loss (``masked_mean``: over trained timesteps, ``N + 1e-8``), and the value
    checks' violation counts.

    Attributes:
        pg_clipfrac: The share of trained timesteps where the clip (or the loss's own gate) was taken.
        ppo_kl: The mean of ``-d``, ``d = logprobs - proximal_logprobs`` (each loss says whether clamped).
        pg_clipfrac_lower: The share where the dual clip cut (``A < 0``).

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.vanilla_ppo_loss(logprobs, old, advantages, mask)
        >>> round(float(stats.pg_clipfrac), 4), round(float(stats.ppo_kl), 4), round(float(stats.pg_clipfrac_lower), 4)
        (0.5, -0.2939, 0.0)
    """

    pg_clipfrac: jax.Array        # the share of tokens the loss clipped (0 where it clips nothing)
    ppo_kl: jax.Array             # mean of -(clamped) log ratio
    pg_clipfrac_lower: jax.Array  # the share clipped on the lower side (0 where the loss has none)
    checks: dict[str, jax.Array] = {}  # (replaced by each loss, never mutated)


def _torch_clamp(x: jax.Array, low: float, high: float) -> jax.Array:
    """``clip(x, low, high)`` with ``torch.clamp``'s gradient: 1 strictly inside, 0 at a bound and beyond
    (``jnp.clip`` passes 1/2 at a bound)."""
    return jnp.where((x > low) & (x < high), x, lax.stop_gradient(jnp.clip(x, low, high)))


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """verl's ``masked_mean``: ``sum(M x) / (N + 1e-8)``, NaN-safe where ``M = 0``."""
    zero = jnp.zeros((), x.dtype)
    return jnp.sum(jnp.where(mask, x, zero)) / (jnp.sum(mask, dtype=jnp.int32).astype(x.dtype) + 1e-8)


def _prepared(logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, per_row_advantages=False):
    """The inputs as float arrays (the accumulation dtype) and a bool mask, zero where untrained; gradients
    flow through ``logprobs`` only. ``per_row_advantages``: ``[B]`` advantages, one per row (TRL's)."""
    dtype = _checks.accumulation_dtype(logprobs, proximal_logprobs, advantages)
    mask = _checks.as_mask("loss_mask", loss_mask)
    zero = jnp.zeros((), dtype)
    logp = jnp.where(mask, _checks.as_float("logprobs", logprobs, dtype), zero)
    old = lax.stop_gradient(jnp.where(mask, _checks.as_float("proximal_logprobs", proximal_logprobs, dtype), zero))
    adv = _checks.as_float("advantages", advantages, dtype)
    adv = lax.stop_gradient(adv if per_row_advantages else jnp.where(mask, adv, zero))
    weights = (None if rollout_is_weights is None else
               lax.stop_gradient(_checks.as_float("rollout_is_weights", rollout_is_weights, dtype)))
    return logp, old, adv, mask, weights


def _weighted(losses: jax.Array, weights: jax.Array | None) -> jax.Array:
    return losses if weights is None else losses * weights


@functools.partial(jax.jit, static_argnames=("kind", "loss_agg_mode", "params", "loss_scale_factor", "dp_size"))
def _loss_jit(logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, extra=None, batch_num_tokens=None,
              global_batch_size=None, *, kind, loss_agg_mode, params, loss_scale_factor, dp_size=1):
    counts = GlobalBatch(dp_size, batch_num_tokens, global_batch_size)
    logp, old, adv, mask, weights = _prepared(logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights)
    input_checks = [*_checks.mask_check("loss_mask", loss_mask), *global_batch_checks(mask, counts)]
    zero = jnp.zeros((), logp.dtype)
    d = logp - old
    clipped = jnp.zeros_like(mask)
    lower = jnp.zeros_like(mask)
    if kind in ("kl_cov", "clip_cov"):
        loss, stats, check = (_kl_cov if kind == "kl_cov" else _clip_cov)(logp, adv, mask, weights, d, extra, params,
                                                                        loss_agg_mode, loss_scale_factor, counts)
        return _checks.counted(loss, stats, [*input_checks, check])
    if kind == "geo_mean":
        low, high = params
        loss, stats, check = _geo_mean(logp, adv, mask, weights, d, low, high)
        return _checks.counted(loss, stats, [*input_checks, check])
    if kind == "vanilla":
        low, high, cap = params
        x = _torch_clamp(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        losses, _, clipped, lower = _clipped_objective(adv, x, mask, 1.0 - low, 1.0 + high, cap)
        lower = lower & (adv < 0)
        kl_mean = _masked_mean(-lax.stop_gradient(x), mask)
    elif kind == "gspo":
        low, high = params
        # The row's mean log ratio s_b, attached to each token with derivative 1 in that token's own logprob
        # (and none through s_b), capped at 10 from above with torch's gradient (none at exactly 10).
        per_row = jnp.sum(mask, axis=1, dtype=jnp.int32).astype(logp.dtype)
        mean = lax.stop_gradient(jnp.sum(jnp.where(mask, d, zero), axis=1) / jnp.maximum(per_row, 1))
        token = logp - lax.stop_gradient(logp) + mean[:, None]
        capped = jnp.where(token < GSPO_LOG_RATIO_CAP, token, lax.stop_gradient(jnp.minimum(token, GSPO_LOG_RATIO_CAP)))
        losses, _, clipped, _ = _clipped_objective(adv, capped, mask, 1.0 - low, 1.0 + high, None)
        kl_mean = _masked_mean(-lax.stop_gradient(d), mask)
    elif kind == "gpg":
        losses, kl_mean = -logp * adv, zero  # (verl reports no metrics for gpg)
    elif kind == "dro":
        (beta,) = params
        losses = -(logp * adv - 0.5 * beta * d * d)
        kl_mean = _masked_mean(-lax.stop_gradient(d), mask)
    else:
        x = _torch_clamp(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl_mean = _masked_mean(-lax.stop_gradient(x), mask)
        ratio = jnp.exp(x)
        if kind in ("dppo_tv", "dppo_kl"):
            low, high, cap = params
            truncated = lax.stop_gradient(jnp.minimum(ratio, cap))
            p_new, p_old = jnp.exp(lax.stop_gradient(logp)), jnp.exp(old)
            positive = adv > 0  # (zero advantages take the negative branch)
            if kind == "dppo_tv":
                valid = jnp.where(positive, p_new - p_old <= high, p_new - p_old >= -low)
            else:
                divergence = p_old * (old - lax.stop_gradient(logp)) + (1.0 - p_old) * jnp.log(
                    (1.0 - p_old + 1e-8) / (1.0 - p_new + 1e-8))  # NaN for p > 1: compares False
                valid = jnp.where(positive, (divergence <= high) | (p_new <= p_old),
                                  (divergence <= low) | (p_new >= p_old))
            valid = valid & mask
            losses = -adv * truncated * logp * valid.astype(logp.dtype)
            clipped = mask & ~valid
            lower = valid & (lax.stop_gradient(ratio) > cap)
        elif kind == "cispo":
            low, high = params
            fixed = lax.stop_gradient(ratio)
            weight = jnp.clip(fixed, 1.0 - low, 1.0 + high)
            clipped = mask & (fixed != weight)
            losses = -weight * adv * logp
        else:  # sapo
            tau_pos, tau_neg = params
            tau = jnp.where(adv > 0, jnp.asarray(tau_pos, logp.dtype), jnp.asarray(tau_neg, logp.dtype))
            losses = -jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv
    losses = jnp.where(mask, _weighted(losses, weights), zero)
    loss = aggregate(losses, mask, loss_agg_mode, loss_scale_factor, counts)
    stats = PolicyLossStats(_masked_mean(clipped.astype(logp.dtype), mask), kl_mean,
                            _masked_mean(lower.astype(logp.dtype), mask))
    return _checks.counted(loss, stats, input_checks)


def _geo_mean(logp, adv, mask, weights, d, low, high):
    """GMPO (verl's compute_policy_loss_geo_mean (verl-project/verl @ 1dda039b, core_algos.py:1928-2010)): the row's geometric
    mean of token-capped ratios times its mean advantage."""
    zero = jnp.zeros((), logp.dtype)
    sign = jnp.sign(adv)
    capped = _torch_clamp(d, -low, high)
    # A > 0 caps the log ratio from above only, A < 0 from below only, A = 0 gives 0; jnp.minimum halves a
    # tie as torch.min does (the 1/2 at exactly a bound).
    m = jnp.where(mask, sign * jnp.minimum(sign * d, sign * capped), zero)
    per_row = jnp.sum(mask, axis=1, dtype=jnp.int32).astype(logp.dtype)
    log_ratio = jnp.sum(m, axis=1) / (per_row + 1e-8)
    ratio = jnp.exp(log_ratio)
    mean_adv = jnp.sum(jnp.where(mask, adv, zero), axis=1) / (per_row + 1e-8)
    rows = -mean_adv * ratio
    if weights is not None:
        rows = rows * jnp.exp(jnp.sum(jnp.where(mask, jnp.log(weights + 1e-10), zero), axis=1) / (per_row + 1e-8))
    loss = jnp.sum(rows) / max(logp.shape[0], 1)  # verl's torch.mean: empty rows count (they add 0)
    fixed = lax.stop_gradient(d)
    clipped = mask & (fixed != lax.stop_gradient(capped))
    stats = PolicyLossStats(_masked_mean((clipped & (adv > 0)).astype(logp.dtype), mask),
                            _masked_mean(-fixed, mask), _masked_mean((clipped & (adv < 0)).astype(logp.dtype), mask))
    overflow = ~jnp.isfinite(lax.stop_gradient(ratio)) & (per_row > 0)
    check = _checks.ValueCheck("geo_mean_ratio_overflow", _checks.violations(overflow),
                               lambda row: f"geo_mean_loss: row {int(row)}'s geometric-mean ratio overflows float32 "
                                           "(its mean capped log ratio is above ~88: a negative advantage, whose log "
                                           "ratio GMPO does not cap from above)", _checks.first_true(overflow))
    return loss, stats, check


def _smallest(keys: jax.Array, eligible: jax.Array, k: jax.Array, ratio: float) -> jax.Array:
    """``[B, T]`` bool: the ``k`` eligible entries of smallest ``keys`` (ties by row-major position), where
    ``k <= floor(ratio * B * T) + 1``: a ``lax.top_k`` of that static size (a partial sort, not a sort of every
    token: 35-49 ms -> under 1 ms at 64x2048 on the CPU), then its first ``k``."""
    flat = jnp.where(eligible, keys, jnp.inf).ravel()
    bound = min(flat.size, math.floor(ratio * flat.size) + 1)
    _, order = lax.top_k(-flat, bound)  # the largest of -keys: ties by lower index, as a stable sort's
    taken = jnp.zeros(flat.shape, jnp.bool_).at[order].set(jnp.arange(bound, dtype=jnp.int32) < k)
    return taken.reshape(keys.shape) & eligible


def _overflow_check(name: str, losses: jax.Array, mask: jax.Array, who: str) -> _checks.ValueCheck:
    """Trained tokens whose loss is not finite for finite inputs: an unclamped ratio that overflowed."""
    flags = mask & ~jnp.isfinite(lax.stop_gradient(losses))
    return _checks.ValueCheck(name, _checks.violations(flags),
                              lambda at: f"{who}: the loss at flat position {int(at)} is not finite: its ratio "
                                         f"exp(logprobs - proximal_logprobs) overflows float32 (a log ratio above "
                                         f"~88.7; {who} does not clamp it)", _checks.first_true(flags))


def _kl_cov(logp, adv, mask, weights, d, extra, params, loss_agg_mode, loss_scale_factor, counts):
    """KL-Cov (verl's compute_policy_loss_kl_cov (verl-project/verl @ 1dda039b, core_algos.py:1848-1924)): the tokens of the
    largest covariance get a |log ratio| penalty, no clip anywhere."""
    ratio_kl, coef = params
    zero = jnp.zeros((), logp.dtype)
    ratio = jnp.where(mask, jnp.exp(d), zero)
    n = jnp.sum(mask, dtype=jnp.int32)
    count = jnp.maximum(n, 1).astype(logp.dtype)
    fixed_logp = lax.stop_gradient(logp)
    cov = ((adv - jnp.sum(jnp.where(mask, adv, zero)) / count) *
           (fixed_logp - jnp.sum(jnp.where(mask, fixed_logp, zero)) / count))
    k = jnp.maximum(jnp.floor(n.astype(jnp.float32) * ratio_kl).astype(jnp.int32), 1)
    selected = _smallest(-cov, mask, k, ratio_kl)  # the k largest (ties: the earlier position)
    absolute = d * lax.stop_gradient(jnp.sign(d))  # |d| with sign(0) = 0 as its gradient (torch's abs)
    losses = jnp.where(selected, -adv * ratio + coef * absolute, -adv * ratio)
    losses = jnp.where(mask, _weighted(losses, weights), zero)
    loss = aggregate(losses, mask, loss_agg_mode, loss_scale_factor, counts)
    stats = PolicyLossStats(jnp.zeros((), logp.dtype), _masked_mean(jnp.abs(lax.stop_gradient(d)), mask),
                            jnp.zeros((), logp.dtype))
    return loss, stats, _overflow_check("kl_cov_ratio_overflow", losses, mask, "kl_cov_loss")


def _clip_cov(logp, adv, mask, weights, d, extra, params, loss_agg_mode, loss_scale_factor, counts):
    """Clip-Cov (verl's compute_policy_loss_clip_cov (verl-project/verl @ 1dda039b, core_algos.py:1743-1844)): PPO's clip, and a
    random few high-covariance tokens dropped from the loss."""
    low, high, ratio_cov, lb, ub, given = params
    zero = jnp.zeros((), logp.dtype)
    pg, _, clip_taken, _ = _clipped_objective(adv, d, mask, 1.0 - low, 1.0 + high, None)
    fixed_logp = lax.stop_gradient(logp)
    cov = (adv - _masked_mean(adv, mask)) * (fixed_logp - _masked_mean(fixed_logp, mask))
    cov = jnp.where(mask & ~clip_taken, cov, -jnp.inf)
    candidates = mask & (cov > lb) & (cov < ub)
    n = jnp.sum(mask, dtype=jnp.int32)
    clip_num = jnp.maximum(jnp.floor(n.astype(jnp.float32) * ratio_cov).astype(jnp.int32), 1)
    if given:  # the chosen tokens, as the caller fixed them
        chosen = mask & extra
    else:  # a uniform random subset of min(clip_num, #candidates) candidates (verl's randperm)
        priority = jax.random.uniform(extra, logp.shape)
        chosen = _smallest(priority, candidates, clip_num, ratio_cov)
    losses = jnp.where(mask & ~chosen, _weighted(pg, weights), zero)
    loss = aggregate(losses, mask, loss_agg_mode, loss_scale_factor, counts)
    stats = PolicyLossStats(_masked_mean(chosen.astype(logp.dtype), mask), _masked_mean(-lax.stop_gradient(d), mask),
                            jnp.zeros((), logp.dtype))
    return loss, stats, _overflow_check("clip_cov_ratio_overflow", losses, mask, "clip_cov_loss")


def _run(kind: str, logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, loss_agg_mode,
         params: tuple[float, ...], loss_scale_factor: float | None, extra=None, *,
         global_batch: GlobalBatch = GlobalBatch()) -> tuple[jax.Array, PolicyLossStats]:
    one_of("loss_agg_mode", loss_agg_mode, VERL_AGG_MODES)
    counts = checked_global_batch(loss_agg_mode, *global_batch)
    if loss_scale_factor is not None:
        loss_scale_factor = finite_number("loss_scale_factor", loss_scale_factor, minimum=0.0)
        if loss_scale_factor == 0:
            raise ValueError("loss_scale_factor must be > 0")
    check_token_arrays(logprobs, proximal_logprobs=proximal_logprobs, advantages=advantages, loss_mask=loss_mask,
                       rollout_is_weights=rollout_is_weights)
    # Eagerly a failed check raises; under jit its count is in stats.checks.
    return _checks.checked(_loss_jit, logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, extra,
                           counts.batch_num_tokens, counts.global_batch_size, kind=kind, loss_agg_mode=loss_agg_mode,
                           params=params, loss_scale_factor=loss_scale_factor, dp_size=counts.dp_size,
                           on_trace="counts")


def vanilla_ppo_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike,
                     *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0,
                     rollout_is_weights: ArrayLike | None = None, loss_agg_mode: VerlAggMode = "token-mean",
                     loss_scale_factor: float | None = None, dp_size: int = 1, batch_num_tokens: Any = None,
                     global_batch_size: Any = None) -> tuple[jax.Array, PolicyLossStats]:
    """verl's ``vanilla`` PPO loss (verl's compute_policy_loss_vanilla (verl-project/verl @ 1dda039b, core_algos.py:1286-1376)):
    ``ppo_clip_loss``'s clip with verl's differences: the log
    ratio clamped to ``[-20, 20]`` (no gradient at or past a bound), the dual clip always on (``clip_ratio_c
    > 1``, 3.0), rollout weights instead of AReaL's behaviour cap, verl's five aggregations. The gradient at
    exactly a clip bound or at a dual-clip tie is half, as torch's. Returns ``(loss, PolicyLossStats)``:
    ``pg_clipfrac`` where the clip was taken, ``pg_clipfrac_lower`` where the dual clip cut (``A < 0``),
    ``ppo_kl`` the mean of the clamped ``-d``.

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.vanilla_ppo_loss(logprobs, old, advantages, mask)
        >>> round(float(loss), 4), round(float(stats.pg_clipfrac), 4)
        (-1.1, 0.5)
    """
    cap = finite_number("clip_ratio_c", clip_ratio_c)
    if cap <= 1:
        raise ValueError(f"clip_ratio_c must be > 1 (the dual clip), got {clip_ratio_c!r}")
    return _run("vanilla", logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, loss_agg_mode,
                (*_clip_ratios(clip_ratio_low, clip_ratio_high), cap), loss_scale_factor,
                global_batch=GlobalBatch(dp_size, batch_num_tokens, global_batch_size))


def gspo_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
              clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, rollout_is_weights: ArrayLike | None = None,
              loss_agg_mode: VerlAggMode = "seq-mean-token-mean",
              loss_scale_factor: float | None = None, dp_size: int = 1, batch_num_tokens: Any = None,
              global_batch_size: Any = None) -> tuple[jax.Array, PolicyLossStats]:
    """verl's ``gspo`` (GSPO-token, Zheng et al. 2025): PPO's clip on the *sequence* ratio. Each token's log
    ratio is its row's mean ``s_b = sum_t M d / max(n_b, 1)`` (a value shared by the row, a derivative of 1 in
    the token's own ``logprobs``, none through the mean), capped at 10 from above (no gradient at or past
    it), ``rho = exp``; ``L = max(-A rho, -A clip(rho, 1 - low, 1 + high))`` with torch's gradient (half at
    exactly a bound, torch's gradient rules, as verl's and AReaL's losses get them (torch.clamp: 1 strictly inside, 0 at a bound
    and beyond; torch.min/max: 1/2 each at a tie)). Per-token advantages are allowed (GSPO-token); row-constant ones give
    the paper's sequence-level gradient. verl always aggregates it with ``seq-mean-token-mean`` (the default
    here; another mode is honoured). The GSPO paper's clip ranges are far smaller (3e-4 / 4e-4). Returns
    ``(loss, PolicyLossStats)``: ``pg_clipfrac`` where the clipped term was taken, ``ppo_kl`` the mean of
    ``-d`` (unclamped).

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.gspo_loss(logprobs, old, advantages, mask)
        >>> round(float(loss), 4), round(float(stats.pg_clipfrac), 4)
        (-1.2, 1.0)
    """
    low, high = _clip_ratios(clip_ratio_low, clip_ratio_high)
    return _run("gspo", logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, loss_agg_mode,
                (low, high), loss_scale_factor,
                global_batch=GlobalBatch(dp_size, batch_num_tokens, global_batch_size))


def geo_mean_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
                  clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                  rollout_is_weights: ArrayLike | None = None) -> tuple[jax.Array, PolicyLossStats]:
    """verl's ``geo_mean`` (GMPO, Zhao et al. 2025): the row's *geometric* mean ratio. Each token's log ratio
    ``d`` is capped to ``[-low, high]`` on the side its advantage's sign makes risky (from above for ``A >
    0``, from below for ``A < 0``; 0 for ``A = 0``), ``R_b = exp(sum_t M m / (n_b + 1e-8))``, and the loss is
    the mean over all rows (empty ones count, adding 0) of ``-mean_t(A) R_b``, times the rows' geometric-mean
    ``rollout_is_weights``. No ±20 clamp, and, as in verl, no ``loss_agg_mode``: the row mean is the
    aggregation. The gradient is torch's (half at exactly a bound). A row whose ``R_b`` overflows float32 is
    counted (``stats.checks["checks/geo_mean_ratio_overflow"]``) and refused eagerly. The GMPO authors use a
    range of 0.4. Returns ``(loss, PolicyLossStats)``: ``pg_clipfrac`` / ``pg_clipfrac_lower`` the shares
    capped with ``A > 0`` / ``A < 0``.

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.geo_mean_loss(logprobs, old, advantages, mask)
        >>> round(float(loss), 4), round(float(stats.pg_clipfrac), 4)
        (-1.1052, 0.5)
    """
    low, high = _clip_ratios(clip_ratio_low, clip_ratio_high)
    return _run("geo_mean", logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, "token-mean",
                (low, high), None)


def dppo_tv_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
                 clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0,
                 rollout_is_weights: ArrayLike | None = None, loss_agg_mode: VerlAggMode = "token-mean",
                 loss_scale_factor: float | None = None, dp_size: int = 1, batch_num_tokens: Any = None,
                 global_batch_size: Any = None) -> tuple[jax.Array, PolicyLossStats]:
    """verl's ``dppo_tv`` (DPPO, binary total-variation trust region): ``L = -A sg(min(r, C)) logprobs *
    valid`` with ``r = exp(clamp(d, -20, 20))``, a REINFORCE gradient ``-A min(r, C)`` where the token stays
    within the region: ``p - p_old <= clip_ratio_high`` for ``A > 0``, ``>= -clip_ratio_low`` otherwise
    (``p = exp(logprobs)``; here the clip ratios are divergence bounds, not ratio bounds). ``clip_ratio_c``
    is verl's shipped 3.0 (its code's own fallback, 20, is never reached with its config; its example uses
    10000). Returns ``(loss, PolicyLossStats)``: ``pg_clipfrac`` the share masked out, ``pg_clipfrac_lower``
    the share truncated (``r > C``).

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.dppo_tv_loss(logprobs, old, advantages, mask)
        >>> round(float(loss), 4), round(float(stats.pg_clipfrac), 4)
        (0.3466, 0.5)
    """
    return _run("dppo_tv", logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, loss_agg_mode,
                _dppo_params(clip_ratio_low, clip_ratio_high, clip_ratio_c), loss_scale_factor,
                global_batch=GlobalBatch(dp_size, batch_num_tokens, global_batch_size))


def dppo_kl_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
                 clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0,
                 rollout_is_weights: ArrayLike | None = None, loss_agg_mode: VerlAggMode = "token-mean",
                 loss_scale_factor: float | None = None, dp_size: int = 1, batch_num_tokens: Any = None,
                 global_batch_size: Any = None) -> tuple[jax.Array, PolicyLossStats]:
    """verl's ``dppo_kl``: ``dppo_tv_loss`` with the binary KL region: ``D = p_old (logp_old - logp) + (1 -
    p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))``; a token is kept where ``D <= clip_ratio_high or p <=
    p_old`` (``A > 0``), ``D <= clip_ratio_low or p >= p_old`` otherwise (a log-prob above 0 makes ``D`` NaN:
    the comparison is False and the second part decides, as in verl). Returns ``(loss, PolicyLossStats)``.

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.dppo_kl_loss(logprobs, old, advantages, mask)
        >>> round(float(loss), 4), round(float(stats.pg_clipfrac), 4)
        (0.3466, 0.5)
    """
    return _run("dppo_kl", logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, loss_agg_mode,
                _dppo_params(clip_ratio_low, clip_ratio_high, clip_ratio_c), loss_scale_factor,
                global_batch=GlobalBatch(dp_size, batch_num_tokens, global_batch_size))


def _clip_ratios(low: float, high: float) -> tuple[float, float]:
    """verl's ``clip_ratio_low`` and ``clip_ratio_high``, checked (finite, >= 0)."""
    return (finite_number("clip_ratio_low", low, minimum=0.0), finite_number("clip_ratio_high", high, minimum=0.0))


def _dppo_params(low: float, high: float, cap: float) -> tuple[float, float, float]:
    cap = finite_number("clip_ratio_c", cap)
    if cap <= 0:
        raise ValueError(f"clip_ratio_c must be > 0, got {cap!r}")
    return (*_clip_ratios(low, high), cap)


def kl_cov_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
                kl_cov_ratio: float = 0.0002, ppo_kl_coef: float = 0.1, rollout_is_weights: ArrayLike | None = None,
                loss_agg_mode: VerlAggMode = "token-mean",
                loss_scale_factor: float | None = None, dp_size: int = 1, batch_num_tokens: Any = None,
                global_batch_size: Any = None) -> tuple[jax.Array, PolicyLossStats]:
    """verl's ``kl_cov`` (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"): no clip; the
    ``k = max(1, floor(N kl_cov_ratio))`` trained tokens of the largest covariance ``(A - mean A)(logprobs -
    mean logprobs)`` (plain means over the trained tokens; ties: the earlier row-major position, where torch's
    top-k leaves them unspecified) get ``-A r + ppo_kl_coef |d|``, the others ``-A r``, ``r = exp(d)``
    unclamped. The penalty's gradient is ``ppo_kl_coef sign(d)`` with ``sign(0) = 0`` (on-policy, ``d = 0``, it
    adds none, as torch's ``abs``). A token whose loss overflows (its ratio above float32) is counted
    (``checks/kl_cov_ratio_overflow``) and refused eagerly. ``ppo_kl`` is the mean ``|d|`` (verl's name).
    Returns ``(loss, PolicyLossStats)``.

    Args:
        kl_cov_ratio: The share of trained tokens (at least one) of the largest covariance that get the KL term.
        ppo_kl_coef: The coefficient of their ``|d|`` penalty.

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.kl_cov_loss(logprobs, old, advantages, mask, kl_cov_ratio=0.5)
        >>> round(float(loss), 4), round(float(stats.pg_clipfrac), 4)
        (-1.3706, 0.0)
    """
    ratio_kl = finite_number("kl_cov_ratio", kl_cov_ratio)
    if not 0 < ratio_kl <= 1:
        raise ValueError(f"kl_cov_ratio must be in (0, 1], got {kl_cov_ratio!r}")
    return _run("kl_cov", logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, loss_agg_mode,
                (ratio_kl, finite_number("ppo_kl_coef", ppo_kl_coef)), loss_scale_factor,
                global_batch=GlobalBatch(dp_size, batch_num_tokens, global_batch_size))


def clip_cov_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
                  key: jax.Array | None = None, chosen: ArrayLike | None = None, clip_ratio_low: float = 0.2,
                  clip_ratio_high: float = 0.2, clip_cov_ratio: float = 0.0002, clip_cov_lb: float = 1.0,
                  clip_cov_ub: float = 5.0, rollout_is_weights: ArrayLike | None = None,
                  loss_agg_mode: VerlAggMode = "token-mean",
                  loss_scale_factor: float | None = None, dp_size: int = 1, batch_num_tokens: Any = None,
                  global_batch_size: Any = None) -> tuple[jax.Array, PolicyLossStats]:
    """verl's ``clip_cov`` (Cui et al. 2025): PPO's clip (no dual clip, ``r = exp(d)`` unclamped, torch's
    gradient at a bound), and ``min(max(floor(N clip_cov_ratio), 1), #candidates)`` tokens chosen uniformly
    at random (``key``, a ``jax.random`` key: verl draws from torch's global generator) among the candidates,
    trained tokens the clip did not take whose covariance ``(A - mean A)(logprobs - mean logprobs)`` (verl's
    ``masked_mean``) lies strictly between ``clip_cov_lb`` and ``clip_cov_ub``; the chosen contribute neither
    loss nor gradient. ``chosen`` ``[B, T]`` bool fixes the choice instead of ``key`` (one of the two is
    required). ``pg_clipfrac`` is the share chosen; a token whose loss overflows (an unclamped ratio on the
    unclipped side) is counted (``checks/clip_cov_ratio_overflow``) and refused eagerly. Returns ``(loss,
    PolicyLossStats)``.

    Args:
        key: A ``jax.random`` key drawing the tokens excluded from the gradient; give it or ``chosen``.
        chosen: ``[B, T]`` bool fixing the excluded tokens instead of ``key``.
        clip_cov_ratio: The share of trained tokens excluded (at least one).
        clip_cov_lb: Candidates' covariance must exceed this lower bound.
        clip_cov_ub: And stay below this upper bound.

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.clip_cov_loss(logprobs, old, advantages, mask, chosen=np.array([[False, True]]))
        >>> round(float(loss), 4), round(float(stats.pg_clipfrac), 4)
        (-0.5, 0.5)
    """
    if (key is None) == (chosen is None):
        raise ValueError("clip_cov_loss needs exactly one of key (a jax.random key: a random choice of tokens) "
                         "and chosen ([B, T] bool: the tokens to drop)")
    ratio_cov = finite_number("clip_cov_ratio", clip_cov_ratio)
    if ratio_cov <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio!r}")
    if chosen is not None:
        _checks.check_shape("chosen", chosen, np.shape(logprobs), "logprobs")
        chosen = jnp.asarray(chosen, bool)
    params = (*_clip_ratios(clip_ratio_low, clip_ratio_high), ratio_cov,
              finite_number("clip_cov_lb", clip_cov_lb), finite_number("clip_cov_ub", clip_cov_ub), chosen is not None)
    return _run("clip_cov", logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, loss_agg_mode,
                params, loss_scale_factor, key if chosen is None else chosen,
                global_batch=GlobalBatch(dp_size, batch_num_tokens, global_batch_size))


def gpg_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
             rollout_is_weights: ArrayLike | None = None, loss_agg_mode: VerlAggMode = "token-mean",
             loss_scale_factor: float | None = None, dp_size: int = 1, batch_num_tokens: Any = None,
             global_batch_size: Any = None) -> tuple[jax.Array, PolicyLossStats]:
    """verl's ``gpg``: ``L = -logprobs * A`` (no ratio; gradient ``-A``), aggregated by ``loss_agg_mode``.
    ``proximal_logprobs`` is not read (kept for one signature). Returns ``(loss, PolicyLossStats)``.

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.gpg_loss(logprobs, old, advantages, mask)
        >>> round(float(loss), 4), round(float(stats.pg_clipfrac), 4)
        (0.3993, 0.0)
    """
    return _run("gpg", logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, loss_agg_mode, (),
                loss_scale_factor,
                global_batch=GlobalBatch(dp_size, batch_num_tokens, global_batch_size))


def dro_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
             dro_beta: float, rollout_is_weights: ArrayLike | None = None, loss_agg_mode: VerlAggMode = "token-mean",
             loss_scale_factor: float | None = None, dp_size: int = 1, batch_num_tokens: Any = None,
             global_batch_size: Any = None) -> tuple[jax.Array, PolicyLossStats]:
    """verl's ``dro``: ``L = -(logprobs * A - beta d^2 / 2)`` with ``d = logprobs - proximal_logprobs``
    (gradient ``-A + beta d``); ``dro_beta`` is required and ``> 0`` (verl's ``policy_loss.dro_beta``).
    Returns ``(loss, PolicyLossStats)``; ``ppo_kl`` is the mean of ``-d``.

    Args:
        dro_beta: β of the squared log-ratio penalty, > 0 (verl's ``policy_loss.dro_beta``; required).

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.dro_loss(logprobs, old, advantages, mask, dro_beta=0.1)
        >>> round(float(loss), 4), round(float(stats.ppo_kl), 4)
        (0.4079, -0.2939)
    """
    beta = finite_number("dro_beta", dro_beta)
    if beta <= 0:
        raise ValueError(f"dro_beta must be > 0, got {dro_beta!r}")
    return _run("dro", logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, loss_agg_mode, (beta,),
                loss_scale_factor,
                global_batch=GlobalBatch(dp_size, batch_num_tokens, global_batch_size))


def cispo_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
               clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, rollout_is_weights: ArrayLike | None = None,
               loss_agg_mode: VerlAggMode = "token-mean",
               loss_scale_factor: float | None = None, dp_size: int = 1, batch_num_tokens: Any = None,
               global_batch_size: Any = None) -> tuple[jax.Array, PolicyLossStats]:
    """verl's ``cispo`` (MiniMax-M1): ``L = -sg(clip(r, 1 - low, 1 + high)) * A * logprobs`` with ``r =
    exp(clamp(d, -20, 20))``: every token keeps a gradient, ``-weight * A``, clipped or not. The CISPO paper
    (and verl's example) drop the lower clip: ``clip_ratio_low=10``. ``pg_clipfrac`` is the share whose weight
    was clipped, either side. Returns ``(loss, PolicyLossStats)``.

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.cispo_loss(logprobs, old, advantages, mask)
        >>> round(float(loss), 4), round(float(stats.pg_clipfrac), 4)
        (0.4098, 0.5)
    """
    low, high = _clip_ratios(clip_ratio_low, clip_ratio_high)
    return _run("cispo", logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, loss_agg_mode,
                (low, high), loss_scale_factor,
                global_batch=GlobalBatch(dp_size, batch_num_tokens, global_batch_size))


def sapo_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
              tau_pos: float = 1.0, tau_neg: float = 1.05, rollout_is_weights: ArrayLike | None = None,
              loss_agg_mode: VerlAggMode = "seq-mean-token-mean",
              loss_scale_factor: float | None = None, dp_size: int = 1, batch_num_tokens: Any = None,
              global_batch_size: Any = None) -> tuple[jax.Array, PolicyLossStats]:
    """verl's ``sapo``: a soft gate instead of a clip, ``L = -sigmoid(tau (r - 1)) * 4 / tau * A`` with ``r =
    exp(clamp(d, -20, 20))`` and ``tau = tau_pos`` where ``A > 0``, else ``tau_neg`` (zero advantages take
    ``tau_neg``); gradient ``-A * 4 s (1 - s) r`` (slope 1 at ``r = 1``). verl always aggregates it with
    ``seq-mean-token-mean`` (its default here; another mode is honoured). Returns ``(loss,
    PolicyLossStats)``.

    Args:
        tau_pos: The gate's temperature where ``A > 0``, > 0.
        tau_neg: The gate's temperature where ``A <= 0``, > 0.

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.sapo_loss(logprobs, old, advantages, mask)
        >>> round(float(loss), 4), round(float(stats.ppo_kl), 4)
        (-2.3799, -0.2939)
    """
    pos = finite_number("tau_pos", tau_pos)
    neg = finite_number("tau_neg", tau_neg)
    if pos <= 0 or neg <= 0:
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos!r} and {tau_neg!r}")
    return _run("sapo", logprobs, proximal_logprobs, advantages, loss_mask, rollout_is_weights, loss_agg_mode,
                (pos, neg), loss_scale_factor,
                global_batch=GlobalBatch(dp_size, batch_num_tokens, global_batch_size))


TrlLossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "luspo"]
#: TRL's ``loss_type`` values ``gspo_sequence_loss`` aggregates by (derived from ``TrlLossType``).
TRL_LOSS_TYPES: tuple[TrlLossType, ...] = get_args(TrlLossType)


class SequenceClipStats(NamedTuple):
    """TRL's clip metrics of a sequence-level loss, over the ``B`` sequences (empty ones included).

    Attributes:
        low_mean: The share of sequences clipped at the lower bound with a negative advantage.
        high_mean: The share clipped at the upper bound with a positive advantage.
        region_mean: The share clipped either way.
        low_min: The smallest of the lower-clip indicators (TRL's ``clip_ratio/low_min``).
        high_max: The largest of the upper-clip indicators (TRL's ``clip_ratio/high_max``).

    Example:
        >>> logprobs, old = np.log(np.array([[0.9, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> _, stats = prm_jax.losses.gspo_sequence_loss(logprobs, old, np.array([1.0], np.float32), np.ones((1, 2), bool))
        >>> float(stats.high_mean), float(stats.low_mean), float(stats.region_mean)
        (1.0, 0.0, 1.0)
    """

    low_mean: jax.Array     # share of rows with ratio < 1 - epsilon and A < 0
    high_mean: jax.Array    # share of rows with ratio > 1 + epsilon_high and A > 0
    region_mean: jax.Array  # either
    low_min: jax.Array      # min of the low flags
    high_max: jax.Array     # max of the high flags
    checks: dict[str, jax.Array] = {}


@functools.partial(jax.jit, static_argnames=("low", "high", "delta", "loss_type", "max_completion_length",
                                             "num_items_in_batch"))
def _sequence_jit(logprobs, proximal_logprobs, advantages, loss_mask, *, low, high, delta, loss_type,
                  max_completion_length, num_items_in_batch):
    logp, old, adv, mask, _ = _prepared(logprobs, proximal_logprobs, advantages, loss_mask, None,
                                        per_row_advantages=True)
    dtype = logp.dtype
    zero = jnp.zeros((), dtype)
    per_row = jnp.sum(mask, axis=1, dtype=jnp.int32).astype(dtype)
    ratio = jnp.exp(jnp.sum(logp - old, axis=1) / jnp.maximum(per_row, 1))  # the gradient flows through the mean
    clipped = _torch_clamp(ratio, 1.0 - low, 1.0 + high)
    capped = ratio if delta is None else jnp.where(ratio < delta, ratio, lax.stop_gradient(jnp.minimum(ratio, delta)))
    rows = -jnp.minimum(capped * adv, clipped * adv)  # jnp.minimum halves a tie, as torch.min
    count = jnp.sum(per_row)
    size = logprobs.shape[0]
    if loss_type == "grpo":
        loss = jnp.sum(per_row / jnp.maximum(per_row, 1) * rows) / max(size, 1)
    elif loss_type in ("bnpo", "dapo"):
        total = jnp.maximum(count, 1) if loss_type == "bnpo" or num_items_in_batch is None else max(num_items_in_batch, 1)
        loss = jnp.sum(per_row * rows) / total
    elif loss_type == "dr_grpo":
        loss = jnp.sum(per_row * rows) / (max(size, 1) * max_completion_length)
    else:  # luspo
        loss = jnp.sum(per_row * rows) / max(size, 1)
    fixed = lax.stop_gradient(capped)
    low_flags = ((fixed < 1.0 - low) & (adv < 0)).astype(dtype)
    high_flags = ((fixed > 1.0 + high) & (adv > 0)).astype(dtype)
    region = jnp.maximum(low_flags, high_flags)
    n = max(size, 1)
    stats = SequenceClipStats(jnp.sum(low_flags) / n, jnp.sum(high_flags) / n, jnp.sum(region) / n,
                              jnp.min(low_flags) if size else zero, jnp.max(high_flags) if size else zero)
    return _checks.counted(loss, stats, _checks.mask_check("loss_mask", loss_mask))


def gspo_sequence_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike,
                       *, epsilon: float = 0.2, epsilon_high: float | None = None, delta: float | None = None,
                       loss_type: TrlLossType = "grpo", max_completion_length: int = 512,
                       num_items_in_batch: int | None = None) -> tuple[jax.Array, SequenceClipStats]:
    """TRL's sequence-level GSPO (``GRPOTrainer`` with ``importance_sampling_level="sequence"``; huggingface/trl @ f2cd5771,
    trl/trainer/grpo_trainer.py):
    one ratio per row, ``c_b = exp(sum_t M d / max(n_b, 1))`` (the gradient flows through the mean), ``c2 =
    clip(c_b, 1 - epsilon, 1 + epsilon_high)`` with torch's gradient, ``delta`` an optional cap of ``c_b``
    (``min(c_b, delta)``), and the row loss ``-min(c_b' A_b, c2 A_b)`` (a tie halves). ``advantages`` is
    ``[B]``, one per row (TRL's). Aggregated by TRL's ``loss_type``: ``grpo`` (the mean over the ``B`` rows of
    each row's token mean: empty rows count, adding 0), ``bnpo`` (``sum n_b l_b / N``), ``dr_grpo`` (``/ (B
    max_completion_length)``), ``dapo`` (``/ num_items_in_batch``, one process; default ``N``), ``luspo`` (``sum
    n_b l_b / B``). TRL's names and defaults (``epsilon_high`` defaults to ``epsilon``). Returns ``(loss,
    SequenceClipStats)``.

    Args:
        epsilon: The clip's lower margin: ``c`` is clipped at ``1 - epsilon``.
        epsilon_high: The clip's upper margin (``1 + epsilon_high``); ``None``: ``epsilon``.
        delta: An upper cap of the sequence ratio (``min(c, delta)``); ``None``: none.
        loss_type: TRL's aggregation: ``grpo``, ``bnpo``, ``dr_grpo``, ``dapo`` or ``luspo``.
        max_completion_length: The divisor's length of ``dr_grpo`` (TRL's ``max_completion_length``).
        num_items_in_batch: The divisor of ``dapo``; ``None``: this call's trained tokens.

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> loss, stats = prm_jax.losses.gspo_sequence_loss(logprobs, old, np.array([1.0], np.float32), np.ones((1, 2), bool))
        >>> round(float(loss), 4), round(float(stats.high_mean), 4)
        (-1.2, 1.0)
    """
    one_of("loss_type", loss_type, TRL_LOSS_TYPES)
    low = finite_number("epsilon", epsilon, minimum=0.0)
    high = low if epsilon_high is None else finite_number("epsilon_high", epsilon_high, minimum=0.0)
    if delta is not None and finite_number("delta", delta) <= 0:
        raise ValueError(f"delta must be > 0, got {delta!r}")
    max_completion_length = integer("max_completion_length", max_completion_length, minimum=1)
    if num_items_in_batch is not None:
        num_items_in_batch = integer("num_items_in_batch", num_items_in_batch, minimum=0)
    check_token_arrays(logprobs, proximal_logprobs=proximal_logprobs, loss_mask=loss_mask)
    _checks.check_shape("advantages", advantages, np.shape(logprobs)[:1], "logprobs' rows (one advantage per row)")
    return _checks.checked(_sequence_jit, logprobs, proximal_logprobs, advantages, loss_mask, low=low, high=high,
                           delta=None if delta is None else float(delta), loss_type=loss_type,
                           max_completion_length=max_completion_length, num_items_in_batch=num_items_in_batch,
                           on_trace="counts")


_POLICY_LOSSES: dict[str, Callable[..., tuple[jax.Array, PolicyLossStats]]] = {"vanilla": vanilla_ppo_loss,
    "gspo": gspo_loss, "sapo": sapo_loss, "gpg": gpg_loss, "clip_cov": clip_cov_loss, "kl_cov": kl_cov_loss,
    "geo_mean": geo_mean_loss, "dro": dro_loss, "cispo": cispo_loss, "dppo_tv": dppo_tv_loss, "dppo_kl": dppo_kl_loss}
PolicyLossMode = Literal["vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo", "dppo_tv",
                         "dppo_kl"]
#: verl's ``policy_loss.loss_mode`` names ``policy_loss`` takes (derived from ``PolicyLossMode``).
POLICY_LOSS_MODES: tuple[PolicyLossMode, ...] = get_args(PolicyLossMode)
assert set(POLICY_LOSS_MODES) == set(_POLICY_LOSSES), "PolicyLossMode names each loss of _POLICY_LOSSES"


def policy_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
                mode: PolicyLossMode = "vanilla", **options: Any) -> tuple[jax.Array, PolicyLossStats]:
    """The loss verl's ``actor.policy_loss.loss_mode`` names (``POLICY_LOSS_MODES``), with its keyword
    ``options`` (that loss's own names: ``clip_ratio_low``, ``loss_agg_mode``, ``dro_beta``, ...; an option
    the loss does not take is refused, naming it). Returns ``(loss, PolicyLossStats)``.

    Args:
        mode: verl's ``policy_loss.loss_mode``: one of ``POLICY_LOSS_MODES``.
        options: That loss's own keyword arguments (``clip_ratio_low``, ``loss_agg_mode``, ``dro_beta``, ...); one it
            does not take is refused, naming it.

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.policy_loss(logprobs, old, advantages, mask, mode="cispo", clip_ratio_high=0.5)
        >>> round(float(loss), 4)
        0.4256
    """
    accepted = policy_loss_options(mode)
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise TypeError(f"policy_loss(mode={mode!r}) takes no option {unknown}; it takes {sorted(accepted)}")
    return _POLICY_LOSSES[mode](logprobs, proximal_logprobs, advantages, loss_mask, **options)


def policy_loss_options(mode: PolicyLossMode) -> frozenset[str]:
    """The keyword options ``policy_loss(..., mode=mode)`` takes (its loss's own: ``geo_mean`` has no
    ``loss_agg_mode``, GMPO aggregating each sequence itself).

    Args:
        mode: verl's ``policy_loss.loss_mode``: one of ``POLICY_LOSS_MODES``.

    Example:
        >>> options = prm_jax.losses.policy_loss_options("dro")
        >>> "dro_beta" in options, "clip_ratio_low" in options
        (True, False)
    """
    one_of("mode", mode, POLICY_LOSS_MODES)
    arrays = {"logprobs", "proximal_logprobs", "advantages", "loss_mask"}
    return frozenset(inspect.signature(_POLICY_LOSSES[mode]).parameters) - arrays
