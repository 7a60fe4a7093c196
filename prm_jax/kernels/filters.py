"""Group filters for grouped (GRPO-style) rollouts, applied to one complete sample group.

For a group: ``r = original_rewards`` if present else ``rewards``;
``mixed = any(r != r[0])``; ``all_wrong = all(r <= 0)``;
``negative_process = any(token_rewards < 0 where the raw, unshifted loss_mask is 1)``.
``filter_mixed_or_penalized_all_wrong`` accepts mixed groups, and all-wrong groups that still carry a
negative process signal. The ``_mask_no_eos`` variant first drops truncated rows (the rows the actor
zeroes with ``mask_no_eos_with_zero``); a group with no untruncated row is rejected and counted by
neither rejection counter.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class GroupFilterResult(NamedTuple):
    accepted: bool
    accepted_penalized_all_wrong: int
    rejected_by_all_correct: int
    rejected_by_all_wrong: int


def _flags(xp, rewards, rows, negative_process_rows):
    first = rewards[xp.argmax(rows)]
    mixed = xp.any(rows & (rewards != first))
    all_wrong = xp.all(~rows | (rewards <= 0))
    return mixed, all_wrong, xp.any(rows & negative_process_rows)


@jax.jit
def group_filter_flags(rewards: jax.Array, rows: jax.Array, negative_process_rows: jax.Array):
    """Jittable core over ``[G]`` rewards, ``[G]`` bool rows taken, ``[G]`` bool negative-process rows.

    Returns ``(mixed, all_wrong, negative_process)`` as bool scalars over the rows taken (the first taken
    row's reward is the reference for ``mixed``). The host filters below run the same code in float64.
    """
    return _flags(jnp, rewards, rows, negative_process_rows)


def _group_rewards(group: Mapping[str, Any]) -> np.ndarray:
    key = "original_rewards" if group.get("original_rewards") is not None else "rewards"
    if group.get(key) is None:
        raise ValueError("group has no 'rewards' (nor 'original_rewards')")
    rewards = np.asarray(group[key], dtype=np.float64)
    if rewards.ndim != 1 or rewards.size == 0:
        raise ValueError(f"group '{key}' must be a non-empty 1-D array, got shape {rewards.shape}")
    if not np.isfinite(rewards).all():
        raise ValueError(f"group '{key}' must be finite, got {rewards.tolist()}")
    return rewards


def _negative_process_rows(group: Mapping[str, Any], size: int) -> np.ndarray:
    token_rewards, loss_mask = group.get("token_rewards"), group.get("loss_mask")
    if token_rewards is None or loss_mask is None:
        return np.zeros(size, bool)
    token_rewards, loss_mask = np.asarray(token_rewards), np.asarray(loss_mask)
    if token_rewards.ndim != 2 or token_rewards.shape != loss_mask.shape or token_rewards.shape[0] != size:
        raise ValueError(f"group 'token_rewards' and 'loss_mask' must both be [{size}, T], got "
                         f"{token_rewards.shape} and {loss_mask.shape}")
    return ((token_rewards < 0) & (loss_mask != 0)).any(axis=1)


def _decide(group: Mapping[str, Any], rows: np.ndarray | None) -> GroupFilterResult:
    rewards = _group_rewards(group)
    negative = _negative_process_rows(group, rewards.size)
    rows = np.ones(rewards.size, bool) if rows is None else rows
    if not rows.any():
        return GroupFilterResult(False, 0, 0, 0)
    mixed, all_wrong, negative_process = (bool(x) for x in _flags(np, rewards, rows, negative))
    if mixed:
        return GroupFilterResult(True, 0, 0, 0)
    if all_wrong and negative_process:
        return GroupFilterResult(True, 1, 0, 0)
    if all_wrong:
        return GroupFilterResult(False, 0, 0, 1)
    return GroupFilterResult(False, 0, 1, 0)


def filter_mixed_or_penalized_all_wrong(group: Mapping[str, Any]) -> GroupFilterResult:
    """Accepts mixed-outcome groups and all-wrong groups with a negative process reward.

    Args:
      group: mapping with ``rewards [G]`` (or ``original_rewards [G]``, preferred when present) and
        optionally ``token_rewards [G, T]`` with the raw, unshifted ``loss_mask [G, T]``.
    """
    return _decide(group, None)


def filter_mixed_or_penalized_all_wrong_mask_no_eos(group: Mapping[str, Any]) -> GroupFilterResult:
    """The same decision over the group's untruncated rows.

    Truncation is ``is_truncated [G]`` when given, else ``seqlen == width`` from ``attention_mask [G, T]``
    (required then).
    """
    size = _group_rewards(group).size
    if group.get("is_truncated") is not None:
        truncated = np.asarray(group["is_truncated"]).astype(bool)
        if truncated.shape != (size,):
            raise ValueError(f"group 'is_truncated' must have shape ({size},), got {truncated.shape}")
    else:
        if group.get("attention_mask") is None:
            raise ValueError("filter_mixed_or_penalized_all_wrong_mask_no_eos needs 'is_truncated' or "
                             "'attention_mask' to tell truncated rows")
        attention_mask = np.asarray(group["attention_mask"])
        if attention_mask.ndim != 2 or attention_mask.shape[0] != size:
            raise ValueError(f"group 'attention_mask' must be [{size}, T], got {attention_mask.shape}")
        truncated = (attention_mask != 0).sum(axis=1) == attention_mask.shape[1]
    return _decide(group, ~truncated)
