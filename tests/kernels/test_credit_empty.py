"""Issue 55.10: every credit kernel has one documented answer for empty inputs, the same on every method: a
batch of no rows or no timesteps (B = 0, T = 0; no nodes for the tree kernels) gives outputs of the shapes
its inputs give (empty along the empty axis; a row with no timesteps or sources gets 0), never an error
(``credit.reinforce_pp`` raised numpy's "argmax of an empty sequence"); an
empty vocabulary (``sum_pi_squared`` on V = 0: an error under ``xla``, 0.0 under ``native``) is refused on
every method, naming the argument."""

from typing import get_args

import numpy as np
import pytest
from native_where import runs_native

from prm_jax import credit
from prm_jax.kernels._recurrence import GAE_METHODS, AlignmentMethod, StepGroupMethod

SHAPES = [(0, 4), (3, 0), (0, 0)]


def zeros(*shape):
    return np.zeros(shape, np.float32)


def mask(*shape):
    return np.zeros(shape, bool)


# Each kernel of credit.__all__ (its output types aside), called on empty inputs with each of its methods.
KERNELS = {
    "reinforce_pp": [lambda b, t, m=m: credit.reinforce_pp(zeros(b, t), mask(b, t), method=m)
                     for m in GAE_METHODS if m != "cumsum"] +
                    [lambda b, t: credit.reinforce_pp(zeros(b, t), mask(b, t), baseline=True, gamma=1.0,
                                                      method="cumsum")],
    "optimal_token_baseline": [lambda b, t, a=a: credit.optimal_token_baseline(
        zeros(b, t), mask(b, t), zeros(b, t), zeros(b, t), alignment=a) for a in get_args(AlignmentMethod)],
    "implicit_process_rewards": [lambda b, t: credit.implicit_process_rewards(zeros(b, t), zeros(b, t), mask(b, t))],
    "distillation_rewards": [lambda b, t: credit.distillation_rewards(zeros(b, t), zeros(b, t), mask(b, t))],
    "min_form": [lambda b, t: credit.min_form(zeros(b, t), mask(b, t))],
    "gigpo": [lambda b, t, m=m: credit.gigpo(zeros(b, t), mask(b, t), zeros(b), step_groups=m)
              for m in get_args(StepGroupMethod)],
    "decoupled_normalization": [lambda b, t: credit.decoupled_normalization(zeros(b, t))],
    "tree_discount": [lambda b, t: credit.tree_discount(np.full(b * t, -1, np.int32), zeros(b * t), 0.9)],
    "tree_advantages": [lambda b, t: credit.tree_advantages(np.full(b * t, -1, np.int32), zeros(b * t))],
    "sum_pi_squared": [lambda b, t, m=m: credit.sum_pi_squared(zeros(b, t, 5), method=m) for m in ("xla", "native")],
}


def test_every_credit_kernel_has_an_empty_input_case():
    kernels = {name for name in credit.__all__ if name[0].islower()}
    assert kernels == set(KERNELS), sorted(kernels ^ set(KERNELS))


@pytest.mark.parametrize("shape", SHAPES, ids=[f"B={b},T={t}" for b, t in SHAPES])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_an_empty_batch_gives_empty_outputs_on_every_method(name, shape):
    b, t = shape
    for case in KERNELS[name]:
        if ("native" in str(case.__defaults__) or name == "sum_pi_squared") and not runs_native():
            continue
        out = case(b, t)
        arrays = [np.asarray(x) for x in (out if isinstance(out, tuple) else (out,))]
        # (decoupled_normalization's one output is per row: with rows and no sources it is not empty)
        assert any(x.size == 0 for x in arrays) or (name, b) == ("decoupled_normalization", 3), [x.shape for x in arrays]
        # What is not empty (a row's outputs where it has no timesteps or sources, a degenerate count) is 0 or
        # the count: nothing is credited from nothing.
        per_row = [x for x in arrays if x.ndim >= 1 and x.size]
        assert all(np.isfinite(x).all() and not x.astype(np.float64).any() for x in per_row), per_row


@pytest.mark.parametrize("method", ["xla", "native", "auto"])
@pytest.mark.parametrize("shape", [(2, 0), (0, 0), (3, 4, 0)])
def test_sum_pi_squared_refuses_an_empty_vocabulary_on_every_method(method, shape):
    with pytest.raises(ValueError, match=r"logits must be \[\.\.\., V\] with a vocabulary of V >= 1.*got shape"):
        credit.sum_pi_squared(zeros(*shape), method=method)
