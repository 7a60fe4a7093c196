import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference

from prm_jax import NormConfig
from prm_jax.kernels import normalize

LEVELS = ("batch", "group", None)


@pytest.mark.parametrize("mean_level,std_level", list(itertools.product(LEVELS, LEVELS)))
@pytest.mark.parametrize("leave1out,unbiased", [(False, True), (True, False), (True, True)])
def test_matches_float64_loop(mean_level, std_level, leave1out, unbiased):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 9)).astype(np.float32) * 3 + 1
    mask = rng.random((6, 9)) < 0.6
    mask[2] = False  # a row with no active entry
    mask[5, 1:] = False  # a row with one
    norm = NormConfig(mean_level, std_level, leave1out, unbiased, eps=1e-5, group_size=2)
    got = normalize(x, mask, norm)
    want = reference.normalize(x, mask, mean_level=mean_level, std_level=std_level, mean_leave1out=leave1out,
                               std_unbiased=unbiased, eps=1e-5, group_size=2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_variable_group_sizes():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 5)).astype(np.float32)
    mask = rng.random((6, 5)) < 0.7
    norm = NormConfig("group", "group")
    got = normalize(x, mask, norm, group_sizes=[1, 2, 3])
    want = reference.normalize(x, mask, mean_level="group", std_level="group", group_sizes=[1, 2, 3])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sizes", [[1, 2], [3, 0, 3], [4, 3, -1]])
def test_bad_group_sizes(sizes):
    with pytest.raises(ValueError, match="group_sizes"):
        normalize(np.zeros((6, 2), np.float32), None, NormConfig("group", "group"), group_sizes=sizes)


def test_non_dividing_group_size_is_an_error():
    with pytest.raises(ValueError, match="does not divide"):
        normalize(np.zeros((5, 2), np.float32), None, NormConfig("group", "batch", group_size=2))


def test_outcome_rewards_vector():
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], np.float32)
    got = normalize(r, None, NormConfig("group", "group", group_size=3))
    want = reference.normalize(r, np.ones(6, bool), mean_level="group", std_level="group", group_size=3)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert got.shape == (6,)


def test_nan_and_inf_at_masked_entries_do_not_leak():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 6)).astype(np.float32)
    mask = rng.random((4, 6)) < 0.5
    mask[0, 0] = True
    poisoned = np.where(mask, x, np.where(rng.random((4, 6)) < 0.5, np.nan, np.inf)).astype(np.float32)
    for norm in (NormConfig(), NormConfig("group", "group", True, group_size=2)):
        got = np.asarray(normalize(poisoned, mask, norm))
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, np.asarray(normalize(x, mask, norm)))
        assert (got[~mask] == 0).all()


def test_small_counts_are_finite():
    x = np.array([[3.0, 7.0]], np.float32)
    one = np.array([[True, False]])
    for norm in (NormConfig(), NormConfig(std_unbiased=False), NormConfig(mean_leave1out=True)):
        got = np.asarray(normalize(x, one, norm))
        assert np.isfinite(got).all(), norm
    # n = 1, unbiased: std is 1, so the lone entry is centred to 0 and divided by 1 + eps.
    np.testing.assert_allclose(normalize(x, one, NormConfig()), [[0.0, 0.0]])
    # Leave-one-out with n = 1 subtracts 0.
    np.testing.assert_allclose(normalize(x, one, NormConfig(mean_leave1out=True)), [[3.0 / (1 + 1e-5), 0.0]],
                               rtol=1e-6)


def test_all_masked_input_is_returned_unchanged():
    x = np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)
    np.testing.assert_array_equal(normalize(x, np.zeros((2, 2), bool), NormConfig()), x)


def test_two_pass_variance_survives_a_large_offset():
    # E[x^2] - E[x]^2 in float32 loses every digit here; two passes keep them.
    x = (1e4 + np.array([[0.0, 1.0, 2.0, 3.0]])).astype(np.float32)
    got = normalize(x, None, NormConfig(std_unbiased=False, eps=0.0))
    want = (np.arange(4) - 1.5) / np.sqrt(1.25)
    np.testing.assert_allclose(got[0], want, rtol=1e-4)


def test_bf16_input_gives_float32():
    x = jnp.asarray(np.linspace(-2, 2, 12).reshape(3, 4), jnp.bfloat16)
    got = normalize(x, None, NormConfig())
    assert got.dtype == jnp.float32
    want = reference.normalize(np.asarray(x, np.float64), np.ones((3, 4), bool))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs,key", [(dict(mean_level="row"), "mean_level"), (dict(std_level="all"), "std_level"),
                                        (dict(eps=float("nan")), "eps"), (dict(group_size=0), "group_size")])
def test_norm_config_validation(kwargs, key):
    with pytest.raises(ValueError, match=key):
        NormConfig(**kwargs)


def test_group_sizes_are_checked_under_jit_too():
    # Issue 11.9: [2, 5] for 4 rows was silently accepted under jit; one check serves eager and jitted calls.
    x = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match="sum to the batch size 4"):
        normalize(x, None, NormConfig("group", "group"), group_sizes=[2, 5])

    @jax.jit
    def step(x, sizes):
        return normalize(x, None, NormConfig("group", "group"), group_sizes=sizes)

    with pytest.raises(Exception, match="sum to the batch size 4"):
        jax.block_until_ready(step(x, jnp.array([2, 5])))
    step(x, jnp.array([2, 2]))
