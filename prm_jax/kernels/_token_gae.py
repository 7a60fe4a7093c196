"""Generalized advantage estimation on timesteps, with masked carry.

GAE: Schulman, Moritz, Levine, Jordan, Abbeel, "High-Dimensional Continuous Control Using Generalized
Advantage Estimation" (2015, arXiv:1506.02438). The masked carry over prompt and tool tokens is AReaL's
(and verl's) multi-turn convention.

Time convention: ``rewards[:, t]``, ``values[:, t]`` and ``mask[:, t]`` belong to timestep ``t`` (see
``alignment``). The recurrence runs right to left from ``last = 0`` and ``nextv = bootstrap``::

  delta_t = r_t + gamma * nextv - V_t
  new_t   = delta_t + gamma * lam * last
  mask_t = 1:  last = new_t,  nextv = V_t
  mask_t = 0:  last, nextv carried unchanged (no discount consumed; a reward there is dropped)
  A_t = last,  returns_t = A_t + V_t

So a masked timestep holds the advantage of the next active timestep to its right (verl/AReaL parity),
and a multi-turn row whose generated spans are separated by user/tool tokens is discounted over its
generated tokens only. The recurrence is linear, ``A_t = c_t A_{t+1} + delta_t`` with
``c_t = gamma * lam`` where active and 1 elsewhere; ``method`` picks how it is computed (``scan``,
``associative``, ``blocked``, ``cumsum``, ``native``, ``pallas`` or ``auto``: see
``prm_jax.kernels._recurrence``).

For the parallel methods ``nextv`` (the value at the next active timestep, or ``bootstrap``) is found
with a reverse running minimum over active indices and a gather: exact, no arithmetic on values.
All methods accumulate in float32 (float64 for float64 inputs) whatever the input dtype.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax.kernels import _checks
from prm_jax.kernels._alignment import shift_to_next_token
from prm_jax.kernels._estimator_contract import EstimatorSpec
from prm_jax.kernels._pallas_gae import pallas_gae
from prm_jax.kernels._recurrence import DEFAULT_BLOCK_SIZE, ScanStrategy, linear_recurrence, resolve_method
from prm_jax.kernels._stage import StageResult
from prm_jax.native import _ffi as ffi


class GAEOutput(NamedTuple):
    """What ``gae`` and ``turn_gae`` return: the advantages and the returns (advantages + values).

    Attributes:
        returns: ``[B, T]`` the returns, ``advantages + values``.

    Example:
        >>> out = prm_jax.kernels.gae(np.array([[0.0, 0.0, 1.0]], np.float32), np.array([[0.5, 0.5, 0.5]], np.float32),
        ...                           np.ones((1, 3), bool), gamma=1.0, lam=1.0)
        ...
        >>> np.asarray(out.advantages).tolist(), np.asarray(out.returns).tolist()
        ([[0.5, 0.5, 0.5]], [[1.0, 1.0, 1.0]])
    """

    advantages: jax.Array  # [B, T] (or [B, K] turns) float32
    returns: jax.Array     # [B, T] float32, advantages + values


def _next_active_values(values: jax.Array, active: jax.Array, bootstrap: jax.Array) -> jax.Array:
    """``nextv[:, t]`` = value at the first active timestep after ``t``, else ``bootstrap``."""
    num_steps = values.shape[-1]
    index = lax.broadcasted_iota(jnp.int32, values.shape, values.ndim - 1)
    candidate = jnp.where(active, index, num_steps)
    first_at_or_after = lax.cummin(candidate, axis=values.ndim - 1, reverse=True)
    first_after = shift_to_next_token(first_at_or_after, fill=num_steps)
    gathered = jnp.take_along_axis(values, jnp.minimum(first_after, num_steps - 1), axis=-1)
    return jnp.where(first_after < num_steps, gathered, bootstrap[:, None])


def _with_gradient_of(kernel: Any, reference: Any) -> Any:
    """``kernel(rewards, values, mask, gamma [B], gamma_lam [B], bootstrap [B]) -> (advantages, returns)``, a
    kernel without autodiff (the native FFI call, the Pallas call), made differentiable: its cotangents are
    those of ``reference``, the same recurrence written in XLA, with ``mask`` read as the trained timesteps
    (bool, or a float 0/1 mask; it has no cotangent)."""

    @jax.custom_vjp
    def differentiable(rewards, values, mask, gamma, gamma_lam, bootstrap):
        return kernel(rewards, values, mask, gamma, gamma_lam, bootstrap)

    def forward(*primals):
        return kernel(*primals), primals

    def backward(primals, cotangents):
        rewards, values, mask, gamma, gamma_lam, bootstrap = primals
        active = _checks.as_mask("mask", mask)
        _, vjp = jax.vjp(lambda r, v, g, gl, b: reference(r, v, active, g, gl, b),
                         rewards, values, gamma, gamma_lam, bootstrap)
        d_rewards, d_values, d_gamma, d_gamma_lam, d_bootstrap = vjp(cotangents)
        d_mask = np.zeros(mask.shape, jax.dtypes.float0) if mask.dtype == jnp.bool_ else jnp.zeros_like(mask)
        return d_rewards, d_values, d_mask, d_gamma, d_gamma_lam, d_bootstrap

    differentiable.defvjp(forward, backward)
    return differentiable


def _scan_gae_pair(rewards, values, active, gamma, gamma_lam, bootstrap):
    advantages = _gae_scan(rewards, values, active, gamma, gamma_lam, bootstrap)
    return advantages, advantages + values


def _associative_gae_pair(rewards, values, active, gamma, gamma_lam, bootstrap):
    coeffs, deltas = linear_form(rewards, values, active, gamma[:, None], gamma_lam, bootstrap)
    advantages = linear_recurrence(coeffs, deltas, jnp.zeros_like(bootstrap), "associative")
    return advantages, advantages + values


# The native kernel (``mask`` bool, or float32 checked by the kernel itself: ``ffi.gae_native``), with the
# cotangents of ``scan``; the Pallas kernel with those of the associative form (no loop over T on a GPU).
_native_gae = _with_gradient_of(ffi.gae_native, _scan_gae_pair)
_pallas_gae = _with_gradient_of(pallas_gae, _associative_gae_pair)


def _gae_scan(rewards, values, active, gamma, gamma_lam, bootstrap):
    def step(carry, inputs):
        last, next_value = carry
        reward, value, is_active = inputs
        new = reward + gamma * next_value - value + gamma_lam * last
        last = jnp.where(is_active, new, last)
        next_value = jnp.where(is_active, value, next_value)
        return (last, next_value), last

    init = (jnp.zeros_like(bootstrap), bootstrap)
    _, advantages = lax.scan(step, init, (rewards.T, values.T, active.T), reverse=True)
    return advantages.T


def _gae_core(rewards: jax.Array, values: jax.Array, active: jax.Array, gamma: jax.Array, lam: jax.Array,
             bootstrap: jax.Array, method: str, block_size: int = DEFAULT_BLOCK_SIZE) -> GAEOutput:
    """GAE of already-validated float arrays; ``method`` resolved; ``lam`` scalar or ``[B]``; ``active`` bool
    (or, for ``native`` with float32 inputs, a float32 mask the kernel reads and checks itself)."""
    gamma_lam = gamma * jnp.broadcast_to(lam, bootstrap.shape)
    if method == "native":
        if rewards.dtype == jnp.float32:
            return GAEOutput(*_native_gae(rewards, values, active, jnp.broadcast_to(gamma, bootstrap.shape),
                                          gamma_lam, bootstrap))
        method = "scan"  # float64 inputs keep float64 accumulation
    if method == "pallas":
        return GAEOutput(*_pallas_gae(rewards, values, active, jnp.broadcast_to(gamma, bootstrap.shape), gamma_lam,
                                     bootstrap))
    if method == "scan":
        advantages = _gae_scan(rewards, values, active, gamma, gamma_lam, bootstrap)
        return GAEOutput(advantages, advantages + values)
    coeffs, deltas = linear_form(rewards, values, active, gamma, gamma_lam, bootstrap)
    if method == "cumsum":
        advantages = lax.cumsum(deltas, axis=1, reverse=True)
    else:
        advantages = linear_recurrence(coeffs, deltas, jnp.zeros_like(bootstrap), method, block_size)
    return GAEOutput(advantages, advantages + values)


def masked_return(rewards: jax.Array, active: jax.Array, gamma: jax.Array, method: str) -> jax.Array:
    """``[B, T]``: the discounted return over the active timesteps, ``G_t = r_t + gamma * G_next``, a masked one
    passing it on undiscounted (its reward not read), 0 where inactive: GAE with no values and ``lam = 1``, so
    one pass of whichever scan ``method`` names (REINFORCE++'s return after verl #7300, turn_rloo's over turns)."""
    zero = jnp.zeros((), rewards.dtype)
    returns = _gae_core(jnp.where(active, rewards, zero), jnp.zeros_like(rewards), active, gamma,
                        jnp.ones((), rewards.dtype), jnp.zeros(rewards.shape[:1], rewards.dtype), method).advantages
    return jnp.where(active, returns, zero)


def linear_form(rewards, values, active, gamma, gamma_lam, next_value_after):
    """The GAE recurrence as ``A_t = coeffs_t * A_{t+1} + deltas_t``.

    ``next_value_after`` ``[B]`` is the value after the last timestep (``bootstrap``, or for a chunk of a
    longer row, the value at the first active timestep right of the chunk).
    """
    next_values = _next_active_values(values, active, next_value_after)
    zero = jnp.zeros((), rewards.dtype)
    deltas = jnp.where(active, rewards + gamma * next_values - values, zero)
    coeffs = jnp.where(active, gamma_lam[:, None], jnp.ones((), rewards.dtype))
    return coeffs, deltas


def _prepare(rewards, values, mask, lam, bootstrap):
    _checks.check_rank("rewards", rewards, 2)
    shape = np.shape(rewards)
    if values is not None:
        _checks.check_shape("values", values, shape, "rewards")
    _checks.check_shape("mask", mask, shape, "rewards")
    if np.ndim(lam) not in (0, 1) or (np.ndim(lam) == 1 and np.shape(lam) != shape[:1]):
        raise ValueError(f"lam must be a scalar or have shape [B] = {shape[:1]}, got {np.shape(lam)}")
    if bootstrap is not None:
        _checks.check_shape("bootstrap", bootstrap, shape[:1], "rewards' batch axis")
    dtype = _checks.accumulation_dtype(rewards, values, bootstrap)
    rewards = _checks.as_float("rewards", rewards, dtype)
    values = jnp.zeros(shape, dtype) if values is None else _checks.as_float("values", values, dtype)
    bootstrap = jnp.zeros(shape[:1], dtype) if bootstrap is None else _checks.as_float("bootstrap", bootstrap, dtype)
    return rewards, values, _checks.as_mask("mask", mask), bootstrap, dtype


def check_discounts(gamma, lam) -> None:
    """``gamma`` and a scalar ``lam`` must lie in [0, 1] when their values are known before tracing."""
    for name, x in (("gamma", gamma), ("lam", lam)):
        if np.ndim(x) == 0:
            value = _checks.concrete_scalar(x)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")


def is_unit_discount(gamma, lam) -> bool:
    g, lam_value = _checks.concrete_scalar(gamma), _checks.concrete_scalar(lam)
    return g is not None and lam_value is not None and g * lam_value == 1.0


@functools.partial(jax.jit, static_argnames=("method", "block_size"))
def _gae_jit(rewards, values, mask, gamma, lam, bootstrap, *, method, block_size):
    rewards, values, active, bootstrap, dtype = _prepare(rewards, values, mask, lam, bootstrap)
    # A float32 mask (verl's, tunix's) goes to the native kernel as it is: the kernel reads it as active
    # where nonzero and enforces the 0/1 rule as it reads it (a violation fails the computation with
    # mask_check's message), so no conversion pass, no check pass and no host round trip.
    kernel_checks = method == "native" and dtype == jnp.float32 and jnp.asarray(mask).dtype == jnp.float32
    output = _gae_core(rewards, values, jnp.asarray(mask) if kernel_checks else active, jnp.asarray(gamma, dtype),
                      jnp.asarray(lam, dtype), bootstrap, method, block_size)
    return output, [] if kernel_checks else _checks.mask_check("mask", mask)


def gae(rewards: ArrayLike, values: ArrayLike | None, mask: ArrayLike, *, gamma: ArrayLike = 1.0,
        lam: ArrayLike = 1.0, bootstrap: ArrayLike | None = None, method: str = "auto",
        block_size: int = DEFAULT_BLOCK_SIZE) -> GAEOutput:
    r"""Generalized advantage estimation with masked carry (the module docstring has the recurrence).

    On a trained timestep :math:`t`, with :math:`t'` the next trained one (its value, or ``bootstrap``
    after the last), :math:`\delta_t = r_t + \gamma V_{t'} - V_t` and
    :math:`\hat A_t = \delta_t + \gamma\lambda\,\hat A_{t'}`; an untrained timestep carries both unchanged.

    Args:
      rewards: ``[B, T]`` float, reward of timestep t (the action token t + 1).
      values: ``[B, T]`` float, V of timestep t; ``None`` means zeros.
      mask: ``[B, T]`` bool/int/float, 1 where timestep t is trained on (the shifted loss mask).
      gamma: discount in [0, 1]; a traced scalar is fine (no retrace when it changes).
      lam: GAE lambda in [0, 1], a scalar or ``[B]`` (one per row).
      bootstrap: ``[B]`` value after the last timestep (``V[seqlen-1]`` for truncated rows), or None (0).
      method: ``auto | scan | associative | blocked | cumsum | native | pallas`` (``cumsum`` needs
        ``gamma * lam == 1`` as Python numbers; ``native`` a CPU with a C++ compiler; ``pallas`` is the GPU
        kernel, interpreted on the CPU, not for a TPU).
      block_size: timesteps per block for ``blocked``.

    Returns:
      ``GAEOutput(advantages [B, T], returns [B, T])``, float32 (float64 for float64 inputs).

    Example:
      One row of three trained timesteps, a reward of 1 on the last, no values, :math:`\gamma = 0.5`:

      >>> import numpy as np
      >>> from prm_jax.kernels import gae
      >>> out = gae(np.array([[0.0, 0.0, 1.0]], np.float32), None, np.ones((1, 3), bool), gamma=0.5)
      >>> np.asarray(out.advantages).tolist()
      [[0.25, 0.5, 1.0]]
    """
    check_discounts(gamma, lam)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    method = resolve_method(method, unit_discount=is_unit_discount(gamma, lam))
    if method != "blocked":
        block_size = DEFAULT_BLOCK_SIZE  # read by ``blocked`` only: another value would only compile again
    return _checks.checked(_gae_jit, rewards, values, mask, gamma, lam, bootstrap, method=method,
                           block_size=block_size)


@dataclasses.dataclass(frozen=True)
class TokenGAE:
    """The default estimator: GAE over token timesteps, the KL rewards inside the recurrence.

    Args:
        block_size: Timesteps per block of the ``blocked`` scan method, >= 1.

    Example:
        >>> prm_jax.AdvantageConfig(gae_block_size=32).plan.estimator
        TokenGAE(block_size=32)
    """

    block_size: int = DEFAULT_BLOCK_SIZE


def _token_gae(stage: TokenGAE, rewards: jax.Array, values: jax.Array, active: jax.Array,
               gamma: jax.Array, lam: jax.Array, bootstrap: jax.Array, strategy: ScanStrategy) -> StageResult:
    advantages, returns = _gae_core(rewards, values, active, gamma, lam, bootstrap, strategy.gae, stage.block_size)
    return StageResult(advantages, returns=returns)


TOKEN_GAE = EstimatorSpec(TokenGAE, _token_gae, "gae_timestep_unit 'token'", kl="rewards", name="token_gae",
                          units=("token",), example={"gae_lambda": 0.9, "discount": 0.95})
