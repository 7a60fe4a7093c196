"""The runtime floor: trajectories, the scorer contract, the runner, export, host-side group filters,
device batches and metrics. It builds on ``prm_jax.kernels`` and knows nothing of files or the CLI.

The public names below are ``prm_jax.runtime.<name>``; the ones a user needs first are also ``prm_jax.<name>``.
"""

from typing import TYPE_CHECKING

from prm_jax._lazy import attach

if TYPE_CHECKING:
    # (prm_jax.errors' classes, at the path they had before it)
    from prm_jax.errors import RetryError as RetryError
    from prm_jax.errors import RunnerClosedError as RunnerClosedError
    from prm_jax.runtime._arrays import ScoredArrays, chains_from_arrays, score_arrays, token_rewards_from_chains
    from prm_jax.runtime._authoring import call_with_retry
    from prm_jax.runtime._batching import batch_spec, bucket_width, empty_batch, pack_branches
    from prm_jax.runtime._blocking import BlockingRunner
    from prm_jax.runtime._context import check_metadata
    from prm_jax.runtime._dispatch import EXECUTORS
    from prm_jax.runtime._export import ExportedTrajectory, ExportResult, ExportService, PRMStats, TrajectoryStore, export_group
    from prm_jax.runtime._lifecycle import Lifecycle, RunnerState
    from prm_jax.runtime._limits import RequestLimiter, should_retry
    from prm_jax.runtime._metrics import InMemoryRecorder, MetricRecorder, MetricStats, branch_stats, reduce_workers
    from prm_jax.runtime._process_pool import ProcessExecutor
    from prm_jax.runtime._runner import PRMRunner
    from prm_jax.runtime._scoring import (
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
    from prm_jax.runtime._settings import Settings, setting
    from prm_jax.runtime._specs import check_scorer_specs, resolve_scorer_class
    from prm_jax.runtime._steps import StepRule, place_steps, step_turn_ids
    from prm_jax.runtime._trajectory import TURN_FIELDS, BranchSequence, Interaction, InteractionCache, stitch

__getattr__, __dir__ = attach(__name__, __file__)

# Every public name of the runtime, at one path; its implementation modules are private (tests/test_public_api.py
# holds the boundary). Its errors (RetryError, RunnerClosedError) are prm_jax.errors' (named here too).
__all__ = [
    "EXECUTORS", "TURN_FIELDS", "BaseScorer", "BaseTrajectoryScorer", "BatchScorer", "BatchTrajectoryScorer",
    "BlockingRunner", "BranchSequence", "ExportResult", "ExportService", "ExportedTrajectory", "InMemoryRecorder",
    "Interaction", "InteractionCache", "Lifecycle", "MetricRecorder", "MetricStats", "PRMMetricObservation",
    "PRMRunner", "PRMScorerResult", "PRMStats", "PRMTurnResult", "ProcessExecutor", "RequestLimiter", "RunnerState",
    "ScoredArrays", "Settings", "StepRule", "SyncScorer", "SyncTrajectoryScorer",
    "TrajectoryStore", "batch_spec", "branch_stats", "bucket_width", "call_with_retry", "chains_from_arrays",
    "check_metadata", "check_scorer_specs", "empty_batch", "export_group", "pack_branches", "place_steps",
    "reduce_workers", "resolve_scorer_class", "score_arrays", "setting", "should_retry", "step_turn_ids", "stitch",
    "token_rewards_from_chains",
]
