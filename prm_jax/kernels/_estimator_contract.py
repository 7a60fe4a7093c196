"""The estimator contract: what a credit estimator declares, and what it is given.

An estimator replaces steps 6-7 of ``compute_advantages`` (GAE, or a credit-assignment mode). It lives
beside its kernel and declares itself with an ``EstimatorSpec``: the plan record that selects it (its
fields are the config keys of ``credit_assignment: {mode: <mode>, ...}``), the batch keys it reads (from
``prm_jax.kernels._schema``), whether it needs turn ids, the prefix of its diagnostics (the command line's
summary prints them), and where the KL rewards go. It is run as every stage is (``prm_jax.kernels._stage``):
``run(stage, **inputs)`` receives exactly the inputs its signature names (``INPUTS``) and returns a
``StageResult``: its advantages as ``value`` (the KL rewards not added under ``kl="after"``), its
diagnostics, its value checks (``ValueCheck``: a violation count computed on the device,
``violations(flags)``, and the message built on the host from its details) and, where it forms them, its
own returns. One registry line (``prm_jax.kernels._estimator_registry``) makes it known to the config, the
pipeline, the command line's packing and its report.

The shared epilogue (``finish``) then forms what every estimator returns the same way: with ``kl="after"``
the KL rewards are added to the advantages (with ``kl="rewards"`` they were in the rewards the estimator
read); the returns are ``advantages + values``, unless the estimator forms its own (turn-level GAE: each
turn's ``A_k + V_k``, the KL rewards left out, AReaL's rule and the one difference there is).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from prm_jax.kernels._checks import ValueCheck, violations
from prm_jax.kernels._normalization import row_groups
from prm_jax.kernels._schema import BATCH_SCHEMA
from prm_jax.kernels._stage import INPUTS, StageResult, run_inputs

__all__ = ["INPUTS", "EstimatorSpec", "SummaryHook", "ValueCheck", "finish", "on_turn_timesteps", "row_groups",
           "violations"]


class SummaryHook(NamedTuple):
    """How the command line's summary shows an estimator's diagnostics when not as plain numbers under
    ``credit``: ``summary[key] = stats(diagnostics)``, printed as ``line(stats)``.

    Attributes:
        key: The summary's key its statistics go under.
        stats: ``stats(diagnostics) -> {name: value}``: the statistics from the estimator's diagnostics.
        line: ``line(stats) -> str``: the summary's line.

    Example:
        >>> hooks = [(spec.mode, spec.summary.key) for spec in prm_jax.estimators.registered() if spec.summary is not None]
        >>> hooks[:2]
        [('gigpo', 'gigpo_step_groups')]
    """

    key: str
    stats: Callable[[Mapping[str, Any]], dict[str, float]]
    line: Callable[[Mapping[str, float]], str]


class EstimatorStage(Protocol):
    """An estimator's record: a frozen dataclass (``TokenGAE``, ``TurnGAE``, ``GiGPOConfig``, ``TreeCredit``,
    ``PureCredit``, ``PrimeCredit`` or a registered one) whose class an ``EstimatorSpec`` names (``stage``).

    Example:
        >>> stage = prm_jax.AdvantageConfig(credit_assignment={"mode": "tree"}).plan.estimator
        >>> isinstance(stage, prm_jax.config.TreeCredit), prm_jax.estimators.estimator_for(stage).label
        (True, "credit_assignment 'tree'")
    """

    __dataclass_fields__: ClassVar[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class EstimatorSpec:
    """An estimator's declaration (see the module docstring).

    ``label`` names it in errors (``"credit_assignment 'tree'"``); ``mode`` is its
    ``credit_assignment.mode`` (``None``: the built-in GAE, chosen by ``gae_timestep_unit``); ``reads``
    are the batch keys it needs and ``may_read`` those it reads when present; ``needs_turn_ids`` also
    makes the pipeline check them (and their turn slots, ``turn_slots(batch, num_turns)``, when turns
    index ``[B, K]`` inputs); ``owns_process_rewards``: it consumes the process rewards itself, so they
    are neither folded into the rewards nor used for shaping; ``missing_hint`` is added to the error for
    a missing key it reads; ``summary`` shows its diagnostics its own way (else the summary lists them
    under ``credit``).

    Args:
        stage: The plan record that selects the estimator; its fields are the ``credit_assignment`` keys.
        run: The estimator, ``run(stage, **inputs) -> StageResult``, its inputs named from ``INPUTS``.
        label: How errors name it (``"credit_assignment 'tree'"``).
        mode: Its ``credit_assignment.mode``; ``None``: the built-in GAE, chosen by ``gae_timestep_unit``.
        reads: The batch keys it needs (``BATCH_SCHEMA``'s).
        may_read: The batch keys it reads when present.
        needs_turn_ids: Whether the pipeline checks the turn ids (and their turn slots) for it.
        kl: Where the KL rewards go: ``rewards`` (into the rewards it reads) or ``after`` (added to its advantages).
        diagnostics: The prefix of its diagnostics' keys, ending in ``/``; ``None``: it has none.
        turn_slots: ``turn_slots(batch, num_turns)``: the turn slots ``K`` its ``[B, K]`` inputs index; ``None``:
            none.
        owns_process_rewards: Whether it consumes the process rewards itself (neither folded nor used for shaping).
        missing_hint: Added to the error for a missing key it reads.
        summary: How the command line's summary shows its diagnostics (``SummaryHook``); ``None``: as numbers under
            ``credit``.
        units: The ``gae_timestep_unit`` values it runs under; one it lacks is refused at configuration.
        refused_with: Other settings it is refused with: ``(key, values, why)`` each, declared here and rendered in
            the guide's refusal table.
        example: A configuration of it the option matrix runs (its record's fields).
        name: Its name (default: its ``mode``; one without a mode must give it).

    Example:
        >>> spec = prm_jax.estimators.estimator_for(prm_jax.config.GiGPOConfig())
        >>> spec.mode, spec.reads, spec.needs_turn_ids, spec.kl
        ('gigpo', ('turn_ids',), True, 'after')
    """

    stage: type
    run: Callable[..., StageResult]
    label: str
    mode: str | None = None
    reads: tuple[str, ...] = ()
    may_read: tuple[str, ...] = ()
    needs_turn_ids: bool = False
    kl: Literal["rewards", "after"] = "after"
    diagnostics: str | None = None
    turn_slots: Callable[[Mapping[str, Any], int], int] | None = None
    owns_process_rewards: bool = False
    missing_hint: str = ""
    summary: SummaryHook | None = None
    units: tuple[str, ...] = ("token", "turn")
    refused_with: tuple[tuple[str, tuple[Any, ...], str], ...] = ()
    example: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            if self.mode is None:
                raise ValueError(f"estimator {self.label}: one without a credit_assignment mode needs a name")
            object.__setattr__(self, "name", self.mode)
        unknown = [name for name in (*self.reads, *self.may_read) if name not in BATCH_SCHEMA]
        if unknown:
            raise ValueError(f"estimator {self.label}: batch keys {unknown} are not in the batch schema")
        run_inputs(self.run, f"estimator {self.label}")
        if self.diagnostics is not None and not self.diagnostics.endswith("/"):
            raise ValueError(f"estimator {self.label}: its diagnostics prefix must end with '/', "
                             f"got {self.diagnostics!r}")

    @property
    def inputs(self) -> tuple[str, ...]:
        """The inputs ``run`` receives: the names of its signature after the record (``INPUTS``)."""
        return run_inputs(self.run, f"estimator {self.label}")

    @property
    def reads_turns(self) -> bool:
        return self.needs_turn_ids or "turns" in self.inputs

    @property
    def batch_keys(self) -> tuple[str, ...]:
        return (*self.reads, *self.may_read)


def finish(spec: EstimatorSpec, estimate: StageResult, kl: jax.Array,
           values: jax.Array) -> tuple[jax.Array, jax.Array, Mapping[str, jax.Array]]:
    """The shared epilogue: ``(advantages, returns, diagnostics)`` of every estimator."""
    advantages = estimate.value if spec.kl == "rewards" else estimate.value + kl
    returns = advantages + values if estimate.returns is None else estimate.returns
    return advantages, returns, estimate.diagnostics


def on_turn_timesteps(per_turn: jax.Array, in_turn: jax.Array, turn_ids: jax.Array) -> jax.Array:
    """``[B, K]`` per-turn values on each turn's active timesteps, 0 elsewhere.

    Args:
        per_turn: ``[B, K]`` one value per turn slot.
        in_turn: ``[B, T]`` bool: the active timesteps of a turn.

    Example:
        >>> turn_ids = np.array([[-1, 0, 0, 1]])
        >>> values = prm_jax.estimators.on_turn_timesteps(np.array([[0.5, 2.0]], np.float32), turn_ids >= 0, turn_ids)
        >>> np.asarray(values).tolist()
        [[0.0, 0.5, 0.5, 2.0]]
    """
    safe = jnp.clip(turn_ids, 0, per_turn.shape[1] - 1)
    return jnp.where(in_turn, jnp.take_along_axis(per_turn, safe, axis=1), jnp.zeros((), per_turn.dtype))
