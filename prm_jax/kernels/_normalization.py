"""Masked, token-weighted normalization of advantages ([B, T]) and outcome rewards ([B]): AReaL's rules.

Group-level normalization of outcome rewards is GRPO's baseline (Shao et al., "DeepSeekMath", 2024,
arXiv:2402.03300); the leave-one-out mean is RLOO's (Ahmadian et al., "Back to Basics", 2024,
arXiv:2402.14740).

This module is the only home of group statistics: the rules below, GiGPO's weighted moments
(``weighted_moments``) and the export proxy's host-side z-score (``proxy_normalize``).

Statistics are taken over active entries only, per level (``batch``: all rows; ``group``: the rows of one
sample group); ``n`` and ``S`` are the level's active count and sum. Per entry:

  mean  mu_i = S / n                                  (0 when n = 0; level None: 0)
        leave-one-out: mu_i = (S - x_i) / (n - 1) at active entries, S / n elsewhere, 0 when n <= 1;
        a group with a single member uses mu_i = x_i (it has no peer to leave out: it normalizes to 0)
  std   SS = sum over the std level of (x_i - mu_i)**2 at active entries (around each entry's own mu:
        the leave-one-out means, the other level's mean, or 0 when the mean level is None)
        unbiased sqrt(SS / (n - 1)), 1 when n <= 1 (and 1 for a single-member group);
        biased sqrt(SS / n), 1 when n = 0; level None: 1 with eps 0
  out   (x_i - mu_i) * m_i / (std + eps)

Single-member rules count rows (or logical members, ``group_member_counts``), never tokens. Masked entries
come out as 0 and are selected with ``where``, so NaN/Inf there never leak (AReaL multiplies by the mask
and propagates them); an input with no active entry is returned unchanged. A fixed ``group_size`` that
does not divide the batch is an error (AReaL would divide the tail by eps).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax._validation import boolean, finite_number, integer, one_of, short_repr
from prm_jax.errors import ConfigError
from prm_jax.kernels import _checks
from prm_jax.kernels._stage import StageResult, StageSpec

NormLevel = Literal["batch", "group"] | None
NORM_LEVELS: tuple[NormLevel, ...] = ("batch", "group", None)


@dataclasses.dataclass(frozen=True)
class NormConfig:
    """AReaL's ``NormConfig``: hashable, so it is a static argument and never causes a retrace.

    Args:
        mean_level: Where the mean is taken: ``batch``, ``group`` or ``None`` (no centring).
        std_level: Where the std is taken: ``batch``, ``group`` or ``None`` (no scaling).
        mean_leave1out: Whether each entry's mean leaves the entry itself out (RLOO's baseline).
        std_unbiased: Whether the std divides by ``n - 1`` (AReaL's default) rather than ``n``.
        eps: Added to the std before dividing, >= 0.
        group_size: Rows per group when no ``group_sizes`` are given (equal groups), >= 1.

    Example:
        >>> norm = prm_jax.NormConfig(mean_level="group", std_level="group", std_unbiased=False)
        >>> x = np.array([1.0, 3.0, 10.0, 20.0], np.float32)
        >>> np.asarray(prm_jax.kernels.normalize(x, norm=norm, group_sizes=np.array([2, 2])), np.float64).round(3).tolist()
        [-1.0, 1.0, -1.0, 1.0]
    """

    mean_level: NormLevel = "batch"
    std_level: NormLevel = "batch"
    mean_leave1out: bool = False
    std_unbiased: bool = True
    eps: float = 1e-5
    group_size: int = 1

    def __post_init__(self):
        for key in ("mean_level", "std_level"):
            one_of(key, getattr(self, key), NORM_LEVELS, config=True)
        object.__setattr__(self, "eps", finite_number("eps", self.eps, minimum=0.0))
        for key in ("mean_leave1out", "std_unbiased"):
            boolean(key, getattr(self, key))
        integer("group_size", self.group_size, minimum=1)

    @property
    def uses_groups(self) -> bool:
        return "group" in (self.mean_level, self.std_level)

    @property
    def spec(self) -> StageSpec:
        """As ``actor.reward_norm`` (AReaL's fields): the outcome stage's normalization of the ``[B]`` rewards."""
        return OUTCOME_NORM


@dataclasses.dataclass(frozen=True)
class DecoupledNorm:
    """``actor.reward_norm: {mode: decoupled, weights, eps}``: GDPO's normalization of the outcome reward and
    the batch's ``reward_sources [B, K]`` (``decoupled_normalization``); ``weights`` one per source, the
    outcome first (default 1 each).

    Args:
        weights: One weight per reward source, the outcome first, each >= 0; ``None``: 1 each.
        eps: Added to each source's std before dividing, > 0.

    Example:
        >>> config = prm_jax.AdvantageConfig(reward_norm={"mode": "decoupled", "weights": [1.0, 0.5]})
        >>> config.reward_norm
        DecoupledNorm(weights=(1.0, 0.5), eps=0.0001)
    """

    weights: tuple[float, ...] | None = None
    eps: float = 1e-4

    def __post_init__(self):
        if self.weights is not None:
            if isinstance(self.weights, (str, bytes)) or not hasattr(self.weights, "__iter__"):
                raise ConfigError("weights", f"must be a list of numbers, got {short_repr(self.weights)}")
            object.__setattr__(self, "weights", tuple(finite_number(f"weights[{i}]", w)
                                                      for i, w in enumerate(self.weights)))
        object.__setattr__(self, "eps", finite_number("eps", self.eps, minimum=0.0))

    @property
    def spec(self) -> StageSpec:
        return DECOUPLED_NORM


class GroupLayout(NamedTuple):
    """Which group each row belongs to, and each group's member count (for the single-member rules)."""

    row_group: jax.Array  # [B] int32, group of each row
    num_groups: int     # static
    members: jax.Array  # [G] int32: rows per group, or the logical member counts of split rollouts


def group_layout(batch: int, norm: NormConfig, group_sizes: jax.Array | None,
                 member_counts: jax.Array | None = None, group_ids: jax.Array | None = None) -> GroupLayout:
    """Rows -> groups from ``group_sizes [G]`` (consecutive groups), else ``group_ids [B]`` (a group id per
    row in ``[0, B)``, -1 for a padding row: one shape for any number of groups), else ``norm.group_size``.

    With ``group_ids`` there are ``B + 1`` group slots; padding rows share the last one, which holds no
    real row.
    """
    if group_sizes is None and group_ids is not None:
        if member_counts is not None:
            raise ValueError("group_member_counts goes with group_sizes [G], not with group_ids [B]")
        ids = _checks.as_int("group_ids", group_ids)
        index = jnp.where(ids >= 0, ids, batch)
        members = jax.ops.segment_sum(jnp.ones((batch,), jnp.int32), index, num_segments=batch + 1)
        return GroupLayout(index, batch + 1, members)
    if group_sizes is not None:
        sizes = _checks.as_int("group_sizes", group_sizes)
        _checks.check_rank("group_sizes", sizes, 1)
        ends = jnp.cumsum(sizes)
        index = jnp.searchsorted(ends, jnp.arange(batch, dtype=jnp.int32), side="right").astype(jnp.int32)
        num_groups = sizes.shape[0]
        rows = sizes
    else:
        if batch % norm.group_size:
            raise ValueError(f"group_size {norm.group_size} does not divide the batch size {batch}; pass "
                             "group_sizes for groups of different sizes")
        index = jnp.arange(batch, dtype=jnp.int32) // norm.group_size
        num_groups = batch // norm.group_size
        rows = jnp.full((num_groups,), norm.group_size, jnp.int32)
    if member_counts is None:
        return GroupLayout(index, num_groups, rows)
    _checks.check_shape("group_member_counts", member_counts, (num_groups,), "the groups")
    return GroupLayout(index, num_groups, _checks.as_int("group_member_counts", member_counts))


#: The batch's GRPO groups as a normalization's levels (group-wise credit modes read them).
GRPO_GROUPS = NormConfig("group", "group")


def batch_groups(batch: Mapping[str, jax.Array], num_rows: int, norm: NormConfig) -> GroupLayout | None:
    """The group layout ``norm`` uses for a batch (its ``group_sizes``, ``group_member_counts`` or
    ``group_ids``); ``None`` for a normalization without a group level."""
    if not norm.uses_groups:
        return None
    return group_layout(num_rows, norm, batch.get("group_sizes"), batch.get("group_member_counts"),
                        batch.get("group_ids"))


def given_groups(rows: int, group_sizes: Any, group_ids: Any) -> tuple[jax.Array, int, list[_checks.ValueCheck]]:
    """A kernel's GRPO groups: ``(row_group [B], num_groups, checks)`` from ``group_sizes [G]`` (consecutive)
    or ``group_ids [B]`` (-1: a padding row), with the one check of each; neither: the batch is one group."""
    if group_sizes is None and group_ids is None:
        return jnp.zeros((rows,), jnp.int32), 1, []
    check = group_sizes_check(group_sizes, rows) if group_sizes is not None else group_ids_check(group_ids, rows)
    layout = group_layout(rows, GRPO_GROUPS, group_sizes, None, group_ids)
    return layout.row_group, layout.num_groups, [check]


def row_groups(groups: GroupLayout | None, rows: int) -> tuple[jax.Array, int]:
    """``(row_group [B], num_groups)``: the batch's GRPO groups, else the whole batch as one group.

    Args:
        groups: The batch's GRPO group layout, or ``None`` (the whole batch one group).
        rows: ``B``, the batch's rows.

    Example:
        >>> row_group, count = prm_jax.estimators.row_groups(None, 3)
        >>> np.asarray(row_group).tolist(), count
        ([0, 0, 0], 1)
    """
    if groups is not None:
        return groups.row_group, groups.num_groups
    return jnp.zeros((rows,), jnp.int32), 1


def group_sizes_check(group_sizes: jax.Array, batch: int) -> _checks.ValueCheck:
    """The one check of ``group_sizes``: positive and summing to the batch (eagerly, or under ``jit``)."""
    sizes = _checks.as_int("group_sizes", group_sizes)
    failed = (jnp.any(sizes <= 0) | (jnp.sum(sizes) != batch)).astype(jnp.int32)
    return _checks.ValueCheck(
        "group_sizes_invalid", failed, lambda sizes: f"group_sizes must be positive and sum to the batch size {batch}, got "
                              f"{sizes.tolist()}", sizes)


def group_ids_check(group_ids: jax.Array, batch: int) -> _checks.ValueCheck:
    """Group ids are -1 (padding) or in ``[0, B)``."""
    ids = _checks.as_int("group_ids", group_ids)
    bad = (ids < -1) | (ids >= batch)
    _, entry, value = _checks.first_flagged(bad[None], ids[None])
    return _checks.ValueCheck("group_ids_invalid", _checks.violations(bad), lambda entry, value:
                              f"group_ids must be -1 (padding) or in [0, {batch}); entry {int(entry)} is {int(value)}",
                              entry, value)


def member_counts_check(member_counts: jax.Array) -> _checks.ValueCheck:
    counts = _checks.as_int("group_member_counts", member_counts)
    return _checks.ValueCheck("group_member_counts_invalid", _checks.violations(counts < 1),
                              lambda counts: "group_member_counts must be >= 1 for "
                              f"every group, got {counts.tolist()}", counts)


def segment_totals(x: jax.Array, segment: jax.Array, num_segments: int, indices_are_sorted: bool = False) -> jax.Array:
    """``[N, ...]``: the sum of ``x`` over each entry's segment (along the first axis), broadcast back."""
    return jax.ops.segment_sum(x, segment, num_segments=num_segments, indices_are_sorted=indices_are_sorted)[segment]


class Moments(NamedTuple):
    """Masked moments, broadcast back to the entries: ``n`` the count of present entries, ``total`` their
    sum, their ``mean``, each entry's deviation from the center (the mean, unless one was given; 0 where not
    present) and the variance ``sum(centred**2) / max(n - ddof, 1)``."""

    n: jax.Array
    total: jax.Array
    mean: jax.Array
    centred: jax.Array
    var: jax.Array


def segment_moments(x: jax.Array, present: jax.Array, segment: jax.Array | None = None, num_segments: int = 1, *,
                    ddof: int, center: jax.Array | None = None) -> Moments:
    """The one masked mean and variance: over every present entry of ``x`` (``segment`` None: scalars), or
    per segment of the first axis (``segment [N]`` ids in ``[0, num_segments)``: each entry gets its
    segment's). ``ddof`` 1 is the unbiased variance (verl's whitening, TRL's GDPO), 0 the population one;
    ``center`` replaces the mean the deviations are taken from (a leave-one-out mean)."""
    if segment is None:
        return moments_over(x, present, jnp.sum, ddof=ddof, center=center,
                            count=jnp.sum(present, dtype=jnp.int32).astype(x.dtype))
    return moments_over(x, present, lambda v: segment_totals(v, segment, num_segments), ddof=ddof, center=center)


def moments_over(x: jax.Array, present: jax.Array, total: Callable[[jax.Array], jax.Array], *, ddof: int,
                 center: jax.Array | None = None, count: jax.Array | None = None) -> Moments:
    """``segment_moments`` with the reduction given: ``total(v)`` sums ``v`` over each entry's set and
    broadcasts it back (AReaL's normalization levels sum each row first: ``normalize_core``)."""
    zero = jnp.zeros((), x.dtype)
    n = total(present.astype(x.dtype)) if count is None else count
    summed = total(jnp.where(present, x, zero))
    mean = summed / jnp.maximum(n, 1)
    centred = jnp.where(present, x - (mean if center is None else center), zero)
    return Moments(n, summed, mean, centred, overflow_as_nan(total(centred * centred) / jnp.maximum(n - ddof, 1)))


def overflow_as_nan(spread: jax.Array) -> jax.Array:
    """A variance (or std) that overflowed float32 as NaN: divided by, an infinite spread would give 0, a
    finite and silently wrong z-score (values near 1e19 square past float32's range); NaN reaches the
    outputs' finiteness check instead (``compute_advantages``' ``outputs_not_finite``; the single kernels,
    which check no values for speed, return it)."""
    return jnp.where(jnp.isinf(spread), jnp.full((), jnp.nan, spread.dtype), spread)


def z_score(x: jax.Array, mean: jax.Array, std: jax.Array, eps: float, alone: jax.Array, *,
            alone_rule: Literal["zero", "itself"], scale: bool = True) -> jax.Array:
    """``(x - mean) / (std + eps)`` (``scale=False``: ``x - mean``), with the rule for an entry alone in its
    group said explicitly: ``"zero"`` gives it 0 (GiGPO's step groups, GDPO's groups of one); ``"itself"``
    scores it against mean 0 and std 1, i.e. ``x / (1 + eps)`` (GiGPO's episode groups of one, verl-agent's
    rule)."""
    scored = (x - mean) / (std + eps) if scale else x - mean
    if alone_rule == "zero":
        return jnp.where(alone, jnp.zeros((), x.dtype), scored)
    return jnp.where(alone, x / (jnp.ones((), x.dtype) + eps) if scale else x, scored)


def weighted_moments(values: jax.Array, weights: jax.Array, segment: jax.Array, num_segments: int,
                     indices_are_sorted: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-segment weighted count, mean and unbiased std (two passes; std 1 for a count <= 1), broadcast back
    to the entries: ``[N]`` each. GiGPO's episode and step statistics."""
    def sums(x):
        return jax.ops.segment_sum(x, segment, num_segments=num_segments, indices_are_sorted=indices_are_sorted)

    count = sums(weights)
    mean = sums(values * weights) / jnp.maximum(count, 1)
    deviation = (values - mean[segment]) * weights
    sq = overflow_as_nan(sums(deviation * (values - mean[segment])))
    std = jnp.where(count > 1, jnp.sqrt(sq / jnp.maximum(count - 1, 1)), 1.0)
    return count[segment], mean[segment], std[segment]


def proxy_normalize(rewards: Sequence[float | None]) -> np.ndarray:
    """The v1/v2 proxy's group normalization of outcome rewards on the host, in float64 as the proxy computes
    it: ``(r - mean) / (population std + 1e-8)``, and the std of one element is 1."""
    r = np.asarray(rewards, np.float64)
    std = r.std() if r.size > 1 else 1.0
    return (r - r.mean()) / (std + 1e-8)


def leave_one_out_mean(x: jax.Array, members: jax.Array, row_group: jax.Array,
                       num_groups: int) -> tuple[jax.Array, jax.Array]:
    """``[B]``: the mean of ``x`` over the other members of each row's group (RLOO's baseline), and ``[B]``
    bool: the row is alone in its group (its mean of others is 0). Non-members count nowhere.

    Args:
        x: ``[B]`` the values.
        members: ``[B]`` bool: the rows that count (non-members count nowhere).
        row_group: ``[B]`` each row's group index.
        num_groups: The number of groups (static).

    Example:
        >>> mean, alone = prm_jax.estimators.leave_one_out_mean(np.array([1.0, 3.0, 5.0], np.float32), np.ones(3, bool),
        ...                                                     np.array([0, 0, 1]), 2)
        ...
        >>> np.asarray(mean).tolist(), np.asarray(alone).tolist()
        ([3.0, 1.0, 0.0], [False, False, True])
    """
    zero = jnp.zeros((), x.dtype)
    kept = jnp.where(members, x, zero)
    total = segment_totals(kept, row_group, num_groups)
    count = segment_totals(members.astype(x.dtype), row_group, num_groups)
    alone = count <= 1
    return jnp.where(alone, zero, (total - kept) / jnp.maximum(count - 1, 1)), alone


def leave_one_out_affine(x: jax.Array, members: jax.Array, row_group: jax.Array,
                         num_groups: int) -> tuple[jax.Array, jax.Array]:
    """verl's form of the leave-one-out difference (PRIME's RLOO), ``x_i - mean_{j != i} x_j = x_i n / (n - 1)
    - sum_j x_j / (n - 1)``: ``[B]`` each row's ``n / (n - 1)`` and ``sum_j x_j / (n - 1)`` over the members
    of its group (``n - 1`` floored at 1, so a group of one gives ``(1, x_i)``: callers mask it), to apply
    to any linear image of ``x`` (PRIME: its sums over timesteps). Non-members count nowhere."""
    n = segment_totals(members.astype(x.dtype), row_group, num_groups)
    others = jnp.maximum(n - 1, 1)
    return n / others, segment_totals(jnp.where(members, x, jnp.zeros((), x.dtype)), row_group, num_groups) / others


def row_sum_mean(x: jax.Array, steps: jax.Array) -> jax.Array:
    """The mean, over the rows with any step, of each row's sum of ``x`` at its ``steps`` (0 without any): a
    process transform's per-row total (min-form, progress)."""
    total = jnp.sum(jnp.where(steps, x, jnp.zeros((), x.dtype)))
    return total / jnp.maximum(jnp.sum(jnp.any(steps, axis=1), dtype=jnp.int32), 1).astype(x.dtype)


# Above this magnitude whitening works on values scaled down by a power of two (exact): their squares would
# overflow float32's range (3.4e38) in the variance.
WHITEN_SCALE_ABOVE = 2.0**32


def whiten(x: jax.Array, active: jax.Array, eps: float = 1e-8) -> jax.Array:
    """verl's ``masked_whiten`` over the active entries of the whole batch: ``(x - mu) / sqrt(var + eps)``
    with the mean and the unbiased variance taken over active entries (one entry: variance 0); inactive
    entries come out as 0 (verl leaves them unmasked).

    Finite for every finite input: where an active entry exceeds ``WHITEN_SCALE_ABOVE`` in magnitude the
    entries are divided by the power of two ``s`` at or above the largest (and ``eps`` by ``s^2``), which
    leaves the formula's value unchanged and keeps the variance in float32's range (rewards of 1e20 gave
    NaN). That pass runs only where verl's variance overflowed; elsewhere the computation is verl's, bit for
    bit.

    Args:
        x: ``[B, T]`` the values.
        active: ``[B, T]`` bool: the entries whitened.
        eps: Added to the variance, > 0 (verl's 1e-8).

    Example:
        >>> x = np.array([[1.0, 2.0, 3.0]], np.float32)
        >>> np.asarray(prm_jax.estimators.whiten(x, np.ones((1, 3), bool)), np.float64).round(4).tolist()
        [[-1.0, 0.0, 1.0]]
    """
    zero = jnp.zeros((), x.dtype)
    moments = segment_moments(x, active, ddof=1)

    def verls() -> jax.Array:
        return jnp.where(active, moments.centred / jnp.sqrt(moments.var + eps), zero)

    def scaled() -> jax.Array:  # (only where the variance overflowed: the common path pays nothing for it)
        top = jnp.max(jnp.where(active, jnp.abs(x), zero), initial=zero)
        # (An infinite or NaN entry is not scaled: it reaches the outputs' finiteness check as it is.)
        big = jnp.isfinite(top) & (top > WHITEN_SCALE_ABOVE)
        exponent = jnp.where(big, jnp.ceil(jnp.log2(jnp.where(big, top, 1))), zero).astype(jnp.int32)
        small = segment_moments(jnp.where(active, jnp.ldexp(x, -exponent), zero), active, ddof=1)
        spread = jnp.sqrt(small.var + jnp.ldexp(jnp.asarray(eps, x.dtype), -2 * exponent))
        # (A spread of exactly 0, equal entries whose eps underflowed with the scale, gives 0; NaN stays NaN.)
        safe = jnp.where(spread == 0, jnp.ones((), x.dtype), spread)
        return jnp.where(active, jnp.where(spread == 0, zero, small.centred / safe), zero)

    # (segment_moments gives an overflowed variance as NaN, as it gives a non-finite input's.)
    return lax.cond(jnp.isnan(moments.var), scaled, verls)


def _decoupled_normalization_core(rewards: jax.Array, weights: jax.Array, real: jax.Array, row_group: jax.Array,
                                 num_groups: int, eps: float) -> tuple[jax.Array, jax.Array]:
    """GDPO's ``normalize_then_sum`` (TRL) on validated ``[B, K]`` rewards (NaN: missing); see
    ``decoupled_normalization``. Returns the ``[B]`` advantages and ``[B]`` bool rows with every reward
    missing."""
    zero = jnp.zeros((), rewards.dtype)
    present = real[:, None] & ~jnp.isnan(rewards)
    per_source = segment_moments(rewards, present, row_group, num_groups, ddof=1)  # [B, K], per row's group
    rows = segment_totals(real.astype(rewards.dtype), row_group, num_groups)[:, None]
    # A group of one row has std 0 (TRL: G = 1); fewer than two present values in a larger group leave the
    # entry out (nanstd is NaN there).
    used = present & ((rows <= 1) | (per_source.n >= 2))
    scaled = z_score(per_source.centred, zero, jnp.sqrt(per_source.var), eps, jnp.broadcast_to(rows <= 1, used.shape),
                     alone_rule="zero")
    summed = jnp.sum(jnp.where(used, scaled * weights[None, :], zero), axis=1)
    missing = real & ~jnp.any(present, axis=1)
    counted = real & ~missing
    total = segment_moments(summed, counted, ddof=1)
    return jnp.where(counted, total.centred / (jnp.sqrt(total.var) + eps), zero), missing


def _level_totals(level: str, groups: GroupLayout | None) -> Callable[[jax.Array], jax.Array]:
    """The reduction of a normalization level for ``moments_over``: ``[B, N]`` summed over each row, then
    over the row's level, broadcast back as ``[B, 1]``."""
    return lambda v: _level_sums(jnp.sum(v, axis=1), level, groups)[:, None]


def _level_sums(per_row: jax.Array, level: str, groups: GroupLayout | None) -> jax.Array:
    """Sum of per-row partial sums over each row's level, broadcast back to rows: ``[B]``."""
    if level == "batch":
        return jnp.broadcast_to(jnp.sum(per_row), per_row.shape)
    assert groups is not None
    return segment_totals(per_row, groups.row_group, groups.num_groups)


def _single_member(level: str, groups: GroupLayout | None) -> jax.Array | bool:
    """``[B, 1]`` bool: the row's group has one member (never at batch level, as in AReaL)."""
    if level == "batch":
        return False
    assert groups is not None
    return (groups.members == 1)[groups.row_group][:, None]


def _normalize_core(x: jax.Array, active: jax.Array, norm: NormConfig, groups: GroupLayout | None) -> jax.Array:
    """Normalization of validated ``[B, N]`` float ``x`` with bool ``active`` (module docstring)."""
    zero, one = jnp.zeros((), x.dtype), jnp.ones((), x.dtype)

    if norm.mean_level is None:
        mean = zero
    else:
        level = moments_over(x, active, _level_totals(norm.mean_level, groups), ddof=0)
        mean = level.mean
        if norm.mean_leave1out:
            left_out = jnp.where(active, (level.total - jnp.where(active, x, zero)) / jnp.maximum(level.n - 1, 1),
                                 mean)
            mean = jnp.where(level.n > 1, left_out, zero)
            # A single member has no peer to leave out: it is its own baseline.
            mean = jnp.where(_single_member(norm.mean_level, groups), x, mean)

    if norm.std_level is None:
        std, eps = one, 0.0
    else:
        ddof = 1 if norm.std_unbiased else 0
        spread = moments_over(x, active, _level_totals(norm.std_level, groups), ddof=ddof, center=mean)
        std = jnp.where(spread.n - ddof > 0, jnp.sqrt(spread.var), one)
        if norm.std_unbiased:
            std = jnp.where(_single_member(norm.std_level, groups), one, std)
        eps = norm.eps

    normalized = jnp.where(active, (x - mean) / (std + eps), zero)
    return jnp.where(jnp.any(active), normalized, x)


def normalize(x: ArrayLike, mask: ArrayLike | None = None, norm: NormConfig = NormConfig(), *,
              group_sizes: ArrayLike | Sequence[int] | None = None,
              group_member_counts: ArrayLike | Sequence[int] | None = None) -> jax.Array:
    """Masked normalization with AReaL's rules (module docstring has the formulas).

    Args:
      x: ``[B, T]`` advantages or ``[B]`` outcome rewards.
      mask: same shape as ``x``, 1 on active entries; ``None`` means all active.
      norm: ``NormConfig``; ``group`` levels use ``norm.group_size`` consecutive rows per group, which must
        divide ``B``.
      group_sizes: ``[G]`` int, consecutive groups of varying sizes (positive, summing to ``B``); overrides
        ``norm.group_size``.
      group_member_counts: ``[G]`` int >= 1, the logical rollouts of each group when a rollout spans
        several rows (split rollouts). It decides only the single-member rules; token weights still come
        from the rows. Defaults to the rows per group.

    Returns:
      float32 (float64 for float64 input) array shaped like ``x``.

    Raises:
      ValueError: on bad shapes, and on ``group_sizes`` that are not positive or do not sum to ``B`` or
        ``group_member_counts`` below 1 (under an outer ``jit``: when the computation runs). Like every single
        kernel (``compute_advantages`` is the checked entry point), it checks no value of ``x``, for speed: a
        non-finite active entry, statistics that overflow float32 (``|x|`` near 1.8e19 and beyond) or a std
        of 0 with ``eps`` 0 give NaN where they reach, never a finite wrong number.

    Example:
        >>> x = np.array([1.0, 2.0, 3.0, 100.0], np.float32)
        >>> mask = np.array([1, 1, 1, 0], bool)
        >>> np.asarray(prm_jax.kernels.normalize(x, mask, prm_jax.NormConfig(std_unbiased=False)), np.float64).round(4).tolist()
        [-1.2247, 0.0, 1.2247, 0.0]
    """
    if not isinstance(norm, NormConfig):
        raise TypeError(f"norm must be a NormConfig, got {type(norm).__name__}")
    if np.ndim(x) not in (1, 2):
        raise ValueError(f"x must have shape [B] or [B, T], got {np.shape(x)}")
    if mask is not None:
        _checks.check_shape("mask", mask, np.shape(x), "x")
    if group_sizes is not None:
        group_sizes = jnp.asarray(group_sizes)
    if group_member_counts is not None:
        group_member_counts = jnp.asarray(group_member_counts)
    return _checks.checked(_normalize_jit, x, mask, group_sizes, group_member_counts, norm=norm)


@functools.partial(jax.jit, static_argnames=("norm",))
def _normalize_jit(x, mask, group_sizes, member_counts, *, norm):
    dtype = _checks.accumulation_dtype(x)
    x = _checks.as_float("x", x, dtype)
    active = jnp.ones(x.shape, jnp.bool_) if mask is None else _checks.as_mask("mask", mask)
    flat = x.ndim == 1
    if flat:
        x, active = x[:, None], active[:, None]
    checks = [] if mask is None else _checks.mask_check("mask", mask)
    if group_sizes is not None:
        checks.append(group_sizes_check(group_sizes, x.shape[0]))
    groups = None
    if norm.uses_groups:
        groups = group_layout(x.shape[0], norm, group_sizes, member_counts)
        if member_counts is not None:
            checks.append(member_counts_check(member_counts))
    out = _normalize_core(x, active, norm, groups)
    return (out[:, 0] if flat else out), checks


def decoupled_normalization(rewards: ArrayLike, weights: ArrayLike | Sequence[float] | None = None,
                            group_ids: ArrayLike | None = None, *, eps: float = 1e-4) -> jax.Array:
    """GDPO's decoupled multi-reward normalization (TRL's ``normalize_then_sum``; NVlabs/GDPO @ b080e63d; TRL's
    normalize_then_sum @ f2cd5771; arXiv 2601.05242); prm-jax's rules where the originals disagree (the credit-assignment guide
    states each)).

    Per reward source ``k``: ``a_k = (r_k - mean_g) / (std_g + eps)`` within each group (unbiased std over
    the group's present rewards; a missing reward, NaN, is left out of the statistics; a group of one row
    gives 0; a group in which fewer than two rows have source ``k`` leaves that term out); ``p = sum_k w_k
    a_k``; then ``(p - mean) / (std + eps)`` over the batch's rows (unbiased). A row with every reward
    missing gets 0 and is left out of the batch statistics.

    Args:
      rewards: ``[B, K]`` float, ``K`` reward sources per row (e.g. the outcome and each trajectory scorer's
        total), NaN where a source did not score the row.
      weights: ``[K]`` source weights (default 1 each).
      group_ids: ``[B]`` int, each row's group in ``[0, B)``, -1 for a padding row (default one group).
      eps: added to both standard deviations (TRL: 1e-4).

    Returns:
      ``[B]`` float32 (float64 for float64 input) advantages.

    Statistics that overflow float32 (rewards near 1.8e19 and beyond) give NaN, never a finite wrong 0.

    Example:
        >>> rewards = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]], np.float32)   # [B, K]: the outcome, one scorer
        >>> normalized = prm_jax.credit.decoupled_normalization(rewards, group_ids=np.array([0, 0, 1, 1]))
        >>> np.asarray(normalized, np.float64).round(3).tolist()
        [0.0, 0.0, 1.225, -1.225]
    """
    _checks.check_rank("rewards", rewards, 2)
    rows, sources = np.shape(rewards)
    if weights is None:
        weights = np.ones(sources, np.float32)
    _checks.check_shape("weights", weights, (sources,), "the reward sources")
    if group_ids is not None:
        _checks.check_shape("group_ids", group_ids, (rows,), "the batch axis")
    eps = finite_number("eps", eps, minimum=0.0)
    return _checks.checked(_decoupled_jit, rewards, jnp.asarray(weights), group_ids, eps=eps)


@functools.partial(jax.jit, static_argnames=("eps",))
def _decoupled_jit(rewards, weights, group_ids, *, eps):
    dtype = _checks.accumulation_dtype(rewards, weights)
    values = _checks.as_float("rewards", rewards, dtype)
    rows = values.shape[0]
    checks = [_checks.finite_check("weights", _checks.as_float("weights", weights, dtype))]
    if group_ids is None:
        layout = GroupLayout(jnp.zeros((rows,), jnp.int32), 1, jnp.full((1,), rows, jnp.int32))
        real = jnp.ones((rows,), jnp.bool_)
    else:
        checks.append(group_ids_check(group_ids, rows))
        layout = group_layout(rows, NormConfig("group", "group"), None, None, group_ids)
        real = _checks.as_int("group_ids", group_ids) >= 0
    # Infinite rewards are errors (NaN is "missing").
    inf = jnp.isinf(values) & real[:, None]
    checks.append(_checks.ValueCheck("rewards_infinite", _checks.violations(inf),
                                     lambda: "rewards must be finite or NaN (missing)"))
    out, _ = _decoupled_normalization_core(values, _checks.as_float("weights", weights, dtype), real,
                                          layout.row_group, layout.num_groups, eps)
    return out, checks


def _normalized_outcome(norm: NormConfig, outcome: jax.Array, real_rows: jax.Array,
                        groups_of: Callable[[NormConfig], GroupLayout | None]) -> StageResult:
    """``reward_norm`` (AReaL's ``NormConfig``) over the ``[B]`` outcome rewards: every real row counts (one
    without generated tokens too, as in AReaL); padding rows (no attention at all) do not, and come out 0."""
    return StageResult(_normalize_core(outcome[:, None], real_rows[:, None], norm, groups_of(norm))[:, 0])


def _decoupled_outcome(norm: DecoupledNorm, outcome: jax.Array, batch: dict, real_rows: jax.Array,
                       grpo_groups: GroupLayout | None) -> StageResult:
    """GDPO: the outcome reward and the batch's ``reward_sources [B, K]`` normalized source by source, within
    the batch's GRPO groups, else the whole batch (the rule of every group-wise credit mode)."""
    rewards = outcome
    columns = rewards[:, None]
    if "reward_sources" in batch:
        columns = jnp.concatenate([columns, _checks.as_float("batch['reward_sources']", batch["reward_sources"],
                                                             rewards.dtype)], axis=1)
    count = columns.shape[1]
    if norm.weights is not None and len(norm.weights) != count:
        raise ValueError(f"reward_norm.weights has {len(norm.weights)} entries but there are {count} reward sources "
                         "(the outcome reward and batch['reward_sources'] [B, K])")
    weights = jnp.asarray(norm.weights if norm.weights is not None else (1.0,) * count, rewards.dtype)
    row_group, num_groups = row_groups(grpo_groups, rewards.shape[0])
    out, missing = _decoupled_normalization_core(columns, weights, real_rows, row_group, num_groups, norm.eps)
    infinite = _checks.ValueCheck("reward_sources_infinite",
                                  _checks.violations(jnp.isinf(columns) & real_rows[:, None]),
                                  lambda: "batch['reward_sources'] must be finite or NaN (a missing score)")
    shares = jnp.sum(jnp.isnan(columns) & real_rows[:, None], dtype=jnp.int32).astype(rewards.dtype)
    return StageResult(out, {"decoupled/rows_without_rewards": jnp.sum(missing, dtype=jnp.int32),
                             "decoupled/missing_share": shares / jnp.maximum(
                                 jnp.sum(real_rows, dtype=jnp.int32) * count, 1).astype(rewards.dtype)}, (infinite,))


def _normalized_advantages(norm: NormConfig, advantages: jax.Array, active: jax.Array,
                           groups_of: Callable[[NormConfig], GroupLayout | None]) -> StageResult:
    """``adv_norm`` (AReaL's ``NormConfig``) over the advantages on the trained timesteps (step 8)."""
    return StageResult(_normalize_core(advantages, active, norm, groups_of(norm)))


OUTCOME_NORM = StageSpec("reward_norm", "normalize", NormConfig, _normalized_outcome)
#: ``actor.adv_norm``: the advantages' normalization (the record is the same ``NormConfig``; the plan names its slot).
ADV_NORM = StageSpec("adv_norm", "normalize", NormConfig, _normalized_advantages)
DECOUPLED_NORM = StageSpec("reward_norm", "decoupled", DecoupledNorm, _decoupled_outcome, reads=("reward_sources",),
                           diagnostics="decoupled/", checks=("reward_sources_infinite",))
