"""The optimal token baseline (OTB; verl's ``compute_multi_turn_optimal_token_baseline_advantage``, arXiv
2602.07078; verl's multi-turn OTB (verl-project/verl @ 1dda039b, core_algos.py
compute_multi_turn_optimal_token_baseline_advantage; arXiv 2602.07078); prm-jax's rules where verl's break (the
credit-assignment guide states each)), its kernel, and the ``sum_pi_squared`` helper it reads.

Each row's trained tokens are taken in order (the generated-token index ``k``: holes such as tool outputs
removed); ``G`` is the reward-to-go over them, ``w = (1 - 2 pi + sum pi^2) rho^2`` the squared norm of the
token's score (``pi`` the sampled token's probability under the old policy, ``rho`` an optional rollout
importance weight), ``W`` its running sum. Each group's baseline at index ``k`` is ``sum G W / (sum W + eps)``
over its rows that reach ``k``; a group of one non-empty row (or none) has baseline 0, so ``A = G``. With
``handle_zero_tail`` (the default, as verl's trainer runs it), a group's longest row, when it is the only
one that long, gets baseline 0 from the second longest row's length on (where it is alone, its baseline
would be its own return and its advantage about 0). The advantages are ``(G - B)`` at the trained tokens, 0
elsewhere; the returns ``G``.

As ``actor.credit_assignment: {mode: otb}`` (settings ``handle_zero_tail``, ``epsilon``) it reads the task
rewards on timesteps (the outcome reward, folded turn rewards with ``token_rewards_as_adv: false``, and the
KL rewards, as REINFORCE++ does), the old policy's log-probs on timesteps (``prox_logprobs`` when given,
else the shifted behaviour log-probs: verl's ``old_log_probs``, the forward that computed ``sum_pi_squared``),
``batch['sum_pi_squared']`` and, when given, ``batch['rollout_is_weights']`` (both model outputs on
timesteps, like ``ref_logprobs``), grouped by the GRPO groups (one group without them). With
``token_rewards_as_adv: true`` the shaping applies after, as it does after GAE.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax._validation import boolean, finite_number, integer
from prm_jax.kernels import _checks
from prm_jax.kernels._estimator_contract import EstimatorSpec
from prm_jax.kernels._normalization import given_groups, segment_totals
from prm_jax.kernels._recurrence import AlignmentMethod, ScanStrategy, native_or, resolve_alignment
from prm_jax.kernels._schema import BATCH_SCHEMA, LOGPROB
from prm_jax.kernels._stage import StageResult
from prm_jax.native import _ffi as ffi


@dataclasses.dataclass(frozen=True)
class OTBCredit:
    """``actor.credit_assignment: {mode: otb}``: the zero tail (on by default, as verl's trainer runs it) and
    the baseline denominator's ``epsilon`` (verl's 1e-8).

    Args:
        handle_zero_tail: Whether a group's longest row, where it alone reaches an index, gets baseline 0 from the
            second longest row's length on (verl's trainer; on by default).
        epsilon: Added to the baseline's denominator, > 0 (verl's 1e-8).

    Example:
        >>> prm_jax.AdvantageConfig(credit_assignment={"mode": "otb"}).credit_assignment
        OTBCredit(handle_zero_tail=True, epsilon=1e-08)
    """

    handle_zero_tail: bool = True
    epsilon: float = 1e-8

    def __post_init__(self) -> None:
        boolean("handle_zero_tail", self.handle_zero_tail)
        object.__setattr__(self, "epsilon", finite_number("epsilon", self.epsilon, minimum=0.0))


class OTBOutput(NamedTuple):
    """``advantages`` and ``returns`` ``[B, T]`` (0 where untrained).

    Attributes:
        returns: ``[B, T]`` the returns ``G`` (0 where untrained).

    Example:
        >>> w = np.array([[0.5, 0.2, 0.3], [0.4, 0.6, 0.0]])
        >>> rewards, mask = np.array([[0, 0, 1.0], [0, 0, 0]]), np.array([[1, 1, 1], [1, 1, 0]], bool)
        >>> out = prm_jax.credit.optimal_token_baseline(rewards, mask, np.log(np.full((2, 3), 0.5)), w)
        >>> np.asarray(out.returns, np.float64).round(4).tolist()
        [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    """

    advantages: jax.Array
    returns: jax.Array


def sum_pi_squared(logits: ArrayLike, *, temperature: float = 1.0, chunk: int | None = None,
                   method: Literal["auto", "native", "xla"] = "auto") -> jax.Array:
    """``sum_v pi_v^2`` of each position's softmax of ``logits / temperature`` (``[..., V]`` -> ``[...]``), as
    ``exp(lse(2z) - 2 lse(z))``: the row's maximum, then the two sums ``sum e^(z - m)`` and ``sum
    e^(2(z - m))``. ``method``: ``native`` (the CPU kernel, float32: one exponential per logit, streaming
    over the vocabulary, its memory bounded whatever ``chunk``; not differentiable), ``xla`` (every backend;
    over the vocabulary in ``chunk``-wide pieces when given, memory bounded by the chunk) or ``auto``
    (native where the native kernels run, for float32 logits). The temperature must be the one the log-probs
    were computed with (verl's rule). Empty leading axes give an empty result; an empty vocabulary (``V = 0``)
    is refused on every method.

    >>> z = np.log(np.array([[0.5, 0.25, 0.25]], np.float32))    # pi = (1/2, 1/4, 1/4)
    >>> round(float(prm_jax.credit.sum_pi_squared(z)[0]), 6)       # 1/4 + 1/16 + 1/16
    0.375

    Args:
        logits: ``[..., V]`` the policy's logits.
        temperature: The sampling temperature the logits are divided by, > 0.
        chunk: Positions per chunk of the ``xla`` method (bounding its memory); ``None``: all at once.
        method: ``native`` (the CPU kernel; not differentiable), ``xla`` (every backend) or ``auto``.
    """
    temperature = finite_number("temperature", temperature, positive=True)
    if chunk is not None:
        integer("chunk", chunk, minimum=1)
    resolved = native_or("method", method, "xla", ("native", "xla"), sharded=False)
    array = jnp.asarray(logits)
    _checks.check_real_dtype("logits", array)
    if array.ndim == 0 or array.shape[-1] == 0:
        raise ValueError(f"logits must be [..., V] with a vocabulary of V >= 1 (a distribution over no token has "
                         f"no sum of pi^2), got shape {tuple(array.shape)}")
    if resolved == "native" and (method == "native" or array.dtype == jnp.float32):
        return ffi.sum_pi_squared(array, temperature)
    return _sum_pi_squared_jit(logits, temperature=temperature, chunk=chunk)


@functools.partial(jax.jit, static_argnames=("temperature", "chunk"))
def _sum_pi_squared_jit(logits, *, temperature, chunk):
    z = jnp.asarray(logits)
    z = z.astype(jnp.promote_types(z.dtype, jnp.float32)) / temperature
    vocab = z.shape[-1]
    if chunk is None or chunk >= vocab:
        top = lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
        e = jnp.exp(z - top)
        return jnp.sum(e * e, axis=-1) / jnp.square(jnp.sum(e, axis=-1))
    pieces = -(-vocab // chunk)
    padded = jnp.pad(z, [(0, 0)] * (z.ndim - 1) + [(0, pieces * chunk - vocab)], constant_values=-jnp.inf)
    blocks = jnp.moveaxis(padded.reshape(*z.shape[:-1], pieces, chunk), -2, 0)
    lead = z.shape[:-1]

    def step(carry, block):
        top, first, second = carry
        new_top = jnp.maximum(top, jnp.max(block, axis=-1))
        scale = jnp.exp(top - new_top)
        e = jnp.exp(block - new_top[..., None])
        return (new_top, first * scale + jnp.sum(e, axis=-1), second * scale * scale + jnp.sum(e * e, axis=-1)), None

    start = (jnp.full(lead, -jnp.inf, z.dtype), jnp.zeros(lead, z.dtype), jnp.zeros(lead, z.dtype))
    (_, first, second), _ = lax.scan(step, start, blocks)
    return second / jnp.square(first)


def _baseline_cuts(lengths: jax.Array, row_group: jax.Array, num_groups: int, zero_tail: bool,
                   width: int) -> jax.Array:
    """``[B]`` int32: the index ``k`` from which each row's baseline is 0: ``0`` in a group of fewer than two
    non-empty rows, the second longest length for a group's unique longest row under the zero tail, else
    ``width`` (never)."""
    def per_group(x: jax.Array) -> jax.Array:
        return segment_totals(x.astype(jnp.int32), row_group, num_groups)

    cut = jnp.where(per_group(lengths > 0) >= 2, width, 0)
    if zero_tail:
        longest = jax.ops.segment_max(lengths, row_group, num_segments=num_groups)[row_group]
        second = jax.ops.segment_max(jnp.where(lengths < longest, lengths, 0), row_group,
                                     num_segments=num_groups)[row_group]
        alone = (lengths == longest) & (per_group(lengths == longest) == 1)
        cut = jnp.where(alone, jnp.minimum(cut, second), cut)
    return cut.astype(jnp.int32)


def _group_baselines(returns: jax.Array, cumulative: jax.Array, row_group: jax.Array, num_groups: int,
                     epsilon: float) -> jax.Array:
    """``[G, T]`` each group's ``sum G W / (sum W + eps)`` per generated-token index, from rows compacted to
    it (0 after each row's end): whole rows summed into their group's."""
    def group_sum(x: jax.Array) -> jax.Array:
        return jax.ops.segment_sum(x, row_group, num_segments=num_groups)

    # (A group whose tokens all have zero weight, deterministic tokens under epsilon 0, has no baseline: 0,
    # not 0/0.)
    denominator = group_sum(cumulative) + epsilon
    safe = jnp.where(denominator > 0, denominator, jnp.ones((), denominator.dtype))
    return jnp.where(denominator > 0, group_sum(returns * cumulative) / safe, jnp.zeros((), denominator.dtype))


def _otb_core(rewards: jax.Array, active: jax.Array, logprobs: jax.Array, pi_squared: jax.Array,
              weights: jax.Array | None, row_group: jax.Array, num_groups: int, zero_tail: bool,
              epsilon: float, alignment: AlignmentMethod) -> OTBOutput:
    """OTB on validated arrays (module docstring), the multi-turn rule. Rows are compacted to generated-token
    index (``G`` and ``W`` there), the group baselines taken, and the advantages put back on the trained
    timesteps: by the native kernels (``alignment="native"``, float32) or by XLA's scatter and gather."""
    rows, width = rewards.shape
    zero = jnp.zeros((), rewards.dtype)
    score = 1.0 - 2.0 * jnp.exp(logprobs) + pi_squared
    if weights is not None:
        score = score * weights * weights
    if alignment == "native" and rewards.dtype == jnp.float32:
        # (An invalid group id fails its own check, which names it: clipped here, the kernel never sees it.)
        row_group = jnp.clip(row_group, 0, num_groups - 1)
        returns_c, cumulative, lengths = ffi.otb_compact(rewards, jnp.where(active, score, zero), active)
        cut = _baseline_cuts(lengths, row_group, num_groups, zero_tail, width)
        baselines = _group_baselines(returns_c, cumulative, row_group, num_groups, epsilon)
        return OTBOutput(*ffi.otb_expand(returns_c, baselines, row_group, cut, active))
    index = jnp.cumsum(active, axis=1, dtype=jnp.int32) - 1          # the generated-token index k
    slot = jnp.where(active, index, width)                            # untrained: a dropped column
    by_row = jnp.arange(rows, dtype=jnp.int32)[:, None]

    def compact(x: jax.Array) -> jax.Array:
        return jnp.zeros((rows, width + 1), x.dtype).at[by_row, slot].add(jnp.where(active, x, zero))[:, :width]

    lengths = jnp.sum(active, axis=1, dtype=jnp.int32)
    valid = jnp.arange(width, dtype=jnp.int32)[None, :] < lengths[:, None]
    returns_c = jnp.cumsum(compact(rewards)[:, ::-1], axis=1)[:, ::-1]   # reward-to-go over trained tokens
    cumulative = jnp.where(valid, jnp.cumsum(compact(score), axis=1), zero)
    cut = _baseline_cuts(lengths, row_group, num_groups, zero_tail, width)
    baseline = _group_baselines(returns_c, cumulative, row_group, num_groups, epsilon)[row_group]
    on = jnp.arange(width, dtype=jnp.int32)[None, :] < cut[:, None]
    advantages_c = returns_c - jnp.where(on, baseline, zero)
    gather = jnp.clip(index, 0, width - 1)
    advantages = jnp.where(active, jnp.take_along_axis(advantages_c, gather, axis=1), zero)
    return OTBOutput(advantages, jnp.where(active, jnp.take_along_axis(returns_c, gather, axis=1), zero))


def optimal_token_baseline(token_rewards: ArrayLike, mask: ArrayLike, logprobs: ArrayLike, sum_pi_squared: ArrayLike,
                           *, group_sizes: ArrayLike | None = None, group_ids: ArrayLike | None = None,
                           rollout_is_weights: ArrayLike | None = None, handle_zero_tail: bool = True,
                           epsilon: float = 1e-8, alignment: AlignmentMethod | Literal["auto"] = "auto") -> OTBOutput:
    """OTB advantages (module docstring), verl's multi-turn variant, with prm-jax's rules where verl's break (the
    credit-assignment guide states each).

    Args:
      token_rewards: ``[B, T]`` each token's reward (the outcome on a row's last token); read at ``mask`` only.
      mask: ``[B, T]`` the trained tokens.
      logprobs: ``[B, T]`` the old policy's log-probs of the sampled tokens.
      sum_pi_squared: ``[B, T]`` ``sum_v pi_v^2`` of each token's distribution (``sum_pi_squared``).
      group_sizes, group_ids: the GRPO groups (``[G]`` consecutive, or ``[B]`` ids); neither: one group.
      rollout_is_weights: ``[B, T]`` optional importance weights ``rho`` (``w`` is scaled by ``rho^2``).
      handle_zero_tail: the zero tail (default on, as verl's trainer runs it).
      epsilon: added to the baseline's denominator (verl's 1e-8).
      alignment: how rows are aligned by generated-token index: ``native`` (the CPU kernel, float32),
        ``scatter`` (XLA, every backend) or ``auto`` (native where the native kernels run).

    Returns:
      ``OTBOutput`` float32 (float64 for float64 inputs).

    The worked example of verl's multi-turn OTB (verl-project/verl @ 1dda039b, core_algos.py
    compute_multi_turn_optimal_token_baseline_advantage; arXiv 2602.07078) (one group: row 0 rewarded, three tokens; row 1 two
    tokens):

    >>> w = np.array([[.5, .2, .3], [.4, .6, 0.0]])   # (pi = 0.5, so sum_pi_squared = w)
    >>> out = prm_jax.credit.optimal_token_baseline(np.array([[0, 0, 1.0], [0, 0, 0]]),
    ...     np.array([[1, 1, 1], [1, 1, 0]], bool), np.log(np.full((2, 3), 0.5)), w)
    >>> [round(float(a), 4) for a in out.advantages.ravel()]
    [0.4444, 0.5882, 1.0, -0.5556, -0.4118, 0.0]
    """
    boolean("handle_zero_tail", handle_zero_tail, config=False)
    epsilon = finite_number("epsilon", epsilon, minimum=0.0)
    _checks.check_rank("token_rewards", token_rewards, 2)
    shape = np.shape(token_rewards)
    for name, x in (("mask", mask), ("logprobs", logprobs), ("sum_pi_squared", sum_pi_squared),
                    ("rollout_is_weights", rollout_is_weights)):
        if x is not None:
            _checks.check_shape(name, x, shape, "token_rewards")
    alignment = resolve_alignment(alignment)
    return _checks.checked(_otb_jit, token_rewards, mask, logprobs, sum_pi_squared, rollout_is_weights, group_sizes,
                           group_ids, zero_tail=handle_zero_tail, epsilon=epsilon, alignment=alignment)


@functools.partial(jax.jit, static_argnames=("zero_tail", "epsilon", "alignment"))
def _otb_jit(token_rewards, mask, logprobs, sum_pi_squared, rollout_is_weights, group_sizes, group_ids, *, zero_tail,
             epsilon, alignment):
    dtype = _checks.accumulation_dtype(token_rewards, logprobs, sum_pi_squared)
    active = _checks.as_mask("mask", mask)
    given = {"token_rewards": token_rewards, "logprobs": logprobs, "sum_pi_squared": sum_pi_squared}
    if rollout_is_weights is not None:
        given["rollout_is_weights"] = rollout_is_weights
    safe, checks = _checks.finite_floats(given, active, dtype)
    checks += [_checks.bounds_check(name, safe[name], active, BATCH_SCHEMA[name].bounds)
               for name in ("logprobs", "sum_pi_squared", "rollout_is_weights") if name in safe]
    row_group, num_groups, group_checks = given_groups(active.shape[0], group_sizes, group_ids)
    checks += [*group_checks, *_checks.mask_check("mask", mask)]
    out = _otb_core(safe["token_rewards"], active, safe["logprobs"], safe["sum_pi_squared"],
                    safe.get("rollout_is_weights"), row_group, num_groups, zero_tail, epsilon, alignment)
    return out, checks


def _estimate(stage: OTBCredit, batch: Mapping[str, jax.Array], rewards: jax.Array,
              logprobs: jax.Array, active: jax.Array, row_group: jax.Array, num_groups: int,
              strategy: ScanStrategy, dtype: Any) -> StageResult:
    """OTB in the pipeline (module docstring). ``sum_pi_squared`` and ``rollout_is_weights`` are finite and
    within their declared ranges on the trained timesteps (the pipeline checks every model output a stage
    reads, BATCH_SCHEMA's rule); the old log-probs, read here as probabilities, are checked here."""
    zero = jnp.zeros((), dtype)
    old = _checks.bounds_check("the old log-probs (batch['prox_logprobs'] when given, else batch['logprobs'] "
                               "shifted to timesteps)", logprobs, active, LOGPROB, key="otb_logprobs")

    def read(key: str) -> jax.Array:
        return jnp.where(active, _checks.as_float(f"batch[{key!r}]", batch[key], dtype), zero)

    weights = read("rollout_is_weights") if "rollout_is_weights" in batch else None
    out = _otb_core(rewards, active, logprobs, read("sum_pi_squared"), weights, row_group, num_groups,
                    stage.handle_zero_tail, stage.epsilon, strategy.alignment)
    return StageResult(out.advantages, checks=(old,), returns=out.returns)


OTB = EstimatorSpec(
    OTBCredit, _estimate, "credit_assignment 'otb'", mode="otb", reads=("sum_pi_squared",),
    may_read=("rollout_is_weights",), kl="rewards", units=("token",),
    missing_hint=" (each token's sum over the vocabulary of pi^2, from the logits that gave the log-probs: "
                 "prm_jax.credit.sum_pi_squared, or the sessions' output_sum_pi_squared)",
    example={"credit_assignment": {"mode": "otb"}})
