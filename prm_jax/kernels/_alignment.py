"""Aligning per-token tensors: turn rewards onto tokens, and positions onto next-token timesteps.

Conventions (batch-major, right-padded): position ``j`` of a ``[B, T]`` tensor holds token ``j``.
Timestep ``t`` is the state "prefix up to token ``t``", whose action is token ``t + 1``; PPO losses,
values and advantages live on timesteps. ``shift_to_next_token`` moves a position tensor onto timesteps.
"""

from __future__ import annotations

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

    Example:
        >>> np.asarray(prm_jax.kernels.shift_to_next_token(np.array([[1, 2, 3]]), fill=-1)).tolist()
        [[2, 3, -1]]
    """
    if np.ndim(x) < 1:
        raise ValueError(f"x must have a time axis, got shape {np.shape(x)}")
    return _shift_jit(x, fill)


def shift_to_previous_position(mask: jax.Array) -> jax.Array:
    """A ``[B, T]`` timestep mask as positions: ``out[:, p] = mask[:, p - 1]``, False at ``p = 0``
    (``shift_to_next_token``'s inverse on the entries it keeps: position ``p``'s value is read at timestep
    ``p - 1``), so a position tensor can be checked where it is read without making its shifted copy."""
    return jnp.concatenate([jnp.zeros(mask.shape[:1] + (1,), jnp.bool_), mask[:, :-1]], axis=1)


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

    Example:
        >>> rewards = prm_jax.kernels.broadcast_turn_rewards(np.array([[0.5, -1.0]], np.float32), np.array([[-1, 0, 0, -1, 1]]))
        >>> np.asarray(rewards).tolist()
        [[0.0, 0.5, 0.5, 0.0, -1.0]]
    """
    _checks.check_rank("turn_rewards", turn_rewards, 2)
    _checks.check_rank("turn_ids", turn_ids, 2)
    if np.shape(turn_rewards)[0] != np.shape(turn_ids)[0]:
        raise ValueError(f"turn_rewards and turn_ids must share the batch axis, got {np.shape(turn_rewards)} and "
                         f"{np.shape(turn_ids)}")
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
