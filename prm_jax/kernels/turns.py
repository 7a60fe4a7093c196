"""Turns on timesteps: AReaL's turn-id rules, turn segments and sums, turn counts, and turn-level GAE.

A turn of a row is the set of its active timesteps that carry one turn id (the shifted ``turn_ids``);
inactive timesteps carry any id (-1 by convention). ``turn_ids_from_spans`` writes the ids from turn
spans on positions, as the session's concat export does on the host (``prm_jax.runtime.trajectory``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax.kernels import _checks
from prm_jax.kernels.alignment import shift_to_next_token
from prm_jax.kernels.gae import GAEOutput, _prepare, check_discounts, gae_core, is_unit_discount
from prm_jax.kernels.recurrence import resolve_method
from prm_jax.validation import integer_dtype


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
    method = resolve_method(method, unit_discount=is_unit_discount(gamma, lam))
    output, checks = _turn_gae_jit(rewards, values, mask, turn_ids, gamma, lam, bootstrap, num_turns=num_turns,
                                   method=method)
    _checks.raise_value_checks(checks, callback=True)
    return output


def same_turn_next(active: jax.Array, turn_ids: jax.Array | None) -> jax.Array:
    """``[B, T]`` bool: the next timestep is active and in the same turn. A turn on timesteps is a run of
    adjacent active timesteps (with equal turn ids when ``turn_ids`` is given)."""
    same = active & shift_to_next_token(active, fill=False)
    if turn_ids is not None:
        same = same & (turn_ids == shift_to_next_token(turn_ids, fill=-1))
    return same


def changes_within_turns(x: jax.Array, same_turn: jax.Array) -> jax.Array:
    """``[B, T]`` bool: ``x`` changes between a timestep and the next one of the same turn (``same_turn``
    from ``same_turn_next``): where a per-turn value is not uniform over its turn."""
    return same_turn & (x != shift_to_next_token(x, fill=0))


def turn_ends(active: jax.Array, turn_ids: jax.Array | None) -> jax.Array:
    """``[B, T]`` bool: each turn's last active timestep (where a folded or min-form turn reward goes)."""
    return active & ~same_turn_next(active, turn_ids)


def turn_counts(active: jax.Array, turn_ids: jax.Array) -> jax.Array:
    """``[B]`` int32: turns with at least one active timestep. Ids never decrease along a row (checked), so a
    new turn starts where an active id exceeds every earlier active id."""
    seen = lax.cummax(jnp.where(active, turn_ids, -1), axis=1)
    before = jnp.concatenate([jnp.full_like(seen[:, :1], -1), seen[:, :-1]], axis=1)
    return jnp.sum(active & (turn_ids > before), axis=1, dtype=jnp.int32)


def turn_ids_from_spans(spans: ArrayLike, width: int) -> jax.Array:
    """Turn ids on positions from turn spans: the ``turn_ids`` that the pipeline and ``score_arrays`` read.

    Args:
      spans: ``[B, K, 2]`` int, ``(start, end)`` of turn ``k``'s generated tokens (end exclusive), turns in
        order and not overlapping; a span with ``end <= start`` (e.g. ``(0, 0)`` for a row with fewer turns)
        names no token.
      width: ``T``, static.

    Returns:
      ``[B, T]`` int32: ``k`` on turn ``k``'s positions, -1 elsewhere (where spans overlap, the later turn).
    """
    _checks.check_rank("spans", spans, 3)
    if jnp.shape(spans)[2] != 2:
        raise ValueError(f"spans must be [B, K, 2] (start, end), got shape {jnp.shape(spans)}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    if not _checks.is_traced(spans) and not isinstance(spans, jax.Array):
        # Host spans: clipped to [0, width] (exact: no position lies outside) before JAX narrows them to
        # int32, which would wrap a 64-bit span beyond 2**31 onto real positions.
        host = np.asarray(spans)
        integer_dtype("spans", host.dtype)
        spans = np.clip(host, 0, width).astype(np.int32)
    return _spans_jit(spans, width=width)


@functools.partial(jax.jit, static_argnames=("width",))
def _spans_jit(spans, *, width):
    spans = jnp.clip(_checks.as_integer("spans", spans), 0, width).astype(jnp.int32)  # exact, at any width
    position = jnp.arange(width, dtype=jnp.int32)[None, None, :]
    inside = (position >= spans[..., :1]) & (position < spans[..., 1:])               # [B, K, T]
    turn = jnp.arange(spans.shape[1], dtype=jnp.int32)[None, :, None]
    return jnp.max(jnp.where(inside, turn, -1), axis=1, initial=-1)
