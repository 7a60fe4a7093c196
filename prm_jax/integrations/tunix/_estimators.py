"""prm-jax's advantage estimators behind tunix's own interfaces (GRPO's group normalization, PPO's GAE),
registered by name (``register_estimators``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from prm_jax.kernels._normalization import NormConfig

# prm-jax's advantage estimators that fit tunix's interfaces, by name in tunix's FunctionRegistry
# (register_estimators): GRPOConfig(advantage_estimator="prm_jax_group_norm"), PPOConfig(advantage_estimator="prm_jax_gae").
ESTIMATOR_NAME = "prm_jax_group_norm"  # GRPO's interface: [B] rewards, the group size
GAE_ESTIMATOR_NAME = "prm_jax_gae"  # PPO's: [B, C] rewards, values and mask, gamma, gae_lambda


def group_norm_advantages(rewards: Any, num_generations: int) -> np.ndarray:
    """tunix's advantage-estimator interface (``rewards [B]``, consecutive groups of ``num_generations``)
    around AReaL's group normalization (``NormConfig("group", "group")``: the group's mean, its unbiased
    std, ``eps`` 1e-5; a group of one gives 0): what ``compute_advantages`` does to outcome rewards."""
    from prm_jax.kernels._normalization import normalize

    rewards = np.asarray(rewards, np.float32)
    if num_generations < 1 or rewards.shape[0] % num_generations:
        raise ValueError(f"{rewards.shape[0]} rewards do not split into groups of num_generations={num_generations}")
    sizes = np.full(rewards.shape[0] // num_generations, num_generations, np.int32)
    return np.asarray(normalize(rewards, norm=NormConfig("group", "group"), group_sizes=sizes))


def gae_advantages(rewards: Any, values: Any, completion_mask: Any, gamma: float,
                   gae_lambda: float) -> tuple[jax.Array, jax.Array]:
    """tunix's PPO advantage-estimator interface (the arguments of its ``gae``: ``[B, C]`` rewards, values
    and ``completion_mask``, ``gamma``, ``gae_lambda``) around prm-jax's GAE kernel (``prm_jax.kernels.gae``,
    the native CPU kernel where it is built) and verl's whitening (``normalization.whiten``).

    As tunix's ``gae``: a token outside ``completion_mask`` carries the advantage and the next value unchanged
    (no bootstrap after the last token); the returns are ``advantages + values`` before whitening; the
    advantages are whitened over the trained tokens (their mean and unbiased variance, ``eps`` 1e-8). Where
    it differs, on purpose: a token outside the mask gets advantage 0 (tunix whitens it too; its loss masks
    it out), and a batch with one trained token gets 0 (tunix's ``n / (n - 1)`` makes it NaN). A
    ``ValueError`` where the advantages or the returns are not finite in float32 (an overflow, or a NaN in).
    """
    from prm_jax.kernels import gae

    out = gae(rewards, values, completion_mask, gamma=gamma, lam=gae_lambda)
    advantages, finite = _whiten_jit(out.advantages, out.returns, completion_mask)
    if not bool(finite):
        raise ValueError(f"{GAE_ESTIMATOR_NAME}: the advantages or the returns are not finite in float32 (the "
                         "rewards or values hold a NaN or overflow it)")
    return advantages, out.returns


@jax.jit
def _whiten_jit(advantages: jax.Array, returns: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The whitened advantages, and whether they and the returns are finite (one program)."""
    from prm_jax.kernels._normalization import whiten

    whitened = whiten(advantages, jnp.asarray(mask) != 0)
    return whitened, jnp.isfinite(whitened).all() & jnp.isfinite(returns).all()


def register_estimators() -> dict[str, str]:
    """Registers prm-jax's advantage estimators that fit tunix's interfaces in its advantage-estimator
    registry and returns ``{kind: registered name}``: ``group_norm_advantages`` as ``prm_jax_group_norm``
    (``GRPOConfig(advantage_estimator=...)``) and ``gae_advantages`` as ``prm_jax_gae``
    (``PPOConfig(advantage_estimator=...)``). (prm-jax's per-token and per-turn estimators need the
    rollout's tokens and turns, which neither interface passes: they run through
    ``ProcessRewardGRPOLearner`` and ``ProcessRewardAgenticGRPOLearner``.)"""
    from tunix.rl import function_registry

    estimators = {"group_norm": (ESTIMATOR_NAME, group_norm_advantages), "gae": (GAE_ESTIMATOR_NAME, gae_advantages)}
    for name, estimator in estimators.values():
        function_registry.register_advantage_estimator(name)(estimator)
    return {kind: name for kind, (name, _) in estimators.items()}
