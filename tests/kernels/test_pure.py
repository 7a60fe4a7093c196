"""PURE's min-form transform and recipe (issue 22.3) against the float64 loops of ``tests/reference.py``."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference

from prm_jax.credit import min_form
from prm_jax.kernels.pure import pure_core
from prm_jax.kernels.turns import turn_ends


def test_the_worked_example():
    # CREDIT.md 1: scores -0.9, 0.5, 0.8 at tau = 0.1; returns-to-go -0.9, 4.5e-7, 3.3e-8.
    r = np.asarray(min_form(np.array([[-0.9, 0.5, 0.8]], np.float32), temperature=0.1), np.float64)[0]
    to_go = np.cumsum(r[::-1])[::-1]
    np.testing.assert_allclose(to_go, [-0.9, 4.5e-7, 3.3e-8], rtol=0.03)
    np.testing.assert_allclose(r, reference.min_form([[-0.9, 0.5, 0.8]], [[1, 1, 1]], 0.1)[0], rtol=1e-5)


@pytest.mark.parametrize("temperature", [1e-3, 0.1, 1.0, 1e4])
def test_min_form_matches_the_loop(temperature):
    rng = np.random.default_rng(int(temperature * 1000) + 1)
    scores = rng.uniform(-1, 1, size=(6, 9)).astype(np.float32)
    steps = rng.random((6, 9)) < 0.7
    steps[0] = False  # a row without steps gives 0
    got = np.asarray(min_form(scores, steps, temperature))
    np.testing.assert_allclose(got, reference.min_form(scores, steps, temperature), rtol=2e-5, atol=1e-6)
    assert np.all(got[0] == 0) and np.all(got[~steps] == 0)


def test_limits_and_ties():
    scores = np.array([[0.3, -0.2, 0.9, -0.2]], np.float32)
    np.testing.assert_allclose(np.sum(min_form(scores, temperature=1e-4)), -0.2, rtol=1e-6)   # -> min
    np.testing.assert_allclose(np.sum(min_form(scores, temperature=1e6)), np.mean(scores), rtol=1e-4)  # -> mean
    tied = np.asarray(min_form(scores, temperature=1e-4))[0]
    assert tied[1] == tied[3]  # ties share the weight equally


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        min_form(np.zeros((1, 2), np.float32), temperature=0.0)
    with pytest.raises(ValueError, match="step_scores must be finite"):
        min_form(np.array([[np.nan, 1.0]], np.float32))
    min_form(np.array([[np.nan, 1.0]], np.float32), np.array([[False, True]]))  # a masked NaN is fine


def test_jit_vmap_bfloat16_no_retrace():
    from prm_jax.kernels.pure import min_form_core
    fn = jax.jit(chex.assert_max_traces(lambda s, m: jax.vmap(lambda a, b: min_form_core(a, b, 0.1))(s, m), n=1))
    rng = np.random.default_rng(3)
    for _ in range(2):
        scores = rng.normal(size=(4, 5)).astype(np.float32)
        np.testing.assert_allclose(fn(scores, np.ones((4, 5), bool)), reference.min_form(scores, np.ones((4, 5)), 0.1),
                                   rtol=2e-5, atol=1e-7)
    low = jnp.asarray(scores, jnp.bfloat16)
    out = min_form(low)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, reference.min_form(np.asarray(low, np.float32), np.ones((4, 5)), 0.1), rtol=2e-5,
                               atol=1e-7)


def recipe_batch(rng, rows, width, group_size):
    mask = np.zeros((rows, width), bool)
    turn_ids = np.full((rows, width), -1, np.int32)
    outcome_step = np.zeros(rows, int)
    for b in range(rows):
        t, k = int(rng.integers(0, 3)), 0
        while t < width - 2 and k < 4:
            n = int(rng.integers(1, 5))
            end = min(t + n, width - 1)
            mask[b, t:end], turn_ids[b, t:end] = True, k
            t, k = end + int(rng.integers(0, 3)), k + 1
        outcome_step[b] = int(np.flatnonzero(mask[b])[-1]) if mask[b].any() else 0
    # A turn's process score is its reward at its last timestep: uniform per turn, as a scalar scorer's.
    process = np.where(mask, rng.uniform(-1, 1, (rows, 1)) * (turn_ids + 1) / 4, 0).astype(np.float32)
    outcome = rng.integers(0, 2, rows).astype(np.float32)
    groups = np.arange(rows) // group_size
    return process, outcome, mask, turn_ids, outcome_step, groups


@pytest.mark.parametrize("whitened", [True, False])
@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_the_recipe_matches_the_loop(whitened, group_size):
    rng = np.random.default_rng(group_size * 2 + whitened)
    process, outcome, mask, turn_ids, outcome_step, groups = recipe_batch(rng, 8, 24, group_size)
    active, ids = jnp.asarray(mask), jnp.asarray(turn_ids)
    outcome_at = jnp.asarray(np.arange(24)[None, :] == outcome_step[:, None])
    got = pure_core(jnp.asarray(process), jnp.asarray(outcome), active, turn_ends(active, ids), outcome_at,
                    jnp.ones(8, bool), jnp.asarray(groups, jnp.int32), 8, 0.1, 1.0, whitened)
    want_adv, want_ret = reference.pure(process, outcome, mask, turn_ids, outcome_step, groups, 0.1, 1.0, whitened)
    np.testing.assert_allclose(got.returns, want_ret, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got.advantages, want_adv, rtol=2e-4, atol=2e-4)
    assert bool(np.all(np.asarray(got.alone) == (group_size == 1)))
    if group_size == 1:  # a group of one has no baseline: 0 everywhere
        assert np.all(np.asarray(got.advantages) == 0)
