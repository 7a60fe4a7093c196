"""Scored branches to padded batches: one host buffer per field (``jax.device_put`` moves it in one call).

Widths are bucketed (to a multiple of ``bucket``, or to a power of two) and the row count can be padded
to a fixed size, so a trainer compiles ``compute_advantages`` a handful of times rather than once per
length. Padding rows have an all-zero attention mask and ``turn_ids`` of -1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from prm_jax.runtime.trajectory import BranchSequence

FIELDS = {
    "input_ids": (np.int32, 0),
    "attention_mask": (np.int32, 0),
    "loss_mask": (np.int32, 0),
    "logprobs": (np.float32, 0.0),
    "turn_ids": (np.int32, -1),
    "token_rewards": (np.float32, 0.0),
}


def bucket_width(length: int, bucket: int | str = 128, min_width: int = 1) -> int:
    """``length`` rounded up to a multiple of ``bucket``, or to a power of two for ``"pow2"``."""
    length = max(int(length), int(min_width), 1)
    if bucket == "pow2":
        return 1 << (length - 1).bit_length()
    if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 1:
        raise ValueError(f"bucket must be a positive integer or 'pow2', got {bucket!r}")
    return -(-length // bucket) * bucket


def pack_branches(sequences: Sequence[BranchSequence], *, bucket: int | str = 128, width: int | None = None,
                  rows: int | None = None, min_width: int = 1) -> dict[str, np.ndarray]:
    """Right-pads branch sequences into ``[rows, width]`` numpy buffers (``rewards``/``is_truncated`` ``[rows]``).

    ``token_rewards`` is present when any branch has token rewards. Every branch needs an outcome reward.
    """
    if not sequences:
        raise ValueError("pack_branches needs at least one sequence")
    longest = max(len(seq.input_ids) for seq in sequences)
    if width is None:
        width = bucket_width(longest, bucket, min_width)
    elif width < longest:
        raise ValueError(f"width {width} is shorter than the longest sequence ({longest} tokens)")
    rows = len(sequences) if rows is None else rows
    if rows < len(sequences):
        raise ValueError(f"rows {rows} is fewer than the {len(sequences)} sequences")
    with_rewards = any(seq.token_rewards is not None for seq in sequences)
    batch: dict[str, np.ndarray] = {name: np.full((rows, width), fill, dtype) for name, (dtype, fill) in FIELDS.items()
             if name != "token_rewards" or with_rewards}
    batch["rewards"] = np.zeros(rows, np.float32)
    batch["is_truncated"] = np.zeros(rows, bool)
    _per_turn(batch, sequences, rows)
    for b, seq in enumerate(sequences):
        if seq.reward is None:
            raise ValueError(f"branch ending at {seq.leaf_id!r} has no outcome reward")
        n = len(seq.input_ids)
        batch["input_ids"][b, :n] = seq.input_ids
        batch["attention_mask"][b, :n] = 1
        batch["loss_mask"][b, :n] = seq.loss_mask
        batch["logprobs"][b, :n] = seq.logprobs
        batch["turn_ids"][b, :n] = seq.turn_ids
        if with_rewards and seq.token_rewards is not None:
            batch["token_rewards"][b, :n] = seq.token_rewards
        batch["rewards"][b] = seq.reward
        batch["is_truncated"][b] = seq.is_truncated
    return batch


def _per_turn(batch: dict[str, np.ndarray], sequences: Sequence[BranchSequence], rows: int) -> None:
    """GiGPO's per-turn inputs, ``[rows, K]`` with K the most turns of a branch: ``anchor_ids`` (-1 where a
    turn has none, int64 as given; ``dense_anchor_ids`` makes them int32) and ``turn_rewards`` (0 where a
    turn has no step reward). Each is present when any turn of the batch has one."""
    turns = max(len(seq.interaction_ids) for seq in sequences)
    if any(a is not None for seq in sequences for a in seq.anchor_ids):
        anchors = np.full((rows, turns), -1, np.int64)
        for b, seq in enumerate(sequences):
            anchors[b, :len(seq.anchor_ids)] = [-1 if a is None else a for a in seq.anchor_ids]
        batch["anchor_ids"] = anchors
    if any(r is not None for seq in sequences for r in seq.step_rewards):
        step_rewards = np.zeros((rows, turns), np.float32)
        for b, seq in enumerate(sequences):
            step_rewards[b, :len(seq.step_rewards)] = [0.0 if r is None else r for r in seq.step_rewards]
        batch["turn_rewards"] = step_rewards
