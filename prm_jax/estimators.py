"""The estimator plug-in API: what a new credit estimator (steps 6-7 of ``compute_advantages``) is written
with, in one namespace. An estimator is a frozen dataclass (its record: the fields are the config keys of
``credit_assignment: {mode: <mode>, ...}``), a ``run(stage, checks, **inputs)`` that returns an
``Estimate``, and one ``EstimatorSpec`` that declares it (what it reads, its diagnostics prefix, the
``gae_timestep_unit`` values it runs with, the settings it refuses, an example configuration);
``register_estimator(spec)`` makes it known to the config, the pipeline, the command line and the tests'
option matrix. ``prm_jax.kernels.estimator.INPUTS`` lists what ``run`` may name; the primitives below are the ones the built-in
estimators share. ``tests/rloo_estimator.py`` is a complete one (leave-one-out RLOO) in 30 lines.
"""

from prm_jax.kernels.estimator import (
    Estimate,
    EstimatorSpec,
    EstimatorStage,
    SummaryHook,
    ValueCheck,
    on_turn_timesteps,
    row_groups,
    violations,
)
from prm_jax.kernels.estimators import credit_modes, estimator_for, register_estimator, registered, unregister_estimator
from prm_jax.kernels.normalization import leave_one_out_mean, whiten
from prm_jax.kernels.recurrence import reverse_cumsum

__all__ = [
    "Estimate", "EstimatorSpec", "EstimatorStage", "SummaryHook", "ValueCheck", "credit_modes",
    "estimator_for", "leave_one_out_mean", "on_turn_timesteps", "register_estimator", "registered",
    "reverse_cumsum", "row_groups", "unregister_estimator", "violations", "whiten",
]
