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

import jax
import jax.numpy as jnp

from prm_jax.kernels import _checks
from prm_jax.kernels._normalization import GroupLayout, row_groups, segment_moments
from prm_jax.kernels._plan import AdvantagePlan

STATISTICS = ("mean", "std", "min", "max")


def statistics(prefix: str, x: jax.Array, active: jax.Array) -> dict[str, jax.Array]:
    """``{prefix}/mean``, ``/std`` (population), ``/min`` and ``/max`` of ``x`` over the trained timesteps
    ``active`` (0 each when none trains). Taken on the values scaled by a power of two into [-1, 1] (exact:
    the same bits where nothing overflows), so that float32 sums of huge values, or of their squares, stay
    finite for finite inputs."""
    count = jnp.sum(active, dtype=jnp.int32)
    zero = jnp.zeros((), x.dtype)
    low = jnp.where(count > 0, jnp.min(jnp.where(active, x, jnp.inf)), zero)
    high = jnp.where(count > 0, jnp.max(jnp.where(active, x, -jnp.inf)), zero)
    _, exponent = jnp.frexp(jnp.maximum(jnp.abs(low), jnp.abs(high)))
    scale = jnp.ldexp(jnp.ones((), x.dtype), exponent)
    moments = segment_moments(x / scale, active, ddof=0)
    return {f"{prefix}/mean": moments.mean * scale, f"{prefix}/std": jnp.sqrt(moments.var) * scale,
            f"{prefix}/min": low, f"{prefix}/max": high}


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
    out.update(statistics("advantages", advantages, active))
    row_group, num_groups = row_groups(groups, active.shape[0])
    group_active = jax.ops.segment_sum(jnp.sum(active, axis=1, dtype=jnp.int32), row_group, num_segments=num_groups)
    group_nonzero = jax.ops.segment_sum(jnp.sum(nonzero, axis=1, dtype=jnp.int32), row_group, num_segments=num_groups)
    out["groups"] = jnp.sum(group_active > 0, dtype=jnp.int32)
    out["zero_advantage_groups"] = jnp.sum((group_active > 0) & (group_nonzero == 0), dtype=jnp.int32)
    if process is not None:
        out.update({**statistics("process", process, active),
                    "process/negative_share": share(process < 0), "process/zero_share": share(process == 0),
                    "process/positive_share": share(process > 0),
                    "process/outside_unit_share": share(~((process >= 0) & (process <= 1)))})
    return out


def outputs_check(advantages: jax.Array, returns: jax.Array, active: jax.Array) -> _checks.ValueCheck:
    """The last check: advantages and returns are finite on trained timesteps, read in one fused pass.

    Every input passed its own checks by then, so a non-finite output is a float32 overflow inside a stage
    (inputs or settings near float32's range, 3.4e38): counted like any check, never returned silently.
    """
    zero = jnp.zeros((), advantages.dtype)
    bad_rows = jnp.isnan(jnp.sum(jnp.where(active, advantages * zero + returns * zero, zero), axis=1))
    count = _checks.violations(bad_rows)

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
