"""The unbiased per-turn baseline under variable turn counts (``credit_assignment: {mode: turn_rloo}``, issue 59).

verl's RFC #7244 (verl-project/verl, "Per-turn reward support for multi-turn RL") found that the natural
per-turn form, each turn's reward less the group's mean reward at that turn index, summed over the row's own
remaining turns (MT-GRPO's per-turn-index normalization), is biased when the policy decides when to stop: the
baseline subtracted at turn ``k`` has one term per turn the row goes on to take, so it depends on the row's own
later actions (the bias is the group's accumulated intermediate reward, a hidden cost on every "take another
turn"). The form here takes the baseline of the return instead:

- each turn's reward ``r_ik`` is the sum of the task rewards on its trained timesteps (the outcome reward on
  the last one, each turn's folded process reward, the KL rewards);
- its return ``G_ik = r_ik + gamma * G_i,next`` runs over the row's turns (turn ids; a turn id the row skips
  passes the return on undiscounted, as a masked timestep does in GAE);
- its baseline ``b_ik`` is the mean of ``G_jk`` over the *other* rows ``j`` of the group that have a turn
  ``k`` (leave-one-out: nothing of row ``i`` enters it, so it cannot depend on row ``i``'s actions); a turn
  no other row of its group reaches has no baseline (``b = 0``, the plain return: unbiased, and counted in
  ``turn_rloo/turns_without_baseline``);
- every trained timestep of turn ``k`` gets ``A = G_ik - b_ik``; the returns are ``G_ik``; timesteps outside
  every turn get 0.

The auditor (``prm_jax.audit``) proves it: on its ``variable_turns`` problem the expected gradient equals the
exact one, where the per-turn-index form is off by the closed form the RFC gives.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from prm_jax.kernels._estimator_contract import EstimatorSpec, on_turn_timesteps
from prm_jax.kernels._normalization import leave_one_out_mean
from prm_jax.kernels._recurrence import ScanStrategy
from prm_jax.kernels._stage import StageResult
from prm_jax.kernels._token_gae import masked_return
from prm_jax.kernels._turns import turn_segments, turn_sums, turns_present

#: How a per-turn baseline is formed: ``return``, of each turn's return (``turn_rloo``, unbiased), or
#: ``per_index``, of each turn's reward summed over the row's own remaining turns (#7244's biased form, which
#: only the auditor runs).
TurnBaselineForm = Literal["return", "per_index"]


@dataclasses.dataclass(frozen=True)
class TurnRLOOCredit:
    """``credit_assignment: {mode: turn_rloo}`` (no settings; the return's discount is ``discount``).

    Example:
        >>> prm_jax.AdvantageConfig(credit_assignment={"mode": "turn_rloo"}).plan.estimator
        TurnRLOOCredit()
    """


def turn_baselines(rewards: jax.Array, active: jax.Array, turn_ids: jax.Array, gamma: jax.Array,
                   real_rows: jax.Array, row_group: jax.Array, num_groups: int, num_turns: int, method: str,
                   form: TurnBaselineForm = "return") -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(advantages [B, T], returns [B, T], turns without a baseline [])`` of a per-turn leave-one-out baseline
    (module docstring), on validated arrays."""
    dtype = rewards.dtype
    zero = jnp.zeros((), dtype)
    in_turn, segment = turn_segments(active, turn_ids, num_turns)
    per_turn = turn_sums(rewards, in_turn, segment, num_turns)                                   # [B, K]
    present = turns_present(in_turn, segment, num_turns)
    returns = masked_return(per_turn, present, gamma, method)
    members = present & real_rows[:, None]
    baseline_of = jax.vmap(lambda x, m: leave_one_out_mean(x, m, row_group, num_groups), in_axes=1, out_axes=1)
    if form == "return":
        baseline, alone = baseline_of(returns, members)
        advantages = jnp.where(present, returns - baseline, zero)
    else:  # #7244's form: each later turn's own baseline, summed over the turns the row goes on to take
        baseline, alone = baseline_of(per_turn, members)
        advantages = masked_return(per_turn - baseline, present, gamma, method)
    without = jnp.sum(alone & members, dtype=jnp.int32)
    return (on_turn_timesteps(advantages, in_turn, turn_ids), on_turn_timesteps(returns, in_turn, turn_ids),
            without)


def _run(stage: TurnRLOOCredit, rewards: jax.Array, active: jax.Array, turn_ids: jax.Array, gamma: jax.Array,
         real_rows: jax.Array, row_group: jax.Array, num_groups: int, num_turns: int,
         strategy: ScanStrategy) -> StageResult:
    advantages, returns, without = turn_baselines(rewards, active, turn_ids, gamma, real_rows, row_group,
                                                  num_groups, num_turns, strategy.gae)
    return StageResult(advantages, {"turn_rloo/turns_without_baseline": without}, returns=returns)


TURN_RLOO = EstimatorSpec(
    TurnRLOOCredit, _run, "credit_assignment 'turn_rloo'", mode="turn_rloo", reads=("turn_ids",),
    needs_turn_ids=True, kl="rewards", diagnostics="turn_rloo/", units=("token",),
    missing_hint="turn_rloo forms one baseline per turn id (the session export writes turn_ids)",
    example={"credit_assignment": {"mode": "turn_rloo"}, "discount": 0.9})
