"""The backward linear recurrence and its scan methods (``prm_jax.kernels.recurrence``)."""

import jax.numpy as jnp
import numpy as np

import prm_jax


def test_linear_recurrence_methods_agree_on_general_coefficients():
    rng = np.random.default_rng(4)
    coeffs = jnp.asarray(rng.uniform(-1, 1, size=(3, 77)), jnp.float32)
    offsets = jnp.asarray(rng.normal(size=(3, 77)), jnp.float32)
    init = jnp.asarray(rng.normal(size=3), jnp.float32)
    want = np.zeros((3, 77))
    for b in range(3):
        x = float(init[b])
        for t in reversed(range(77)):
            x = float(coeffs[b, t]) * x + float(offsets[b, t])
            want[b, t] = x
    for method in ("scan", "associative", "blocked"):
        got = prm_jax.kernels.backward_linear_recurrence(coeffs, offsets, init, method=method, block_size=10)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
