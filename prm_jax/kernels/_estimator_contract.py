"""The estimator contract: what a credit estimator declares, and what it is given.

An estimator replaces steps 6-7 of ``compute_advantages`` (GAE, or a credit-assignment mode). It lives
beside its kernel and declares itself with an ``EstimatorSpec``: the plan record that selects it (its
fields are the config keys of ``credit_assignment: {mode: <mode>, ...}``), the batch keys it reads (from
``prm_jax.kernels._schema``), whether it needs turn ids, the prefix of its diagnostics (the command line's
summary prints them), and where the KL rewards go. Its ``run(stage, checks, **inputs)`` receives exactly
the inputs its signature names (``INPUTS``), appends its value checks to ``checks`` (``ValueCheck``: a
violation count computed on the device, ``violations(flags)``, and the message built on the host from its
details), and returns an ``Estimate``. One registry line (``prm_jax.kernels._estimator_registry``) makes it
known to the config, the pipeline, the command line's packing and its report.

The shared epilogue (``finish``) then forms what every estimator returns the same way: with ``kl="after"``
the KL rewards are added to the advantages (with ``kl="rewards"`` they were in the rewards the estimator
read); the returns are ``advantages + values``, unless the estimator forms its own (turn-level GAE: each
turn's ``A_k + V_k``, the KL rewards left out, AReaL's rule and the one difference there is).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Literal, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from prm_jax.kernels._checks import ValueCheck, violations
from prm_jax.kernels._normalization import row_groups
from prm_jax.kernels._schema import BATCH_SCHEMA

#: What an estimator may name in its run function's signature (besides ``stage`` and ``checks``).
INPUTS: Mapping[str, str] = MappingProxyType({
    "batch": "the batch keys it declared (reads and may_read), as given",
    "rewards": "[B, T] task rewards on timesteps: the outcome reward (+ folded turn rewards), plus the KL "
               "rewards with kl='rewards'",
    "outcome": "[B] transformed outcome rewards (0 on truncated rows under mask_no_eos_with_zero)",
    "process": "[B, T] process rewards P on timesteps, 0 where untrained (None without token_rewards)",
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
    "row_group": "[B] int32: each row's GRPO group (0 for all without groups)",
    "num_groups": "the number of groups (static)",
    "num_turns": "the configured bound on turns per row (max_turns, else T; static)",
    "strategy": "the resolved ScanStrategy (static): pass its methods to every scan",
    "outcome_at": "[B, T] bool: the timestep the outcome reward goes to",
    "turns": "TurnSteps: where turns continue and end",
    "dtype": "the float dtype of the computation",
})


__all__ = ["INPUTS", "Estimate", "EstimatorSpec", "SummaryHook", "ValueCheck", "finish", "on_turn_timesteps",
           "row_groups", "violations"]


class Estimate(NamedTuple):
    """What an estimator returns: advantages on timesteps (the KL rewards not added under ``kl='after'``),
    its own returns or ``None`` (the epilogue forms ``advantages + values``), and its diagnostics (each key
    under the declared prefix, or ``checks``' counts)."""

    advantages: jax.Array
    returns: jax.Array | None = None
    diagnostics: Mapping[str, jax.Array] = {}


class SummaryHook(NamedTuple):
    """How the command line's summary shows an estimator's diagnostics when not as plain numbers under
    ``credit``: ``summary[key] = stats(diagnostics)``, printed as ``line(stats)``."""

    key: str
    stats: Callable[[Mapping[str, Any]], dict[str, float]]
    line: Callable[[Mapping[str, float]], str]



class EstimatorStage(Protocol):
    """An estimator's record: a frozen dataclass (``TokenGAE``, ``TurnGAE``, ``GiGPOConfig``, ``TreeCredit``,
    ``PureCredit``, ``PrimeCredit`` or a registered one) whose class an ``EstimatorSpec`` names (``stage``)."""

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
    """

    stage: type
    run: Callable[..., Estimate]
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
        strange = [name for name in self.inputs if name not in INPUTS]
        if strange:
            raise ValueError(f"estimator {self.label}: run() names inputs {strange}; it may name {list(INPUTS)}")
        if self.diagnostics is not None and not self.diagnostics.endswith("/"):
            raise ValueError(f"estimator {self.label}: its diagnostics prefix must end with '/', "
                             f"got {self.diagnostics!r}")

    @property
    def inputs(self) -> tuple[str, ...]:
        """The inputs ``run`` receives: the names of its signature after ``stage`` and ``checks``."""
        return tuple(inspect.signature(self.run).parameters)[2:]

    @property
    def reads_turns(self) -> bool:
        return self.needs_turn_ids or "turns" in self.inputs

    @property
    def batch_keys(self) -> tuple[str, ...]:
        return (*self.reads, *self.may_read)


def finish(spec: EstimatorSpec, estimate: Estimate, kl: jax.Array,
           values: jax.Array) -> tuple[jax.Array, jax.Array, Mapping[str, jax.Array]]:
    """The shared epilogue: ``(advantages, returns, diagnostics)`` of every estimator."""
    advantages = estimate.advantages if spec.kl == "rewards" else estimate.advantages + kl
    returns = advantages + values if estimate.returns is None else estimate.returns
    return advantages, returns, estimate.diagnostics


def on_turn_timesteps(per_turn: jax.Array, in_turn: jax.Array, turn_ids: jax.Array) -> jax.Array:
    """``[B, K]`` per-turn values on each turn's active timesteps, 0 elsewhere."""
    safe = jnp.clip(turn_ids, 0, per_turn.shape[1] - 1)
    return jnp.where(in_turn, jnp.take_along_axis(per_turn, safe, axis=1), jnp.zeros((), per_turn.dtype))
