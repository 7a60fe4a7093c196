"""The pipeline's diagnostics, in one home: the statistics that explain a mode that does not learn, the
advantages' statistics the command line's report reads, and the last check (the outputs are finite).

``AdvantageOutput.diagnostics`` holds, besides the value checks' counts (``checks/<name>``) and the
declared stages' own (each under its declared prefix), with ``AdvantagePlan.diagnostics`` on:
``active_timesteps``, ``nonzero_advantage_share``, ``shaping_changed_share``, ``shaping_sign_flip_share``,
``advantages/{mean,std,min,max}``, ``groups``, ``zero_advantage_groups`` and, with process rewards,
``process/{mean,std,min,max,negative_share,zero_share,positive_share,outside_unit_share}``; under ``gvpo``
``process/negative_share`` always (the host warns when it is 0: gvpo reads only the sign).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from prm_jax.kernels import _checks
from prm_jax.kernels._normalization import GroupLayout, row_groups
from prm_jax.kernels._plan import AdvantagePlan

STATISTICS = ("mean", "std", "min", "max")


def statistics(prefix: str, x: jax.Array, active: jax.Array) -> dict[str, jax.Array]:
    """``{prefix}/mean``, ``/std`` (population), ``/min`` and ``/max`` of ``x`` over the trained timesteps
    ``active`` (0 each when none trains): ``statistics_of`` for one array."""
    return statistics_of({prefix: x}, active)


def statistics_of(arrays: Mapping[str, jax.Array], active: jax.Array) -> dict[str, jax.Array]:
    """``statistics`` of several ``[B, T]`` arrays over the same trained timesteps, in few passes: the minima and
    maxima of all of them in one variadic reduction, each sum a dot product (vectorized, and summed in blocks:
    as accurate as a pairwise sum, where XLA:CPU's scalar reductions are slow). Taken on each array scaled by
    a power of two into [-1, 1] (exact: the same bits where nothing overflows), so that float32 sums of huge
    values, or of their squares, stay finite for finite inputs."""
    names, xs = list(arrays), list(arrays.values())
    dtype = xs[0].dtype
    zero = jnp.zeros((), dtype)
    count = jnp.sum(active, dtype=jnp.int32)
    n = jnp.maximum(count, 1).astype(dtype)
    bounds = (jnp.inf, -jnp.inf)
    extremes = lax.reduce(tuple(jnp.where(active, x, bound) for x in xs for bound in bounds),
                          tuple(jnp.asarray(bound, dtype) for _ in xs for bound in bounds), _minima_maxima,
                          tuple(range(active.ndim)))
    flat = active.reshape(-1)
    ones = jnp.ones(flat.shape, dtype)
    out = {}
    for i, (name, x) in enumerate(zip(names, xs)):
        low, high = (jnp.where(count > 0, extremes[2 * i + j], zero) for j in (0, 1))
        scale = _power_of_two_above(jnp.maximum(jnp.abs(low), jnp.abs(high)))
        unit = jnp.where(flat, x.reshape(-1) / scale, zero)
        mean = jnp.dot(unit, ones, precision=lax.Precision.HIGHEST) / n
        centred = jnp.where(flat, unit - mean, zero)
        var = jnp.dot(centred, centred, precision=lax.Precision.HIGHEST) / n
        out.update({f"{name}/mean": mean * scale, f"{name}/std": jnp.sqrt(var) * scale, f"{name}/min": low,
                    f"{name}/max": high})
    return out


def _power_of_two_above(magnitude: jax.Array) -> jax.Array:
    """The power of two just above a non-negative float (``2**e`` with ``magnitude < 2**e``; at most the
    largest finite one, ``2**127`` in float32), from its exponent bits: dividing by it is exact."""
    info = jnp.finfo(magnitude.dtype)
    integer = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[info.bits // 8]
    field = (lax.bitcast_convert_type(magnitude, integer) >> info.nmant) & ((1 << info.nexp) - 1)
    top = (1 << info.nexp) - 2  # the largest finite exponent field
    return lax.bitcast_convert_type(jnp.minimum(field + 1, top).astype(integer) << info.nmant, magnitude.dtype)


def diagnostics(advantages: jax.Array, unshaped: jax.Array, process: jax.Array | None, active: jax.Array,
                groups: GroupLayout | None, plan: AdvantagePlan) -> dict[str, jax.Array]:
    """The pipeline's own diagnostics (the module docstring lists them)."""
    count = jnp.sum(active, dtype=jnp.int32)
    n = jnp.maximum(count, 1).astype(advantages.dtype)

    def share(flags: jax.Array) -> jax.Array:
        return jnp.sum(active & flags, dtype=jnp.int32).astype(advantages.dtype) / n

    gvpo = process is not None and plan.shaping is not None and plan.shaping.mode == "gvpo"
    out = {"process/negative_share": share(process < 0)} if gvpo and process is not None else {}
    if not plan.diagnostics:
        return out
    nonzero = active & (advantages != 0)
    out.update({"active_timesteps": count, "nonzero_advantage_share": share(advantages != 0),
                "shaping_changed_share": share(advantages != unshaped),
                "shaping_sign_flip_share": share(jnp.sign(advantages) * jnp.sign(unshaped) < 0)})
    out.update(statistics_of({"advantages": advantages, **({} if process is None else {"process": process})},
                             active))
    row_group, num_groups = row_groups(groups, active.shape[0])
    group_active = jax.ops.segment_sum(jnp.sum(active, axis=1, dtype=jnp.int32), row_group, num_segments=num_groups)
    group_nonzero = jax.ops.segment_sum(jnp.sum(nonzero, axis=1, dtype=jnp.int32), row_group, num_segments=num_groups)
    out["groups"] = jnp.sum(group_active > 0, dtype=jnp.int32)
    out["zero_advantage_groups"] = jnp.sum((group_active > 0) & (group_nonzero == 0), dtype=jnp.int32)
    if process is not None:
        out.update({"process/negative_share": share(process < 0), "process/zero_share": share(process == 0),
                    "process/positive_share": share(process > 0),
                    "process/outside_unit_share": share(~((process >= 0) & (process <= 1)))})
    return out


def outputs_check(advantages: jax.Array, returns: jax.Array, active: jax.Array) -> _checks.ValueCheck:
    """The last check: advantages and returns are finite on trained timesteps, read in one fused pass.

    Every input passed its own checks by then, so a non-finite output is a float32 overflow inside a stage
    (inputs or settings near float32's range, 3.4e38): counted like any check, never returned silently.
    """
    bad_advantages, bad_returns = _checks.nonfinite_rows([(advantages, active), (returns, active)])  # (one pass)
    count = _checks.violations(bad_advantages | bad_returns)

    def locate() -> tuple[jax.Array, ...]:
        bad_advantage = active & ~jnp.isfinite(advantages)
        flags = bad_advantage | (active & ~jnp.isfinite(returns))
        row, step, advantage, ret = _checks.first_flagged(flags, advantages, returns)
        return row, step, jnp.any(bad_advantage), advantage, ret

    row, step, which, advantage, ret = _checks.located(count, locate)
    return _checks.ValueCheck(
        "outputs_not_finite", count,
        lambda row, step, which, advantage, ret: (
            f"compute_advantages computed a non-finite {'advantage' if which else 'return'} "
            f"({float(advantage if which else ret)!r}) at row {int(row)}, timestep {int(step)} from inputs that "
            "passed their checks: a float32 overflow inside a stage (inputs or settings near float32's range, "
            "|x| <= 3.4e38, or sums or squares of them); scale them down. (Or a normalization with eps 0 over a "
            "group of equal values: 0 / 0.)"), row, step, which, advantage, ret)


def _minima_maxima(left: tuple[Any, ...], right: tuple[Any, ...]) -> tuple[Any, ...]:
    """The reducer of the statistics' extremes: minima at even places, maxima at odd ones (one function for
    all, so JAX's caches, keyed by the reducer, compile it once a layout, op by op too)."""
    return tuple(jnp.minimum(p, q) if i % 2 == 0 else jnp.maximum(p, q) for i, (p, q) in enumerate(zip(left, right)))
