"""A toy estimator, as a user would add one: this module and one ``register_estimator`` line.

``credit_assignment: {mode: constant, value: v}`` gives every trained timestep the advantage ``v`` (plus
the KL rewards, the shared epilogue's). It reads the session trees' ``node_ids`` (so the command line packs
them), checks that every real row names a node, and reports ``constant/`` diagnostics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from prm_jax.estimators import EstimatorSpec, StageResult, ValueCheck, violations


@dataclasses.dataclass(frozen=True)
class ConstantCredit:
    value: float = 1.0


def _run(stage: ConstantCredit, batch: Mapping[str, jax.Array], active: jax.Array,
         real_rows: jax.Array, dtype) -> StageResult:
    nameless = real_rows & jnp.all(batch["node_ids"] < 0, axis=1)
    check = ValueCheck("constant_rows_without_nodes", violations(nameless),
                       lambda: "credit_assignment 'constant': a real row names no node in batch['node_ids']")
    advantages = jnp.where(active, jnp.asarray(stage.value, dtype), jnp.zeros((), dtype))
    return StageResult(advantages, {"constant/trained": jnp.sum(active, dtype=jnp.int32),
                                    "constant/nodes": jnp.sum(batch["node_ids"] >= 0, dtype=jnp.int32)}, (check,))


CONSTANT = EstimatorSpec(ConstantCredit, _run, "credit_assignment 'constant'", mode="constant",
                         reads=("node_ids",), diagnostics="constant/")
