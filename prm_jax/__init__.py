"""prm-jax: process rewards to shaped PPO/GRPO advantages, in JAX.

The names a user needs first are here; the rest live in namespaces, as optax's do:

- ``prm_jax.config``: every configuration class and the YAML loader;
- ``prm_jax.kernels``: the jitted pure functions over padded ``[B, T]`` batches (``gae``, ``turn_gae``,
  ``normalize``, ``shape_advantages``, ``kl_rewards``, ``gigpo``, the alignment helpers, ...);
- ``prm_jax.runtime``: sessions, the runner's pieces, export, batches, metrics, retries;
- ``prm_jax.credit``: credit assignment beyond GAE (tree, PURE, PRIME, GDPO, GiGPO);
- ``prm_jax.estimators``: the estimator plug-in API (``EstimatorSpec``, ``register_estimator``, the shared
  primitives);
- ``prm_jax.audit``: the credit auditor (does a configuration estimate the policy gradient? on exact problems);
- ``prm_jax.losses``: the PPO loss side (``logprobs_on_timesteps``, ``ppo_clip_loss``);
- ``prm_jax.filters``: AReaL's host-side group filters;
- ``prm_jax.scorers``: the built-in scorers;
- ``prm_jax.errors``: every error a caller can catch (``PRMJaxError`` their base), and what the command line
  does with each.

Four floors, each importing only the ones below it: ``prm_jax.kernels`` (with ``prm_jax.native`` beside
it), ``prm_jax.config``, ``prm_jax.runtime`` and ``prm_jax.app`` (the JSONL format and the command line);
``import prm_jax`` loads no application code.
"""

from typing import TYPE_CHECKING

from prm_jax._lazy import attach

if TYPE_CHECKING:
    from prm_jax import audit, config, credit, estimators, filters, kernels, losses, runtime, scorers
    from prm_jax.config import AdvantageConfig, ExperimentConfig, GiGPOConfig, NormConfig, ShapingConfig, load_config
    from prm_jax.kernels import AdvantageOutput, compute_advantages
    from prm_jax.runtime._arrays import score_arrays
    from prm_jax.runtime._batching import pack_branches
    from prm_jax.runtime._blocking import BlockingRunner
    from prm_jax.runtime._runner import PRMRunner
    from prm_jax.runtime._scoring import (
        BaseScorer,
        BaseTrajectoryScorer,
        BatchScorer,
        BatchTrajectoryScorer,
        PRMMetricObservation,
        PRMScorerResult,
        SyncScorer,
        SyncTrajectoryScorer,
    )
    from prm_jax.runtime._trajectory import Interaction, InteractionCache

__getattr__, __dir__ = attach(__name__, __file__)

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)
__all__ = [
    "AdvantageConfig", "AdvantageOutput", "BaseScorer", "BaseTrajectoryScorer", "BatchScorer",
    "BatchTrajectoryScorer", "BlockingRunner", "ExperimentConfig", "SyncScorer", "SyncTrajectoryScorer",
    "GiGPOConfig", "Interaction", "InteractionCache", "NormConfig", "PRMMetricObservation", "PRMRunner",
    "PRMScorerResult", "ShapingConfig", "compute_advantages", "load_config", "pack_branches", "score_arrays",
    "audit", "config", "credit", "estimators", "filters", "kernels", "losses", "runtime", "scorers",
]
