"""KL penalty rewards on timesteps.

The estimators k1, k2, k3 are those of J. Schulman, "Approximating KL Divergence" (2020,
http://joschu.net/blog/kl-approx.html), clamped to [-10, 10] as AReaL does
(``clamp``; ``actor.kl_clamp``).

With ``d = logprobs - ref_logprobs`` (behaviour minus reference log-prob of the action at timestep t):

  k1 = d,    k2 = d**2 / 2,    k3 = exp(-d) - 1 + d

The estimate is clamped to [-10, 10] and the reward is ``-kl_ctl * kl`` on active timesteps, 0 elsewhere.
"""

from __future__ import annotations

import functools
from typing import Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from prm_jax._validation import finite_number, one_of
from prm_jax.kernels import _checks

KLEstimator = Literal["k1", "k2", "k3"]
#: The KL estimators ``kl_estimator`` may name (derived from ``KLEstimator``).
KL_ESTIMATORS: tuple[KLEstimator, ...] = get_args(KLEstimator)
#: AReaL's clamp of the per-timestep KL estimate (``actor.kl_clamp``'s default).
KL_CLAMP = 10.0


def kl_estimate(logprobs: ArrayLike, ref_logprobs: ArrayLike, estimator: str = "k1", *,
                clamp: float = KL_CLAMP) -> jax.Array:
    """Per-timestep KL estimate, clamped to ``[-clamp, clamp]`` (AReaL's 10 by default), accumulated in
    float32 (or float64).

    Args:
      logprobs: ``[B, T]`` behaviour log-probs on timesteps.
      ref_logprobs: ``[B, T]`` reference log-probs on timesteps.
      estimator: ``"k1" | "k2" | "k3"``.
      clamp: the bound, a finite number > 0.

    Example:
        >>> logp, ref = np.log(np.array([[0.5, 0.25]], np.float32)), np.log(np.array([[0.25, 0.5]], np.float32))
        >>> np.asarray(prm_jax.kernels.kl_estimate(logp, ref, "k1"), np.float64).round(4).tolist()
        [[0.6931, -0.6931]]
    """
    one_of("estimator", estimator, KL_ESTIMATORS)
    clamp = finite_number("clamp", clamp, positive=True)
    _checks.check_shape("ref_logprobs", ref_logprobs, np.shape(logprobs), "logprobs")
    return _kl_estimate_jit(logprobs, ref_logprobs, estimator=estimator, clamp=clamp)


@functools.partial(jax.jit, static_argnames=("estimator", "clamp"))
def _kl_estimate_jit(logprobs, ref_logprobs, *, estimator, clamp=KL_CLAMP):
    dtype = _checks.accumulation_dtype(logprobs, ref_logprobs)
    d = _checks.as_float("logprobs", logprobs, dtype) - _checks.as_float("ref_logprobs", ref_logprobs, dtype)
    if estimator == "k1":
        kl = d
    elif estimator == "k2":
        kl = 0.5 * d * d
    else:
        kl = jnp.expm1(-d) + d
    return jnp.clip(kl, -clamp, clamp)


def kl_rewards(logprobs: ArrayLike, ref_logprobs: ArrayLike, mask: ArrayLike, *, kl_ctl: float = 0.1,
               estimator: str = "k1", clamp: float = KL_CLAMP) -> jax.Array:
    """``-kl_ctl * kl_estimate`` where ``mask`` is active, exactly 0 elsewhere.

    Masked timesteps are selected with ``where``, so NaN or Inf log-probs on padding do not leak.

    Args:
      logprobs, ref_logprobs: ``[B, T]`` float on timesteps.
      mask: ``[B, T]`` timestep loss mask (the shifted ``loss_mask``).
      kl_ctl: KL coefficient.
      estimator: ``"k1" | "k2" | "k3"``.
      clamp: the estimate's bound (``kl_estimate``).

    Example:
        >>> logp, ref = np.log(np.array([[0.5, 0.25, 0.5]], np.float32)), np.log(np.array([[0.25, 0.5, 0.25]], np.float32))
        >>> np.asarray(prm_jax.kernels.kl_rewards(logp, ref, np.ones((1, 3), bool), kl_ctl=0.1), np.float64).round(4).tolist()
        [[-0.0693, 0.0693, -0.0693]]
    """
    one_of("estimator", estimator, KL_ESTIMATORS)
    clamp = finite_number("clamp", clamp, positive=True)
    _checks.check_shape("ref_logprobs", ref_logprobs, np.shape(logprobs), "logprobs")
    _checks.check_shape("mask", mask, np.shape(logprobs), "logprobs")
    return _checks.checked(_kl_rewards_jit, logprobs, ref_logprobs, mask, kl_ctl, estimator=estimator, clamp=clamp)


@functools.partial(jax.jit, static_argnames=("estimator", "clamp"))
def _kl_rewards_jit(logprobs, ref_logprobs, mask, kl_ctl, *, estimator, clamp=KL_CLAMP):
    checks = _checks.mask_check("mask", mask)
    active = _checks.as_mask("mask", mask)
    dtype = _checks.accumulation_dtype(logprobs, ref_logprobs)
    zero = jnp.zeros((), dtype)
    safe_logp = jnp.where(active, _checks.as_float("logprobs", logprobs, dtype), zero)
    safe_ref = jnp.where(active, _checks.as_float("ref_logprobs", ref_logprobs, dtype), zero)
    estimate = kl_estimate(safe_logp, safe_ref, estimator, clamp=clamp)
    return jnp.where(active, -jnp.asarray(kl_ctl, dtype) * estimate, zero), checks
