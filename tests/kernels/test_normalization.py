import itertools
from pathlib import Path

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


# ---- GDPO's decoupled normalization (issue 22.5) ----

def test_decoupled_normalization_matches_the_loop_with_missing_rewards():
    from prm_jax.credit import decoupled_normalization
    rng = np.random.default_rng(22)
    for rows, sources, size in ((8, 3, 4), (12, 2, 3), (6, 1, 2), (5, 4, 5)):
        rewards = rng.normal(size=(rows, sources)).astype(np.float32)
        rewards[rng.random((rows, sources)) < 0.25] = np.nan
        rewards[0] = np.nan  # a row with every reward missing
        weights = rng.uniform(0.5, 2, sources).astype(np.float32)
        groups = (np.arange(rows) // size).astype(np.int32)
        got = np.asarray(decoupled_normalization(rewards, weights, groups))
        want = reference.decoupled(rewards, weights, groups)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        assert got[0] == 0


def test_decoupled_normalization_takes_its_weights_as_a_list_without_a_jax_deprecation():
    # The credit guide passes weights=[1.0, 0.5]; the shape checks read it with jnp.shape, deprecated for lists
    # in jax 0.10 and a TypeError in newer releases: they read shapes with np.shape now.
    import warnings

    from prm_jax.credit import decoupled_normalization
    rewards = np.array([[1.0, 0.2], [0.0, np.nan], [1.0, 0.9], [0.0, 0.1]], np.float32)
    groups = np.array([0, 0, 1, 1], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = np.asarray(decoupled_normalization(rewards, [1.0, 0.5], groups))
    np.testing.assert_array_equal(got, np.asarray(decoupled_normalization(rewards, np.array([1.0, 0.5], np.float32),
                                                                          groups)))
    np.testing.assert_allclose(got, reference.decoupled(rewards, [1.0, 0.5], groups), rtol=1e-4, atol=1e-6)


def test_decoupled_normalization_edge_cases():
    from prm_jax.credit import decoupled_normalization
    # Groups of one: every per-source term is 0, so every advantage is 0.
    np.testing.assert_array_equal(decoupled_normalization(np.array([[1.0, 2.0], [3.0, 0.0]], np.float32),
                                                          group_ids=np.array([0, 1])), 0)
    # Zero std within every group: 0.
    np.testing.assert_allclose(decoupled_normalization(np.ones((4, 2), np.float32), group_ids=np.array([0, 0, 1, 1])),
                               0, atol=1e-7)
    # Padding rows (-1) change nothing and come out as 0; permuting groups permutes the output.
    rng = np.random.default_rng(3)
    rewards = rng.normal(size=(6, 2)).astype(np.float32)
    groups = np.array([0, 0, 0, 1, 1, 1])
    base = np.asarray(decoupled_normalization(rewards, group_ids=groups))
    padded = np.asarray(decoupled_normalization(np.concatenate([rewards, np.full((2, 2), 7.0, np.float32)]),
                                                group_ids=np.concatenate([groups, [-1, -1]])))
    np.testing.assert_allclose(padded[:6], base, rtol=1e-6, atol=1e-7)
    assert np.all(padded[6:] == 0)
    order = np.array([3, 4, 5, 0, 1, 2])
    np.testing.assert_allclose(decoupled_normalization(rewards[order], group_ids=groups), base[order], rtol=1e-6,
                               atol=1e-7)
    with pytest.raises(ValueError, match="finite or NaN"):
        decoupled_normalization(np.array([[np.inf], [0.0]], np.float32))
    # One source and no missing rewards: GRPO's group z-score, then a batch z-score.
    one = rng.normal(size=(4, 1)).astype(np.float32)
    np.testing.assert_allclose(decoupled_normalization(one, group_ids=np.array([0, 0, 1, 1])),
                               reference.decoupled(one, [1.0], [0, 0, 1, 1]), rtol=1e-5, atol=1e-6)


def test_decoupled_normalization_under_jit_and_vmap_without_retrace_and_in_bfloat16():
    import chex

    from prm_jax.credit import decoupled_normalization
    from prm_jax.kernels._normalization import _decoupled_normalization_core
    rng = np.random.default_rng(9)
    groups = jnp.asarray(np.arange(8) // 4, jnp.int32)
    real = jnp.ones(8, bool)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def batched(r):
        return jax.vmap(lambda x: _decoupled_normalization_core(x, jnp.ones(2), real, groups, 2, 1e-4)[0])(r)

    for _ in range(2):  # new contents, one trace
        rewards = rng.normal(size=(3, 8, 2)).astype(np.float32)
        rewards[rng.random((3, 8, 2)) < 0.2] = np.nan
        got = np.asarray(batched(rewards))
        for i in range(3):
            np.testing.assert_allclose(got[i], reference.decoupled(rewards[i], [1.0, 1.0], np.arange(8) // 4),
                                       rtol=2e-5, atol=2e-5)
    low = jnp.asarray(rng.normal(size=(8, 2)), jnp.bfloat16)
    out = decoupled_normalization(low, group_ids=np.arange(8) // 4)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, reference.decoupled(np.asarray(low, np.float32), [1.0, 1.0], np.arange(8) // 4),
                               rtol=1e-4, atol=1e-4)


def test_a_group_of_one_under_leave_one_out_normalizes_to_zero_where_areal_passes_x_through():
    # Issue 55.17: the decisions guide states this difference from AReaL (its test_group_size_edge_cases
    # expects x / (1 + eps) for a single-member group with mean_leave1out and std_unbiased); prm-jax gives 0.
    x = np.array([[0.7], [-1.3], [2.0]], np.float32)
    norm = NormConfig(mean_level="group", std_level="group", mean_leave1out=True, std_unbiased=True)
    out = np.asarray(normalize(x, np.ones_like(x), norm, group_sizes=[1, 2]))
    assert out[0, 0] == 0.0  # AReaL's test: 0.7 / (1 + 1e-5)
    assert abs(out[1, 0]) > 0.5 and abs(out[2, 0]) > 0.5  # the group of two: each against its peer
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "decisions.md").read_text()
    assert "test_group_size_edge_cases" in guide and "x / (1 + eps)" in guide
