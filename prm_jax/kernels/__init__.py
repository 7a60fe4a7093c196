"""Jitted pure functions over padded ``[B, T]`` batches: one module per concept."""

from prm_jax.kernels.advantages import AdvantageOutput, AdvantagePlan, compute_advantages
from prm_jax.kernels.alignment import broadcast_turn_rewards, shift_to_next_token
from prm_jax.kernels.gae import GAEOutput, gae
from prm_jax.kernels.gigpo import GiGPOConfig, GiGPOOutput, dense_anchor_ids, gigpo
from prm_jax.kernels.kl import KL_ESTIMATORS, kl_estimate, kl_rewards
from prm_jax.kernels.normalization import NormConfig, normalize
from prm_jax.kernels.recurrence import GAE_METHODS, backward_linear_recurrence
from prm_jax.kernels.sequence_parallel import sequence_parallel_gae
from prm_jax.kernels.shaping import SHAPING_MODES, ShapingConfig, shape_advantages
from prm_jax.kernels.turns import turn_gae, turn_ids_from_spans

__all__ = [
    "AdvantageOutput", "AdvantagePlan", "GAEOutput", "GAE_METHODS", "KL_ESTIMATORS",
    "NormConfig", "SHAPING_MODES", "ShapingConfig", "backward_linear_recurrence", "broadcast_turn_rewards",
    "GiGPOConfig", "GiGPOOutput", "compute_advantages", "dense_anchor_ids", "gae", "gigpo", "kl_estimate",
    "kl_rewards", "normalize", "sequence_parallel_gae", "shape_advantages", "shift_to_next_token", "turn_gae",
    "turn_ids_from_spans",
]
