"""Masked, token-weighted normalization of advantages ([B, T]) and outcome rewards ([B]).

Statistics are taken over active entries only, per level (``batch``: all rows; ``group``: the rows of one
sample group), with a two-pass variance::

  mean = sum(x * m) / n                       (leave-one-out: (sum - x_i) / (n - 1), 0 when n <= 1)
  var  = sum(m * (x - mean)**2) / (n - 1)     (unbiased; std = 1 when n <= 1)  or  / n  (biased)
  x'   = (x - mean) * m / (std + eps)         (mean level None -> mean 0; std level None -> std 1, eps 0)

Masked entries come out as 0 and are selected with ``where``, so NaN/Inf there never leak; an input with
no active entry is returned unchanged. The standard deviation is always taken around the plain mean of its
own level (leave-one-out only changes the subtracted mean).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from prm_jax.kernels import _checks

NORM_LEVELS = ("batch", "group", None)


@dataclasses.dataclass(frozen=True)
class NormConfig:
    """AReaL's ``NormConfig``: hashable, so it is a static argument and never causes a retrace."""

    mean_level: str | None = "batch"
    std_level: str | None = "batch"
    mean_leave1out: bool = False
    std_unbiased: bool = True
    eps: float = 1e-5
    group_size: int = 1

    def __post_init__(self):
        for key in ("mean_level", "std_level"):
            if getattr(self, key) not in NORM_LEVELS:
                raise ValueError(f"{key} must be one of 'batch', 'group' or None, got {getattr(self, key)!r}")
        object.__setattr__(self, "eps", _checks.finite_number("eps", self.eps, minimum=0.0))
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            raise ValueError(f"group_size must be an integer >= 1, got {self.group_size!r}")

    @classmethod
    def from_value(cls, value: Any, name: str) -> "NormConfig | None":
        """``None``, a ``NormConfig`` or a mapping of its fields (unknown keys are errors)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise ValueError(f"{name} has unknown keys {sorted(unknown)}")
            try:
                return cls(**value)
            except ValueError as err:
                raise ValueError(f"{name}.{err}") from None
        raise TypeError(f"{name} must be a NormConfig, a mapping or None, got {type(value).__name__}")

    @property
    def uses_groups(self) -> bool:
        return "group" in (self.mean_level, self.std_level)


def group_index(batch: int, norm: NormConfig, group_sizes: jax.Array | None) -> tuple[jax.Array, int]:
    """Row -> group index ``[B]`` and the static number of groups."""
    if group_sizes is not None:
        sizes = _checks.as_int("group_sizes", group_sizes)
        _checks.check_rank("group_sizes", sizes, 1)
        ends = jnp.cumsum(sizes)
        return jnp.searchsorted(ends, jnp.arange(batch, dtype=jnp.int32), side="right").astype(jnp.int32), sizes.shape[0]
    if batch % norm.group_size:
        raise ValueError(f"group_size {norm.group_size} does not divide the batch size {batch}; pass "
                         "group_sizes for groups of different sizes")
    return jnp.arange(batch, dtype=jnp.int32) // norm.group_size, batch // norm.group_size


def check_group_sizes(group_sizes: Any, batch: int) -> None:
    """Eager check of concrete ``group_sizes``: positive integers summing to the batch size."""
    sizes = np.asarray(group_sizes)
    if sizes.ndim != 1 or sizes.size == 0:
        raise ValueError(f"group_sizes must be a non-empty 1-D sequence, got shape {sizes.shape}")
    if (sizes <= 0).any() or int(sizes.sum()) != batch:
        raise ValueError(f"group_sizes must be positive and sum to the batch size {batch}, got {sizes.tolist()}")


def group_sizes_check(group_sizes: jax.Array, batch: int) -> _checks.ValueCheck:
    sizes = _checks.as_int("group_sizes", group_sizes)
    failed = jnp.any(sizes <= 0) | (jnp.sum(sizes) != batch)
    return _checks.ValueCheck(
        failed, lambda sizes: f"group_sizes must be positive and sum to the batch size {batch}, got "
                              f"{sizes.tolist()}", sizes)


def _level_sums(per_row: jax.Array, level: str, groups: jax.Array, num_groups: int) -> jax.Array:
    """Sum of per-row partial sums over each row's level, broadcast back to rows: ``[B]``."""
    if level == "batch":
        return jnp.broadcast_to(jnp.sum(per_row), per_row.shape)
    return jax.ops.segment_sum(per_row, groups, num_segments=num_groups)[groups]


def normalize_core(x: jax.Array, active: jax.Array, norm: NormConfig, groups: jax.Array | None,
                   num_groups: int) -> jax.Array:
    """Normalization of validated ``[B, N]`` float ``x`` with bool ``active``."""
    zero = jnp.zeros((), x.dtype)
    weight = active.astype(x.dtype)
    safe_x = jnp.where(active, x, zero)
    row_sum = jnp.sum(safe_x, axis=1)
    row_count = jnp.sum(weight, axis=1)

    def stats(level):
        total = _level_sums(row_sum, level, groups, num_groups)
        count = _level_sums(row_count, level, groups, num_groups)
        mean = total / jnp.maximum(count, 1)
        return total[:, None], count[:, None], mean[:, None]

    if norm.mean_level is None:
        mean = zero
    else:
        total, count, mean = stats(norm.mean_level)
        if norm.mean_leave1out:
            mean = jnp.where(count > 1, (total - safe_x) / jnp.maximum(count - 1, 1), zero)

    if norm.std_level is None:
        std, eps = jnp.ones((), x.dtype), 0.0
    else:
        _, count, level_mean = stats(norm.std_level)
        centred = jnp.where(active, x - level_mean, zero)
        sq_sum = _level_sums(jnp.sum(centred * centred, axis=1), norm.std_level, groups, num_groups)[:, None]
        divisor = count - 1 if norm.std_unbiased else count
        std = jnp.where(divisor > 0, jnp.sqrt(sq_sum / jnp.maximum(divisor, 1)), jnp.ones((), x.dtype))
        eps = norm.eps

    normalized = jnp.where(active, (x - mean) / (std + eps), zero)
    return jnp.where(jnp.any(active), normalized, x)


def normalize(x: ArrayLike, mask: ArrayLike | None = None, norm: NormConfig = NormConfig(), *,
              group_sizes: ArrayLike | Sequence[int] | None = None) -> jax.Array:
    """Masked normalization (module docstring has the formulas).

    Args:
      x: ``[B, T]`` advantages or ``[B]`` outcome rewards.
      mask: same shape as ``x``, 1 on active entries; ``None`` means all active.
      norm: ``NormConfig``; ``group`` levels use ``norm.group_size`` consecutive rows per group, which must
        divide ``B``.
      group_sizes: ``[G]`` int, consecutive groups of varying sizes (positive, summing to ``B``); overrides
        ``norm.group_size``.

    Returns:
      float32 (float64 for float64 input) array shaped like ``x``.
    """
    if not isinstance(norm, NormConfig):
        raise TypeError(f"norm must be a NormConfig, got {type(norm).__name__}")
    if jnp.ndim(x) not in (1, 2):
        raise ValueError(f"x must have shape [B] or [B, T], got {jnp.shape(x)}")
    if mask is not None:
        _checks.check_shape("mask", mask, jnp.shape(x), "x")
    if group_sizes is not None:
        if not _checks.is_traced(group_sizes):
            check_group_sizes(group_sizes, jnp.shape(x)[0])
        group_sizes = jnp.asarray(group_sizes)
    return _normalize_jit(x, mask, group_sizes, norm=norm)


@functools.partial(jax.jit, static_argnames=("norm",))
def _normalize_jit(x, mask, group_sizes, *, norm):
    dtype = _checks.accumulation_dtype(x)
    x = _checks.as_float("x", x, dtype)
    active = jnp.ones(x.shape, jnp.bool_) if mask is None else _checks.as_mask("mask", mask)
    flat = x.ndim == 1
    if flat:
        x, active = x[:, None], active[:, None]
    groups, num_groups = (group_index(x.shape[0], norm, group_sizes) if norm.uses_groups
                          else (None, 1))
    out = normalize_core(x, active, norm, groups, num_groups)
    return out[:, 0] if flat else out
