"""The contract of the pipeline's other stage kinds: outcome normalizations, process transforms, shapings.

Estimators declare themselves with an ``EstimatorSpec`` (``prm_jax.kernels._estimator_contract``); the three other
kinds of configurable stage declare themselves with a ``StageSpec`` the same way, beside their kernel: the
config key and mode that select it, the batch keys it reads when present (``prm_jax.kernels._schema``),
whether it reads turns, the prefix of its diagnostics (the command line's summary lists them under
``credit``) and the names of the value checks it appends. Its record (a frozen dataclass: ``NormConfig``,
``DecoupledNorm``, ``MinFormTransform``, ``ProgressTransform``, ``ShapingConfig``) returns its spec from
``spec``, so the driver runs a plan's stages without asking what they are. Each kind's ``run`` has one
signature, and returns the stage's array and its diagnostics (each key under the declared prefix):

- ``reward_norm``: ``run(stage, checks, rewards [B], batch, real_rows [B], groups_of, grpo_groups)``; the
  batch holds the keys it declared, as given; ``groups_of(norm)`` is the group layout a ``NormConfig`` uses,
  ``grpo_groups`` the batch's GRPO groups (``None`` without any).
- ``process_reward_transform``: ``run(stage, checks, process [B, T], active, turns, batch, outcome [B],
  method)``; ``process`` is on timesteps, 0 where untrained; the batch keys are as given (on positions).
- ``advantage_shaping``: ``run(stage, checks, advantages [B, T], process [B, T], active)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import jax

from prm_jax.kernels._schema import BATCH_SCHEMA

StageKind = Literal["reward_norm", "process_reward_transform", "adv_norm", "advantage_shaping"]


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """A stage's declaration (see the module docstring); ``turns(stage)`` says whether a record reads turns."""

    kind: StageKind
    mode: str
    stage: type
    run: Callable[..., tuple[jax.Array, Mapping[str, jax.Array]]]
    reads: tuple[str, ...] = ()
    diagnostics: str | None = None
    checks: tuple[str, ...] = ()
    turns: Callable[[Any], bool] = lambda stage: False

    def __post_init__(self) -> None:
        unknown = [name for name in self.reads if name not in BATCH_SCHEMA]
        if unknown:
            raise ValueError(f"{self.kind} {self.mode!r}: batch keys {unknown} are not in the batch schema")
        if self.diagnostics is not None and not self.diagnostics.endswith("/"):
            raise ValueError(f"{self.kind} {self.mode!r}: its diagnostics prefix must end with '/', "
                             f"got {self.diagnostics!r}")


class DeclaredStage(Protocol):
    """A stage record that returns its declaration."""

    @property
    def spec(self) -> StageSpec: ...


def declared_batch(spec: StageSpec, batch: Mapping[str, Any]) -> dict[str, Any]:
    """The keys ``spec`` declared that the batch holds: all a stage's ``run`` is given of it."""
    return {key: batch[key] for key in spec.reads if key in batch}
