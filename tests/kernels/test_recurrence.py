"""The backward linear recurrence and its scan methods (``prm_jax.kernels._recurrence``)."""

import jax.numpy as jnp
import numpy as np
import pytest

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


@pytest.mark.parametrize("method", ["blocked", "lax"])
@pytest.mark.parametrize("width", [1, 127, 128, 200, 1000])
def test_reverse_cumsum_blocked_equals_the_loop(width, method):
    # The CPU's blocked form (a block matrix product, then block carries) and lax.cumsum, chosen by
    # argument (issue 31.3), against a plain loop.
    from prm_jax.kernels._recurrence import reverse_cumsum
    rng = np.random.default_rng(width)
    x = rng.normal(size=(3, width)).astype(np.float32)
    active = rng.random((3, width)) < 0.7
    got = np.asarray(reverse_cumsum(jnp.asarray(x), jnp.asarray(active), method))
    want = np.zeros((3, width))
    for b in range(3):
        running = 0.0
        for t in reversed(range(width)):
            if active[b, t]:
                running += float(x[b, t])
                want[b, t] = running
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
