"""Jitted pure functions over padded ``[B, T]`` batches: one module per concept."""

from prm_jax.kernels.advantages import AdvantageOutput, compute_advantages
from prm_jax.kernels.alignment import broadcast_turn_rewards, shift_to_next_token
from prm_jax.kernels.gigpo import dense_anchor_ids
from prm_jax.kernels.kl import KL_ESTIMATORS, kl_estimate, kl_rewards
from prm_jax.kernels.normalization import normalize
from prm_jax.kernels.plan import AdvantagePlan
from prm_jax.kernels.recurrence import GAE_METHODS, backward_linear_recurrence
from prm_jax.kernels.sequence_parallel import sequence_parallel_gae
from prm_jax.kernels.shaping import SHAPING_MODES, shape_advantages
from prm_jax.kernels.token_gae import GAEOutput, gae
from prm_jax.kernels.turns import turn_gae, turn_ids_from_spans

# Each public name has one namespace (configuration classes are prm_jax.config's, GiGPO's kernel is
# prm_jax.credit's); no function here shadows a module of this package (tests/test_public_api.py).
__all__ = [
    "AdvantageOutput", "AdvantagePlan", "GAEOutput", "GAE_METHODS", "KL_ESTIMATORS", "SHAPING_MODES",
    "backward_linear_recurrence", "broadcast_turn_rewards", "compute_advantages", "dense_anchor_ids", "gae",
    "kl_estimate", "kl_rewards", "normalize", "sequence_parallel_gae", "shape_advantages", "shift_to_next_token",
    "turn_gae", "turn_ids_from_spans",
]
