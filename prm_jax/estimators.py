"""The estimator plug-in API: what a new credit estimator (steps 6-7 of ``compute_advantages``) is written
with, in one namespace. An estimator is a frozen dataclass (its record: the fields are the config keys of
``credit_assignment: {mode: <mode>, ...}``), a ``run(stage, **inputs)`` that returns a ``StageResult``
(its advantages, diagnostics, value checks and, where it forms them, its returns), and one
``EstimatorSpec`` that declares it (what it reads, its diagnostics prefix, the ``gae_timestep_unit`` values
it runs with, the settings it refuses, an example configuration); ``register_estimator(spec)`` makes it
known to the config, the pipeline, the command line and the tests' option matrix. ``INPUTS`` lists what
``run`` may name; the primitives below are the ones the built-in estimators share.
``tests/rloo_estimator.py`` is a complete one (leave-one-out RLOO) in 30 lines.

The other stage kinds (outcome and advantage normalizations, process transforms, shapings) declare
themselves with a ``StageSpec``, beside their kernels, and are called the same way (``run(stage,
**inputs)`` returning a ``StageResult``); ``STAGE_SPECS`` lists them.
"""

from prm_jax.kernels._estimator_contract import (
    INPUTS,
    EstimatorSpec,
    EstimatorStage,
    SummaryHook,
    ValueCheck,
    on_turn_timesteps,
    row_groups,
    violations,
)
from prm_jax.kernels._estimator_registry import (
    credit_modes,
    estimator_for,
    register_estimator,
    registered,
    unregister_estimator,
)
from prm_jax.kernels._normalization import leave_one_out_mean, whiten
from prm_jax.kernels._plan import STAGE_SPECS
from prm_jax.kernels._recurrence import reverse_cumsum
from prm_jax.kernels._stage import StageResult, StageSpec

__all__ = [
    "INPUTS", "STAGE_SPECS", "EstimatorSpec", "EstimatorStage", "StageResult", "StageSpec", "SummaryHook", "ValueCheck",
    "credit_modes", "estimator_for", "leave_one_out_mean", "on_turn_timesteps", "register_estimator", "registered",
    "reverse_cumsum", "row_groups", "unregister_estimator", "violations", "whiten",
]
