"""PURE: min-form credit assignment for process rewards (Cheng et al., "Stop Gamma Decay: Min-Form Credit
Assignment Is All Process Reward Model Needs for Reasoning", 2025; PURE's authors' code (CJReinforce/PURE, branch verl @
83f9869c); prm-jax's rules where the originals disagree (the credit-assignment guide states each)).

``min_form`` transforms one row's step scores ``s_k`` (in prm-jax a row's turns) with temperature ``tau``::

  w_k = exp(-s_k / tau) / sum over the row's steps of exp(-s_u / tau),   r_k = w_k * s_k

so ``sum_k r_k`` tends to the row's minimum score as ``tau -> 0`` and to its mean as ``tau -> inf``. The
weights are normalized over all steps of the row, as the authors' code does (not over future steps):
scores -0.9, 0.5, 0.8 at ``tau = 0.1`` give ``r`` = -0.9, 4.2e-7, 3.3e-8, whose returns-to-go are -0.9,
4.5e-7, 3.3e-8: after the minimizing step almost nothing is left, not the minimum of the remaining steps.
Ties share the weight equally; a row without steps gives 0.

The recipe end to end (``_pure_core``, the authors' verl pipeline), on timesteps: ``q`` holds ``r_k`` at each
turn's last trained timestep (the turn's score is its process reward there) plus ``verifier_coef * R`` (the
outcome reward) at the outcome's timestep; ``G_t = sum_{u >= t} q_u`` over trained timesteps; a row's RLOO
baseline is the mean, over the other rows of its group, of their per-token mean return ``sum_t G / L`` (the
original divides by the padded width instead of ``L``: the two agree on rows without padding); returns are
``(G - baseline) * m``; with ``whiten`` the advantages are the returns whitened over the batch's trained
timesteps (``normalization.whiten``), else the returns. A group of one has no baseline: its returns are
0. ``'strict min-form'`` is not offered: it zeroes every positive reward (a bug of the original).
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
from prm_jax.kernels._normalization import leave_one_out_mean, row_sum_mean, whiten
from prm_jax.kernels._recurrence import CumsumMethod, ScanStrategy, reverse_cumsum
from prm_jax.kernels._stage import StageResult, StageSpec
from prm_jax.kernels._turns import TurnSteps, any_change_within_turns, first_at_or_after


def check_temperature(temperature: float) -> float:
    """``temperature`` as a float; it must be > 0 and a normal float32 (the kernels divide by it in float32:
    a subnormal one is flushed to 0 there, which would zero every reward)."""
    return finite_number("temperature", temperature, positive=True)


@dataclasses.dataclass(frozen=True)
class MinFormTransform:
    """``actor.process_reward_transform: {mode: min_form, temperature}``: each turn's process reward (its
    value at the turn's last trained timestep) is replaced by its min-form reward, uniform over the turn.

    Args:
        temperature: τ of the min-form's softmin over the turn's step scores, > 0 (PURE's 0.1).

    Example:
        >>> config = prm_jax.AdvantageConfig(process_reward_transform={"mode": "min_form", "temperature": 0.2})
        >>> config.process_reward_transform
        MinFormTransform(temperature=0.2)
    """

    temperature: float = 0.1

    def __post_init__(self):
        object.__setattr__(self, "temperature", check_temperature(self.temperature))

    @property
    def spec(self) -> StageSpec:
        return MIN_FORM_TRANSFORM


@dataclasses.dataclass(frozen=True)
class PureCredit:
    """``actor.credit_assignment`` with ``mode: pure`` (the recipe end to end; module docstring).

    Args:
        temperature: τ of the min-form's softmin, > 0 (PURE's 0.1).
        verifier_coef: The weight of the verifier's (outcome) reward beside the process rewards.
        whiten: Whether the advantages are whitened over the batch (PURE's default).

    Example:
        >>> prm_jax.AdvantageConfig(credit_assignment={"mode": "pure", "temperature": 0.1}).credit_assignment
        PureCredit(temperature=0.1, verifier_coef=1.0, whiten=True)
    """

    temperature: float = 0.1
    verifier_coef: float = 1.0
    whiten: bool = True

    def __post_init__(self):
        object.__setattr__(self, "temperature", check_temperature(self.temperature))
        object.__setattr__(self, "verifier_coef", finite_number("verifier_coef", self.verifier_coef))
        boolean("whiten", self.whiten)


def _min_form_core(scores: jax.Array, steps: jax.Array, temperature: float, at: jax.Array | None = None) -> jax.Array:
    """``min_form`` along the last axis of validated float ``scores`` with bool ``steps``: the weights are
    normalized over ``steps``; ``w * s`` is given where ``at`` (default ``steps``), 0 elsewhere (a score
    outside the steps weighed by the steps' normalizer: a turn's reward at every timestep of a turn whose
    score is uniform, the same number as at the turn's end).

    Each weight is computed from the score's difference to the row's lowest step score,
    ``exp(-(s - min) / tau)``: the difference is exact where scores are close (no cancellation of two large
    logits at a small temperature), the exponent is never positive (no overflow, whatever the scores'
    magnitude), the lowest step weighs 1, so the normalizer is at least 1.
    """
    zero = jnp.zeros((), scores.dtype)
    low = jnp.min(jnp.where(steps, scores, jnp.inf), axis=-1, keepdims=True, initial=jnp.inf)
    low = jnp.where(jnp.isfinite(low), low, zero)  # a row without steps

    inverse = jnp.asarray(1.0 / temperature, scores.dtype)  # (a product per element, not a division)
    # The normalizer's exponent is masked before the exp and the output's is not: two expressions, so XLA
    # recomputes the exp inside each consumer instead of sharing one [B, T] array of weights (a round
    # trip through memory, ~15% of the whole pipeline on the CPU).
    total = jnp.maximum(jnp.sum(jnp.exp(jnp.where(steps, (low - scores) * inverse, -jnp.inf)), axis=-1,
                                keepdims=True), jnp.ones((), scores.dtype))
    return jnp.where(steps if at is None else at, jnp.exp((low - scores) * inverse) / total * scores, zero)


def min_form(step_scores: ArrayLike, step_mask: ArrayLike | None = None, temperature: float = 0.1) -> jax.Array:
    """PURE's min-form transform of each row's step scores (module docstring).

    Args:
      step_scores: ``[B, K]`` float, the steps' process scores (``K`` turns).
      step_mask: ``[B, K]``, the steps that exist (default all).
      temperature: ``tau > 0``; small values approach the row's minimum.

    Returns:
      ``[B, K]`` float32 (float64 for float64 input), 0 where ``step_mask`` is False.

    Raises:
      ValueError: a bad temperature or shape, or a non-finite score of an existing step.

    Example:
        >>> scores = np.array([[0.9, 0.1, 0.8]], np.float32)
        >>> np.asarray(prm_jax.credit.min_form(scores, temperature=0.1), np.float64).round(4).tolist()
        [[0.0003, 0.0999, 0.0007]]
    """
    temperature = check_temperature(temperature)
    _checks.check_rank("step_scores", step_scores, 2)
    if step_mask is not None:
        _checks.check_shape("step_mask", step_mask, np.shape(step_scores), "step_scores")
    return _checks.checked(_min_form_jit, step_scores, step_mask, temperature=temperature)


@functools.partial(jax.jit, static_argnames=("temperature",))
def _min_form_jit(step_scores, step_mask, *, temperature):
    dtype = _checks.accumulation_dtype(step_scores)
    scores = _checks.as_float("step_scores", step_scores, dtype)
    steps = jnp.ones(scores.shape, jnp.bool_) if step_mask is None else _checks.as_mask("step_mask", step_mask)
    checks = [_checks.finite_check("step_scores", scores, steps, axis="step"),
              *([] if step_mask is None else _checks.mask_check("step_mask", step_mask))]
    return _min_form_core(scores, steps, temperature), checks


def _min_form_turns(transform: MinFormTransform, process: jax.Array, active: jax.Array, turns: TurnSteps | None,
                    strategy: ScanStrategy) -> StageResult:
    """``process_reward_transform: min_form`` on the pipeline's timesteps: each turn's process score (its
    value at the turn's last timestep) becomes its min-form reward over the row's turns, uniform over the
    turn's timesteps.

    Where every turn's process reward is uniform (a scalar scorer's), each timestep already holds its turn's
    score and takes its reward in place; otherwise each active timestep takes the reward at its own turn's
    end (one masked fill). ``_min_form_core`` computes both from the same per-row weights, so the two give
    the same numbers on uniform turns, and a row's numbers do not depend on which one its batch takes
    (``lax.cond`` runs only the one taken).
    """
    assert turns is not None  # the transform declares that it reads turns
    zero, method = jnp.zeros((), process.dtype), strategy.general
    ends = turns.ends

    def in_place(_: None) -> jax.Array:
        return _min_form_core(process, ends, transform.temperature, at=active)

    def spread(_: None) -> jax.Array:
        rewards = _min_form_core(process, ends, transform.temperature)  # the min-form reward at each turn end
        return jnp.where(active, first_at_or_after(rewards, ends, method), zero)

    out = jax.lax.cond(any_change_within_turns(process, turns, active, method), spread, in_place, None)
    diagnostics = {"min_form/turns": jnp.sum(ends, dtype=jnp.int32),  # (each turn's reward once: at its end)
                   "min_form/row_sum_mean": row_sum_mean(out, ends)}
    return StageResult(out, diagnostics)


MIN_FORM_TRANSFORM = StageSpec("process_reward_transform", "min_form", MinFormTransform, _min_form_turns,
                               diagnostics="min_form/", turns=lambda transform: True)


class PureOutput(NamedTuple):
    advantages: jax.Array  # [B, T] on timesteps, 0 where inactive
    returns: jax.Array     # [B, T] (G - baseline) * m
    alone: jax.Array       # [B] bool: rows alone in their group (returns 0)


def _pure_core(process: jax.Array, outcome: jax.Array, active: jax.Array, ends: jax.Array, outcome_at: jax.Array,
              real: jax.Array, row_group: jax.Array, num_groups: int, temperature: float, verifier_coef: float,
              whitened: bool, cumsum: CumsumMethod) -> PureOutput:
    """The PURE recipe on validated arrays: ``process`` P and ``active`` on timesteps, ``ends`` each turn's
    last active timestep, ``outcome_at`` [B, T] bool the outcome's timestep, ``real`` [B] the real rows."""
    zero = jnp.zeros((), process.dtype)
    steps = _min_form_core(process, ends, temperature)
    q = steps + jnp.where(outcome_at, verifier_coef * outcome[:, None], zero)
    to_go = reverse_cumsum(q, active, cumsum)
    length = jnp.sum(active, axis=1, dtype=jnp.int32).astype(process.dtype)
    per_token = jnp.sum(to_go, axis=1) / jnp.maximum(length, 1)
    baseline, alone = leave_one_out_mean(per_token, real, row_group, num_groups)
    scored = active & ~alone[:, None]
    returns = jnp.where(scored, to_go - baseline[:, None], zero)
    return PureOutput(whiten(returns, scored) if whitened else returns, returns, alone & real)


def _estimate(stage: PureCredit, process: jax.Array | None, outcome: jax.Array, active: jax.Array,
              turns: TurnSteps, outcome_at: jax.Array, real_rows: jax.Array, row_group: jax.Array, num_groups: int,
              strategy: ScanStrategy, dtype: Any) -> StageResult:
    """The PURE recipe (``_pure_core``): min-form turn rewards and the verifier score, sum returns, RLOO,
    whitening."""
    process = process if process is not None else jnp.zeros(active.shape, dtype)
    out = _pure_core(process, outcome, active, turns.ends, outcome_at, real_rows, row_group, num_groups,
                    stage.temperature, stage.verifier_coef, stage.whiten, strategy.cumsum)
    return StageResult(out.advantages, {"pure/groups_of_one": jnp.sum(out.alone, dtype=jnp.int32)})


PURE = EstimatorSpec(
    PureCredit, _estimate, "credit_assignment 'pure'", mode="pure", may_read=("token_rewards",), diagnostics="pure/",
    owns_process_rewards=True, units=("token",),
    refused_with=(("process_reward_transform.mode", ("min_form",),
                   "PURE applies min-form to the process rewards itself: it would run twice"),
                  ("process_reward_transform.mode", ("progress",),
                   "PURE's min-form reads the process rewards as step scores; progress would hand it their differences"),
                  ("advantage_shaping.mode", ("gvpo", "process_weighted"),
                   "PURE's returns already hold the process rewards, so it shapes nothing (shaping would count them "
                   "twice)")),
    example={"credit_assignment": {"mode": "pure", "temperature": 0.3, "verifier_coef": 0.5}})
