"""Turns on timesteps: AReaL's turn-id rules, turn segments and sums, turn counts, and turn-level GAE.

A turn of a row is the set of its active timesteps that carry one turn id (the shifted ``turn_ids``);
inactive timesteps carry any id (-1 by convention). ``turn_ids_from_spans`` writes the ids from turn
spans on positions, as the session's concat export does on the host (``prm_jax.runtime._trajectory``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax._validation import integer, integer_dtype
from prm_jax.kernels import _checks
from prm_jax.kernels._alignment import shift_to_next_token
from prm_jax.kernels._estimator_contract import EstimatorSpec
from prm_jax.kernels._recurrence import ScanStrategy, resolve_strategy
from prm_jax.kernels._stage import StageResult
from prm_jax.kernels._token_gae import GAEOutput, _gae_core, _prepare, check_discounts, is_unit_discount
from prm_jax.native import _ffi as ffi


def turn_ids_check(turn_ids: jax.Array, active: jax.Array, steps: TurnSteps,
                   num_turns: int | None = None) -> _checks.ValueCheck:
    """AReaL's turn-id rules on timesteps: every active id ``>= 0`` (and below ``num_turns`` where turns are
    segments of ``[B, K]`` slots), never decreasing along a row's active timesteps (``steps.decreasing``).

    Gaps (ids skipped) are allowed; inactive timesteps carry any id (``-1`` by convention). Where the rule
    breaks is searched for only when it does (``_checks.located``).
    """
    above = jnp.zeros(active.shape, jnp.bool_) if num_turns is None else active & (turn_ids >= num_turns)
    problem = jnp.where(active & (turn_ids < 0), 1, jnp.where(above, 2, jnp.where(steps.decreasing, 3, 0)))
    kinds = {1: "an active timestep must carry a turn id >= 0",
             2: f"an active turn id must be below the number of turn slots {num_turns} (max_turns, default T; "
                "for GiGPO and tree credit the width K of its [B, K] inputs)",
             3: "turn ids must not decrease along a row (the next trained timestep has a lower id)"}
    count = _checks.violations(problem > 0)
    row, step, kind, value = _checks.located(count, lambda: _checks.first_flagged(problem > 0, problem, turn_ids))

    def message(row, step, kind, value):
        return (f"invalid turn_ids: {kinds[int(kind)]}; row {int(row)}, timestep {int(step)} has id {int(value)} "
                "(turn_ids on timesteps, i.e. shifted)")

    return _checks.ValueCheck("turn_ids_invalid", count, message, row, step, kind, value)


def turn_segments(active: jax.Array, turn_ids: jax.Array, num_turns: int) -> tuple[jax.Array, jax.Array]:
    """``in_turn [B, T]`` (active with an id below ``num_turns``) and each timestep's segment ``b * K + id``.

    Timesteps outside any turn go to segment ``B * K``, which segment ops with ``B * K`` segments drop.
    """
    batch = active.shape[0]
    in_turn = active & (turn_ids >= 0) & (turn_ids < num_turns)
    row = lax.broadcasted_iota(jnp.int32, active.shape, 0)
    return in_turn, jnp.where(in_turn, row * num_turns + turn_ids, batch * num_turns)


def turn_sums(x: jax.Array, in_turn: jax.Array, segment: jax.Array, num_turns: int) -> jax.Array:
    """Sums of a ``[B, T]`` timestep array over each turn's timesteps: ``[B, K]``."""
    batch = x.shape[0]
    return jax.ops.segment_sum(jnp.where(in_turn, x, jnp.zeros((), x.dtype)).ravel(), segment.ravel(),
                               num_segments=batch * num_turns).reshape(batch, num_turns)


def turns_present(in_turn: jax.Array, segment: jax.Array, num_turns: int) -> jax.Array:
    """``[B, K]`` bool: the turn slots with at least one timestep in the turn (``turn_segments``' outputs)."""
    return turn_sums(in_turn.astype(jnp.int32), in_turn, segment, num_turns) > 0


def _turn_gae_core(rewards: jax.Array, values: jax.Array, active: jax.Array, turn_ids: jax.Array,
                  gamma: jax.Array, lam: jax.Array, bootstrap: jax.Array, num_turns: int,
                  method: str) -> GAEOutput:
    """Turn-level GAE on validated arrays (ids checked by ``turn_ids_check``); see ``turn_gae``."""
    batch, num_steps = rewards.shape
    dtype = rewards.dtype
    zero = jnp.zeros((), dtype)
    in_turn, segment = turn_segments(active, turn_ids, num_turns)
    turn_rewards = turn_sums(rewards, in_turn, segment, num_turns)
    step_index = lax.broadcasted_iota(jnp.int32, (batch, num_steps), 1)
    first_step = jax.ops.segment_min(jnp.where(in_turn, step_index, num_steps).ravel(), segment.ravel(),
                                     num_segments=batch * num_turns).reshape(batch, num_turns)
    turn_active = first_step < num_steps
    turn_values = jnp.take_along_axis(values, jnp.clip(first_step, 0, num_steps - 1), axis=1)
    turn_values = jnp.where(turn_active, turn_values, zero)
    turn_advantages = _gae_core(turn_rewards, turn_values, turn_active, gamma, lam, bootstrap, method).advantages

    safe_ids = jnp.clip(turn_ids, 0, num_turns - 1)
    token_advantages = jnp.take_along_axis(turn_advantages, safe_ids, axis=1)
    token_returns = token_advantages + jnp.take_along_axis(turn_values, safe_ids, axis=1)
    # Outside every turn: advantage 0 and return V_t (AReaL: A * m, R * m + V * (1 - m)).
    return GAEOutput(jnp.where(in_turn, token_advantages, zero), jnp.where(in_turn, token_returns, values))


@functools.partial(jax.jit, static_argnames=("num_turns", "method", "general"))
def _turn_gae_jit(rewards, values, mask, turn_ids, gamma, lam, bootstrap, *, num_turns, method, general):
    rewards, values, active, bootstrap, dtype = _prepare(rewards, values, mask, lam, bootstrap)
    _checks.check_shape("turn_ids", turn_ids, rewards.shape, "rewards")
    turn_ids = _checks.as_int("turn_ids", turn_ids)
    output = _turn_gae_core(rewards, values, active, turn_ids, jnp.asarray(gamma, dtype), jnp.asarray(lam, dtype),
                           bootstrap, num_turns, method)
    steps = turn_steps(active, turn_ids, general)
    return output, [turn_ids_check(turn_ids, active, steps, num_turns), *_checks.mask_check("mask", mask)]


def turn_gae(rewards: ArrayLike, values: ArrayLike | None, mask: ArrayLike, turn_ids: ArrayLike, *,
             gamma: ArrayLike = 1.0, lam: ArrayLike = 1.0, bootstrap: ArrayLike | None = None,
             num_turns: int | None = None, method: str = "auto") -> GAEOutput:
    """GAE with turns as the time unit (``gae_timestep_unit: turn``).

    Turn ``k`` of a row is the set of active timesteps whose (shifted) ``turn_ids`` equal ``k``. Its reward
    is the sum of ``rewards`` over those timesteps, its value is ``values`` at its first active timestep.
    The token recurrence then runs over turns ``k = K-1 .. 0`` (turns with no active timestep are masked)::

      delta_k = R_k + gamma * V_{k+1} - V_k,   A_k = delta_k + gamma * lam * A_{k+1}

    and each timestep of turn ``k`` gets ``A_k`` and the return ``A_k + V_k``. Timesteps in no turn get
    advantage 0 and return ``V_t`` (AReaL). Turn ids must follow AReaL's rules (``turn_ids_check``):
    active ids in ``[0, num_turns)``, never decreasing along a row; otherwise ``ValueError``.

    Args:
      rewards, values, mask: ``[B, T]`` on timesteps, as for ``gae``.
      turn_ids: ``[B, T]`` int, turn index of each timestep (shifted ``turn_ids``), -1 outside turns.
      gamma, lam, bootstrap, method: as for ``gae``.
      num_turns: static bound on turn ids (ids must be below it). Defaults to ``T``.

    Returns:
      ``GAEOutput(advantages [B, T], returns [B, T])``, float32.

    Example:
        >>> rewards = np.array([[0.0, 0.0, 0.0, 1.0]], np.float32)   # the outcome on the last token
        >>> turn_ids = np.array([[0, 0, 1, 1]])
        >>> out = prm_jax.kernels.turn_gae(rewards, None, np.ones((1, 4), bool), turn_ids, gamma=0.5)
        >>> np.asarray(out.advantages, np.float64).tolist()
        [[0.5, 0.5, 1.0, 1.0]]
    """
    check_discounts(gamma, lam)
    num_turns = np.shape(rewards)[-1] if num_turns is None else int(num_turns)
    if num_turns < 1:
        raise ValueError(f"num_turns must be >= 1, got {num_turns}")
    strategy = resolve_strategy(method, unit_discount=is_unit_discount(gamma, lam))
    return _checks.checked(_turn_gae_jit, rewards, values, mask, turn_ids, gamma, lam, bootstrap,
                           num_turns=num_turns, method=strategy.gae, general=strategy.general)


def first_at_or_after(x: jax.Array, where: jax.Array, method: str) -> jax.Array:
    """``[B, T]``: ``x`` at the first timestep at or after ``t`` where ``where`` holds, 0 where none follows.

    The masked-carry recurrence with a zero discount (GAE with ``gamma = lam = 0`` and no values: a
    marked timestep takes its own ``x``, an unmarked one carries the value from its right), so it is one
    pass of whichever scan ``method`` names (``ScanStrategy.general``; exact: no arithmetic on ``x``).
    """
    zero = jnp.zeros((), x.dtype)
    zeros = jnp.zeros(x.shape[:1], x.dtype)
    return _gae_core(jnp.where(where, x, zero), jnp.zeros_like(x), where, zero, zero, zeros, method).advantages


class TurnSteps(NamedTuple):
    """Where each turn of a row continues and ends, by the turn-id rule (``turn_steps``)."""

    same: jax.Array        # [B, T] bool: the row's next active timestep is in the same turn
    ends: jax.Array        # [B, T] bool: each turn's last active timestep
    holes: jax.Array       # [] bool: some turn has an inactive timestep between two of its active ones
    decreasing: jax.Array  # [B, T] bool: an active turn id above the next active one (AReaL's rule broken)


def turn_steps(active: jax.Array, turn_ids: jax.Array | None, method: str) -> TurnSteps:
    """The turns of each row on timesteps (module docstring), and where they end.

    With ``turn_ids``, a turn is the set of active timesteps that carry one id, so an inactive timestep
    inside a turn (a hole of the loss mask: tunix's pads inside a completion) does not split it: a turn
    continues where the row's next *active* timestep carries the same id (found with one masked fill,
    ``first_at_or_after``; ids are exact in float32 below 2**24). Without them a turn is a run of adjacent
    active timesteps. ``decreasing`` flags AReaL's non-decreasing rule broken at no extra cost.
    """
    adjacent = active & shift_to_next_token(active, fill=False)
    if turn_ids is None:
        none = jnp.zeros(active.shape, jnp.bool_)
        return TurnSteps(adjacent, active & ~adjacent, jnp.zeros((), jnp.bool_), none)
    if method == "native":  # one reverse pass (prm_jax/native/turns_cpu.cc)
        next_id = ffi.next_active_ids(turn_ids, active)
    else:  # (id + 1) of the first active timestep at or after t, 0 where none: shifted, the next active id
        following = first_at_or_after((turn_ids + 1).astype(jnp.float32), active, method)
        next_id = shift_to_next_token(following, fill=0).astype(jnp.int32) - 1
    same = active & (next_id == turn_ids)
    return TurnSteps(same, active & ~same, jnp.any(same & ~adjacent), active & (next_id >= 0) & (next_id < turn_ids))


def _changes(x: jax.Array, steps: TurnSteps, active: jax.Array, method: str) -> tuple[jax.Array, Callable[[], jax.Array]]:
    """Where ``x`` changes to the next timestep of its turn: the adjacent pairs (fused into their consumer),
    and a function giving the pairs across a hole (one more fill: call it only under ``steps.holes``)."""
    adjacent = shift_to_next_token(active, fill=False)

    def differ(a: jax.Array, b: jax.Array) -> jax.Array:
        # NaN next to NaN is no change: a NaN here comes from an overflow upstream (an outcome reward that
        # overflowed in a normalization, read by progress' terminal potential), counted by the outputs'
        # check; calling it a non-uniform turn would blame the wrong input.
        return (a != b) & ~(jnp.isnan(a) & jnp.isnan(b))

    flags = steps.same & adjacent & differ(x, shift_to_next_token(x, fill=0))

    def across_holes() -> jax.Array:
        following = shift_to_next_token(first_at_or_after(x, active, method), fill=0)
        return steps.same & ~adjacent & differ(x, following)

    return flags, across_holes


def changes_within_turns(x: jax.Array, steps: TurnSteps, active: jax.Array, method: str) -> jax.Array:
    """``[B, T]`` bool: ``x`` changes between an active timestep and the next active one of its turn: where a
    per-turn value is not uniform over its turn (holes skipped; one more fill only when a batch has them)."""
    flags, across_holes = _changes(x, steps, active, method)
    return flags | lax.cond(steps.holes, lambda _: across_holes(), lambda _: jnp.zeros(x.shape, jnp.bool_), None)


def any_change_within_turns(x: jax.Array, steps: TurnSteps, active: jax.Array, method: str) -> jax.Array:
    """``changes_within_turns(...).any()``, with nothing of ``[B, T]`` materialized when the batch has no hole."""
    flags, across_holes = _changes(x, steps, active, method)
    return jnp.any(flags) | lax.cond(steps.holes, lambda _: jnp.any(across_holes()), lambda _: jnp.zeros((), jnp.bool_),
                                     None)


def fold_turn_rewards(process: jax.Array, active: jax.Array, turns: TurnSteps,
                      method: str) -> tuple[jax.Array, _checks.ValueCheck]:
    """Folds uniform per-turn rewards into one reward at each turn's last timestep, with a uniformity check
    (the pipeline's ``token_rewards_as_adv=False``).

    A turn is what ``turn_steps`` says (the active timesteps of one turn id, holes of the loss mask
    included; a run of adjacent active timesteps without ``turn_ids``).
    """
    zero = jnp.zeros((), process.dtype)
    uneven = changes_within_turns(process, turns, active, method)
    count = _checks.violations(uneven)
    row, step = _checks.located(count, lambda: _checks.first_flagged(uneven))
    check = _checks.ValueCheck(
        "turn_rewards_not_uniform", count,
        lambda row, step: "token_rewards_as_adv=False folds one reward per turn into GAE, so token_rewards must "
                          f"be uniform over each turn's generated tokens; row {int(row)} changes value at timestep "
                          f"{int(step)}", row, step)
    return jnp.where(turns.ends, process, zero), check


def turn_counts(steps: TurnSteps) -> jax.Array:
    """``[B]`` int32: turns with at least one active timestep (each has exactly one end)."""
    return jnp.sum(steps.ends, axis=1, dtype=jnp.int32)


def turn_ids_from_spans(spans: ArrayLike, width: int) -> jax.Array:
    """Turn ids on positions from turn spans: the ``turn_ids`` that the pipeline and ``score_arrays`` read.

    Args:
      spans: ``[B, K, 2]`` int, ``(start, end)`` of turn ``k``'s generated tokens (end exclusive), turns in
        order and not overlapping; a span with ``end <= start`` (e.g. ``(0, 0)`` for a row with fewer turns)
        names no token.
      width: ``T``, static.

    Returns:
      ``[B, T]`` int32: ``k`` on turn ``k``'s positions, -1 elsewhere (where spans overlap, the later turn).

    Example:
        >>> np.asarray(prm_jax.kernels.turn_ids_from_spans(np.array([[[1, 3], [4, 6]]]), 7)).tolist()
        [[-1, 0, 0, -1, 1, 1, -1]]
    """
    _checks.check_rank("spans", spans, 3)
    if np.shape(spans)[2] != 2:
        raise ValueError(f"spans must be [B, K, 2] (start, end), got shape {np.shape(spans)}")
    integer("width", width, minimum=1)
    if not _checks.is_traced(spans) and not isinstance(spans, jax.Array):
        # Host spans: clipped to [0, width] (exact: no position lies outside) before JAX narrows them to
        # int32, which would wrap a 64-bit span beyond 2**31 onto real positions.
        host = np.asarray(spans)
        integer_dtype("spans", host.dtype)
        spans = np.clip(host, 0, width).astype(np.int32)
    return _spans_jit(spans, width=width)


@functools.partial(jax.jit, static_argnames=("width",))
def _spans_jit(spans, *, width):
    spans = jnp.clip(_checks.as_integer("spans", spans), 0, width).astype(jnp.int32)  # exact, at any width
    position = jnp.arange(width, dtype=jnp.int32)[None, None, :]
    inside = (position >= spans[..., :1]) & (position < spans[..., 1:])               # [B, K, T]
    turn = jnp.arange(spans.shape[1], dtype=jnp.int32)[None, :, None]
    return jnp.max(jnp.where(inside, turn, -1), axis=1, initial=-1)


@dataclasses.dataclass(frozen=True)
class TurnGAE:
    """GAE over turns (``gae_timestep_unit: turn``); the KL rewards are added to the advantages afterwards
    and stay out of the returns (each turn's ``A_k + V_k``, AReaL's rule).

    Example:
        >>> prm_jax.AdvantageConfig(gae_timestep_unit="turn").plan.estimator
        TurnGAE()
    """


def _turn_gae(stage: TurnGAE, rewards: jax.Array, values: jax.Array, active: jax.Array,
              turn_ids: jax.Array, gamma: jax.Array, lam: jax.Array, bootstrap: jax.Array, num_turns: int,
              strategy: ScanStrategy) -> StageResult:
    advantages, returns = _turn_gae_core(rewards, values, active, turn_ids, gamma, lam, bootstrap, num_turns,
                                         strategy.gae)
    return StageResult(advantages, returns=returns)


TURN_GAE = EstimatorSpec(TurnGAE, _turn_gae, "gae_timestep_unit 'turn'", reads=("turn_ids",), needs_turn_ids=True,
                         name="turn_gae", units=("turn",), example={"gae_timestep_unit": "turn", "gae_lambda": 0.9})
