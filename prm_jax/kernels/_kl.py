"""KL penalty rewards on timesteps.

The estimators k1, k2, k3 are those of J. Schulman, "Approximating KL Divergence" (2020,
http://joschu.net/blog/kl-approx.html), clamped to [-10, 10] as AReaL does.

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

from prm_jax._validation import one_of
from prm_jax.kernels import _checks

KLEstimator = Literal["k1", "k2", "k3"]
#: The KL estimators ``kl_estimator`` may name (derived from ``KLEstimator``).
KL_ESTIMATORS: tuple[KLEstimator, ...] = get_args(KLEstimator)
KL_CLAMP = 10.0


def kl_estimate(logprobs: ArrayLike, ref_logprobs: ArrayLike, estimator: str = "k1") -> jax.Array:
    """Per-timestep KL estimate, clamped to [-10, 10], accumulated in float32 (or float64).

    Args:
      logprobs: ``[B, T]`` behaviour log-probs on timesteps.
      ref_logprobs: ``[B, T]`` reference log-probs on timesteps.
      estimator: ``"k1" | "k2" | "k3"``.
    """
    one_of("estimator", estimator, KL_ESTIMATORS)
    _checks.check_shape("ref_logprobs", ref_logprobs, np.shape(logprobs), "logprobs")
    return _kl_estimate_jit(logprobs, ref_logprobs, estimator=estimator)


@functools.partial(jax.jit, static_argnames=("estimator",))
def _kl_estimate_jit(logprobs, ref_logprobs, *, estimator):
    dtype = _checks.accumulation_dtype(logprobs, ref_logprobs)
    d = _checks.as_float("logprobs", logprobs, dtype) - _checks.as_float("ref_logprobs", ref_logprobs, dtype)
    if estimator == "k1":
        kl = d
    elif estimator == "k2":
        kl = 0.5 * d * d
    else:
        kl = jnp.expm1(-d) + d
    return jnp.clip(kl, -KL_CLAMP, KL_CLAMP)


def kl_rewards(logprobs: ArrayLike, ref_logprobs: ArrayLike, mask: ArrayLike, *, kl_ctl: float = 0.1,
               estimator: str = "k1") -> jax.Array:
    """``-kl_ctl * kl_estimate`` where ``mask`` is active, exactly 0 elsewhere.

    Masked timesteps are selected with ``where``, so NaN or Inf log-probs on padding do not leak.

    Args:
      logprobs, ref_logprobs: ``[B, T]`` float on timesteps.
      mask: ``[B, T]`` timestep loss mask (the shifted ``loss_mask``).
      kl_ctl: KL coefficient.
      estimator: ``"k1" | "k2" | "k3"``.
    """
    one_of("estimator", estimator, KL_ESTIMATORS)
    _checks.check_shape("ref_logprobs", ref_logprobs, np.shape(logprobs), "logprobs")
    _checks.check_shape("mask", mask, np.shape(logprobs), "logprobs")
    return _checks.checked(_kl_rewards_jit, logprobs, ref_logprobs, mask, kl_ctl, estimator=estimator)


@functools.partial(jax.jit, static_argnames=("estimator",))
def _kl_rewards_jit(logprobs, ref_logprobs, mask, kl_ctl, *, estimator):
    checks = _checks.mask_check("mask", mask)
    active = _checks.as_mask("mask", mask)
    dtype = _checks.accumulation_dtype(logprobs, ref_logprobs)
    zero = jnp.zeros((), dtype)
    safe_logp = jnp.where(active, _checks.as_float("logprobs", logprobs, dtype), zero)
    safe_ref = jnp.where(active, _checks.as_float("ref_logprobs", ref_logprobs, dtype), zero)
    return jnp.where(active, -jnp.asarray(kl_ctl, dtype) * kl_estimate(safe_logp, safe_ref, estimator), zero), checks
