"""Jitted pure functions over padded ``[B, T]`` batches: one private module per concept, every public name
here (``prm_jax.kernels.gae_lambda`` holds AReaL's λ functions, named by dotted path in configs)."""

from typing import TYPE_CHECKING

from prm_jax._lazy import attach

if TYPE_CHECKING:
    from prm_jax.kernels._advantages import AdvantageOutput, compute_advantage_variants, compute_advantages
    from prm_jax.kernels._alignment import broadcast_turn_rewards, shift_to_next_token
    from prm_jax.kernels._gigpo import dense_anchor_ids
    from prm_jax.kernels._kl import KL_ESTIMATORS, kl_estimate, kl_rewards
    from prm_jax.kernels._normalization import normalize
    from prm_jax.kernels._plan import (
        AdvantagePlan,
        KLStage,
        LambdaFunction,
        OutcomeStage,
        OverlongPenalty,
        TaskRewardStage,
    )
    from prm_jax.kernels._platform import lowering_platform
    from prm_jax.kernels._recurrence import GAE_METHODS, ScanStrategy, backward_linear_recurrence
    from prm_jax.kernels._schema import BATCH_SCHEMA, BatchKey
    from prm_jax.kernels._sequence_parallel import sequence_parallel_gae
    from prm_jax.kernels._shaping import SHAPING_MODES, shape_advantages
    from prm_jax.kernels._token_gae import GAEOutput, TokenGAE, gae
    from prm_jax.kernels._turns import TurnGAE, turn_gae, turn_ids_from_spans

__getattr__, __dir__ = attach(__name__, __file__)

# Each public name has one namespace (configuration classes are prm_jax.config's, GiGPO's kernel is
# prm_jax.credit's); no function here shadows a module of this package (tests/test_public_api.py).
__all__ = [
    "AdvantageOutput", "AdvantagePlan", "BATCH_SCHEMA", "BatchKey", "GAEOutput", "GAE_METHODS", "KLStage",
    "KL_ESTIMATORS", "LambdaFunction", "OutcomeStage", "OverlongPenalty", "SHAPING_MODES", "ScanStrategy",
    "TaskRewardStage", "TokenGAE", "TurnGAE", "backward_linear_recurrence", "broadcast_turn_rewards",
    "compute_advantage_variants", "compute_advantages", "dense_anchor_ids", "gae",
    "kl_estimate", "kl_rewards", "lowering_platform", "normalize", "sequence_parallel_gae", "shape_advantages",
    "shift_to_next_token", "turn_gae", "turn_ids_from_spans",
]
