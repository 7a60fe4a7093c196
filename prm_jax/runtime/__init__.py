"""The runtime floor: trajectories, the scorer contract, the runner, export, host-side group filters,
device batches and metrics. It builds on ``prm_jax.kernels`` and knows nothing of files or the CLI.

The public names below are ``prm_jax.runtime.<name>``; the ones a user needs first are also ``prm_jax.<name>``.
"""

from prm_jax.runtime.arrays import ScoredArrays, chains_from_arrays, score_arrays, token_rewards_from_chains
from prm_jax.runtime.authoring import RetryError, call_with_retry
from prm_jax.runtime.batching import empty_batch, pack_branches
from prm_jax.runtime.blocking import BlockingRunner
from prm_jax.runtime.export import ExportedTrajectory, ExportResult, ExportService, PRMStats, TrajectoryStore, export_group
from prm_jax.runtime.lifecycle import RunnerClosedError, RunnerState
from prm_jax.runtime.metrics import InMemoryRecorder, MetricRecorder, MetricStats
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
from prm_jax.runtime.steps import step_turn_ids
from prm_jax.runtime.trajectory import BranchSequence, Interaction, InteractionCache

# What a user needs; the helpers behind them (bucket_width, batch_spec, stitch, the metric reducers, the
# scorer-spec checks, ...) are reached through their modules. tests/test_public_api.py holds the boundary.
__all__ = [
    "BaseScorer", "BaseTrajectoryScorer", "BatchScorer", "BatchTrajectoryScorer", "BlockingRunner",
    "BranchSequence", "ExportResult", "ExportService", "ExportedTrajectory", "InMemoryRecorder", "Interaction",
    "InteractionCache", "MetricRecorder", "MetricStats", "PRMMetricObservation", "PRMRunner", "PRMScorerResult",
    "PRMStats", "PRMTurnResult", "RetryError", "RunnerClosedError", "RunnerState", "ScoredArrays", "SyncScorer",
    "SyncTrajectoryScorer", "TrajectoryStore", "call_with_retry", "chains_from_arrays", "empty_batch",
    "export_group", "pack_branches", "score_arrays", "step_turn_ids", "token_rewards_from_chains",
]
