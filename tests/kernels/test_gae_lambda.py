"""Issue 31.10: ``prm_jax.kernels.gae_lambda`` (AReaL's per-row lambda functions) on its own, against the
formulas in its docstring computed in float64 here."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from prm_jax.errors import ConfigError
from prm_jax.kernels.gae_lambda import constant_gae_lambda, relative_position_gae_lambda, vapo_length_adaptive_gae

LENGTHS = [0, 1, 2, 3, 10, 1000]


def context(lengths):
    lengths = jnp.asarray(lengths, jnp.int32)
    return {"effective_token_lengths": lengths, "turn_counts": lengths, "timestep_lengths": lengths}


@pytest.mark.parametrize("alpha", [0.05, 1.0, 3.0])
def test_vapo_is_max_0_one_minus_one_over_alpha_l_and_0_for_an_empty_row(alpha):
    expected = [0.0 if n == 0 else max(0.0, 1 - 1 / (alpha * n)) for n in LENGTHS]
    np.testing.assert_allclose(vapo_length_adaptive_gae(context(LENGTHS), alpha=alpha), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("q", [0.1, 0.5, 1.0])
def test_relative_position_keeps_q_at_the_first_timestep_whatever_the_length(q):
    expected = [0.0 if n == 0 else 1.0 if n == 1 else q ** (1 / (n - 1)) for n in LENGTHS]
    out = np.asarray(relative_position_gae_lambda(context(LENGTHS), q=q), np.float64)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    for n, lam in zip(LENGTHS, out):  # the product over the L - 1 steps back to the first timestep is q
        if n >= 2:
            assert math.isclose(lam ** (n - 1), q, rel_tol=1e-4)


def test_constant_is_the_value_on_every_row():
    assert constant_gae_lambda(context(LENGTHS), value=0.95).tolist() == [np.float32(0.95)] * len(LENGTHS)


@pytest.mark.parametrize("fn,kwargs,needle", [
    (vapo_length_adaptive_gae, {"alpha": 0.0}, "alpha must be > 0"),
    (relative_position_gae_lambda, {"q": 0.0}, r"q must be in \(0, 1\]"),
    (relative_position_gae_lambda, {"q": 1.5}, r"q must be in \(0, 1\]"),
    (constant_gae_lambda, {"value": float("nan")}, "value"),
])
def test_bad_parameters_are_config_errors_naming_them(fn, kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        fn(context(LENGTHS), **kwargs)
