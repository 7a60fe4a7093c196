"""Aligning per-token tensors: turn rewards onto tokens, and positions onto next-token timesteps.

Conventions (batch-major, right-padded): position ``j`` of a ``[B, T]`` tensor holds token ``j``.
Timestep ``t`` is the state "prefix up to token ``t``", whose action is token ``t + 1``; PPO losses,
values and advantages live on timesteps. ``shift_to_next_token`` moves a position tensor onto timesteps.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from prm_jax.kernels import _checks


def shift_to_next_token(x: ArrayLike, *, fill: ArrayLike = 0) -> jax.Array:
    """Moves a per-position tensor onto next-token timesteps.

    ``out[..., t] = x[..., t + 1]`` and ``out[..., T - 1] = fill``. The fill is written explicitly rather
    than wrapped around (``roll(-1)``), so the first prompt token never leaks into the last timestep.

    Args:
      x: ``[..., T]`` array of any dtype.
      fill: value of the last timestep (0 for rewards and masks, -1 for ``turn_ids``).

    Returns:
      ``[..., T]`` array with ``x``'s dtype.
    """
    if jnp.ndim(x) < 1:
        raise ValueError(f"x must have a time axis, got shape {jnp.shape(x)}")
    return _shift_jit(x, fill)


@jax.jit
def _shift_jit(x, fill):
    x = jnp.asarray(x)
    last = jnp.full(x.shape[:-1] + (1,), fill, dtype=x.dtype)
    return jnp.concatenate([x[..., 1:], last], axis=-1)


def broadcast_turn_rewards(turn_rewards: ArrayLike, turn_ids: ArrayLike) -> jax.Array:
    """Scalar broadcasting with prompt-zero alignment.

    ``out[b, j] = turn_rewards[b, turn_ids[b, j]]`` where ``0 <= turn_ids[b, j] < K``, else 0. Prompt and
    gap tokens carry ``turn_ids == -1`` and get 0; ids at or past ``K`` also get 0 (they name no turn).

    Args:
      turn_rewards: ``[B, K]`` float, one scalar per turn (turn ``k`` is the ``k``-th turn, root first).
      turn_ids: ``[B, T]`` int, the turn of each position's token, -1 on prompt/gap tokens.

    Returns:
      ``[B, T]`` array with ``turn_rewards``'s dtype.
    """
    _checks.check_rank("turn_rewards", turn_rewards, 2)
    _checks.check_rank("turn_ids", turn_ids, 2)
    if jnp.shape(turn_rewards)[0] != jnp.shape(turn_ids)[0]:
        raise ValueError(f"turn_rewards and turn_ids must share the batch axis, got {jnp.shape(turn_rewards)} and "
                         f"{jnp.shape(turn_ids)}")
    return _broadcast_jit(turn_rewards, turn_ids)


@jax.jit
def _broadcast_jit(turn_rewards, turn_ids):
    turn_rewards = jnp.asarray(turn_rewards)
    turn_ids = _checks.as_int("turn_ids", turn_ids)
    num_turns = turn_rewards.shape[1]
    valid = (turn_ids >= 0) & (turn_ids < num_turns)
    gathered = jnp.take_along_axis(turn_rewards, jnp.clip(turn_ids, 0, max(num_turns - 1, 0)), axis=1,
                                   mode="clip") if num_turns else jnp.zeros(turn_ids.shape, turn_rewards.dtype)
    return jnp.where(valid, gathered, jnp.zeros((), turn_rewards.dtype))


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
        if not np.issubdtype(host.dtype, np.integer):
            raise TypeError(f"spans must be an integer array, got dtype {host.dtype}")
        spans = np.clip(host, 0, width).astype(np.int32)
    return _spans_jit(spans, width=width)


@functools.partial(jax.jit, static_argnames=("width",))
def _spans_jit(spans, *, width):
    spans = jnp.clip(_checks.as_integer("spans", spans), 0, width).astype(jnp.int32)  # exact, at any width
    position = jnp.arange(width, dtype=jnp.int32)[None, None, :]
    inside = (position >= spans[..., :1]) & (position < spans[..., 1:])               # [B, K, T]
    turn = jnp.arange(spans.shape[1], dtype=jnp.int32)[None, :, None]
    return jnp.max(jnp.where(inside, turn, -1), axis=1, initial=-1)
