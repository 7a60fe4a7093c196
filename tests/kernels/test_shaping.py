import jax.numpy as jnp
import numpy as np
import pytest
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

from prm_jax import ShapingConfig
from prm_jax.kernels import shape_advantages


def case():
    a = np.array([[-1.0, -1e-7, 0.0, 1e-7, 2.0, -3.0, 0.5, -0.5, 4.0]], np.float32)
    p = np.array([[-0.1, -0.2, -1.0, -0.3, -2.0, 0.0, 0.7, 0.3, -5.0]], np.float32)
    m = np.array([[1, 1, 1, 1, 1, 1, 1, 1, 0]], bool)
    return a, p, m


def test_gvpo_rules_by_hand():
    a, p, m = case()
    got = np.asarray(shape_advantages(a, p, m, ShapingConfig("gvpo", 0.2, 0.4, 1e-6)))
    # A<-eps: (1+b)A; |A|<=eps: -z; A>eps: 0; P>=0 unchanged; masked unchanged.
    np.testing.assert_allclose(got[0], [-1.2, -0.4, -0.4, -0.4, 0.0, -3.0, 0.5, -0.5, 4.0], rtol=1e-6)


def test_process_weighted_rules_by_hand():
    a = np.array([[2.0, 0.0, -1.0, -1.0, 3.0]], np.float32)
    p = np.array([[0.5, 0.3, 0.25, 0.0, 2.0]], np.float32)
    m = np.array([[1, 1, 1, 1, 0]], bool)
    got = np.asarray(shape_advantages(a, p, m, ShapingConfig("process_weighted")))
    np.testing.assert_allclose(got[0], [1.0, 0.0, 0.25, -1.0, 3.0])


@pytest.mark.parametrize("mode", ["additive", "gvpo"])
def test_matches_loop(mode):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 20)).astype(np.float32)
    a[:, ::4] = 0.0
    p = rng.choice([-0.5, 0.0, 0.3, -1e-9], size=(5, 20)).astype(np.float32)
    m = rng.random((5, 20)) < 0.8
    shaping = ShapingConfig(mode, 0.3, 0.7, 1e-4)
    got = shape_advantages(a, p, m, shaping)
    want = reference.shape(a, p, m, mode, 0.3, 0.7, 1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_process_weighted_matches_loop(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(3, 11)).astype(np.float32)
    p = np.where(rng.random((3, 11)) < 0.3, 0.0, rng.uniform(0, 1, size=(3, 11))).astype(np.float32)
    m = rng.random((3, 11)) < 0.7
    got = shape_advantages(a, p, m, ShapingConfig("process_weighted"))
    np.testing.assert_allclose(got, reference.shape(a, p, m, "process_weighted"), rtol=1e-6)


@pytest.mark.parametrize("bad", [-0.1, 1.5, np.nan])
def test_process_weighted_range_error(bad):
    a, _, m = case()
    p = np.full_like(a, 0.5)
    p[0, 3] = bad
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        shape_advantages(a, p, m, ShapingConfig("process_weighted"))
    p[0, 3], p[0, 8] = 0.5, bad  # only on a masked timestep: fine
    shape_advantages(a, p, m, ShapingConfig("process_weighted"))


def test_only_sign_matters_for_gvpo():
    a, p, m = case()
    shaping = ShapingConfig("gvpo")
    np.testing.assert_array_equal(shape_advantages(a, p, m, shaping), shape_advantages(a, np.sign(p) * 7, m, shaping))


def test_dtype():
    a, p, m = case()
    assert shape_advantages(jnp.asarray(a, jnp.bfloat16), jnp.asarray(p, jnp.bfloat16), m).dtype == jnp.float32
