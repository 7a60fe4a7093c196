"""The optimal token baseline (OTB; verl's ``compute_multi_turn_optimal_token_baseline_advantage``, arXiv
2602.07078; CREDIT2.md 1 and 5.1), its kernel, and the ``sum_pi_squared`` helper it reads.

Each row's trained tokens are taken in order (the generated-token index ``k``: holes such as tool outputs
removed); ``G`` is the reward-to-go over them, ``w = (1 - 2 pi + sum pi^2) rho^2`` the squared norm of the
token's score (``pi`` the sampled token's probability under the old policy, ``rho`` an optional rollout
importance weight), ``W`` its running sum. Each group's baseline at index ``k`` is ``sum G W / (sum W + eps)``
over its rows that reach ``k``; a group of one non-empty row (or none) has baseline 0, so ``A = G``. With
``handle_zero_tail`` (the default, as verl's trainer runs it), a group's longest row, when it is the only
one that long, gets baseline 0 from the second longest row's length on (where it is alone, its baseline
would be its own return and its advantage about 0). The advantages are ``(G - B)`` at the trained tokens, 0
elsewhere; the returns ``G``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax._validation import boolean, finite_number, integer
from prm_jax.kernels import _checks
from prm_jax.kernels._normalization import given_groups


class OTBOutput(NamedTuple):
    """``advantages`` and ``returns`` ``[B, T]`` (0 where untrained)."""

    advantages: jax.Array
    returns: jax.Array


def sum_pi_squared(logits: ArrayLike, *, temperature: float = 1.0, chunk: int | None = None) -> jax.Array:
    """``sum_v pi_v^2`` of each position's softmax of ``logits / temperature`` (``[..., V]`` -> ``[...]``), as
    ``exp(lse(2z) - 2 lse(z))``: one pass keeping a running maximum and the two sums ``sum e^(z - m)`` and
    ``sum e^(2(z - m))``, over the vocabulary in ``chunk``-wide pieces when given (memory bounded by the
    chunk). The temperature must be the one the log-probs were computed with (verl's rule)."""
    temperature = finite_number("temperature", temperature, positive=True)
    if chunk is not None:
        integer("chunk", chunk, minimum=1)
    _checks.check_real_dtype("logits", jnp.asarray(logits))
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


def _otb_core(rewards: jax.Array, active: jax.Array, logprobs: jax.Array, pi_squared: jax.Array,
              weights: jax.Array | None, row_group: jax.Array, num_groups: int, zero_tail: bool,
              epsilon: float) -> OTBOutput:
    """OTB on validated arrays (module docstring), the multi-turn rule."""
    rows, width = rewards.shape
    zero = jnp.zeros((), rewards.dtype)
    index = jnp.cumsum(active, axis=1, dtype=jnp.int32) - 1          # the generated-token index k
    slot = jnp.where(active, index, width)                            # untrained: a dropped column
    lengths = jnp.sum(active, axis=1, dtype=jnp.int32)
    by_row = jnp.arange(rows, dtype=jnp.int32)[:, None]

    def compact(x: jax.Array) -> jax.Array:
        return jnp.zeros((rows, width + 1), x.dtype).at[by_row, slot].add(jnp.where(active, x, zero))[:, :width]

    valid = jnp.arange(width, dtype=jnp.int32)[None, :] < lengths[:, None]
    score = 1.0 - 2.0 * jnp.exp(logprobs) + pi_squared
    if weights is not None:
        score = score * weights * weights
    returns = jnp.cumsum(compact(rewards)[:, ::-1], axis=1)[:, ::-1]   # reward-to-go over trained tokens
    cumulative = jnp.cumsum(compact(score), axis=1)
    numerator = jax.ops.segment_sum(jnp.where(valid, returns * cumulative, zero), row_group, num_segments=num_groups)
    denominator = jax.ops.segment_sum(jnp.where(valid, cumulative, zero), row_group, num_segments=num_groups)
    baseline = (numerator / (denominator + epsilon))[row_group]
    members = jax.ops.segment_sum((lengths > 0).astype(jnp.int32), row_group, num_segments=num_groups)[row_group]
    baseline = jnp.where((members >= 2)[:, None], baseline, zero)
    if zero_tail:
        longest = jax.ops.segment_max(lengths, row_group, num_segments=num_groups)[row_group]
        ties = jax.ops.segment_sum((lengths == longest).astype(jnp.int32), row_group, num_segments=num_groups)[row_group]
        second = jax.ops.segment_max(jnp.where(lengths < longest, lengths, 0), row_group,
                                     num_segments=num_groups)[row_group]
        alone = (lengths == longest) & (ties == 1)
        cut = alone[:, None] & (jnp.arange(width, dtype=jnp.int32)[None, :] >= second[:, None])
        baseline = jnp.where(cut, zero, baseline)
    advantages_c = jnp.where(valid, returns - baseline, zero)
    gather = jnp.clip(index, 0, width - 1)
    advantages = jnp.where(active, jnp.take_along_axis(advantages_c, gather, axis=1), zero)
    return OTBOutput(advantages, jnp.where(active, jnp.take_along_axis(returns, gather, axis=1), zero))


def optimal_token_baseline(token_rewards: ArrayLike, mask: ArrayLike, logprobs: ArrayLike, sum_pi_squared: ArrayLike,
                           *, group_sizes: ArrayLike | None = None, group_ids: ArrayLike | None = None,
                           rollout_is_weights: ArrayLike | None = None, handle_zero_tail: bool = True,
                           epsilon: float = 1e-8) -> OTBOutput:
    """OTB advantages (module docstring), verl's multi-turn variant with CREDIT2.md 5.1's rules.

    Args:
      token_rewards: ``[B, T]`` each token's reward (the outcome on a row's last token); read at ``mask`` only.
      mask: ``[B, T]`` the trained tokens.
      logprobs: ``[B, T]`` the old policy's log-probs of the sampled tokens.
      sum_pi_squared: ``[B, T]`` ``sum_v pi_v^2`` of each token's distribution (``sum_pi_squared``).
      group_sizes, group_ids: the GRPO groups (``[G]`` consecutive, or ``[B]`` ids); neither: one group.
      rollout_is_weights: ``[B, T]`` optional importance weights ``rho`` (``w`` is scaled by ``rho^2``).
      handle_zero_tail: the zero tail (default on, as verl's trainer runs it).
      epsilon: added to the baseline's denominator (verl's 1e-8).

    Returns:
      ``OTBOutput`` float32 (float64 for float64 inputs).

    The worked example of CREDIT2.md 1 (one group: row 0 rewarded, three tokens; row 1 two tokens):

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
    return _checks.checked(_otb_jit, token_rewards, mask, logprobs, sum_pi_squared, rollout_is_weights, group_sizes,
                           group_ids, zero_tail=handle_zero_tail, epsilon=epsilon)


@functools.partial(jax.jit, static_argnames=("zero_tail", "epsilon"))
def _otb_jit(token_rewards, mask, logprobs, sum_pi_squared, rollout_is_weights, group_sizes, group_ids, *, zero_tail,
             epsilon):
    dtype = _checks.accumulation_dtype(token_rewards, logprobs, sum_pi_squared)
    active = _checks.as_mask("mask", mask)
    given = {"token_rewards": token_rewards, "logprobs": logprobs, "sum_pi_squared": sum_pi_squared}
    if rollout_is_weights is not None:
        given["rollout_is_weights"] = rollout_is_weights
    safe, checks = _checks.finite_floats(given, active, dtype)
    row_group, num_groups, group_checks = given_groups(active.shape[0], group_sizes, group_ids)
    checks += [*group_checks, *_checks.mask_check("mask", mask)]
    out = _otb_core(safe["token_rewards"], active, safe["logprobs"], safe["sum_pi_squared"],
                    safe.get("rollout_is_weights"), row_group, num_groups, zero_tail, epsilon)
    return out, checks
