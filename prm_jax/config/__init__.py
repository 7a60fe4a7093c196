"""Configuration: every YAML-facing setting, validated, with AReaL's keys.

``AdvantageConfig`` (``actor``) resolves into the kernels' ``AdvantagePlan``; ``ExperimentConfig`` is a
whole file (``rollout``, ``rollout.agent.prm``, ``actor``), read by ``load_config`` (YAML with a bound on
alias expansion). Errors are ``prm_jax.errors.ConfigError`` (``ConfigFileError`` for a file), naming the key
path. The kernels' own parameter records
(``NormConfig``, ``DecoupledNorm``, ``ShapingConfig``, ``GiGPOConfig``, ``TreeCredit``, ``PureCredit``,
``PrimeCredit``, ``OTBCredit``, ``ReinforcePPCredit``, ``ReinforcePPBaselineCredit``, ``TurnRLOOCredit``, ``MinFormTransform``,
``ProgressTransform``) are re-exported: they are the values of
``reward_norm``/``adv_norm``, ``advantage_shaping``, ``credit_assignment`` and ``process_reward_transform``.
"""

from prm_jax.config._advantage import (
    SETTING_REFUSALS,
    AdvantageConfig,
    Refusal,
    refusals_markdown,
    refused_pairs,
    resolve_lambda,
)
from prm_jax.config._experiment import (
    ERROR_POLICIES,
    ErrorPolicy,
    ExperimentConfig,
    PRMConfig,
    PRMSection,
    RolloutConfig,
    ScorerSpec,
)
from prm_jax.config._loader import load_config, parse_yaml

# (prm_jax.errors' classes, at the path they had before it)
from prm_jax.errors import ConfigError as ConfigError
from prm_jax.errors import ConfigFileError as ConfigFileError
from prm_jax.kernels._gigpo import GiGPOConfig
from prm_jax.kernels._normalization import DecoupledNorm, NormConfig
from prm_jax.kernels._otb import OTBCredit
from prm_jax.kernels._prime import PrimeCredit
from prm_jax.kernels._progress import ProgressTransform
from prm_jax.kernels._pure import MinFormTransform, PureCredit
from prm_jax.kernels._reinforce_pp import ReinforcePPBaselineCredit, ReinforcePPCredit
from prm_jax.kernels._shaping import ShapingConfig
from prm_jax.kernels._tree import TreeCredit
from prm_jax.kernels._turn_rloo import TurnRLOOCredit

__all__ = [
    "ERROR_POLICIES",
    "AdvantageConfig",
    "DecoupledNorm",
    "ErrorPolicy",
    "ExperimentConfig",
    "GiGPOConfig",
    "MinFormTransform",
    "ProgressTransform",
    "NormConfig",
    "OTBCredit",
    "PRMConfig",
    "PRMSection",
    "PrimeCredit",
    "PureCredit",
    "ReinforcePPBaselineCredit",
    "ReinforcePPCredit",
    "SETTING_REFUSALS",
    "Refusal",
    "RolloutConfig",
    "ScorerSpec",
    "ShapingConfig",
    "TreeCredit",
    "TurnRLOOCredit",
    "load_config",
    "refusals_markdown",
    "refused_pairs",
    "parse_yaml",
    "resolve_lambda",
]
