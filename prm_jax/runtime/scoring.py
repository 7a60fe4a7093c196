"""The scorer contract: what a process-reward scorer implements and what it may return.

A scorer scores every turn of one branch. ``evaluate`` returns an *unweighted* score per turn: a float,
broadcast over the turn's output tokens, or an array of shape ``[output_len]`` that keeps token positions.
``None`` or an exception rejects the trajectory; a real zero is ``0.0``. The runner multiplies by the
scorer's ``weight`` and adds the contributions of all scorers into the turn's ``token_rewards``.

Scorers receive read-only inputs (``Interaction.readonly()``, an immutable ``ctx``) and one instance serves
concurrent sessions: keep request state inside the coroutine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from prm_jax.runtime.trajectory import Interaction
from prm_jax.validation import deadline, scorer_weight

SCOPES = ("turn", "trajectory")
VALUE_TYPES = ("float", "boolean")
AGGREGATIONS = {"boolean": ("count", "rate"), "float": ("sum", "mean")}


@dataclasses.dataclass(frozen=True)
class PRMMetricObservation:
    """One structured monitoring value, unweighted. A turn-scope observation targets its own turn."""

    metric_id: str
    scope: str
    target_id: str
    value: float | bool
    value_type: str
    aggregations: tuple[str, ...]

    def __post_init__(self):
        for key in ("metric_id", "target_id"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ValueError(f"PRMMetricObservation.{key} must be a non-empty string, got {getattr(self, key)!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"PRMMetricObservation.scope must be one of {SCOPES}, got {self.scope!r}")
        if self.value_type not in VALUE_TYPES:
            raise ValueError(f"PRMMetricObservation.value_type must be one of {VALUE_TYPES}, got {self.value_type!r}")
        aggregations = (self.aggregations,) if isinstance(self.aggregations, str) else tuple(self.aggregations)
        object.__setattr__(self, "aggregations", aggregations)
        if not aggregations:
            raise ValueError(f"metric {self.metric_id!r}: aggregations must not be empty")
        if len(set(aggregations)) != len(aggregations):
            raise ValueError(f"metric {self.metric_id!r}: aggregations must be unique, got {aggregations}")
        allowed = AGGREGATIONS[self.value_type]
        bad = [a for a in aggregations if a not in allowed]
        if bad:
            raise ValueError(f"metric {self.metric_id!r}: a {self.value_type} observation allows only {allowed}, "
                             f"got {bad}")
        if self.value_type == "boolean":
            if not isinstance(self.value, (bool, np.bool_)):
                raise ValueError(f"metric {self.metric_id!r}: a boolean value must be a bool, got {self.value!r}")
            object.__setattr__(self, "value", bool(self.value))
        else:
            if isinstance(self.value, (bool, np.bool_)) or not isinstance(self.value, (int, float, np.number)) \
                    or not math.isfinite(float(self.value)):
                raise ValueError(f"metric {self.metric_id!r}: a float value must be a finite, non-bool number, got "
                                 f"{self.value!r}")
            object.__setattr__(self, "value", float(self.value))

    @property
    def schema(self) -> tuple[str, tuple[str, ...]]:
        return self.value_type, self.aggregations


@dataclasses.dataclass(frozen=True)
class PRMScorerResult:
    """A scorer's raw (unweighted) reward for one turn plus its observations."""

    reward: Any
    observations: tuple[PRMMetricObservation, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "observations", tuple(self.observations))


@dataclasses.dataclass(frozen=True, slots=True)
class PRMTurnResult:
    """What one scorer committed to one turn: the weighted token rewards and the turn metric."""

    scorer: str
    interaction_id: str
    weight: float
    token_rewards: np.ndarray  # weight * raw, float32 [output_len]
    reward: float              # mean over the turn's tokens of weight * raw
    observations: tuple[PRMMetricObservation, ...] = ()


class BaseScorer:
    """Subclass, set a unique class-level ``name`` and implement ``async evaluate(interaction, ctx)``.

    ``ctx`` holds ``messages`` (the branch's full conversation), ``is_eval`` and the caller's context.
    Override ``prepare_result`` or ``evaluate_result`` to return ``PRMScorerResult(reward, observations)``
    for structured monitoring, and ``aclose`` to release what the scorer owns.
    """

    name: ClassVar[str] = ""

    def __init__(self, weight: float = 1.0, enabled: bool = True, timeout: float | None = None, **kwargs: Any):
        if not isinstance(type(self).name, str) or not type(self).name:
            raise ValueError(f"{type(self).__name__} must set a non-empty class-level name")
        if not isinstance(enabled, bool):
            raise ValueError(f"scorer {self.name!r}: enabled must be a bool, got {enabled!r}")
        if kwargs:
            raise TypeError(f"scorer {self.name!r} got unexpected keyword arguments {sorted(kwargs)}")
        self.weight = scorer_weight(f"scorer {self.name!r}: weight", weight)
        self.enabled = enabled
        # Seconds per evaluate / evaluate_trajectory call under a runner (None: no deadline); a config
        # entry's ``timeout`` wins for the scorers a runner builds.
        self.timeout = deadline(f"scorer {self.name!r}: timeout", timeout)

    @classmethod
    def validate_kwargs(cls, **kwargs: Any) -> None:
        """Checks a config entry's ``kwargs`` for this class without acquiring anything (no client, no
        connection, no file): ``validate-config`` and ``prm-jax score``'s preflight call it, so a bad value
        is reported before anything is scored. Raise ``ValueError`` or ``TypeError`` naming the argument; a
        constructor should call it too, so each rule has one home. The default accepts everything."""

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> Any:
        raise NotImplementedError(f"scorer {self.name!r} must implement evaluate(interaction, ctx)")

    def prepare_result(self, interaction: Interaction, raw: Any, ctx: Mapping[str, Any]) -> PRMScorerResult | None:
        """Wraps a raw score; override to attach observations. ``None`` stays ``None`` (a rejection)."""
        if raw is None or isinstance(raw, PRMScorerResult):
            return raw
        return PRMScorerResult(raw)

    async def evaluate_result(self, interaction: Interaction, ctx: Mapping[str, Any]) -> PRMScorerResult | None:
        return self.prepare_result(interaction, await self.evaluate(interaction, ctx), ctx)

    async def aclose(self) -> None:
        """Cleanup hook (default no-op): flush buffers, join writers, close owned clients, with bounded I/O."""


class BaseTrajectoryScorer(BaseScorer):
    """Scores a whole branch at once: ``evaluate_trajectory`` maps interaction ids to unweighted rewards.

    Ids it leaves out get 0.0; an unknown id is a ``ValueError``; a non-mapping is a ``TypeError``.
    """

    async def evaluate_trajectory(self, interactions: Sequence[Interaction],
                                  ctx: Mapping[str, Any]) -> Mapping[str, Any] | None:
        raise NotImplementedError(f"scorer {self.name!r} must implement evaluate_trajectory(interactions, ctx)")

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> Any:
        raise RuntimeError(f"trajectory scorer {self.name!r} scores whole branches: the runner calls "
                           "evaluate_trajectory, not evaluate")
