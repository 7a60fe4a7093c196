"""A real estimator added as a plug-in (issue 43.2): leave-one-out RLOO, ``A_i = R_i - mean_{j != i} R_j`` on
row ``i``'s trained timesteps (``R`` the outcome reward; a row alone in its group gets 0). One module and one
registration line (``tests/conftest.py``); its float64 reference is one entry of ``reference.CREDIT``.
Nothing else lists it: it replaces GAE (``units=("token",)``), so ``gae_timestep_unit: turn`` is refused
with it from its declaration, and the option matrix and the strategy tests run it from its ``example``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from prm_jax.estimators import EstimatorSpec, StageResult, leave_one_out_mean


@dataclasses.dataclass(frozen=True)
class RLOOCredit:
    """``credit_assignment: {mode: rloo}`` (no settings)."""


def _run(stage: RLOOCredit, outcome: jax.Array, active: jax.Array, real_rows: jax.Array,
         row_group: jax.Array, num_groups: int, dtype) -> StageResult:
    baseline, alone = leave_one_out_mean(outcome, real_rows, row_group, num_groups)
    advantage = jnp.where(alone, jnp.zeros((), dtype), outcome - baseline)
    return StageResult(jnp.where(active, advantage[:, None], jnp.zeros((), dtype)),
                       {"rloo/groups_of_one": jnp.sum(alone & real_rows, dtype=jnp.int32)})


RLOO = EstimatorSpec(RLOOCredit, _run, "credit_assignment 'rloo'", mode="rloo", diagnostics="rloo/", units=("token",),
                     example={"credit_assignment": {"mode": "rloo"}})
