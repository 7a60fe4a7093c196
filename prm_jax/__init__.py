"""prm-jax: process rewards to shaped PPO/GRPO advantages, in JAX.

The numerical core (``prm_jax.kernels``) is jitted pure functions over padded ``[B, T]`` batches; the
runtime (trajectories, scorers, the runner, config, metrics, device batches) is a small anyio layer.
"""

from prm_jax.kernels import *  # noqa: F401,F403  (the list below is the public surface)
from prm_jax.kernels import __all__ as _kernel_names
from prm_jax.authoring import RetryError, call_with_retry
from prm_jax.batching import bucket_width, pack_branches, to_device
from prm_jax.config import ExperimentConfig, PRMConfig, ScorerSpec, load_config
from prm_jax.metrics import InMemoryRecorder, MetricRecorder, MetricStats, branch_stats, reduce_workers
from prm_jax.runner import PRMRunner, resolve_scorer_class
from prm_jax.scoring import (BaseScorer, BaseTrajectoryScorer, PRMMetricObservation, PRMScorerResult,
                             PRMTurnResult)
from prm_jax.trajectory import BranchSequence, Interaction, InteractionCache, stitch

__version__ = "0.1.0"
__all__ = list(_kernel_names) + [
    "BaseScorer", "BaseTrajectoryScorer", "BranchSequence", "ExperimentConfig", "InMemoryRecorder", "Interaction",
    "InteractionCache", "MetricRecorder", "MetricStats", "PRMConfig", "PRMMetricObservation", "PRMRunner",
    "PRMScorerResult", "PRMTurnResult", "RetryError", "ScorerSpec", "branch_stats", "bucket_width",
    "call_with_retry", "load_config", "pack_branches", "reduce_workers", "resolve_scorer_class", "stitch",
    "to_device",
]
