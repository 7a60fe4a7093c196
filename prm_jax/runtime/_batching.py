"""Scored branches to padded batches: one host buffer per field (``jax.device_put`` moves it in one call).

Widths are bucketed (to a multiple of ``bucket``, or to a power of two) and the row count can be padded
to a fixed size, so a trainer compiles ``compute_advantages`` a handful of times rather than once per
length. Padding rows have an all-zero attention mask and ``turn_ids`` of -1. Every buffer starts on a
64-byte boundary: on the CPU backend ``jax.device_put`` then aliases it instead of copying it (numpy's own
allocations are only 16-byte aligned), so do not write into a batch after putting it on the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from prm_jax.kernels._gigpo import dense_anchor_ids
from prm_jax.kernels._schema import BATCH_SCHEMA, MODEL_OUTPUT_KEYS
from prm_jax.runtime._trajectory import MODEL_OUTPUT_FIELDS, BranchSequence


def bucket_width(length: int, bucket: int | str = 128, min_width: int = 1) -> int:
    """``length`` rounded up to a multiple of ``bucket``, or to a power of two for ``"pow2"``.

    Args:
        length: The length to round, >= 0.
        bucket: A multiple to round up to, >= 1, or ``"pow2"``.
        min_width: The smallest width returned, >= 1.

    Example:
        >>> prm_jax.runtime.bucket_width(130), prm_jax.runtime.bucket_width(130, 64), prm_jax.runtime.bucket_width(130, "pow2")
        (256, 192, 256)
    """
    length = max(int(length), int(min_width), 1)
    if bucket == "pow2":
        return 1 << (length - 1).bit_length()
    if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 1:
        raise ValueError(f"bucket must be a positive integer or 'pow2', got {bucket!r}")
    return -(-length // bucket) * bucket


def pack_branches(sequences: Sequence[BranchSequence], *, bucket: int | str = 128, width: int | None = None,
                  rows: int | None = None, min_width: int = 1, group_sizes: Sequence[int] | None = None,
                  token_rewards: bool = True, per_turn: bool = False, turns: int | None = None,
                  sessions: Sequence[str] | None = None, model_outputs: bool = False) -> dict[str, np.ndarray]:
    """Right-pads branch sequences into ``[rows, width]`` numpy buffers.

    The keys depend only on the arguments, never on the content (a jitted step sees one structure):
    ``input_ids``, ``attention_mask``, ``loss_mask``, ``logprobs``, ``turn_ids``, ``rewards [rows]``,
    ``is_truncated [rows]``, ``group_ids [rows]`` (consecutive groups of ``group_sizes``, else one group;
    -1 on padding rows), and with ``token_rewards`` (default) ``token_rewards`` (0 where a branch has none:
    AReaL's value for an unscored turn). Pass ``token_rewards=False`` when no scorer runs: a batch with the
    key is shaped, and under ``process_weighted`` a process reward of 0 zeroes a positive advantage; then
    no token reward of the branches is used at all (GiGPO's derived step rewards included).
    ``per_turn`` adds GiGPO's ``anchor_ids [rows, K]`` int32 (``dense_anchor_ids``: -1 for no anchor),
    ``turn_rewards [rows, K]`` (the turn's step reward, 0 where it has none) and ``turn_reward_mask [rows, K]``
    bool (True where a turn has one; where False ``compute_advantages`` derives it from the turn's process
    rewards by ``GiGPOConfig.step_reward``), ``K = turns`` or the most turns of a branch. ``sessions`` (each
    sequence's session key) adds the session trees for
    ``credit_assignment: {mode: tree}``: ``node_ids [rows, K]`` (the node of each row's turn ``k``, -1 for
    none) and ``node_parents [rows * K]`` (each node's parent, -1 for a root or an unused slot), a node
    being one interaction of one session (branches of a session share their common turns' nodes).
    ``model_outputs`` adds the schema's per-token model outputs ``[rows, width]`` on *timesteps* (as
    ``compute_advantages`` reads them: the value for position ``t + 1``'s token at ``t``): MODEL_OUTPUTS
    (``MODEL_OUTPUT_FIELDS``, from the schema); NaN on the tokens of a turn (or a branch) without
    them, so a stage that reads them refuses the batch instead of training on 0 (``compute_advantages``
    names the row and timestep).
    Every branch needs an outcome reward.

    Args:
        sequences: The branches to pack (``BranchSequence``), one row each.
        bucket: The width is rounded up to a multiple of this (or ``"pow2"``), so a jitted step compiles per bucket.
        width: A fixed width ``T`` (at least the longest branch); ``None``: the longest, bucketed.
        rows: A fixed number of rows (padding rows after the branches); ``None``: one per branch.
        min_width: The smallest width, >= 1.
        group_sizes: Consecutive groups' sizes (summing to the branches); ``None``: one group.
        token_rewards: Whether ``token_rewards`` is packed (``False`` when no scorer runs).
        per_turn: Whether GiGPO's ``anchor_ids``, ``turn_rewards`` and ``turn_reward_mask`` are packed.
        turns: ``K`` of the per-turn and tree arrays; ``None``: the most turns of a branch.
        sessions: Each sequence's session key, to pack the session trees (``credit_assignment: {mode: tree}``);
            ``None``: none.
        model_outputs: Whether the per-token model outputs are packed (on timesteps).

    Example:
        >>> cache = prm_jax.InteractionCache([
        ...     prm_jax.Interaction("t0", [1], [2, 3]),
        ...     prm_jax.Interaction("t1", [1, 2, 3, 7], [8], parent_id="t0", reward=1.0)])
        >>> batch = prm_jax.pack_branches([cache.to_sequence("t1")], bucket=8)
        >>> batch["input_ids"].tolist(), batch["loss_mask"].tolist(), batch["turn_ids"].tolist()
        ([[1, 2, 3, 7, 8, 0, 0, 0]], [[0, 1, 1, 0, 1, 0, 0, 0]], [[-1, 0, 0, -1, 1, -1, -1, -1]])
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
    most = max(len(seq.interaction_ids) for seq in sequences)
    if sessions is not None and len(sessions) != len(sequences):
        raise ValueError(f"sessions must name one session per sequence: {len(sessions)} for {len(sequences)}")
    if (per_turn or sessions is not None) and turns is not None and turns < most:
        raise ValueError(f"turns {turns} is fewer than the {most} turns of the longest branch")
    count = most if turns is None else turns
    batch = empty_batch(rows, width, token_rewards=token_rewards, turns=count if per_turn else None,
                        tree_turns=count if sessions is not None else None, model_outputs=model_outputs)
    batch["group_ids"] = _group_ids(group_sizes, len(sequences), rows)
    for b, seq in enumerate(sequences):
        if seq.reward is None:
            raise ValueError(f"branch ending at {seq.leaf_id!r} has no outcome reward")
        n = len(seq.input_ids)
        batch["input_ids"][b, :n] = seq.input_ids
        batch["attention_mask"][b, :n] = 1
        batch["loss_mask"][b, :n] = seq.loss_mask
        batch["logprobs"][b, :n] = seq.logprobs
        batch["turn_ids"][b, :n] = seq.turn_ids
        if token_rewards and seq.token_rewards is not None:
            batch["token_rewards"][b, :n] = seq.token_rewards
        batch["rewards"][b] = seq.reward
        batch["is_truncated"][b] = seq.is_truncated
        for key in MODEL_OUTPUT_KEYS if model_outputs else ():
            on_positions = seq.model_outputs.get(key)
            if on_positions is None:  # a branch without them: NaN where it is trained, never a silent 0
                on_positions = np.where(seq.loss_mask > 0, np.float32(np.nan), np.float32(0))
            if n > 1:
                batch[key][b, :n - 1] = on_positions[1:]  # position t + 1 -> timestep t
    if per_turn:
        _per_turn(batch, sequences)
    if sessions is not None:
        _session_trees(batch, sequences, sessions)
    return batch


def _listed(names: list[str]) -> str:
    quoted = [f"``{name}``" for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


# The model outputs pack_branches carries, in its docstring as the schema declares them (never pasted).
pack_branches.__doc__ = (pack_branches.__doc__ or "").replace("MODEL_OUTPUTS", (
    f"{_listed(list(MODEL_OUTPUT_FIELDS))}, from the interactions' {_listed(list(MODEL_OUTPUT_FIELDS.values()))}"))


def _session_trees(batch: dict[str, np.ndarray], sequences: Sequence[BranchSequence], sessions: Sequence[str]) -> None:
    """Numbers each ``(session, interaction)`` once, in first-seen order, with its parent's number."""
    node_ids, parents = batch["node_ids"], batch["node_parents"]
    number: dict[tuple[str, str], int] = {}
    for b, (seq, session) in enumerate(zip(sequences, sessions)):
        above = -1
        for k, interaction_id in enumerate(seq.interaction_ids):
            key = (session, interaction_id)
            if key not in number:
                number[key] = len(number)
                parents[number[key]] = above
            node_ids[b, k] = above = number[key]


def empty_batch(rows: int, width: int, *, token_rewards: bool = True, turns: int | None = None,
                tree_turns: int | None = None, model_outputs: bool = False) -> dict[str, np.ndarray]:
    """``rows`` padding rows with ``pack_branches``' keys, dtypes and fill values (``turns``: with GiGPO's
    per-turn arrays, ``[rows, turns]``; ``tree_turns``: with the session trees' ``node_ids [rows,
    tree_turns]`` and ``node_parents [rows * tree_turns]``): a fixed-shape template, e.g. to compile a step
    before any data. Its parameters are ``batch_spec``'s.

    Example:
        >>> batch = prm_jax.runtime.empty_batch(2, 4)
        >>> batch["turn_ids"].tolist(), batch["rewards"].tolist()
        ([[-1, -1, -1, -1], [-1, -1, -1, -1]], [0.0, 0.0])
    """
    spec = batch_spec(rows, width, token_rewards=token_rewards, turns=turns, tree_turns=tree_turns,
                      model_outputs=model_outputs)
    return {name: aligned_full(shape, fill, dtype) for name, (shape, dtype, fill) in spec.items()}


def batch_spec(rows: int, width: int, *, token_rewards: bool = True, turns: int | None = None,
               tree_turns: int | None = None,
               model_outputs: bool = False) -> dict[str, tuple[tuple[int, ...], type, float | int | bool]]:
    """``pack_branches``' keys with the shape, dtype and padding value of each (nothing allocated), from
    ``BATCH_SCHEMA``: its ``packed`` argument says which of them adds a key.

    Args:
        rows: The batch's rows.
        width: The padded width ``T``.
        token_rewards: Whether the batch holds ``token_rewards`` (as ``pack_branches``' argument).
        turns: ``K``, with GiGPO's per-turn arrays ``[rows, K]``; ``None``: without them.
        tree_turns: ``K``, with the session trees' ``node_ids`` and ``node_parents``; ``None``: without them.
        model_outputs: Whether the batch holds the per-token model outputs (as ``pack_branches``' argument).

    Example:
        >>> spec = prm_jax.runtime.batch_spec(2, 8, turns=3)
        >>> spec["turn_ids"], spec["anchor_ids"][0]
        (((2, 8), <class 'numpy.int32'>, -1), (2, 3))
    """
    added = {"always": True, "token_rewards": token_rewards, "per_turn": turns is not None,
             "model_outputs": model_outputs, "sessions": tree_turns is not None, "never": False}
    slots = {"per_turn": turns, "sessions": tree_turns}
    spec: dict[str, tuple[tuple[int, ...], type, float | int | bool]] = {}
    for name, key in BATCH_SCHEMA.items():
        if not added[key.packed]:
            continue
        shape = {"BT": (rows, width), "B": (rows,), "BK": (rows, slots.get(key.packed) or 0),
                 "N": (rows * (tree_turns or 0),), "G": (rows,)}[key.shape]
        spec[name] = (shape, key.numpy_dtype, key.fill)
    return spec


ALIGNMENT = 64  # what XLA's CPU client needs to alias a host buffer rather than copy it


def aligned_full(shape: tuple[int, ...], fill: float | int | bool, dtype: type) -> np.ndarray:
    """``np.full(shape, fill, dtype)`` starting on an ``ALIGNMENT``-byte boundary (a view into a slightly
    larger byte buffer)."""
    dtype_ = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype_.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    out = raw[start:start + nbytes].view(dtype_).reshape(shape)
    out.fill(fill)
    return out


def _group_ids(group_sizes: Sequence[int] | None, real: int, rows: int) -> np.ndarray:
    ids = aligned_full((rows,), -1, np.int32)
    if group_sizes is None:
        ids[:real] = 0
        return ids
    sizes = np.asarray(group_sizes)
    if sizes.ndim != 1 or not np.issubdtype(sizes.dtype, np.integer) or (sizes < 1).any() or sizes.sum() != real:
        raise ValueError(f"group_sizes must be positive integers summing to the {real} sequences, got "
                         f"{np.asarray(group_sizes).tolist()}")
    ids[:real] = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    return ids


def _per_turn(batch: dict[str, np.ndarray], sequences: Sequence[BranchSequence]) -> None:
    """Fills GiGPO's per-turn inputs: ``anchor_ids`` (dense int32 ids, equal exactly where the turns' anchors
    are: any 64-bit ids, signed or unsigned, compared whole; -1 where a turn has none), ``turn_rewards`` (the
    step reward, 0 where a turn has none) and ``turn_reward_mask`` (where a turn has one: elsewhere
    ``compute_advantages`` derives it, with the configured rule, from the process rewards it is given, one
    home for that rule; a NaN could be a failed score, so "derive" has its own mask)."""
    anchors, step_rewards, given_mask = batch["anchor_ids"], batch["turn_rewards"], batch["turn_reward_mask"]
    given = np.full(anchors.shape, -1, dtype=object)  # Python ints: no numpy dtype holds -1 beside 2**63
    for b, seq in enumerate(sequences):
        given[b, :len(seq.anchor_ids)] = [-1 if a is None else a for a in seq.anchor_ids]
    anchors[...] = dense_anchor_ids(given)
    for b, seq in enumerate(sequences):
        step_rewards[b, :len(seq.step_rewards)] = [0.0 if r is None else r for r in seq.step_rewards]
        given_mask[b, :len(seq.step_rewards)] = [r is not None for r in seq.step_rewards]
