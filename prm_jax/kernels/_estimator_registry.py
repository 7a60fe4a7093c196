"""The registry of estimators (``prm_jax.kernels._estimator_contract`` says what one declares).

One line per estimator below; ``register_estimator`` adds one at run time (a plug-in, or a test's toy).
The config's ``credit_assignment`` modes, the pipeline's dispatch and checks, the command line's packing
and its report of diagnostics all read this registry.
"""

from __future__ import annotations

from prm_jax.kernels._estimator_contract import EstimatorSpec
from prm_jax.kernels._gigpo import GIGPO
from prm_jax.kernels._otb import OTB
from prm_jax.kernels._prime import PRIME
from prm_jax.kernels._pure import PURE
from prm_jax.kernels._reinforce_pp import REINFORCE_PP, REINFORCE_PP_BASELINE
from prm_jax.kernels._token_gae import TOKEN_GAE
from prm_jax.kernels._tree import TREE
from prm_jax.kernels._turn_rloo import TURN_RLOO
from prm_jax.kernels._turns import TURN_GAE

_REGISTRY: dict[type, EstimatorSpec] = {}


def register_estimator(spec: EstimatorSpec) -> EstimatorSpec:
    """Makes ``spec`` known (its plan record and its ``credit_assignment`` mode must be new); returns it.

    Args:
        spec: The estimator's declaration (``EstimatorSpec``).

    Example:
        >>> import dataclasses
        >>> import jax.numpy as jnp
        >>> @dataclasses.dataclass(frozen=True)
        ... class Constant:
        ...     value: float = 1.0
        ...
        >>> def run(stage, active):
        ...     return prm_jax.estimators.StageResult(jnp.where(active, jnp.float32(stage.value), jnp.float32(0)))
        ...
        >>> spec = prm_jax.estimators.EstimatorSpec(Constant, run, "credit_assignment 'constant'", mode="constant")
        >>> spec = prm_jax.estimators.register_estimator(spec)
        >>> config = prm_jax.AdvantageConfig(credit_assignment={"mode": "constant", "value": 0.5}, kl_ctl=0.0)
        >>> batch = {"attention_mask": np.ones((1, 3), np.int32), "loss_mask": np.array([[0, 1, 1]], np.int32),
        ...          "logprobs": np.zeros((1, 3), np.float32), "rewards": np.array([1.0], np.float32),
        ...          "is_truncated": np.array([False])}
        ...
        >>> np.asarray(prm_jax.compute_advantages(batch, config).advantages).tolist()
        [[0.5, 0.5, 0.0]]
        >>> prm_jax.estimators.unregister_estimator(spec)
    """
    if not isinstance(spec, EstimatorSpec):
        raise TypeError(f"register_estimator needs an EstimatorSpec, got {type(spec).__name__}")
    taken = [other.label for other in _REGISTRY.values()
             if other.stage is spec.stage or (spec.mode is not None and other.mode == spec.mode)]
    if taken:
        raise ValueError(f"estimator {spec.label}: its record or mode is already registered ({taken[0]})")
    _REGISTRY[spec.stage] = spec
    return spec


def unregister_estimator(spec: EstimatorSpec) -> None:
    """Removes an estimator ``register_estimator`` added.

    Args:
        spec: A declaration ``register_estimator`` added.

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass(frozen=True)
        ... class Zero:
        ...     pass
        ...
        >>> def run(stage, advantages):
        ...     return prm_jax.estimators.StageResult(advantages * 0)
        ...
        >>> spec = prm_jax.estimators.register_estimator(
        ...     prm_jax.estimators.EstimatorSpec(Zero, run, "credit_assignment 'zero'", mode="zero"))
        >>> "zero" in prm_jax.estimators.credit_modes()
        True
        >>> prm_jax.estimators.unregister_estimator(spec)
        >>> "zero" in prm_jax.estimators.credit_modes()
        False
    """
    if _REGISTRY.get(spec.stage) is spec:
        del _REGISTRY[spec.stage]


def estimator_for(stage: object) -> EstimatorSpec:
    """The declaration of a plan's estimator record.

    Args:
        stage: A plan's estimator record (``TokenGAE``, ``GiGPOConfig``, ...).

    Example:
        >>> prm_jax.estimators.estimator_for(prm_jax.kernels.TokenGAE()).name
        'token_gae'
    """
    try:
        return _REGISTRY[type(stage)]
    except KeyError:
        raise TypeError(f"no estimator is registered for {type(stage).__name__} "
                        "(register it with prm_jax.estimators.register_estimator)") from None


def registered() -> tuple[EstimatorSpec, ...]:
    """Every registered estimator, in registration order.

    Example:
        >>> [spec.name for spec in prm_jax.estimators.registered()][:4]
        ['token_gae', 'turn_gae', 'gigpo', 'tree']
    """
    return tuple(_REGISTRY.values())


def credit_modes() -> dict[str, type]:
    """``credit_assignment.mode`` -> the record its keys build.

    Example:
        >>> modes = prm_jax.estimators.credit_modes()
        >>> modes["gigpo"].__name__, "tree" in modes
        ('GiGPOConfig', True)
    """
    return {spec.mode: spec.stage for spec in _REGISTRY.values() if spec.mode is not None}


for _spec in (TOKEN_GAE, TURN_GAE, GIGPO, TREE, PURE, PRIME, REINFORCE_PP, REINFORCE_PP_BASELINE, OTB, TURN_RLOO):
    register_estimator(_spec)
