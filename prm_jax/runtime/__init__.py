"""The runtime floor: trajectories, the scorer contract, the runner, export, host-side group filters,
device batches and metrics. It builds on ``prm_jax.kernels`` and knows nothing of files or the CLI.

The public names below are ``prm_jax.runtime.<name>``; the ones a user needs first are also ``prm_jax.<name>``.
"""

from prm_jax.runtime.arrays import ScoredArrays, chains_from_arrays, score_arrays, token_rewards_from_chains
from prm_jax.runtime.authoring import RetryError, call_with_retry
from prm_jax.runtime.batching import batch_spec, bucket_width, empty_batch, pack_branches
from prm_jax.runtime.blocking import BlockingRunner
from prm_jax.runtime.export import HITL_SESSION, ExportedTrajectory, ExportResult, ExportService, TrajectoryStore, export_group
from prm_jax.runtime.metrics import InMemoryRecorder, MetricRecorder, MetricStats, branch_stats, reduce_workers
from prm_jax.runtime.model_scorer import ModelScorer
from prm_jax.runtime.runner import PRMRunner
from prm_jax.runtime.scoring import (
    BaseScorer,
    BaseTrajectoryScorer,
    BatchScorer,
    BatchTrajectoryScorer,
    PRMMetricObservation,
    PRMScorerResult,
    PRMTurnResult,
    SyncScorer,
    SyncTrajectoryScorer,
)
from prm_jax.runtime.specs import check_scorer_specs, resolve_scorer_class
from prm_jax.runtime.trajectory import BranchSequence, Interaction, InteractionCache, stitch

__all__ = [
    "BaseScorer", "BaseTrajectoryScorer", "BatchScorer", "BatchTrajectoryScorer", "BlockingRunner",
    "BranchSequence", "ExportResult", "ExportService", "ExportedTrajectory", "HITL_SESSION", "InMemoryRecorder",
    "Interaction", "InteractionCache", "MetricRecorder", "MetricStats", "ModelScorer", "PRMMetricObservation",
    "PRMRunner", "PRMScorerResult", "PRMTurnResult", "RetryError", "ScoredArrays", "SyncScorer",
    "SyncTrajectoryScorer", "TrajectoryStore", "batch_spec", "branch_stats", "bucket_width", "call_with_retry",
    "chains_from_arrays", "check_scorer_specs", "empty_batch", "export_group", "pack_branches", "reduce_workers",
    "resolve_scorer_class", "score_arrays", "stitch", "token_rewards_from_chains",
]
