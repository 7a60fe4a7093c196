"""prm-jax: process rewards to shaped PPO/GRPO advantages, in JAX.

Three floors, each importing only the ones below it: ``prm_jax.kernels`` (jitted pure functions over
padded ``[B, T]`` batches), ``prm_jax.runtime`` (trajectories, the scorer contract, the runner, export,
group filters, batches, metrics: a small anyio layer) and ``prm_jax.app`` (config files, the JSONL
session format, the command line). Everything public is re-exported here.
"""

from prm_jax.kernels import *  # noqa: F403  (the list below is the public surface)
from prm_jax.kernels import __all__ as _kernel_names
from prm_jax.runtime.arrays import chains_from_arrays, score_arrays, token_rewards_from_chains
from prm_jax.runtime.authoring import RetryError, call_with_retry
from prm_jax.runtime.batching import bucket_width, pack_branches
from prm_jax.runtime.blocking import BlockingRunner
from prm_jax.runtime.config import ExperimentConfig, PRMConfig, ScorerSpec
from prm_jax.runtime.config_file import load_config
from prm_jax.runtime.export import ExportService, TrajectoryStore, export_group
from prm_jax.runtime.filters import (
                                     GroupFilterResult,
                                     filter_function,
                                     filter_mixed_or_penalized_all_wrong,
                                     filter_mixed_or_penalized_all_wrong_mask_no_eos,
                                     group_filter_flags,
)
from prm_jax.runtime.metrics import InMemoryRecorder, MetricRecorder, MetricStats, branch_stats, reduce_workers
from prm_jax.runtime.runner import PRMRunner
from prm_jax.runtime.scoring import (
                                     BaseScorer,
                                     BaseTrajectoryScorer,
                                     PRMMetricObservation,
                                     PRMScorerResult,
                                     PRMTurnResult,
)
from prm_jax.runtime.specs import resolve_scorer_class
from prm_jax.runtime.trajectory import BranchSequence, Interaction, InteractionCache, stitch

__version__ = "0.1.0"
__all__ = list(_kernel_names) + [
    "BaseScorer", "BaseTrajectoryScorer", "BlockingRunner", "BranchSequence", "ExperimentConfig", "ExportService",
    "GroupFilterResult", "InMemoryRecorder", "Interaction", "InteractionCache", "MetricRecorder", "MetricStats",
    "PRMConfig", "PRMMetricObservation", "PRMRunner", "PRMScorerResult", "PRMTurnResult", "RetryError",
    "ScorerSpec", "TrajectoryStore", "branch_stats", "bucket_width", "call_with_retry", "chains_from_arrays",
    "export_group",
    "filter_function", "filter_mixed_or_penalized_all_wrong", "filter_mixed_or_penalized_all_wrong_mask_no_eos",
    "group_filter_flags", "load_config", "pack_branches", "reduce_workers", "resolve_scorer_class", "score_arrays",
    "stitch", "token_rewards_from_chains",
]
