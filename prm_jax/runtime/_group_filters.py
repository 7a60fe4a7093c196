"""Group filters for grouped (GRPO-style) rollouts, applied to one complete sample group.

These are the dynamic filters of AReaL's ``examples/swe/filter_function.py``, decision for decision. For a
group: ``r = original_rewards`` if present else ``rewards`` (flattened); over **all** rows,
``mixed = any(r != r[0])`` and ``all_wrong = all(r <= 0)``.

- ``filter_function``: accepts mixed groups; ``all_correct = all(r >= 1 - 1e-3)``.
- ``filter_mixed_or_penalized_all_wrong``: also keeps an all-wrong group that carries a negative process
  reward on a generated token (``token_rewards < 0`` where the raw, unshifted ``loss_mask`` is 1);
  ``all_correct = all(r > 0)``.
- ``filter_mixed_or_penalized_all_wrong_mask_no_eos``: the same, except that the negative-process check
  ignores truncated rows (the rows whose penalties the actor clears under ``mask_no_eos_with_zero``).
  ``mixed`` and ``all_wrong`` still see every row.

The negative-process check runs only for a group that is not mixed and all wrong (AReaL short-circuits
it), and only then are its inputs required and checked. Each decision carries AReaL's counters:
``rejected_by_failed_or_perfect = not accepted``, ``rejected_by_all_correct = not accepted and
all_correct``, ``rejected_by_all_wrong = not accepted and not all_correct``, and for the two PRM filters
``accepted_penalized_all_wrong`` (an all-wrong group kept for its process penalty).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

CORRECT_THRESHOLD = 1.0 - 1e-3  # filter_function's "all correct"


class GroupFilterResult(NamedTuple):
    """What a group filter decided for one group: accepted or not, and the counts of each rejection reason
    (AReaL's filters' statistics).

    Attributes:
        accepted: Whether the group is kept.
        rejected_by_failed_or_perfect: Groups rejected as all failed or all perfect (0 or 1).
        rejected_by_all_correct: Groups rejected as all correct (0 or 1).
        rejected_by_all_wrong: Groups rejected as all wrong without a penalized turn (0 or 1).
        accepted_penalized_all_wrong: All-wrong groups kept because a turn was penalized (0 or 1).

    Example:
        >>> result = prm_jax.filters.filter_function({"rewards": np.array([1.0, 1.0])})
        >>> result.accepted, result.rejected_by_failed_or_perfect
        (False, 1)
    """

    accepted: bool
    rejected_by_failed_or_perfect: int
    rejected_by_all_correct: int
    rejected_by_all_wrong: int
    accepted_penalized_all_wrong: int  # always 0 for filter_function


@jax.jit
def group_filter_flags(rewards: jax.Array, negative_process_rows: jax.Array) -> tuple[jax.Array, jax.Array,
                                                                                        jax.Array]:
    """Jittable core over ``[G]`` rewards and ``[G]`` bool rows with a negative process reward.

    Returns ``(mixed, all_wrong, negative_process)`` as bool scalars over every row; the host filters
    below make the same decisions in float64.

    Args:
        rewards: ``[G]`` the group's outcome rewards.
        negative_process_rows: ``[G]`` bool: the rows with a negative process reward.

    Example:
        >>> flags = prm_jax.filters.group_filter_flags(np.array([0.0, 0.0]), np.array([False, True]))
        >>> [bool(f) for f in flags]
        [False, True, True]
    """
    return (jnp.any(rewards != rewards[0]), jnp.all(rewards <= 0), jnp.any(negative_process_rows))


def _group_rewards(group: Mapping[str, Any]) -> np.ndarray:
    key = "original_rewards" if group.get("original_rewards") is not None else "rewards"
    if group.get(key) is None:
        raise ValueError("group has no 'rewards' (nor 'original_rewards')")
    rewards = np.asarray(group[key], dtype=np.float64).reshape(-1)
    if rewards.size == 0:
        raise ValueError(f"group '{key}' must hold at least one reward")
    if not np.isfinite(rewards).all():
        raise ValueError(f"group '{key}' must be finite")
    return rewards


def _truncated_rows(group: Mapping[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    """``is_truncated`` if given, else ``seqlen == width``; ``attention_mask`` is required either way."""
    if group.get("attention_mask") is None:
        raise ValueError("the mask-no-EOS filter needs 'attention_mask' to tell truncated rows")
    attention_mask = np.asarray(group["attention_mask"])
    if attention_mask.shape != shape:
        raise ValueError(f"group 'attention_mask' must have the shape of 'loss_mask' {shape}, got "
                         f"{attention_mask.shape}")
    if group.get("is_truncated") is not None:
        truncated = np.asarray(group["is_truncated"]).astype(bool)
        if truncated.shape != shape[:1]:
            raise ValueError(f"group 'is_truncated' must have shape {shape[:1]}, got {truncated.shape}")
        return truncated
    return (attention_mask != 0).sum(axis=1) == shape[1]


def has_negative_process_reward(group: Mapping[str, Any], *, ignore_no_eos: bool) -> bool:
    """Whether a generated token (raw ``loss_mask`` 1) has ``token_rewards < 0``; False without either.

    With ``ignore_no_eos`` truncated rows do not count (see ``_truncated_rows``).
    """
    token_rewards, loss_mask = group.get("token_rewards"), group.get("loss_mask")
    if token_rewards is None or loss_mask is None:
        return False
    token_rewards, loss_mask = np.asarray(token_rewards), np.asarray(loss_mask)
    if token_rewards.ndim != 2 or token_rewards.shape != loss_mask.shape:
        raise ValueError(f"group 'token_rewards' and 'loss_mask' must both be [G, T] of one shape, got "
                         f"{token_rewards.shape} and {loss_mask.shape}")
    if not np.isfinite(token_rewards).all():
        raise ValueError("group 'token_rewards' must be finite")
    valid = loss_mask != 0
    if ignore_no_eos:
        valid = valid & ~_truncated_rows(group, loss_mask.shape)[:, None]
    return bool(((token_rewards < 0) & valid).any())


def _counted(accepted: bool, all_correct: bool, preserved: bool) -> GroupFilterResult:
    return GroupFilterResult(accepted, int(not accepted), int(not accepted and all_correct),
                             int(not accepted and not all_correct), int(preserved))


def filter_function(group: Mapping[str, Any]) -> GroupFilterResult:
    """AReaL's plain dynamic filter: accepts a group whose outcome rewards are not all equal.

    Args:
      group: mapping with ``rewards [G]`` (or ``original_rewards [G]``, preferred when present).

    Example:
        >>> prm_jax.filters.filter_function({"rewards": np.array([1.0, 0.0])}).accepted
        True
    """
    rewards = _group_rewards(group)
    accepted = bool((rewards != rewards[0]).any())
    return _counted(accepted, bool((rewards >= CORRECT_THRESHOLD).all()), False)


def _penalized_all_wrong(group: Mapping[str, Any], ignore_no_eos: bool) -> GroupFilterResult:
    rewards = _group_rewards(group)
    mixed = bool((rewards != rewards[0]).any())
    all_wrong = bool((rewards <= 0).all())
    preserved = not mixed and all_wrong and has_negative_process_reward(group, ignore_no_eos=ignore_no_eos)
    return _counted(mixed or preserved, bool((rewards > 0).all()), preserved)


def filter_mixed_or_penalized_all_wrong(group: Mapping[str, Any]) -> GroupFilterResult:
    """Accepts mixed-outcome groups and all-wrong groups with a negative process reward.

    Args:
      group: mapping with ``rewards [G]`` (or ``original_rewards [G]``, preferred when present) and
        optionally ``token_rewards [G, T]`` with the raw, unshifted ``loss_mask [G, T]``.

    Example:
        >>> group = {"rewards": np.array([0.0, 0.0]), "token_rewards": np.array([[0.0, -1.0], [0.0, 0.0]]),
        ...          "loss_mask": np.array([[0, 1], [0, 1]])}
        ...
        >>> prm_jax.filters.filter_mixed_or_penalized_all_wrong(group).accepted
        True
    """
    return _penalized_all_wrong(group, False)


def filter_mixed_or_penalized_all_wrong_mask_no_eos(group: Mapping[str, Any]) -> GroupFilterResult:
    """As ``filter_mixed_or_penalized_all_wrong``, with penalties on truncated rows ignored.

    When the penalty check runs (an all-wrong, unmixed group with ``token_rewards`` and ``loss_mask``),
    it needs ``attention_mask [G, T]``, even when ``is_truncated [G]`` is given (AReaL's rule); truncation
    is ``is_truncated`` when given, else ``seqlen == width``.

    Args:
        group: The group's arrays, by name (``rewards [G]``, ``token_rewards``, ``loss_mask``, ``attention_mask``
            ...).

    Example:
        >>> group = {"rewards": np.array([0.0, 0.0]), "token_rewards": np.array([[0.0, -1.0], [0.0, 0.0]]),
        ...          "loss_mask": np.array([[0, 1], [0, 1]]), "attention_mask": np.ones((2, 2)),
        ...          "is_truncated": np.array([True, False])}
        ...
        >>> prm_jax.filters.filter_mixed_or_penalized_all_wrong_mask_no_eos(group).accepted
        False
    """
    return _penalized_all_wrong(group, True)
