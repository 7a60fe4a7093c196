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

Every key is checked; unknown keys are errors. Every class validates itself in ``__post_init__`` (built
from YAML or in code alike) and is built from a mapping by one function, ``prm_jax._validation.from_mapping``,
whose errors name the key path. ``actor`` takes the ``AdvantageConfig`` fields (AReaL's names).

The shaping settings are written under ``rollout.agent.prm.advantage_shaping`` (AReaL's place) but have one
owner, ``AdvantageConfig.advantage_shaping``, the pipeline's static argument: ``ExperimentConfig`` moves
them there when PRM is enabled (with PRM disabled they are validated and unused: the actor shapes
nothing). The scorer rules (direct process advantages, concat export and template, no v2 external-model
mode) apply only when scorers are active: PRM enabled and a non-empty scorer list. Scorer *instances* are
not configuration: pass them to ``PRMRunner(..., scorers=...)`` (they are borrowed, never closed there).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple, get_args

from prm_jax._validation import boolean, deadline, finite_number, from_mapping, one_of, scorer_weight, short_repr
from prm_jax.config._advantage import AdvantageConfig, shaping_config
from prm_jax.errors import ConfigError
from prm_jax.kernels._normalization import DecoupledNorm
from prm_jax.kernels._shaping import ShapingConfig

VERSIONS = ("v1", "v2")


@dataclasses.dataclass(frozen=True)
class ScorerSpec:
    """One ``rollout.agent.prm.scorers`` entry: a dotted import path to a ``BaseScorer`` subclass.

    Args:
        path: The scorer class's dotted import path (``prm_jax.scorers.MathVerifyScorer``, ``mypkg.MyScorer``).
        kwargs: The scorer's own constructor arguments (a mapping), checked by its ``validate_kwargs``.

    Example:
        >>> spec = prm_jax.config.ScorerSpec("prm_jax.scorers.LengthBudgetScorer", weight=0.5, kwargs={"max_output_tokens": 64})
        >>> spec.path.rsplit(".", 1)[-1], spec.weight, dict(spec.kwargs)
        ('LengthBudgetScorer', 0.5, {'max_output_tokens': 64})
    """

    path: str
    weight: float = 1.0
    enabled: bool = True
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    timeout: float | None = None  # seconds per evaluate / evaluate_trajectory call; None: no deadline

    def __post_init__(self):
        if not isinstance(self.path, str) or not self.path:
            raise ConfigError("path", f"must be a non-empty dotted import path, got {short_repr(self.path)}")
        object.__setattr__(self, "weight", scorer_weight("weight", self.weight))
        boolean("enabled", self.enabled)
        kwargs = {} if self.kwargs is None else self.kwargs
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise ConfigError("kwargs", f"must be a mapping of argument names, got {short_repr(kwargs)}")
        object.__setattr__(self, "kwargs", dict(kwargs))
        object.__setattr__(self, "timeout", deadline("timeout", self.timeout))


def _scorer_list(value: Any, where: str) -> tuple[ScorerSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ConfigError(where, f"must be a list, got {type(value).__name__}")
    specs = []
    for i, entry in enumerate(value):
        if not isinstance(entry, (ScorerSpec, Mapping)):
            raise ConfigError(f"{where}[{i}]", f"must be a scorer entry {{path, weight, enabled, kwargs, timeout}}, "
                                               f"got {type(entry).__name__} (scorer instances go to "
                                               "PRMRunner(..., scorers=...))")
        if isinstance(entry, Mapping) and "path" not in entry and set(entry) & SCORER_NAME_KEYS:
            key = sorted(set(entry) & SCORER_NAME_KEYS)[0]
            raise ConfigError(f"{where}[{i}]", f"has unknown key {key!r}: did you mean path:? A scorer entry names its "
                                               f"class by dotted import path (path: prm_jax.scorers.PoolingPRMScorer, "
                                               f"path: my_scorers.MyScorer), got {key}: {short_repr(entry[key])}")
        specs.append(from_mapping(ScorerSpec, entry, f"{where}[{i}]"))
    return tuple(specs)


# Keys other configs name a scorer by (a registry name, a class): an entry with one and no path is told of path.
SCORER_NAME_KEYS = frozenset({"name", "class", "cls", "type", "scorer", "class_path", "target", "_target_"})


#: ``rollout.agent.prm.error_policy``: what a failed scorer does to its group (``reject``: the whole group
#: is rejected, as AReaL; ``keep_original``: the group is kept without process rewards).
ErrorPolicy = Literal["reject", "keep_original"]
#: The values of ``ErrorPolicy``, in order (derived from the ``Literal``).
ERROR_POLICIES: tuple[ErrorPolicy, ...] = get_args(ErrorPolicy)


@dataclasses.dataclass(frozen=True)
class PRMConfig:
    """``rollout.agent.prm`` without the shaping settings (their owner is ``AdvantageConfig``).

    ``error_policy`` (AReaL PR #1747): ``reject`` (default) rejects a session, and so its group, when a
    scorer fails; ``keep_original`` exports that session as it was before scoring (its original outcome and
    token rewards, never a partly scored branch), counted in the ``prm_fallback`` metric. Cancellation,
    start-up and configuration errors are never caught by the fallback. v1 only (AReaL has no v2 fallback).

    Args:
        enabled: Whether process rewards are computed (``False``: the scorers are validated, never run).
        scorers: The scorer entries (``ScorerSpec``), in order; their classes' names must be unique.
        error_policy: ``reject`` (a scorer failure rejects the session and its group) or ``keep_original`` (AReaL PR
            #1747).

    Example:
        >>> prm = prm_jax.config.PRMConfig.from_mapping({"enabled": True, "scorers": [
        ...     {"path": "prm_jax.scorers.LengthBudgetScorer", "weight": 0.5, "kwargs": {"max_output_tokens": 64}}]})
        ...
        >>> prm.active, prm.scorers[0].weight, prm.error_policy
        (True, 0.5, 'reject')
    """

    enabled: bool = True
    scorers: tuple[ScorerSpec, ...] = ()
    error_policy: ErrorPolicy = "reject"

    def __post_init__(self):
        boolean("enabled", self.enabled)
        object.__setattr__(self, "scorers", _scorer_list(self.scorers, "scorers"))
        one_of("error_policy", self.error_policy, ERROR_POLICIES, config=True)

    @property
    def active(self) -> bool:
        """Scoring happens: PRM enabled with at least one scorer entry."""
        return self.enabled and bool(self.scorers)

    @classmethod
    def from_mapping(cls, data: Any, where: str = "rollout.agent.prm") -> PRMConfig:
        """The YAML section; its ``advantage_shaping`` belongs to the actor (see ``ExperimentConfig``): it is
        checked here (a bad one is a ``ConfigError`` naming it) and read by ``section_shaping``.

        Args:
            data: The ``rollout.agent.prm`` section, decoded (a mapping).
        """
        section = dict(data or {}) if isinstance(data, Mapping) else data
        if isinstance(section, dict):
            section_shaping(section, where)
            section.pop("advantage_shaping", None)
        return from_mapping(cls, section, where)


def section_shaping(section: Mapping[str, Any], where: str = "rollout.agent.prm") -> ShapingConfig:
    """The ``advantage_shaping`` a PRM section (a mapping) writes, checked; the default where it writes none."""
    return shaping_config(section.get("advantage_shaping"), f"{where}.advantage_shaping" if where else
                          "advantage_shaping")


class PRMSection(NamedTuple):
    """``rollout.agent.prm`` as written, shaping included: what a scorer's ``validate_prm_config`` reads.

    Args:
        enabled: ``rollout.agent.prm.enabled`` as written.
        advantage_shaping: The shaping as written (``ShapingConfig``).
        scorers: The scorer entries as written (``ScorerSpec``).

    Example:
        >>> section = prm_jax.config.ExperimentConfig.from_mapping({"rollout": {"agent": {"prm": {
        ...     "enabled": True, "advantage_shaping": {"mode": "gvpo"}}}}}).prm_section
        ...
        >>> section.enabled, section.advantage_shaping.mode
        (True, 'gvpo')
    """

    enabled: bool
    advantage_shaping: ShapingConfig
    scorers: tuple[ScorerSpec, ...]


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """``rollout``: the proxy version, the v2 external-model URL, the agent's template and export style.

    Args:
        version: The proxy's version, ``v1`` or ``v2`` (the YAML key ``_version``).
        api_url: The v2 external-model URL (``None``: none); process rewards are refused with it set.
        chat_template_type: The agent's chat template (``concat`` is the one process rewards support).
        export_style: How sessions are exported (``concat`` is the one process rewards support).

    Example:
        >>> rollout = prm_jax.config.ExperimentConfig.from_mapping({"rollout": {"_version": "v2"}}).rollout
        >>> rollout.version, rollout.api_url, rollout.export_style
        ('v2', None, 'concat')
    """

    version: str = "v1"
    api_url: str | None = None
    chat_template_type: str = "concat"
    export_style: str = "concat"

    def __post_init__(self):
        one_of("_version", self.version, VERSIONS, config=True)
        if self.api_url is not None and not isinstance(self.api_url, str):
            raise ConfigError("api_url", f"must be a string or null, got {short_repr(self.api_url)}")
        for key in ("chat_template_type", "export_style"):
            if not isinstance(getattr(self, key), str):
                raise ConfigError(f"agent.{key}", f"must be a string, got {short_repr(getattr(self, key))}")


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """The whole YAML: rollout settings, the PRM section and the actor's advantage settings.

    Args:
        rollout: The ``rollout`` section: the proxy version, the v2 external-model URL, the template and export style.
        prm: ``rollout.agent.prm``: the scorers and the error policy.
        actor: The ``actor`` section: the advantage pipeline's settings (``AdvantageConfig``).
        turn_discount: AReaL's per-turn discount of an exported trajectory's reward (``None``: no discount); the
            export applies it.

    Example:
        >>> config = prm_jax.config.ExperimentConfig.from_mapping({"actor": {"kl_ctl": 0.0}, "turn_discount": 0.9})
        >>> config.actor.kl_ctl, config.turn_discount, config.prm.active
        (0.0, 0.9, False)
    """

    rollout: RolloutConfig = RolloutConfig()
    prm: PRMConfig = PRMConfig(enabled=False)
    actor: AdvantageConfig = AdvantageConfig()
    # AReaL's experiment-level ``turn_discount`` (its agent workflows pass it to ``apply_reward_discount``):
    # when set, the export discounts each session's rewards per tree (``prm_jax.credit.tree_discount``).
    turn_discount: float | None = None

    def __post_init__(self):
        if self.turn_discount is not None:
            object.__setattr__(self, "turn_discount", finite_number("turn_discount", self.turn_discount,
                                                                    minimum=0.0, maximum=1.0))
        for key, kind in (("rollout", RolloutConfig), ("prm", PRMConfig), ("actor", AdvantageConfig)):
            if not isinstance(getattr(self, key), kind):
                raise ConfigError(key, f"must be a {kind.__name__}, got {type(getattr(self, key)).__name__}")
        self._check_active_scorers()
        self._check_reward_sources()

    @property
    def reward_sources(self) -> int:
        """GDPO's sources (``reward_norm: {mode: decoupled}``) as ``prm-jax score`` builds them: the outcome and
        one per enabled scorer entry, in the config's order (a scorer that fails a session leaves NaN)."""
        return 1 + (sum(spec.enabled for spec in self.prm.scorers) if self.prm.active else 0)

    def _check_reward_sources(self) -> None:
        norm = self.actor.reward_norm
        if isinstance(norm, DecoupledNorm) and norm.weights is not None and len(norm.weights) != self.reward_sources:
            raise ConfigError("actor.reward_norm.weights",
                              f"has {len(norm.weights)} entries but there are {self.reward_sources} reward sources: the "
                              "outcome reward and one per enabled entry of rollout.agent.prm.scorers, in that order")

    @property
    def prm_section(self) -> PRMSection:
        return PRMSection(self.prm.enabled, self.actor.advantage_shaping, self.prm.scorers)

    @classmethod
    def from_mapping(cls, data: Any) -> ExperimentConfig:
        """From the YAML's mapping (AReaL's layout: ``rollout.agent.prm``, ``actor``).

        Args:
            data: The whole YAML document, decoded (a mapping).
        """
        top = _keys(_read_sections(data), "", {"rollout", "actor", "turn_discount"})
        rollout = _keys(top.get("rollout"), "rollout", {"_version", "api_url", "agent"})
        agent = _keys(rollout.get("agent"), "rollout.agent", {"chat_template_type", "export_style", "prm"})
        try:
            rollout_config = RolloutConfig(rollout.get("_version", "v1"), rollout.get("api_url"),
                                           agent.get("chat_template_type", "concat"), agent.get("export_style", "concat"))
        except ConfigError as err:
            raise err.under("rollout") from None
        prm_data = _keys(agent.get("prm"), "rollout.agent.prm", {"enabled", "advantage_shaping", "scorers",
                                                                 "error_policy"})
        prm = PRMConfig.from_mapping(prm_data)
        shaping = shaping_config(prm_data.get("advantage_shaping"), "rollout.agent.prm.advantage_shaping")
        actor = _keys(top.get("actor"), "actor", {f.name for f in dataclasses.fields(AdvantageConfig)}
                      - {"advantage_shaping"})
        if prm.enabled:
            actor["advantage_shaping"] = shaping
        return cls(rollout_config, prm, from_mapping(AdvantageConfig, actor, "actor"), top.get("turn_discount"))

    def _check_active_scorers(self) -> None:
        """The cross-section rules of active scorers; each message names the offending key."""
        if self.prm.enabled and self.prm.error_policy == "keep_original" and self.rollout.version == "v2":
            raise ConfigError("rollout.agent.prm.error_policy", "keep_original is not implemented for rollout._version "
                                                               "v2 (AReaL rejects it there): use reject")
        if not self.prm.active:
            return
        if not self.actor.token_rewards_as_adv:
            raise ConfigError("actor.token_rewards_as_adv", "must be true with active PRM scorers (direct process "
                                                           "advantages); folding dense scorer rewards into GAE is "
                                                           "not supported")
        for key in ("export_style", "chat_template_type"):
            if getattr(self.rollout, key) != "concat":
                raise ConfigError(f"rollout.agent.{key}", f"must be 'concat' with active PRM scorers, got "
                                                          f"{short_repr(getattr(self.rollout, key))}")
        if self.rollout.version == "v2" and self.rollout.api_url is not None:
            raise ConfigError("rollout.api_url", "(v2 external-model mode) stores string-only responses and cannot "
                                                 "be used with active PRM scorers, which need token-backed "
                                                 "interactions")


def _read_sections(data: Any) -> Any:
    """A full AReaL experiment config is accepted: its top-level sections other than ``rollout`` and
    ``actor`` (``cluster``, ``gconfig``, ``train_dataset``, ...) are not prm-jax's and are ignored, with one
    warning listing them. Unknown keys inside the sections prm-jax reads stay errors."""
    if not isinstance(data, Mapping):
        return data
    read = ("rollout", "actor", "turn_discount")
    ignored = sorted(map(str, set(data) - set(read)))
    if ignored:
        warnings.warn(f"config sections that prm-jax does not read are ignored: {short_repr(ignored)}", stacklevel=3)
    return {key: value for key, value in data.items() if key in read}


def _keys(data: Any, where: str, allowed: set[str]) -> dict:
    """A YAML section as a dict, unknown keys refused (sections that are not one config class)."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(where or "config", f"must be a mapping, got {type(data).__name__}")
    unknown = sorted(map(str, set(data) - allowed))
    if unknown:
        raise ConfigError(where or "config", f"has unknown keys {short_repr(unknown)} (allowed: {sorted(allowed)})")
    return dict(data)
