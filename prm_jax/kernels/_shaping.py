"""Advantage shaping with direct process rewards, applied after GAE and advantage normalization.

Process rewards score each step of a solution (Lightman et al., "Let's Verify Step by Step", 2023,
arXiv:2305.20050); the three ways of combining them with outcome advantages (``additive``, ``gvpo``,
``process_weighted``) are AReaL's process-reward feature, reproduced rule for rule.

``P`` is the shifted process reward on timesteps; shaping touches active timesteps only and never changes
returns. With ``b = negative_scale``, ``z = zero_penalty``, ``eps = zero_eps``:

- ``additive``:          ``A' = A + P``
- ``gvpo``:              where ``P < 0``: ``A < -eps -> (1 + b) A``; ``|A| <= eps -> -z``; ``A > eps -> 0``
                         (only the sign of ``P`` matters; ``P >= 0`` leaves ``A``)
- ``process_weighted``:  ``P`` in [0, 1]; ``A >= 0 -> A P``; ``A < 0, P > 0 -> P``; ``A < 0, P = 0 -> A``

No mode turns a non-finite advantage into a finite one: where ``A`` is NaN or infinite it is left as it is.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from prm_jax._validation import finite_number, one_of
from prm_jax.kernels import _checks
from prm_jax.kernels._stage import StageResult, StageSpec

ShapingMode = Literal["additive", "gvpo", "process_weighted"]
#: The ``advantage_shaping.mode`` values (derived from ``ShapingMode``).
SHAPING_MODES: tuple[ShapingMode, ...] = get_args(ShapingMode)


@dataclasses.dataclass(frozen=True)
class ShapingConfig:
    """``rollout.agent.prm.advantage_shaping``; hashable, a static argument.

    Args:
        mode: ``additive`` (``A + P``), ``gvpo`` (only the sign of negative ``P`` matters) or ``process_weighted``
            (``P`` in [0, 1] weights ``A``).
        negative_scale: gvpo's ``b``, >= 0: a negative advantage under a negative process reward becomes ``(1 + b)
            A``.
        zero_penalty: gvpo's ``z``, >= 0: a zero advantage under a negative process reward becomes ``-z``.
        zero_eps: gvpo's ``ε``, >= 0: ``|A| <= ε`` counts as zero.

    Example:
        >>> shaping = prm_jax.ShapingConfig("gvpo", negative_scale=0.5)
        >>> advantages, process = np.array([[-1.0, 0.0, 1.0]], np.float32), np.array([[-1.0, -1.0, -1.0]], np.float32)
        >>> shaped = prm_jax.kernels.shape_advantages(advantages, process, np.ones((1, 3), bool), shaping)
        >>> np.asarray(shaped, np.float64).round(3).tolist()
        [[-1.5, -0.4, 0.0]]
    """

    mode: ShapingMode = "additive"
    negative_scale: float = 0.2
    zero_penalty: float = 0.4
    zero_eps: float = 1e-6

    def __post_init__(self):
        one_of("mode", self.mode, SHAPING_MODES, config=True)
        for key in ("negative_scale", "zero_penalty", "zero_eps"):
            object.__setattr__(self, key, finite_number(key, getattr(self, key), minimum=0.0))

    @property
    def spec(self) -> StageSpec:
        return SHAPINGS[self.mode]


def _shape_core(advantages: jax.Array, process_rewards: jax.Array, active: jax.Array,
               shaping: ShapingConfig) -> jax.Array:
    """Shaping of validated float arrays (same dtype) with a bool mask."""
    a, p = advantages, process_rewards
    if shaping.mode == "additive":
        shaped = a + p
    elif shaping.mode == "gvpo":
        eps = shaping.zero_eps
        on_negative = jnp.where(a < -eps, (1.0 + shaping.negative_scale) * a,
                                jnp.where(a > eps, jnp.zeros((), a.dtype), jnp.full((), -shaping.zero_penalty, a.dtype)))
        shaped = jnp.where(p < 0, on_negative, a)
    else:
        shaped = jnp.where(a >= 0, a * p, jnp.where(p > 0, p, a))
    # A non-finite advantage stays as it is: NaN fails every comparison above, so gvpo would turn it into -z
    # and process_weighted into P (a plausible number where an input was broken).
    return jnp.where(active & jnp.isfinite(a), shaped, a)


_warned: set[str] = set()


def warn_gvpo_without_penalty(stacklevel: int) -> None:
    """Host side, once per process: gvpo reads only the sign of the process reward, so a batch in which no
    active process reward is negative is not shaped at all (the eager ``compute_advantages`` and
    ``score_arrays``, for jitted trainers, call this)."""
    if "gvpo" in _warned:
        return
    _warned.add("gvpo")
    warnings.warn("advantage_shaping.mode='gvpo' reads only the sign of the process reward, and no active "
                  "process reward in this batch is negative: gvpo changes nothing here (a 1/0 judge is a "
                  "no-op under gvpo; see the table of what each mode expects in the guide 'Calling it from a "
                  "jitted train step')", stacklevel=stacklevel + 1)


def process_range_check(process_rewards: jax.Array, active: jax.Array) -> _checks.ValueCheck:
    """process_weighted needs P in [0, 1] on active timesteps (NaN fails too)."""
    inside = (process_rewards >= 0) & (process_rewards <= 1)
    lowest = jnp.min(jnp.where(active, process_rewards, jnp.inf))
    highest = jnp.max(jnp.where(active, process_rewards, -jnp.inf))
    return _checks.ValueCheck(
        "process_reward_out_of_range", _checks.violations(active & ~inside),
        lambda lo, hi: "process_weighted shaping needs process rewards in [0, 1] on active timesteps, "
                               f"got values in [{float(lo):g}, {float(hi):g}] (NaN counts as outside)",
        lowest, highest)


def _shaped(shaping: ShapingConfig, advantages: jax.Array, process: jax.Array, active: jax.Array) -> StageResult:
    """Step 9 of the pipeline: the normalized advantages shaped with the process rewards; process_weighted
    first checks that they lie in [0, 1]."""
    checks = (process_range_check(process, active),) if shaping.mode == "process_weighted" else ()
    return StageResult(_shape_core(advantages, process, active, shaping), checks=checks)


#: Each ``advantage_shaping.mode``'s declaration (``prm_jax.kernels._stage``).
SHAPINGS: dict[str, StageSpec] = {mode: StageSpec(
    "advantage_shaping", mode, ShapingConfig, _shaped,
    checks=("process_reward_out_of_range",) if mode == "process_weighted" else ()) for mode in SHAPING_MODES}


def shape_advantages(advantages: ArrayLike, process_rewards: ArrayLike, mask: ArrayLike,
                     shaping: ShapingConfig = ShapingConfig()) -> jax.Array:
    """Shapes advantages with direct process rewards (module docstring has the rules).

    Args:
      advantages: ``[B, T]`` float on timesteps (after GAE and normalization).
      process_rewards: ``[B, T]`` float on timesteps (shifted ``token_rewards``).
      mask: ``[B, T]`` timestep loss mask; inactive timesteps keep their advantage.
      shaping: ``ShapingConfig``.

    Returns:
      ``[B, T]`` float32 (float64 for float64 inputs). ``process_weighted`` raises ``ValueError`` when an
      active process reward is outside [0, 1].

    Example:
        >>> advantages = np.array([[0.5, -0.5, -0.5]], np.float32)
        >>> process = np.array([[1.0, 0.5, 0.0]], np.float32)
        >>> shaping = prm_jax.ShapingConfig("process_weighted")
        >>> shaped = prm_jax.kernels.shape_advantages(advantages, process, np.ones((1, 3), bool), shaping)
        >>> np.asarray(shaped, np.float64).round(3).tolist()
        [[0.5, 0.5, -0.5]]
    """
    if not isinstance(shaping, ShapingConfig):
        raise TypeError(f"shaping must be a ShapingConfig, got {type(shaping).__name__}")
    _checks.check_rank("advantages", advantages, 2)
    _checks.check_shape("process_rewards", process_rewards, np.shape(advantages), "advantages")
    _checks.check_shape("mask", mask, np.shape(advantages), "advantages")
    return _checks.checked(_shape_jit, advantages, process_rewards, mask, shaping=shaping)


def _shape_impl(advantages, process_rewards, mask, *, shaping):
    dtype = _checks.accumulation_dtype(advantages, process_rewards)
    a = _checks.as_float("advantages", advantages, dtype)
    p = _checks.as_float("process_rewards", process_rewards, dtype)
    active = _checks.as_mask("mask", mask)
    checks = [process_range_check(p, active)] if shaping.mode == "process_weighted" else []
    checks += _checks.mask_check("mask", mask)
    return _shape_core(a, p, active, shaping), checks


_shape_jit = jax.jit(_shape_impl, static_argnames=("shaping",))
