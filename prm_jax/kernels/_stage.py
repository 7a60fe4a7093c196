"""The one contract of every stage of ``compute_advantages``: the named inputs a stage may ask for, the record
it returns, and how the driver runs it.

Each configurable stage declares itself beside its kernel: an estimator with an ``EstimatorSpec``
(``prm_jax.kernels._estimator_contract``: steps 6-7), every other kind with a ``StageSpec`` (the config
key and mode that select it, the batch keys it reads when present, whether it reads turns, the prefix of its
diagnostics and the names of its value checks). Its record (a frozen dataclass: ``NormConfig``,
``DecoupledNorm``, ``MinFormTransform``, ``ProgressTransform``, ``ShapingConfig``) returns its spec from
``spec`` (``adv_norm``'s slot names its own: its record is a ``NormConfig`` too), so the driver runs a plan's
stages without asking what they are.

Every kind is called the same way, ``run(stage, **inputs)``: after the record, the names of its signature are
inputs of ``INPUTS``, and it receives exactly those, as the steps before it left them (``batch``: the keys it
declared, as given). It returns a ``StageResult``: its value (the outcome rewards ``[B]`` of a
``reward_norm``, the process rewards ``[B, T]`` of a ``process_reward_transform``, the advantages ``[B, T]``
of an estimator, ``adv_norm`` or ``advantage_shaping``), its diagnostics (each key under its declared prefix)
and its value checks (``ValueCheck``: a violation count computed on the device, the message built on the
host); an estimator may add its own returns. ``run_stage`` is the driver's one call of any of them.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, Protocol

import jax

from prm_jax.kernels._checks import ValueCheck
from prm_jax.kernels._schema import BATCH_SCHEMA

StageKind = Literal["reward_norm", "process_reward_transform", "adv_norm", "advantage_shaping"]

#: What a stage may name in its run function's signature (after its record), each as the steps before the
#: stage left it: the one table of every stage kind's inputs.
INPUTS: Mapping[str, str] = MappingProxyType({
    "batch": "the batch keys it declared (reads and may_read), as given",
    "rewards": "[B, T] task rewards on timesteps: the outcome reward (+ folded turn rewards), plus the KL "
               "rewards with kl='rewards' (steps 6-7)",
    "outcome": "[B] outcome rewards: transformed (step 1), 0 on truncated rows under mask_no_eos_with_zero "
               "(from step 5)",
    "process": "[B, T] process rewards P on timesteps, 0 where untrained (None without token_rewards)",
    "advantages": "[B, T] advantages on timesteps (steps 8-9: after the estimator, after adv_norm)",
    "active": "[B, T] bool: the trained timesteps (the shifted loss mask)",
    "logprobs": "[B, T] the old policy's log-probs on timesteps (prox_logprobs when given, else the shifted "
                "behaviour log-probs), 0 where untrained",
    "values": "[B, T] values (0 without a critic)",
    "turn_ids": "[B, T] int32 turn ids on timesteps (-1 in the last column), None without them",
    "ref_logprobs": "[B, T] reference log-probs, 0 where untrained (None without them)",
    "bootstrap": "[B] V[seqlen - 1] on truncated rows, else 0",
    "lam": "λ: a scalar or [B]",
    "gamma": "the discount, a scalar",
    "real_rows": "[B] bool: rows with any attention",
    "groups_of": "a function of a NormConfig: the group layout its levels ask for (None: the whole batch)",
    "grpo_groups": "the batch's GRPO group layout (group_sizes or group_ids), None without groups",
    "row_group": "[B] int32: each row's GRPO group (0 for all without groups)",
    "num_groups": "the number of groups (static)",
    "num_turns": "the configured bound on turns per row (max_turns, else T; static)",
    "strategy": "the resolved ScanStrategy (static): pass its methods to every scan",
    "outcome_at": "[B, T] bool: the timestep the outcome reward goes to",
    "turns": "TurnSteps: where turns continue and end",
    "dtype": "the float dtype of the computation",
})


class StageResult(NamedTuple):
    """What every stage returns: its ``value`` (see the module docstring), its ``diagnostics`` (each key under
    its declared prefix) and its value ``checks``; an estimator's own ``returns``, or ``None`` (the epilogue
    forms ``advantages + values``).

    Attributes:
        value: The stage's value: the outcome rewards, the process rewards or the advantages, by its kind.
        returns: An estimator's own returns ``[B, T]``; ``None``: the epilogue forms ``advantages + values``.

    Example:
        >>> result = prm_jax.estimators.StageResult(np.zeros((1, 3), np.float32))
        >>> result.value.shape, dict(result.diagnostics), result.checks, result.returns
        ((1, 3), {}, (), None)
    """

    value: jax.Array
    diagnostics: Mapping[str, jax.Array] = {}
    checks: tuple[ValueCheck, ...] = ()
    returns: jax.Array | None = None


def run_inputs(run: Callable[..., Any], who: str) -> tuple[str, ...]:
    """The inputs a stage's ``run`` names (its signature after the record), each checked against ``INPUTS``."""
    names = tuple(inspect.signature(run).parameters)[1:]
    strange = [name for name in names if name not in INPUTS]
    if strange:
        raise ValueError(f"{who}: run() names inputs {strange}; it may name {list(INPUTS)}")
    return names


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """A stage's declaration (see the module docstring); ``turns(stage)`` says whether a record reads turns.

    Args:
        kind: The stage's kind, its config key: ``reward_norm``, ``process_reward_transform``, ``adv_norm`` or
            ``advantage_shaping`` (an estimator is declared by ``EstimatorSpec``).
        mode: The mode that selects it in its config key (``gvpo``, ``min_form``, ...).
        stage: The record that configures it.
        run: The stage, ``run(stage, **inputs) -> StageResult``, its inputs named from ``INPUTS``.
        reads: The batch keys it needs.
        diagnostics: The prefix of its diagnostics' keys, ending in ``/``; ``None``: it has none.
        checks: The names of the value checks it may report.
        turns: ``turns(stage)``: whether a record of it reads turns.

    Example:
        >>> spec, stage = prm_jax.AdvantageConfig(advantage_shaping={"mode": "gvpo"}).plan.stages_of("advantage_shaping")[0]
        >>> spec.kind, spec.mode, spec.inputs
        ('advantage_shaping', 'gvpo', ('advantages', 'process', 'active'))
    """

    kind: StageKind
    mode: str
    stage: type
    run: Callable[..., StageResult]
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
        run_inputs(self.run, f"{self.kind} {self.mode!r}")

    @property
    def inputs(self) -> tuple[str, ...]:
        """The inputs ``run`` receives: the names of its signature after the record."""
        return run_inputs(self.run, f"{self.kind} {self.mode!r}")

    @property
    def batch_keys(self) -> tuple[str, ...]:
        return self.reads


class DeclaredStage(Protocol):
    """A stage record that returns its declaration."""

    @property
    def spec(self) -> StageSpec: ...


class Declared(Protocol):
    """What ``run_stage`` reads of any declaration (a ``StageSpec`` or an ``EstimatorSpec``)."""

    @property
    def run(self) -> Callable[..., StageResult]: ...

    @property
    def inputs(self) -> tuple[str, ...]: ...

    @property
    def batch_keys(self) -> tuple[str, ...]: ...


def run_stage(spec: Declared, stage: Any, available: Mapping[str, Callable[[], Any]],
              batch: Mapping[str, Any]) -> StageResult:
    """``spec.run(stage, **inputs)`` with exactly the inputs it names, each taken from ``available`` (a thunk a
    name, as the steps so far left it; ``batch``: the keys the stage declared that the batch holds)."""
    inputs = {name: {key: batch[key] for key in spec.batch_keys if key in batch} if name == "batch"
              else available[name]() for name in spec.inputs}
    return spec.run(stage, **inputs)
