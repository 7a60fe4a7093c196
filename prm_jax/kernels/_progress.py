"""Potential-based "progress" shaping of process scores (Ng, Harada and Russell, "Policy invariance under
reward transformations", 1999): ``process_reward_transform: {mode: progress, gamma, initial, terminal, level}``.

A process score is read as a *state* estimate, the potential of the state a step leaves behind (a PRM's
"how likely is this solution to end right, so far"; how close the agent is to done after the turn), not as
a reward for the step. Each step ``k`` of a row (a turn at ``level: turn``, a trained timestep at
``level: token``) is credited with the change it made::

  F_k = gamma * Phi(s_{k+1}) - Phi(s_k),   Phi(s_{k+1}) = the step's score,   Phi(s_0) = initial

- An unscored step (``batch['token_reward_mask']`` False at the turn's last trained timestep, or at the
  timestep) carries the last potential forward: its own ``Phi(s_{k+1}) = Phi(s_k)``, so at ``gamma = 1`` it
  earns 0 and the next scored step earns the whole change since the last scored one (prime-rl's
  ``turn_credit`` proposal). Without the mask every step is scored.
- The last step's next state is terminal: its potential is 0 (``terminal: zero``, Ng's condition for
  episodic tasks; the outcome reward, on the same timestep, then gives the terminal value, so the last turn
  is credited ``R - Phi(s_{n-1})`` in all), or the row's outcome reward (``terminal: outcome``), so the last
  step's own score is not read.
- Telescoping: at ``gamma = 1`` a row's shaped rewards sum to ``Phi(s_n) - initial`` (``-initial`` under
  ``terminal: zero``): the shaping moves credit between steps and adds nothing a policy could farm.

At ``level: turn`` a turn's score is its process reward at its last trained timestep (as min-form reads
it), and ``F_k`` is given on each of the turn's timesteps (uniform, as a scalar scorer's reward), so the
turn-level estimators, folding and additive shaping read it as any per-turn process reward. At
``level: token`` every trained timestep is a step and takes its own ``F``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

import jax
import jax.numpy as jnp
from jax import lax

from prm_jax._validation import finite_number, one_of
from prm_jax.errors import ConfigError
from prm_jax.kernels import _checks
from prm_jax.kernels._alignment import shift_to_next_token
from prm_jax.kernels._normalization import row_sum_mean
from prm_jax.kernels._recurrence import ScanStrategy
from prm_jax.kernels._stage import StageResult, StageSpec
from prm_jax.kernels._turns import TurnSteps, first_at_or_after

ProgressTerminal = Literal["zero", "outcome"]
ProgressLevel = Literal["turn", "token"]


@dataclasses.dataclass(frozen=True)
class ProgressTransform:
    """``actor.process_reward_transform: {mode: progress, gamma, initial, terminal, level}`` (module
    docstring): each step's process score becomes ``gamma * Phi(next) - Phi(this)``. ``gamma`` is the
    shaping's discount, in ``[0, 1]`` (Ng's invariance holds for the discount the returns use); ``initial``
    is ``Phi(s_0)``, the potential before a row's first step (and carried into leading unscored ones);
    ``terminal`` the potential after the last step, ``"zero"`` or ``"outcome"`` (the row's outcome reward);
    ``level`` says what a step is, ``"turn"`` or ``"token"`` (a trained timestep).

    Args:
        gamma: The shaping's discount, in [0, 1].
        initial: Φ(s_0), the potential before a row's first step.
        terminal: The potential after the last step: ``zero`` or ``outcome`` (the row's outcome reward).
        level: What a step is: ``turn`` or ``token`` (a trained timestep).

    Example:
        >>> config = prm_jax.AdvantageConfig(process_reward_transform={"mode": "progress", "gamma": 0.9})
        >>> config.process_reward_transform.gamma, config.process_reward_transform.terminal
        (0.9, 'zero')
    """

    gamma: float = 1.0
    initial: float = 0.0
    terminal: ProgressTerminal = "zero"
    level: ProgressLevel = "turn"

    def __post_init__(self):
        gamma = finite_number("gamma", self.gamma)
        if not 0.0 <= gamma <= 1.0:
            raise ConfigError("gamma", f"must be in [0, 1], got {gamma!r}")
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "initial", finite_number("initial", self.initial))
        one_of("terminal", self.terminal, get_args(ProgressTerminal), config=True)
        one_of("level", self.level, get_args(ProgressLevel), config=True)

    @property
    def spec(self) -> StageSpec:
        return PROGRESS_TRANSFORM


def _shift_right(x: jax.Array, fill: jax.Array) -> jax.Array:
    """``x`` at ``t - 1`` along the last axis, ``fill`` at ``t = 0``."""
    return jnp.concatenate([jnp.broadcast_to(fill, x.shape[:-1] + (1,)).astype(x.dtype), x[..., :-1]], axis=-1)


def _last_at_or_before(x: jax.Array, where: jax.Array, method: str) -> jax.Array:
    """``[B, T]``: ``x`` at the last timestep at or before ``t`` where ``where`` holds, 0 where none does
    (``first_at_or_after`` on the reversed rows: exact, one scan)."""
    return jnp.flip(first_at_or_after(jnp.flip(x, -1), jnp.flip(where, -1), method), -1)


def progress_rewards(process: jax.Array, steps: jax.Array, scored: jax.Array, outcome: jax.Array,
                     transform: ProgressTransform, method: str) -> jax.Array:
    """The shaped reward ``F`` of each step, at the step's marked timestep (``steps``: each turn's last
    trained timestep, or every trained one), 0 elsewhere.

    ``process`` holds each step's score at its marked timestep; ``scored`` says which marked timesteps hold
    one; ``outcome`` is ``[B]``. The carried potential is a forward fill over the row (exact: no
    arithmetic on the scores), so each marked timestep reads ``Phi`` after its step (``carried``) and
    before it (the carry at the previous timestep); where the fill has found nothing yet, and which step is
    a row's last, are positions against a row's first scored step and its last step (reductions).
    """
    dtype = process.dtype
    zero = jnp.zeros((), dtype)
    initial = jnp.asarray(transform.initial, dtype)
    given = steps & scored
    position = lax.broadcasted_iota(jnp.int32, steps.shape, steps.ndim - 1)
    width = steps.shape[-1]
    first_scored = jnp.min(jnp.where(given, position, width), axis=-1, keepdims=True)
    last_step = jnp.max(jnp.where(steps, position, -1), axis=-1, keepdims=True)
    value = _last_at_or_before(jnp.where(given, process, zero), given, method)
    carried = jnp.where(position >= first_scored, value, initial)    # Phi after the last step at or before t
    before = _shift_right(carried, initial)                           # Phi before the step that ends at t
    terminal = zero if transform.terminal == "zero" else outcome[:, None].astype(dtype)
    after = jnp.where(position < last_step, carried, terminal)        # a row's last step leaves the terminal
    return jnp.where(steps, jnp.asarray(transform.gamma, dtype) * after - before, zero)


def progress_process(transform: ProgressTransform, process: jax.Array, active: jax.Array,
                     turns: TurnSteps | None, batch: dict, outcome: jax.Array,
                     strategy: ScanStrategy) -> StageResult:
    """``process_reward_transform: progress`` on the pipeline's timesteps: ``P`` replaced by the shaped
    rewards, uniform over each turn at ``level: turn`` (a masked fill from the turn's end), per timestep at
    ``level: token``; with its diagnostics. A step is scored where ``batch['token_reward_mask']`` (on
    positions, read on the next token's timestep as the process rewards are) says so; every step without it."""
    zero, method = jnp.zeros((), process.dtype), strategy.general
    scored = active
    if "token_reward_mask" in batch:
        scored = active & shift_to_next_token(_checks.as_mask("batch['token_reward_mask']", batch["token_reward_mask"]),
                                              fill=False)
    if transform.level == "turn":
        assert turns is not None  # the transform declares that it reads turns at level: turn
        steps = turns.ends
        at_ends = progress_rewards(process, steps, scored, outcome, transform, method)
        out = jnp.where(active, first_at_or_after(at_ends, steps, method), zero)
    else:
        steps = active
        out = progress_rewards(process, steps, scored, outcome, transform, method)
    count = jnp.sum(steps, dtype=jnp.int32)
    diagnostics = {"progress/steps": count, "progress/unscored_steps": jnp.sum(steps & ~scored, dtype=jnp.int32),
                   "progress/row_sum_mean": row_sum_mean(out, steps)}
    return StageResult(out, diagnostics)


PROGRESS_TRANSFORM = StageSpec("process_reward_transform", "progress", ProgressTransform, progress_process,
                               reads=("token_reward_mask",), diagnostics="progress/",
                               turns=lambda transform: transform.level == "turn")
