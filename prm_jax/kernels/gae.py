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
``c_t = gamma * lam`` where active and 1 elsewhere, and every method below computes it:

- ``scan``: one sequential ``lax.scan`` over time carrying ``(last, nextv)``: the literal recurrence.
- ``associative``: ``lax.associative_scan`` over affine maps ``x -> c x + delta`` (log depth).
- ``blocked``: a sequential scan inside blocks of ``block_size`` timesteps, all blocks in parallel, then
  a scan over block carries and a fix-up pass (a chunked scan: few, wide steps).
- ``cumsum``: when ``gamma * lam == 1`` is known before tracing, ``c_t == 1`` and ``A`` is a reverse
  cumulative sum of ``delta``: exact, no products.
- ``native``: the literal recurrence as a C++ XLA FFI kernel on the CPU (``prm_jax.native``),
  built on first use where a C++ compiler exists; float32 only, not differentiable.
- ``auto``: on CPU ``native`` when it is available and the process has one device, else ``scan``; on
  GPU/TPU ``cumsum`` when ``gamma * lam == 1`` is static, else ``associative``.

For the parallel methods ``nextv`` (the value at the next active timestep, or ``bootstrap``) is found
with a reverse running minimum over active indices and a gather: exact, no arithmetic on values.
All methods accumulate in float32 (float64 for float64 inputs) whatever the input dtype.
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax.kernels import _checks
from prm_jax.kernels.alignment import shift_to_next_token
from prm_jax.native import ffi

GAEMethod = Literal["auto", "scan", "associative", "blocked", "cumsum", "native"]
GAE_METHODS: tuple[GAEMethod, ...] = ("auto", "scan", "associative", "blocked", "cumsum", "native")
DEFAULT_BLOCK_SIZE = 64


class GAEOutput(NamedTuple):
    advantages: jax.Array  # [B, T] (or [B, K] turns) float32
    returns: jax.Array     # [B, T] float32, advantages + values


def resolve_method(method: GAEMethod | str, *, unit_discount: bool, sharded: bool = False) -> GAEMethod:
    """The one place ``auto`` is resolved, outside any trace; the result is a static argument of the jit.

    ``auto``: on CPU ``native`` when it is available and the program runs on one device (``sharded``
    False and one device; a custom call has no partitioning rule), else ``scan``; on GPU/TPU ``cumsum``
    when ``gamma * lam == 1`` is known statically (``unit_discount``), else ``associative``.
    """
    if method not in GAE_METHODS:
        raise ValueError(f"method must be one of {GAE_METHODS}, got {method!r}")
    if method == "cumsum" and not unit_discount:
        raise ValueError("method='cumsum' needs gamma * lam == 1 known before tracing (Python floats); "
                         "use 'auto', 'scan', 'associative' or 'blocked' otherwise")
    if method == "native" and not ffi.available():
        raise ValueError("method='native' needs the CPU backend and a C++ compiler to build the kernel "
                         "(see prm_jax.native); use 'auto' to fall back to 'scan'")
    if method == "native" and sharded:
        raise ValueError("method='native' cannot run in a sharded program (a custom call has no partitioning "
                         "rule); use 'auto' or 'scan'")
    if method != "auto":
        return method
    if jax.default_backend() == "cpu":
        return "native" if ffi.use_native(sharded=sharded) else "scan"
    return "cumsum" if unit_discount else "associative"


def _next_active_values(values: jax.Array, active: jax.Array, bootstrap: jax.Array) -> jax.Array:
    """``nextv[:, t]`` = value at the first active timestep after ``t``, else ``bootstrap``."""
    num_steps = values.shape[-1]
    index = lax.broadcasted_iota(jnp.int32, values.shape, values.ndim - 1)
    candidate = jnp.where(active, index, num_steps)
    first_at_or_after = lax.cummin(candidate, axis=values.ndim - 1, reverse=True)
    first_after = shift_to_next_token(first_at_or_after, fill=num_steps)
    gathered = jnp.take_along_axis(values, jnp.minimum(first_after, num_steps - 1), axis=-1)
    return jnp.where(first_after < num_steps, gathered, bootstrap[:, None])


def _affine_combine(later, earlier):
    """Composes ``x -> a_l x + b_l`` (later timesteps, applied first) with ``x -> a_e x + b_e``."""
    a_later, b_later = later
    a_earlier, b_earlier = earlier
    return a_later * a_earlier, a_earlier * b_later + b_earlier


def affine_scan(coeffs: jax.Array, offsets: jax.Array, method: str) -> tuple[jax.Array, jax.Array]:
    """The chunked-scan primitive: ``(products, locals)`` of ``x_t = coeffs_t x_{t+1} + offsets_t`` from 0.

    Along the last axis, right to left from a zero carry: ``locals_t`` is ``x_t`` and ``products_t`` the
    product of ``coeffs`` from ``t`` to the end, so the same chunk with a carry-in ``c`` is
    ``locals_t + products_t * c`` (``carry_correction``). ``method`` is ``scan`` or ``associative``.
    """
    if method == "associative":
        return lax.associative_scan(_affine_combine, (coeffs, offsets), reverse=True, axis=coeffs.ndim - 1)

    def step(carry, coeff_offset):
        product, local = carry
        coeff, offset = coeff_offset
        carry = (coeff * product, coeff * local + offset)
        return carry, carry

    time_major = (jnp.moveaxis(coeffs, -1, 0), jnp.moveaxis(offsets, -1, 0))
    zeros = jnp.zeros(coeffs.shape[:-1], coeffs.dtype)
    _, (products, locals_) = lax.scan(step, (jnp.ones_like(zeros), zeros), time_major, reverse=True)
    return jnp.moveaxis(products, 0, -1), jnp.moveaxis(locals_, 0, -1)


def carry_correction(products: jax.Array, locals_: jax.Array, carry_in: jax.Array) -> jax.Array:
    """A chunk's values once the carry entering it from the right, ``carry_in [...]``, is known."""
    return locals_ + products * carry_in[..., None]


def backward_linear_recurrence(coeffs: ArrayLike, offsets: ArrayLike, init: ArrayLike, *,
                               method: str = "scan", block_size: int = DEFAULT_BLOCK_SIZE) -> jax.Array:
    """``x_t = coeffs_t * x_{t+1} + offsets_t`` for t = T-1 .. 0 along the last axis, ``x_T = init``.

    Args:
      coeffs, offsets: ``[B, T]`` float.
      init: ``[B]`` float.
      method: ``scan | associative | blocked``.
      block_size: timesteps per block for ``blocked``.

    Returns:
      ``[B, T]`` float32 (float64 for float64 inputs).
    """
    if method not in ("scan", "associative", "blocked"):
        raise ValueError(f"method must be 'scan', 'associative' or 'blocked', got {method!r}")
    _checks.check_rank("coeffs", coeffs, 2)
    _checks.check_shape("offsets", offsets, jnp.shape(coeffs), "coeffs")
    _checks.check_shape("init", init, jnp.shape(coeffs)[:1], "coeffs' batch axis")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return _recurrence_jit(coeffs, offsets, init, method=method, block_size=block_size)


@functools.partial(jax.jit, static_argnames=("method", "block_size"))
def _recurrence_jit(coeffs, offsets, init, *, method, block_size):
    dtype = _checks.accumulation_dtype(coeffs, offsets, init)
    return linear_recurrence(_checks.as_float("coeffs", coeffs, dtype), _checks.as_float("offsets", offsets, dtype),
                             _checks.as_float("init", init, dtype), method, block_size)


def linear_recurrence(coeffs: jax.Array, offsets: jax.Array, init: jax.Array, method: str,
                      block_size: int = DEFAULT_BLOCK_SIZE) -> jax.Array:
    """``backward_linear_recurrence`` on validated arrays, inside a trace."""
    if method == "scan":
        def step(x, coeff_offset):
            coeff, offset = coeff_offset
            x = coeff * x + offset
            return x, x
        _, xs = lax.scan(step, init, (coeffs.T, offsets.T), reverse=True)
        return xs.T
    if method == "associative":
        products, locals_ = affine_scan(coeffs, offsets, "associative")
        return carry_correction(products, locals_, init)
    if method == "blocked":
        return _blocked_recurrence(coeffs, offsets, init, block_size)
    raise ValueError(f"no linear recurrence for method {method!r}")


def _blocked_recurrence(coeffs: jax.Array, offsets: jax.Array, init: jax.Array, block_size: int) -> jax.Array:
    """Blocks of ``block_size`` timesteps scanned side by side, then one carry per block (a chunked scan)."""
    batch, num_steps = coeffs.shape
    block_size = max(1, min(block_size, num_steps))
    num_blocks = -(-num_steps // block_size)
    pad = num_blocks * block_size - num_steps
    # Identity steps on the right leave the carried-in value unchanged.
    coeffs = jnp.pad(coeffs, ((0, 0), (0, pad)), constant_values=1).reshape(batch, num_blocks, block_size)
    offsets = jnp.pad(offsets, ((0, 0), (0, pad))).reshape(batch, num_blocks, block_size)
    products, locals_ = affine_scan(coeffs, offsets, "scan")

    def across_blocks(x_after_block, product_local):
        product, local = product_local
        return product * x_after_block + local, x_after_block

    # carry_in[:, j] is x just right of block j (the first step of block j + 1, or init).
    _, carry_in = lax.scan(across_blocks, init, (products[:, :, 0].T, locals_[:, :, 0].T), reverse=True)
    xs = carry_correction(products, locals_, carry_in.T)
    return xs.reshape(batch, num_blocks * block_size)[:, :num_steps]


@jax.custom_vjp
def _native_gae(rewards, values, active, gamma, gamma_lam, bootstrap):
    """The native kernel, differentiable: its cotangents are those of the same recurrence as ``scan``."""
    return ffi.gae_native(rewards, values, active, gamma, gamma_lam, bootstrap)


def _native_gae_fwd(rewards, values, active, gamma, gamma_lam, bootstrap):
    primals = (rewards, values, active, gamma, gamma_lam, bootstrap)
    return _native_gae(*primals), primals


def _scan_gae_pair(rewards, values, active, gamma, gamma_lam, bootstrap):
    advantages = _gae_scan(rewards, values, active, gamma, gamma_lam, bootstrap)
    return advantages, advantages + values


def _native_gae_bwd(primals, cotangents):
    rewards, values, active, gamma, gamma_lam, bootstrap = primals
    differentiable = lambda r, v, g, gl, b: _scan_gae_pair(r, v, active, g, gl, b)
    _, vjp = jax.vjp(differentiable, rewards, values, gamma, gamma_lam, bootstrap)
    d_rewards, d_values, d_gamma, d_gamma_lam, d_bootstrap = vjp(cotangents)
    d_active = np.zeros(active.shape, jax.dtypes.float0)
    return d_rewards, d_values, d_active, d_gamma, d_gamma_lam, d_bootstrap


_native_gae.defvjp(_native_gae_fwd, _native_gae_bwd)


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


def gae_core(rewards: jax.Array, values: jax.Array, active: jax.Array, gamma: jax.Array, lam: jax.Array,
             bootstrap: jax.Array, method: str, block_size: int = DEFAULT_BLOCK_SIZE) -> GAEOutput:
    """GAE of already-validated float arrays; ``method`` resolved; ``lam`` scalar or ``[B]``."""
    gamma_lam = gamma * jnp.broadcast_to(lam, bootstrap.shape)
    if method == "native":
        if rewards.dtype == jnp.float32:
            return GAEOutput(*_native_gae(rewards, values, active, jnp.broadcast_to(gamma, bootstrap.shape),
                                          gamma_lam, bootstrap))
        method = "scan"  # float64 inputs keep float64 accumulation
    if method == "scan":
        advantages = _gae_scan(rewards, values, active, gamma, gamma_lam, bootstrap)
        return GAEOutput(advantages, advantages + values)
    coeffs, deltas = linear_form(rewards, values, active, gamma, gamma_lam, bootstrap)
    if method == "cumsum":
        advantages = lax.cumsum(deltas, axis=1, reverse=True)
    else:
        advantages = linear_recurrence(coeffs, deltas, jnp.zeros_like(bootstrap), method, block_size)
    return GAEOutput(advantages, advantages + values)


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
    shape = jnp.shape(rewards)
    if values is not None:
        _checks.check_shape("values", values, shape, "rewards")
    _checks.check_shape("mask", mask, shape, "rewards")
    if jnp.ndim(lam) not in (0, 1) or (jnp.ndim(lam) == 1 and jnp.shape(lam) != shape[:1]):
        raise ValueError(f"lam must be a scalar or have shape [B] = {shape[:1]}, got {jnp.shape(lam)}")
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
        if jnp.ndim(x) == 0:
            value = _checks.concrete_scalar(x)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")


def _is_unit_discount(gamma, lam) -> bool:
    g, lam_value = _checks.concrete_scalar(gamma), _checks.concrete_scalar(lam)
    return g is not None and lam_value is not None and g * lam_value == 1.0


@functools.partial(jax.jit, static_argnames=("method", "block_size"))
def _gae_jit(rewards, values, mask, gamma, lam, bootstrap, *, method, block_size):
    rewards, values, active, bootstrap, dtype = _prepare(rewards, values, mask, lam, bootstrap)
    output = gae_core(rewards, values, active, jnp.asarray(gamma, dtype), jnp.asarray(lam, dtype), bootstrap, method,
                      block_size)
    return output, _checks.mask_check("mask", mask)


def gae(rewards: ArrayLike, values: ArrayLike | None, mask: ArrayLike, *, gamma: ArrayLike = 1.0,
        lam: ArrayLike = 1.0, bootstrap: ArrayLike | None = None, method: str = "auto",
        block_size: int = DEFAULT_BLOCK_SIZE) -> GAEOutput:
    """Generalized advantage estimation with masked carry (module docstring has the recurrence).

    Args:
      rewards: ``[B, T]`` float, reward of timestep t (the action token t + 1).
      values: ``[B, T]`` float, V of timestep t; ``None`` means zeros.
      mask: ``[B, T]`` bool/int/float, 1 where timestep t is trained on (the shifted loss mask).
      gamma: discount in [0, 1]; a traced scalar is fine (no retrace when it changes).
      lam: GAE lambda in [0, 1], a scalar or ``[B]`` (one per row).
      bootstrap: ``[B]`` value after the last timestep (``V[seqlen-1]`` for truncated rows), or None (0).
      method: ``auto | scan | associative | blocked | cumsum | native`` (``cumsum`` needs
        ``gamma * lam == 1`` as Python numbers; ``native`` a CPU with a C++ compiler).
      block_size: timesteps per block for ``blocked``.

    Returns:
      ``GAEOutput(advantages [B, T], returns [B, T])``, float32 (float64 for float64 inputs).
    """
    check_discounts(gamma, lam)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    method = resolve_method(method, unit_discount=_is_unit_discount(gamma, lam))
    output, checks = _gae_jit(rewards, values, mask, gamma, lam, bootstrap, method=method, block_size=block_size)
    _checks.raise_value_checks(checks, callback=True)
    return output


def turn_ids_check(turn_ids: jax.Array, active: jax.Array, num_turns: int) -> _checks.ValueCheck:
    """AReaL's turn-id rules on timesteps: every active id in ``[0, num_turns)``, never decreasing along a row.

    Gaps (ids skipped) are allowed; inactive timesteps carry any id (``-1`` by convention).
    """
    running_max = lax.cummax(jnp.where(active, turn_ids, -1), axis=1)
    problem = jnp.where(active & (turn_ids < 0), 1,
                        jnp.where(active & (turn_ids >= num_turns), 2,
                                  jnp.where(active & (turn_ids < running_max), 3, 0)))
    kinds = {1: "an active timestep must carry a turn id >= 0",
             2: f"an active turn id must be below the number of turn slots {num_turns} (max_turns, default T)",
             3: "turn ids must not decrease along a row"}

    def message(kind, row, step, value):
        return (f"invalid turn_ids: {kinds[int(kind)]}; row {int(row)}, timestep {int(step)} has id {int(value)} "
                "(turn_ids on timesteps, i.e. shifted)")

    row, step, kind, value = _checks.first_flagged(problem > 0, problem, turn_ids)
    return _checks.ValueCheck("turn_ids_invalid", _checks.violations(problem > 0), message, kind, row, step, value)


def turn_segments(active: jax.Array, turn_ids: jax.Array, num_turns: int) -> tuple[jax.Array, jax.Array]:
    """``in_turn [B, T]`` (active with an id below ``num_turns``) and each timestep's segment ``b * K + id``.

    Timesteps outside any turn go to segment ``B * K``, which segment ops with ``B * K`` segments drop.
    """
    batch = active.shape[0]
    in_turn = active & (turn_ids >= 0) & (turn_ids < num_turns)
    row = lax.broadcasted_iota(jnp.int32, active.shape, 0)
    return in_turn, jnp.where(in_turn, row * num_turns + turn_ids, batch * num_turns)


def turn_sums(x: jax.Array, in_turn: jax.Array, segment: jax.Array, num_turns: int) -> jax.Array:
    """Sums of a ``[B, T]`` timestep array over each turn's timesteps: ``[B, K]``."""
    batch = x.shape[0]
    return jax.ops.segment_sum(jnp.where(in_turn, x, jnp.zeros((), x.dtype)).ravel(), segment.ravel(),
                               num_segments=batch * num_turns).reshape(batch, num_turns)


def turn_gae_core(rewards: jax.Array, values: jax.Array, active: jax.Array, turn_ids: jax.Array,
                  gamma: jax.Array, lam: jax.Array, bootstrap: jax.Array, num_turns: int,
                  method: str) -> GAEOutput:
    """Turn-level GAE on validated arrays (ids checked by ``turn_ids_check``); see ``turn_gae``."""
    batch, num_steps = rewards.shape
    dtype = rewards.dtype
    zero = jnp.zeros((), dtype)
    in_turn, segment = turn_segments(active, turn_ids, num_turns)
    turn_rewards = turn_sums(rewards, in_turn, segment, num_turns)
    step_index = lax.broadcasted_iota(jnp.int32, (batch, num_steps), 1)
    first_step = jax.ops.segment_min(jnp.where(in_turn, step_index, num_steps).ravel(), segment.ravel(),
                                     num_segments=batch * num_turns).reshape(batch, num_turns)
    turn_active = first_step < num_steps
    turn_values = jnp.take_along_axis(values, jnp.clip(first_step, 0, num_steps - 1), axis=1)
    turn_values = jnp.where(turn_active, turn_values, zero)
    turn_advantages = gae_core(turn_rewards, turn_values, turn_active, gamma, lam, bootstrap, method).advantages

    safe_ids = jnp.clip(turn_ids, 0, num_turns - 1)
    token_advantages = jnp.take_along_axis(turn_advantages, safe_ids, axis=1)
    token_returns = token_advantages + jnp.take_along_axis(turn_values, safe_ids, axis=1)
    # Outside every turn: advantage 0 and return V_t (AReaL: A * m, R * m + V * (1 - m)).
    return GAEOutput(jnp.where(in_turn, token_advantages, zero), jnp.where(in_turn, token_returns, values))


@functools.partial(jax.jit, static_argnames=("num_turns", "method"))
def _turn_gae_jit(rewards, values, mask, turn_ids, gamma, lam, bootstrap, *, num_turns, method):
    rewards, values, active, bootstrap, dtype = _prepare(rewards, values, mask, lam, bootstrap)
    _checks.check_shape("turn_ids", turn_ids, rewards.shape, "rewards")
    turn_ids = _checks.as_int("turn_ids", turn_ids)
    output = turn_gae_core(rewards, values, active, turn_ids, jnp.asarray(gamma, dtype), jnp.asarray(lam, dtype),
                           bootstrap, num_turns, method)
    return output, [turn_ids_check(turn_ids, active, num_turns), *_checks.mask_check("mask", mask)]


def turn_gae(rewards: ArrayLike, values: ArrayLike | None, mask: ArrayLike, turn_ids: ArrayLike, *,
             gamma: ArrayLike = 1.0, lam: ArrayLike = 1.0, bootstrap: ArrayLike | None = None,
             num_turns: int | None = None, method: str = "auto") -> GAEOutput:
    """GAE with turns as the time unit (``gae_timestep_unit: turn``).

    Turn ``k`` of a row is the set of active timesteps whose (shifted) ``turn_ids`` equal ``k``. Its reward
    is the sum of ``rewards`` over those timesteps, its value is ``values`` at its first active timestep.
    The token recurrence then runs over turns ``k = K-1 .. 0`` (turns with no active timestep are masked)::

      delta_k = R_k + gamma * V_{k+1} - V_k,   A_k = delta_k + gamma * lam * A_{k+1}

    and each timestep of turn ``k`` gets ``A_k`` and the return ``A_k + V_k``. Timesteps in no turn get
    advantage 0 and return ``V_t`` (AReaL). Turn ids must follow AReaL's rules (``turn_ids_check``):
    active ids in ``[0, num_turns)``, never decreasing along a row; otherwise ``ValueError``.

    Args:
      rewards, values, mask: ``[B, T]`` on timesteps, as for ``gae``.
      turn_ids: ``[B, T]`` int, turn index of each timestep (shifted ``turn_ids``), -1 outside turns.
      gamma, lam, bootstrap, method: as for ``gae``.
      num_turns: static bound on turn ids (ids must be below it). Defaults to ``T``.

    Returns:
      ``GAEOutput(advantages [B, T], returns [B, T])``, float32.
    """
    check_discounts(gamma, lam)
    num_turns = jnp.shape(rewards)[-1] if num_turns is None else int(num_turns)
    if num_turns < 1:
        raise ValueError(f"num_turns must be >= 1, got {num_turns}")
    method = resolve_method(method, unit_discount=_is_unit_discount(gamma, lam))
    output, checks = _turn_gae_jit(rewards, values, mask, turn_ids, gamma, lam, bootstrap, num_turns=num_turns,
                                   method=method)
    _checks.raise_value_checks(checks, callback=True)
    return output
