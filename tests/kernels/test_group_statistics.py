"""Issue 31.4: the group statistics are primitives (``segment_moments`` with ``ddof``, ``z_score`` with its rule
for a group of one) that whitening, GDPO and GiGPO call; checked against float64 loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prm_jax.kernels.normalization import leave_one_out_affine, leave_one_out_mean, segment_moments, z_score


def loop_moments(x, present, segment, num_segments, ddof):
    x, present = np.asarray(x, np.float64), np.asarray(present, bool)
    segment = np.zeros(x.shape[0], int) if segment is None else np.asarray(segment)
    n, total, mean, var = (np.zeros(x.shape) for _ in range(4))
    for g in range(num_segments):
        rows = segment == g
        for idx in np.ndindex(x.shape[1:]):
            cols = (rows,) + idx
            values = x[cols][present[cols]]
            count = values.size
            m = values.sum() / max(count, 1)
            v = ((values - m) ** 2).sum() / max(count - ddof, 1)
            n[cols], total[cols], mean[cols], var[cols] = count, values.sum(), m, v
    return n, total, mean, np.where(present, x - mean, 0.0), var


@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("grouped", [False, True])
def test_segment_moments_match_a_float64_loop(ddof, grouped):
    rng = np.random.default_rng(ddof + 2 * grouped)
    x = rng.normal(size=(12, 3)).astype(np.float32)
    present = rng.random((12, 3)) < 0.7
    present[5] = False  # an entry of nothing
    segment = rng.integers(0, 4, size=12).astype(np.int32) if grouped else None
    segment_ = None if segment is None else jnp.asarray(segment)
    got = jax.jit(lambda x, p, s: segment_moments(x, p, s, 4 if grouped else 1, ddof=ddof))(x, present, segment_)
    if grouped:
        want = loop_moments(x, present, segment, 4, ddof)
    else:  # one set of scalars over every present entry
        n, total, mean, _, var = loop_moments(x.reshape(-1, 1), present.reshape(-1, 1), None, 1, ddof)
        want = (n[0, 0], total[0, 0], mean[0, 0], np.where(present, x - mean[0, 0], 0.0), var[0, 0])
    for name, g, w in zip(("n", "total", "mean", "centred", "var"), got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_given_center_takes_the_deviations():
    # (AReaL's leave-one-out mean is such a center: normalize_core's std is taken around it.)
    x = jnp.asarray([1.0, 2.0, 4.0, 9.0], jnp.float32)
    present = jnp.asarray([True, True, True, False])
    center = jnp.asarray([0.5, 1.0, 2.0, 3.0], jnp.float32)
    got = segment_moments(x, present, ddof=1, center=center)
    np.testing.assert_allclose(np.asarray(got.centred), [0.5, 1.0, 2.0, 0.0])
    np.testing.assert_allclose(float(got.var), (0.25 + 1.0 + 4.0) / 2, rtol=1e-6)
    assert float(got.mean) == pytest.approx(7 / 3)


def test_masked_values_change_no_moment():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(8,)).astype(np.float32)
    present = rng.random(8) < 0.5
    junk = np.where(present, x, np.float32(1e30))
    a, b = segment_moments(jnp.asarray(x), jnp.asarray(present), ddof=1), segment_moments(
        jnp.asarray(junk), jnp.asarray(present), ddof=1)
    for left, right in zip(a, b):
        np.testing.assert_array_equal(np.asarray(left), np.asarray(right))


@pytest.mark.parametrize("scale", [True, False])
def test_z_score_states_its_rule_for_a_group_of_one(scale):
    x = jnp.asarray([2.0, 4.0, 7.0], jnp.float32)
    mean, std = jnp.asarray([3.0, 3.0, 9.0], jnp.float32), jnp.asarray([1.0, 1.0, 5.0], jnp.float32)
    alone = jnp.asarray([False, False, True])
    eps = 0.5
    scored = [(2 - 3) / (1 + eps), (4 - 3) / (1 + eps)] if scale else [-1.0, 1.0]
    zero = z_score(x, mean, std, eps, alone, alone_rule="zero", scale=scale)
    itself = z_score(x, mean, std, eps, alone, alone_rule="itself", scale=scale)
    np.testing.assert_allclose(np.asarray(zero), scored + [0.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(itself), scored + [7 / (1 + eps) if scale else 7.0], rtol=1e-6)


def test_leave_one_out_mean_and_verls_affine_form_match_a_float64_loop():
    # PRIME's RLOO (verl): x_i - mean of the others = x_i n / (n - 1) - sum_j x_j / (n - 1); the affine form
    # applies to any linear image of x (PRIME's sums over timesteps). Group 3 has one member, row 7 none.
    x = np.array([1.0, 2.0, 4.0, -3.0, 0.5, 7.0, 2.5, 9.0], np.float32)
    group = np.array([0, 0, 0, 1, 1, 3, 2, 2], np.int32)
    members = np.array([True, True, True, True, True, True, True, False])
    mean, alone = jax.jit(lambda *a: leave_one_out_mean(*a, 4))(x, members, group)
    scale, others = jax.jit(lambda *a: leave_one_out_affine(*a, 4))(x, members, group)
    for i in range(8):
        peers = [float(x[j]) for j in range(8) if j != i and members[j] and group[j] == group[i]]
        n = sum(1 for j in range(8) if members[j] and group[j] == group[i])
        total = sum(float(x[j]) for j in range(8) if members[j] and group[j] == group[i])
        assert bool(alone[i]) == (n <= 1)
        np.testing.assert_allclose(float(mean[i]), np.mean(peers) if n > 1 else 0.0, rtol=1e-6)
        np.testing.assert_allclose((float(scale[i]), float(others[i])), (n / max(n - 1, 1), total / max(n - 1, 1)),
                                   rtol=1e-6)
        if n > 1 and members[i]:  # the affine form is the leave-one-out difference
            np.testing.assert_allclose(float(x[i] * scale[i] - others[i]), float(x[i]) - np.mean(peers), rtol=1e-5)
