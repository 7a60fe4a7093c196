"""PRIME: implicit process rewards from a PRM's log-probs (Cui et al., "Process Reinforcement through
Implicit Rewards", 2025; verl's ``recipe/prime`` @ 246cac4c; prm-jax's rules where the originals disagree (the credit-assignment
guide states each)).

On timesteps, over each row's trained timesteps ``m`` (multi-turn rows have gaps; "next" means the next
trained timestep):

  q_t   = log pi_prm(y_t) - log pi_ref(y_t)
  lam = 0 (default):  r_t = beta * q_t
  lam != 0:           q'_t = beta * q_t (with ``outcome``: q' at the row's last trained timestep is
                      replaced by ``R - sum of the row's other q'``, verl's ``prime_use_gt``);
                      r_t = q'_t + lam * r_next   (the lambda-return)
  s_t   = r_t, except 0 at the row's last trained timestep (verl drops the last token's reward)

``_prime_core``, the recipe end to end: with ``batch_norm``, ``s`` is divided by ``max |sum_{u >= t} s_u|``
over the batch plus 1e-6 (so a row's reward depends on the batch it is in, as in verl); then RLOO per
source over each group of ``n`` rows: the dense source ``s`` (times ``dpo_coef``) becomes
``s_t * n / (n - 1) - sum_j mu_j / (n - 1)`` with ``mu_j`` row ``j``'s mean over its trained timesteps,
and the outcome ``R`` at the row's last trained timestep (times ``gt_coef``) becomes ``R - mean of the
others``; the returns are the reverse cumulative sums of their sum, and the advantages the returns
whitened over the batch's trained timesteps. A group of one row has no leave-one-out baseline (verl
divides by zero): it is refused (``ValueError`` eagerly, a count under ``jit``). A coefficient of 0 drops
its source.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from prm_jax._validation import boolean, finite_number, one_of
from prm_jax.kernels import _checks
from prm_jax.kernels._estimator_contract import EstimatorSpec
from prm_jax.kernels._normalization import leave_one_out_affine, leave_one_out_mean, whiten
from prm_jax.kernels._recurrence import CumsumMethod, ScanStrategy, resolve_strategy, reverse_cumsum
from prm_jax.kernels._stage import StageResult
from prm_jax.kernels._token_gae import _gae_core

PrimeNorm = Literal["batch_norm", "none"]
PRIME_NORMS: tuple[PrimeNorm, ...] = get_args(PrimeNorm)


@dataclasses.dataclass(frozen=True)
class PrimeCredit:
    """``actor.credit_assignment`` with ``mode: prime``: verl's ``beta_train``, ``lambda``,
    ``prime_use_gt``, ``reward_dpo_coef``, ``reward_gt_coef`` and ``prime_norm`` (``batch_norm`` or
    ``none``), with verl's defaults.

    Args:
        beta: β of the implicit PRM's reward ``β (log π_prm - log π_ref)`` (verl's ``beta_train``).
        lam: λ of the implicit rewards' λ-return (verl's ``lambda``).
        use_gt: Whether the ground-truth (outcome) reward is used beside the implicit ones (``prime_use_gt``).
        dpo_coef: The weight of the implicit (DPO-style) rewards (``reward_dpo_coef``).
        gt_coef: The weight of the ground-truth reward (``reward_gt_coef``).
        norm: ``batch_norm`` (the implicit rewards normalized over the batch) or ``none`` (``prime_norm``).

    Example:
        >>> credit = prm_jax.AdvantageConfig(credit_assignment={"mode": "prime", "beta": 0.1}).credit_assignment
        >>> type(credit).__name__, credit.beta, credit.norm
        ('PrimeCredit', 0.1, 'batch_norm')
    """

    beta: float = 0.05
    lam: float = 0.0
    use_gt: bool = False
    dpo_coef: float = 5.0
    gt_coef: float = 5.0
    norm: PrimeNorm = "batch_norm"

    def __post_init__(self):
        object.__setattr__(self, "beta", finite_number("beta", self.beta))
        object.__setattr__(self, "lam", finite_number("lam", self.lam, minimum=0.0, maximum=1.0))
        for key in ("dpo_coef", "gt_coef"):
            object.__setattr__(self, key, finite_number(key, getattr(self, key)))
        boolean("use_gt", self.use_gt)
        one_of("norm", self.norm, PRIME_NORMS, config=True)


def last_active(active: jax.Array, cumsum: CumsumMethod) -> jax.Array:
    """``[B, T]`` bool: each row's last active timestep."""
    later = reverse_cumsum(active.astype(jnp.float32), active, cumsum)  # exact: integers far below 2**24
    return active & (later == 1)


def _implicit_rewards_core(prm_logprobs: jax.Array, ref_logprobs: jax.Array, active: jax.Array, beta: float,
                          lam: float, outcome: jax.Array | None, strategy: ScanStrategy,
                          last: jax.Array | None = None) -> jax.Array:
    """``implicit_process_rewards`` on validated float arrays on timesteps (``last``: each row's last
    trained timestep, when the caller has it)."""
    zero = jnp.zeros((), prm_logprobs.dtype)
    q = jnp.where(active, beta * (prm_logprobs - ref_logprobs), zero)
    last = last_active(active, strategy.cumsum) if last is None else last
    if lam == 0.0:
        rewards = q
    else:
        if outcome is not None:
            others = jnp.sum(jnp.where(last, zero, q), axis=1)
            q = jnp.where(last, (outcome - others)[:, None], q)
        # The lambda-return with masked carry is GAE with gamma 1 and no values: one scan of any method.
        zeros = jnp.zeros(q.shape[:1], q.dtype)
        rewards = jnp.where(active, _gae_core(q, jnp.zeros_like(q), active, jnp.ones((), q.dtype),
                                             jnp.asarray(lam, q.dtype), zeros, strategy.general).advantages, zero)
    return jnp.where(last, zero, rewards)


def implicit_process_rewards(prm_logprobs: ArrayLike, ref_logprobs: ArrayLike, mask: ArrayLike, *,
                             beta: float = 0.05, lam: float = 0.0, outcome: ArrayLike | None = None) -> jax.Array:
    """PRIME's implicit process rewards (module docstring).

    Args:
      prm_logprobs, ref_logprobs: ``[B, T]`` float, the implicit PRM's and the reference model's log-probs
        of each timestep's token (on timesteps, as ``ref_logprobs`` in ``compute_advantages``).
      mask: ``[B, T]``, the trained timesteps.
      beta: the implicit reward's scale (verl's ``beta_train``, 0.05).
      lam: the lambda of the lambda-return (0: none, verl's default).
      outcome: ``[B]`` outcome rewards for ``prime_use_gt`` (with ``lam != 0`` only).

    Returns:
      ``[B, T]`` float32 (float64 for float64 input) process rewards, 0 at inactive timesteps and at each
      row's last trained timestep.

    Example:
        >>> prm = np.log(np.array([[0.5, 0.8, 0.5]], np.float32))
        >>> ref = np.log(np.array([[0.5, 0.4, 0.25]], np.float32))
        >>> rewards = prm_jax.credit.implicit_process_rewards(prm, ref, np.ones((1, 3), bool), beta=1.0)
        >>> np.asarray(rewards, np.float64).round(4).tolist()   # beta log(prm / ref); 0 on the last timestep
        [[0.0, 0.6931, 0.0]]
    """
    _checks.check_rank("prm_logprobs", prm_logprobs, 2)
    shape = np.shape(prm_logprobs)
    _checks.check_shape("ref_logprobs", ref_logprobs, shape, "prm_logprobs")
    _checks.check_shape("mask", mask, shape, "prm_logprobs")
    if outcome is not None:
        _checks.check_shape("outcome", outcome, shape[:1], "the batch axis")
    beta, lam = finite_number("beta", beta), finite_number("lam", lam, minimum=0.0, maximum=1.0)
    strategy = resolve_strategy("auto", unit_discount=lam == 1.0)
    return _checks.checked(_implicit_jit, prm_logprobs, ref_logprobs, mask, outcome, beta=beta, lam=lam,
                           strategy=strategy)


@functools.partial(jax.jit, static_argnames=("beta", "lam", "strategy"))
def _implicit_jit(prm_logprobs, ref_logprobs, mask, outcome, *, beta, lam, strategy):
    dtype = _checks.accumulation_dtype(prm_logprobs, ref_logprobs, outcome)
    active = _checks.as_mask("mask", mask)
    prm = _checks.as_float("prm_logprobs", prm_logprobs, dtype)
    ref = _checks.as_float("ref_logprobs", ref_logprobs, dtype)
    checks = [*_checks.mask_check("mask", mask), _checks.finite_check("prm_logprobs", prm, active),
              _checks.finite_check("ref_logprobs", ref, active)]
    gt = None if outcome is None else _checks.as_float("outcome", outcome, dtype)
    return _implicit_rewards_core(prm, ref, active, beta, lam, gt, strategy), checks


class PrimeOutput(NamedTuple):
    advantages: jax.Array  # [B, T] whitened returns, 0 where inactive
    returns: jax.Array     # [B, T]
    rewards: jax.Array     # [B, T] the implicit process rewards s (after batch_norm)


def _prime_core(prm_logprobs: jax.Array, ref_logprobs: jax.Array, outcome: jax.Array, active: jax.Array,
               real: jax.Array, row_group: jax.Array, num_groups: int, *, beta: float, lam: float, use_gt: bool,
               dpo_coef: float, gt_coef: float, batch_norm: bool,
               strategy: ScanStrategy) -> tuple[PrimeOutput, _checks.ValueCheck]:
    """The PRIME recipe on validated arrays (module docstring), and the check that no group has one row."""
    zero = jnp.zeros((), outcome.dtype)
    steps_to_go = reverse_cumsum(active.astype(outcome.dtype), active, strategy.cumsum)  # trained timesteps from t on
    rewards = _implicit_rewards_core(prm_logprobs, ref_logprobs, active, beta, lam, outcome if use_gt else None,
                                    strategy, last=active & (steps_to_go == 1))
    # One reverse cumulative sum of the rewards serves both batch_norm and the returns: the returns are
    # linear in the rewards (RLOO's dense source is a per-row affine map of them, the outcome source sits
    # at the last trained timestep, so every trained timestep's return-to-go holds all of it).
    to_go = reverse_cumsum(rewards, active, strategy.cumsum)
    if batch_norm:
        scale = jnp.max(jnp.abs(to_go)) + 1e-6
        rewards, to_go = rewards / scale, to_go / scale
    baseline, alone = leave_one_out_mean(outcome, real, row_group, num_groups)
    alone = alone & real
    returns = jnp.zeros_like(rewards)
    if dpo_coef != 0.0:
        length = jnp.sum(active, axis=1, dtype=jnp.int32).astype(rewards.dtype)
        row_mean = jnp.where(real, jnp.sum(rewards, axis=1) / jnp.maximum(length, 1), zero)
        scale, others = leave_one_out_affine(row_mean, real, row_group, num_groups)
        # s_t n / (n - 1) - others per trained timestep, summed from t on: the same map of the sums.
        returns = returns + dpo_coef * (scale[:, None] * to_go - others[:, None] * steps_to_go)
    if gt_coef != 0.0:
        returns = returns + gt_coef * (outcome - baseline)[:, None]
    returns = jnp.where(active & ~alone[:, None], returns, zero)
    row = _checks.first_true(alone)
    check = _checks.ValueCheck("prime_group_of_one", _checks.violations(alone),
                               lambda row: f"credit_assignment 'prime' needs groups of at least two rows (RLOO has no "
                                           f"baseline for one); row {int(row)} is alone in its group", row)
    return PrimeOutput(whiten(returns, active & ~alone[:, None]), returns, rewards), check


def _estimate(stage: PrimeCredit, batch: Mapping[str, jax.Array], ref_logprobs: jax.Array,
              outcome: jax.Array, active: jax.Array, real_rows: jax.Array, row_group: jax.Array, num_groups: int,
              strategy: ScanStrategy, dtype: Any) -> StageResult:
    """The PRIME recipe (``_prime_core``) from ``batch['prm_logprobs']`` and the reference log-probs."""
    # (Finite on trained timesteps: the pipeline checks every model output a stage reads, BATCH_SCHEMA's rule.)
    prm = jnp.where(active, _checks.as_float("batch['prm_logprobs']", batch["prm_logprobs"], dtype), jnp.zeros((), dtype))
    out, alone = _prime_core(prm, ref_logprobs, outcome, active, real_rows, row_group, num_groups,
                            beta=stage.beta, lam=stage.lam, use_gt=stage.use_gt, dpo_coef=stage.dpo_coef,
                            gt_coef=stage.gt_coef, batch_norm=stage.norm == "batch_norm", strategy=strategy)
    count = jnp.maximum(jnp.sum(active, dtype=jnp.int32), 1).astype(dtype)
    return StageResult(out.advantages, {"prime/implicit_reward_mean": jnp.sum(out.rewards) / count}, (alone,))


PRIME = EstimatorSpec(PrimeCredit, _estimate, "credit_assignment 'prime'", mode="prime",
                      reads=("prm_logprobs", "ref_logprobs"), diagnostics="prime/", units=("token",),
                      example={"credit_assignment": {"mode": "prime", "beta": 0.1, "lam": 0.5, "use_gt": True}})
