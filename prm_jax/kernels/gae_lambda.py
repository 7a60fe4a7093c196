"""Per-row GAE lambda from trajectory lengths (AReaL's dynamic ``gae_lambda``).

``AdvantageConfig.gae_lambda`` is a float or a dotted path to a function ``fn(context, **kwargs)`` that
returns one lambda per row, ``[B]`` float. ``context`` is a ``GAELambdaContext`` of ``[B]`` int32 arrays
built from the shifted loss mask ``m`` (timesteps):

- ``effective_token_lengths``: active timesteps, ``sum_t m_t`` (the generated tokens trained on, an
  active EOS included);
- ``turn_counts``: turns with at least one active timestep (0 in token mode without ``turn_ids``);
- ``timestep_lengths``: the ``L`` of the selected ``gae_timestep_unit``: tokens or turns.

The function runs inside the jitted pipeline, so it must be jittable. Built in, under AReaL's paths
(``areal.trainer.ppo.lambda_fn.<name>``) as well as this module's (``prm_jax.config`` resolves the paths
when a config is built; this module imports nothing):

- ``vapo_length_adaptive_gae(alpha > 0)``: ``lambda = max(0, 1 - 1 / (alpha L))`` for ``L > 0``, 0 for
  ``L = 0`` (VAPO, Yue et al. 2025, arXiv 2504.05118);
- ``relative_position_gae_lambda(0 < q <= 1)``: ``lambda = q ** (1 / (L - 1))`` for ``L >= 2``, 1 for
  ``L = 1``, 0 for ``L = 0``: a terminal reward keeps the fraction ``q`` at the first timestep of
  every trajectory, whatever its length;
- ``constant_gae_lambda(value)``: ``value`` for every row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypedDict

import jax
import jax.numpy as jnp
import numpy as np

from prm_jax._validation import finite_number
from prm_jax.errors import ConfigError

__all__ = ["GAELambdaContext", "constant_gae_lambda", "relative_position_gae_lambda", "vapo_length_adaptive_gae"]


class GAELambdaContext(TypedDict):
    """What a λ function reads of each row: its trained tokens, its turns, and the lengths in the configured
    timestep unit (tokens or turns).

    Example:
        >>> lengths = np.array([1, 4, 16], np.int32)
        >>> Context = prm_jax.kernels.gae_lambda.GAELambdaContext
        >>> context = Context(effective_token_lengths=lengths, turn_counts=np.zeros(3, np.int32), timestep_lengths=lengths)
        >>> sorted(context)
        ['effective_token_lengths', 'timestep_lengths', 'turn_counts']
    """

    effective_token_lengths: jax.Array  # [B] int32
    turn_counts: jax.Array              # [B] int32
    timestep_lengths: jax.Array         # [B] int32


def _check_value(*, value: float) -> float:
    return finite_number("value", value)


def _check_alpha(*, alpha: float) -> float:
    return finite_number("alpha", alpha, positive=True)


def _check_q(*, q: float) -> float:
    q = finite_number("q", q)
    if not 0 < q <= 1:
        raise ConfigError("q", f"must be in (0, 1], got {q!r}")
    return q


def constant_gae_lambda(context: GAELambdaContext, *, value: float) -> jax.Array:
    """``value`` for every row.

    Args:
        context: The rows' lengths (``GAELambdaContext``), which the pipeline gives every λ function.
        value: λ for every row, in [0, 1].

    Example:
        >>> lengths = np.array([1, 4, 16], np.int32)
        >>> Context = prm_jax.kernels.gae_lambda.GAELambdaContext
        >>> context = Context(effective_token_lengths=lengths, turn_counts=np.zeros(3, np.int32), timestep_lengths=lengths)
        >>> np.asarray(prm_jax.kernels.gae_lambda.constant_gae_lambda(context, value=0.9), np.float64).round(4).tolist()
        [0.9, 0.9, 0.9]
    """
    value = _check_value(value=value)
    return jnp.full(np.shape(context["timestep_lengths"]), value, jnp.float32)


def vapo_length_adaptive_gae(context: GAELambdaContext, *, alpha: float) -> jax.Array:
    """VAPO's length-adaptive ``lambda = max(0, 1 - 1 / (alpha L))``; 0 for an empty trajectory.

    Args:
        context: The rows' lengths (``GAELambdaContext``), which the pipeline gives every λ function.
        alpha: VAPO's α, > 0: longer rows get λ closer to 1.

    Example:
        >>> lengths = np.array([1, 4, 16], np.int32)
        >>> Context = prm_jax.kernels.gae_lambda.GAELambdaContext
        >>> context = Context(effective_token_lengths=lengths, turn_counts=np.zeros(3, np.int32), timestep_lengths=lengths)
        >>> np.asarray(prm_jax.kernels.gae_lambda.vapo_length_adaptive_gae(context, alpha=0.5), np.float64).round(4).tolist()
        [0.0, 0.5, 0.875]
    """
    alpha = _check_alpha(alpha=alpha)
    lengths = context["timestep_lengths"]
    adaptive = 1.0 - 1.0 / (alpha * jnp.maximum(lengths, 1).astype(jnp.float32))
    return jnp.where(lengths > 0, jnp.maximum(adaptive, 0.0), 0.0)


def relative_position_gae_lambda(context: GAELambdaContext, *, q: float) -> jax.Array:
    """``lambda = q ** (1 / (L - 1))`` for ``L >= 2`` (1 for ``L = 1``, 0 for ``L = 0``).

    Args:
        context: The rows' lengths (``GAELambdaContext``), which the pipeline gives every λ function.
        q: λ's value at the full length: ``q ** (1 / (L - 1))``, in [0, 1].

    Example:
        >>> lengths = np.array([1, 4, 16], np.int32)
        >>> Context = prm_jax.kernels.gae_lambda.GAELambdaContext
        >>> context = Context(effective_token_lengths=lengths, turn_counts=np.zeros(3, np.int32), timestep_lengths=lengths)
        >>> np.asarray(prm_jax.kernels.gae_lambda.relative_position_gae_lambda(context, q=0.5), np.float64).round(4).tolist()
        [1.0, 0.7937, 0.9548]
    """
    q = _check_q(q=q)
    lengths = context["timestep_lengths"]
    decay_steps = jnp.maximum(lengths - 1, 1).astype(jnp.float32)
    per_step = jnp.exp(math.log(q) / decay_steps)
    return jnp.where(lengths > 1, per_step, jnp.where(lengths == 1, 1.0, 0.0)).astype(jnp.float32)


BUILTIN = {fn.__name__: fn for fn in (constant_gae_lambda, vapo_length_adaptive_gae, relative_position_gae_lambda)}
# Each built-in's kwargs check, run when a config is built (no JAX work at config time).
KWARG_CHECKS: dict[Callable[..., jax.Array], Callable[..., float]] = {
    constant_gae_lambda: _check_value, vapo_length_adaptive_gae: _check_alpha,
    relative_position_gae_lambda: _check_q}
