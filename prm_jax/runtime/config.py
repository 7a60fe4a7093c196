"""Configuration, YAML-compatible with AReaL's process-reward settings.

```yaml
rollout:
  _version: v1            # or v2
  api_url: null           # v2 external-model mode when set
  agent:
    chat_template_type: concat
    export_style: concat
    prm:
      enabled: true
      advantage_shaping: {mode: process_weighted, negative_scale: 0.2, zero_penalty: 0.4, zero_eps: 1.0e-6}
      scorers:
        - {path: prm_jax.scorers.LengthBudgetScorer, weight: 1.0, kwargs: {max_output_tokens: 128}}
actor:
  token_rewards_as_adv: true
  mask_no_eos_with_zero: false
```

Every key is checked; unknown keys are errors. ``actor`` takes the ``AdvantageConfig`` fields (AReaL's
names). The scorer rules (direct process advantages, concat export and template, no v2 external-model
mode) apply only when scorers are active: PRM enabled and a non-empty scorer list. The shaping mode's own
rules (``gvpo``/``process_weighted`` need ``token_rewards_as_adv``) apply whenever PRM is enabled; with PRM
disabled the shaping settings are validated but unused (the actor shapes nothing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from prm_jax.kernels.normalization import NormConfig
from prm_jax.kernels.pipeline import AdvantageConfig
from prm_jax.kernels.shaping import ShapingConfig
from prm_jax.runtime.scoring import BaseScorer
from prm_jax.validation import finite_number, short_repr

VERSIONS = ("v1", "v2")


def _check_keys(where: str, data: Any, allowed: set[str]) -> dict:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping, got {type(data).__name__}")
    unknown = sorted(map(str, set(data) - allowed))
    if unknown:
        raise ValueError(f"{where} has unknown keys {short_repr(unknown)} (allowed: {sorted(allowed)})")
    return dict(data)


@dataclasses.dataclass(frozen=True)
class ScorerSpec:
    """One ``rollout.agent.prm.scorers`` entry: a dotted import path to a ``BaseScorer`` subclass."""

    path: str
    weight: float = 1.0
    enabled: bool = True
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    timeout: float | None = None  # seconds per evaluate / evaluate_trajectory call; None: no deadline

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ScorerSpec:
        data = _check_keys(where, data, {"path", "weight", "enabled", "kwargs", "timeout"})
        if not isinstance(data.get("path"), str) or not data.get("path"):
            raise ValueError(f"{where}.path must be a non-empty dotted import path, got {short_repr(data.get('path'))}")
        weight = finite_number(f"{where}.weight", data.get("weight", 1.0))
        enabled = data.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ValueError(f"{where}.enabled must be a bool, got {short_repr(enabled)}")
        kwargs = data.get("kwargs") or {}
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise ValueError(f"{where}.kwargs must be a mapping of argument names, got {short_repr(kwargs)}")
        timeout = data.get("timeout")
        if timeout is not None:
            timeout = finite_number(f"{where}.timeout", timeout)
            if timeout <= 0:
                raise ValueError(f"{where}.timeout must be > 0 seconds (or null for no deadline), got {short_repr(timeout)}")
        return cls(data["path"], weight, enabled, dict(kwargs), timeout)


@dataclasses.dataclass(frozen=True)
class PRMConfig:
    """``rollout.agent.prm``. ``scorers`` holds ``ScorerSpec`` entries or borrowed ``BaseScorer`` instances."""

    enabled: bool = True
    advantage_shaping: ShapingConfig = ShapingConfig()
    scorers: tuple[ScorerSpec | BaseScorer, ...] = ()

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise ValueError(f"rollout.agent.prm.enabled must be a bool, got {short_repr(self.enabled)}")
        object.__setattr__(self, "advantage_shaping", ShapingConfig.from_value(self.advantage_shaping))
        scorers = []
        for i, entry in enumerate(self.scorers or ()):
            if not isinstance(entry, (ScorerSpec, BaseScorer)):
                entry = ScorerSpec.from_dict(entry, f"rollout.agent.prm.scorers[{i}]")
            scorers.append(entry)
        object.__setattr__(self, "scorers", tuple(scorers))

    @property
    def active(self) -> bool:
        """Scoring happens: PRM enabled with at least one scorer entry."""
        return self.enabled and bool(self.scorers)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PRMConfig:
        data = _check_keys("rollout.agent.prm", data, {"enabled", "advantage_shaping", "scorers"})
        try:
            shaping = ShapingConfig.from_value(data.get("advantage_shaping") or {})
        except TypeError as err:
            raise ValueError(f"rollout.agent.prm.{err}") from None
        scorers = data.get("scorers") or []
        if not isinstance(scorers, (list, tuple)):
            raise ValueError(f"rollout.agent.prm.scorers must be a list, got {type(scorers).__name__}")
        return cls(data.get("enabled", True), shaping,
                   tuple(ScorerSpec.from_dict(s, f"rollout.agent.prm.scorers[{i}]") for i, s in enumerate(scorers)))


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    version: str = "v1"
    api_url: str | None = None
    chat_template_type: str = "concat"
    export_style: str = "concat"


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """The whole YAML: rollout settings, the PRM section and the actor's advantage settings."""

    rollout: RolloutConfig
    prm: PRMConfig
    actor: AdvantageConfig

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentConfig:
        data = _check_keys("config", data, {"rollout", "actor"})
        rollout = _check_keys("rollout", data.get("rollout"), {"_version", "api_url", "agent"})
        agent = _check_keys("rollout.agent", rollout.get("agent"), {"chat_template_type", "export_style", "prm"})
        version = rollout.get("_version", "v1")
        if version not in VERSIONS:
            raise ValueError(f"rollout._version must be one of {VERSIONS}, got {short_repr(version)}")
        api_url = rollout.get("api_url")
        if api_url is not None and not isinstance(api_url, str):
            raise ValueError(f"rollout.api_url must be a string or null, got {short_repr(api_url)}")
        for key in ("chat_template_type", "export_style"):
            if not isinstance(agent.get(key, "concat"), str):
                raise ValueError(f"rollout.agent.{key} must be a string, got {short_repr(agent.get(key))}")
        rollout_config = RolloutConfig(version, api_url, agent.get("chat_template_type", "concat"),
                                       agent.get("export_style", "concat"))
        prm = PRMConfig.from_dict(agent.get("prm"))
        actor = _check_keys("actor", data.get("actor"), {f.name for f in dataclasses.fields(AdvantageConfig)}
                            - {"advantage_shaping"})
        if prm.enabled:
            actor["advantage_shaping"] = prm.advantage_shaping
        for key in ("reward_norm", "adv_norm"):
            if key in actor:
                actor[key] = _norm(actor[key], f"actor.{key}")
        try:
            actor_config = AdvantageConfig(**actor)
        except (ValueError, TypeError) as err:
            message = str(err)
            raise ValueError(message if message.startswith(("actor.", "advantage_shaping")) else
                             f"actor.{message}") from None
        config = cls(rollout_config, prm, actor_config)
        config.validate()
        return config

    def validate(self) -> None:
        """The cross-section rules of active scorers (SPEC 4); each message names the offending key."""
        if not self.prm.active:
            return
        if not self.actor.token_rewards_as_adv:
            raise ValueError("actor.token_rewards_as_adv must be true with active PRM scorers (direct process "
                             "advantages); folding dense scorer rewards into GAE is not supported")
        if self.rollout.export_style != "concat":
            raise ValueError(f"rollout.agent.export_style must be 'concat' with active PRM scorers, got "
                             f"{short_repr(self.rollout.export_style)}")
        if self.rollout.chat_template_type != "concat":
            raise ValueError(f"rollout.agent.chat_template_type must be 'concat' with active PRM scorers, got "
                             f"{short_repr(self.rollout.chat_template_type)}")
        if self.rollout.version == "v2" and self.rollout.api_url is not None:
            raise ValueError("rollout.api_url (v2 external-model mode) stores string-only responses and cannot be "
                             "used with active PRM scorers, which need token-backed interactions")


def _norm(value: Any, where: str) -> NormConfig | None:
    try:
        return NormConfig.from_value(value, where)
    except TypeError as err:
        raise ValueError(str(err)) from None
