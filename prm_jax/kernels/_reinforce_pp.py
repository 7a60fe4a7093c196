"""REINFORCE++ and REINFORCE++-baseline (Hu, arXiv 2501.03262; verl's ``compute_reinforce_plus_plus_outcome
_advantage`` after its fix #7300, and ``..._baseline_outcome_advantage``; verl's REINFORCE++ after its fix #7300
(verl-project/verl @ 1dda039b, core_algos.py compute_reinforce_plus_plus_outcome_advantage; arXiv 2501.03262); prm-jax's rules
where verl's break (the credit-assignment guide states each)).

REINFORCE++: the discounted return over generated tokens, carried unchanged across masked spans (a tool's
output): at a trained timestep ``G_t = r_t + gamma * c`` and ``c <- G_t``; at a masked one the output is 0 and
``c`` passes unchanged, so a hole costs no discount and a reward written on it is ignored (the rule before
#7300 cut the return at every hole). Then ``A = whiten(G)`` over every trained timestep of the batch (verl's
``masked_whiten``: unbiased variance, ``(G - mean) / sqrt(var + 1e-8)``), and the returns are ``G``.

REINFORCE++-baseline: each row's score is the sum of its rewards on trained timesteps; the mean score of its
GRPO group (every real row of it, rows without trained timesteps too, as verl counts them) is subtracted
(a group of one subtracts 0: its raw score), the result is given to every trained timestep of the row and
whitened over the batch; the returns are the advantages. ``gamma`` is unused.

Degenerate batches (fewer than two trained timesteps: verl raises) give advantages 0, counted under
``reinforce_pp/degenerate``. In ``compute_advantages`` the rewards are the task rewards on timesteps (the
outcome reward, folded turn rewards with ``token_rewards_as_adv: false``, and the KL rewards), the discount
the config's ``discount``; with ``token_rewards_as_adv: true`` the shaping applies after, as after GAE.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from prm_jax._validation import boolean, finite_number
from prm_jax.kernels import _checks
from prm_jax.kernels._estimator_contract import EstimatorSpec
from prm_jax.kernels._normalization import given_groups, whiten
from prm_jax.kernels._recurrence import GAEMethod, ScanStrategy, resolve_strategy
from prm_jax.kernels._stage import StageResult
from prm_jax.kernels._token_gae import masked_return


@dataclasses.dataclass(frozen=True)
class ReinforcePPCredit:
    """``actor.credit_assignment: {mode: reinforce_pp}`` (no settings: the discount is ``actor.discount``).

    Example:
        >>> prm_jax.AdvantageConfig(credit_assignment={"mode": "reinforce_pp"}, discount=0.99).plan.discount
        0.99
    """


@dataclasses.dataclass(frozen=True)
class ReinforcePPBaselineCredit:
    """``actor.credit_assignment: {mode: reinforce_pp_baseline}`` (no settings).

    Example:
        >>> prm_jax.AdvantageConfig(credit_assignment={"mode": "reinforce_pp_baseline"}).credit_assignment
        ReinforcePPBaselineCredit()
    """


class ReinforcePPOutput(NamedTuple):
    """``advantages`` and ``returns`` ``[B, T]`` (0 where untrained); ``degenerate``: 1 when fewer than two
    timesteps train (the advantages are then 0), else 0.

    Attributes:
        returns: ``[B, T]`` the discounted returns (0 where untrained).
        degenerate: 1 when fewer than two timesteps train (the advantages are then 0), else 0.

    Example:
        >>> out = prm_jax.credit.reinforce_pp(np.array([[0, 0, 1.0]]), np.array([[1, 1, 1]], bool), gamma=1.0)
        >>> np.asarray(out.returns, np.float64).tolist(), int(out.degenerate)
        ([[1.0, 1.0, 1.0]], 0)
    """

    advantages: jax.Array
    returns: jax.Array
    degenerate: jax.Array


def _reinforce_pp_core(rewards: jax.Array, active: jax.Array, gamma: jax.Array, baseline: bool,
                       real_rows: jax.Array, row_group: jax.Array, num_groups: int, method: str) -> ReinforcePPOutput:
    """REINFORCE++ (``baseline`` False) or its baseline variant on validated arrays (module docstring)."""
    zero = jnp.zeros((), rewards.dtype)
    rewards = jnp.where(active, rewards, zero)  # (a reward on an untrained timestep is never read)
    if baseline:
        score = jnp.where(real_rows, jnp.sum(rewards, axis=1), zero)
        members = jax.ops.segment_sum(real_rows.astype(rewards.dtype), row_group, num_segments=num_groups)
        totals = jax.ops.segment_sum(score, row_group, num_segments=num_groups)
        mean = jnp.where(members > 1, totals / jnp.maximum(members, 1), zero)[row_group]
        returns = jnp.where(active, (score - mean)[:, None], zero)
    else:  # the masked-carry return (its rule at a hole is #7300's)
        returns = masked_return(rewards, active, gamma, method)
    advantages = whiten(returns, active)  # fewer than two trained timesteps: 0 (centred values, variance 0)
    degenerate = (jnp.sum(active, dtype=jnp.int32) < 2).astype(jnp.int32)
    return ReinforcePPOutput(advantages, advantages if baseline else returns, degenerate)


def reinforce_pp(token_rewards: ArrayLike, mask: ArrayLike, *, gamma: float = 1.0, baseline: bool = False,
                 group_sizes: ArrayLike | None = None, group_ids: ArrayLike | None = None,
                 method: GAEMethod = "auto") -> ReinforcePPOutput:
    """REINFORCE++ advantages of token rewards (module docstring), as verl computes them after #7300.

    Args:
      token_rewards: ``[B, T]`` float, each token's reward (the outcome on a row's last token); values where
        ``mask`` is False are ignored.
      mask: ``[B, T]`` bool or 0/1, the trained tokens (holes: tool outputs).
      gamma: the discount over trained tokens, in ``[0, 1]`` (REINFORCE++ only).
      baseline: REINFORCE++-baseline: each row's reward sum minus its group's mean score.
      group_sizes: ``[G]`` consecutive groups for ``baseline`` (or ``group_ids [B]``); neither: one group.
      group_ids: ``[B]`` each row's group id, for ``baseline`` (rows of one id form a group); ``None``:
        ``group_sizes``, or one group.
      method: the scan (``prm_jax.kernels.gae``'s methods).

    Returns:
      ``ReinforcePPOutput``: float32 (float64 for float64 rewards).

    Raises:
      ValueError: bad shapes or settings, or (eagerly) a non-finite reward on a trained token.

    The worked example of verl's issue #7278 (a tool's output at tokens 2-3):

    >>> out = prm_jax.credit.reinforce_pp(np.array([[0, 0, 0, 0, 0, 1.0]]),
    ...                                   np.array([[1, 1, 0, 0, 1, 1]], bool), gamma=0.9)
    >>> [round(float(g), 3) for g in out.returns[0]]
    [0.729, 0.81, 0.0, 0.0, 0.9, 1.0]
    """
    gamma = finite_number("gamma", gamma, minimum=0.0, maximum=1.0)
    boolean("baseline", baseline, config=False)
    _checks.check_rank("token_rewards", token_rewards, 2)
    _checks.check_shape("mask", mask, np.shape(token_rewards), "token_rewards")
    strategy = resolve_strategy(method, unit_discount=gamma == 1.0)
    return _checks.checked(_reinforce_pp_jit, token_rewards, mask, group_sizes, group_ids, gamma=gamma,
                           baseline=baseline, strategy=strategy)


@functools.partial(jax.jit, static_argnames=("gamma", "baseline", "strategy"))
def _reinforce_pp_jit(token_rewards, mask, group_sizes, group_ids, *, gamma, baseline, strategy: ScanStrategy):
    dtype = _checks.accumulation_dtype(token_rewards)
    rewards = _checks.as_float("token_rewards", token_rewards, dtype)
    active = _checks.as_mask("mask", mask)
    rows = rewards.shape[0]
    row_group, num_groups, checks = given_groups(rows, group_sizes, group_ids)
    checks += [_checks.finite_check("token_rewards", rewards, active), *_checks.mask_check("mask", mask)]
    out = _reinforce_pp_core(rewards, active, jnp.asarray(gamma, dtype), baseline, jnp.ones((rows,), jnp.bool_),
                             row_group, num_groups, strategy.gae)
    return out, checks


def _estimate(baseline: bool) -> Any:
    def run(stage: Any, rewards: jax.Array, active: jax.Array, gamma: jax.Array, real_rows: jax.Array,
            row_group: jax.Array, num_groups: int, strategy: ScanStrategy) -> StageResult:
        out = _reinforce_pp_core(rewards, active, gamma, baseline, real_rows, row_group, num_groups, strategy.gae)
        return StageResult(out.advantages, {"reinforce_pp/degenerate": out.degenerate}, returns=out.returns)
    return run


REINFORCE_PP = EstimatorSpec(
    ReinforcePPCredit, _estimate(False), "credit_assignment 'reinforce_pp'", mode="reinforce_pp", kl="rewards",
    diagnostics="reinforce_pp/", units=("token",), example={"credit_assignment": {"mode": "reinforce_pp"},
                                                            "discount": 0.9})
REINFORCE_PP_BASELINE = EstimatorSpec(
    ReinforcePPBaselineCredit, _estimate(True), "credit_assignment 'reinforce_pp_baseline'",
    mode="reinforce_pp_baseline", kl="rewards", diagnostics="reinforce_pp/", units=("token",),
    example={"credit_assignment": {"mode": "reinforce_pp_baseline"}})
