"""A scorer's raw result for one turn, validated and weighted: ``weight * raw`` as float32 token rewards,
or an error naming the scorer and the turn (the runner commits nothing of a scorer until all its results
pass)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from prm_jax._validation import FLOAT32_MAX, short_repr
from prm_jax.runtime._scoring import BaseScorer
from prm_jax.runtime._trajectory import Interaction


def where(scorer: BaseScorer, turn: Interaction) -> str:
    return f"scorer {scorer.name!r} on interaction {turn.interaction_id!r}"


def weighted_rewards(scorer: BaseScorer, turn: Interaction, raw: Any) -> tuple[np.ndarray, float]:
    """``weight * raw`` as float32 ``[output_len]`` and its mean, or a ``ValueError``/``TypeError`` naming
    scorer and turn."""
    n = turn.output_len  # > 0: the runner scores scorable turns only (trajectory.require_scorable)
    if isinstance(raw, (bool, np.bool_)):  # a judge's verdict, like any Python number: 1.0 or 0.0
        raw = float(raw)
    if type(raw) in (float, int):  # the common case, in plain Python and one numpy call
        if not math.isfinite(raw):
            raise ValueError(f"{where(scorer, turn)}: returned non-finite rewards")
        weighted = raw * scorer.weight
        if not abs(weighted) <= FLOAT32_MAX:
            raise ValueError(f"{where(scorer, turn)}: reward * weight ({scorer.weight}) is non-finite")
        return np.full(n, weighted, np.float32), float(weighted)
    product, weighted = weighted_float32(_reward_array(scorer, turn, raw, n), scorer.weight)
    if not np.isfinite(weighted).all():
        raise ValueError(f"{where(scorer, turn)}: reward * weight ({scorer.weight}) is non-finite")
    return weighted, float(np.mean(product))


def weighted_float32(raw: np.ndarray, weight: float) -> tuple[np.ndarray, np.ndarray]:
    """``(weight * raw, the same in float32)``: what is committed, by one rule for turns and for a model's
    rows (the caller refuses where the float32 one is not finite, naming scorer and turn or row)."""
    with np.errstate(over="ignore", invalid="ignore"):
        product = raw * weight
        return product, product.astype(np.float32)


def _reward_array(scorer: BaseScorer, turn: Interaction, raw: Any, n: int) -> np.ndarray:
    if isinstance(raw, (str, bytes)):
        raise TypeError(f"{where(scorer, turn)}: returned a {type(raw).__name__} ({short_repr(raw)}); expected a "
                        "float (a number, not text)")
    try:
        array = np.asarray(raw)
        if array.dtype.kind not in "iuf":  # bool arrays, strings and objects are not scores
            raise TypeError
        array = array.astype(np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{where(scorer, turn)}: returned {type(raw).__name__} ({short_repr(raw)}); expected a "
                        f"float or an array of shape ({n},) of numbers") from None
    if array.ndim == 0:
        array = np.full(n, float(array))
    elif array.shape != (n,):
        raise ValueError(f"{where(scorer, turn)}: must return shape (n,) with n = output_len = {n}, got shape "
                         f"{array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{where(scorer, turn)}: returned non-finite rewards")
    return array
