"""Issue 31.4: the group statistics are primitives (``segment_moments`` with ``ddof``, ``z_score`` with its rule
for a group of one) that whitening, GDPO and GiGPO call; checked against float64 loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prm_jax.kernels._normalization import leave_one_out_affine, leave_one_out_mean, segment_moments, z_score


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


# ---- The float32 range: a z-score whose statistics overflow is an error (or counted), never zeros ----

HUGE = np.float32(2.0**70)  # finite in float32; its squares are not (about 1.4e42 > 3.4e38)


def spread_rewards():
    return np.array([0.3, -1.2, 0.8, 0.1, -0.5, 2.0, 1.1, -0.7], np.float32)


def test_an_overflowing_variance_is_nan_not_a_zero_z_score():
    # Before: the variance overflowed to inf, and x / (inf + eps) gave every entry a z-score of 0.
    x = spread_rewards() * HUGE
    moments = segment_moments(jnp.asarray(x), jnp.ones(8, bool), ddof=1)
    assert np.isnan(float(moments.var))
    ok = segment_moments(jnp.asarray(spread_rewards()), jnp.ones(8, bool), ddof=1)
    np.testing.assert_allclose(float(ok.var), np.var(spread_rewards().astype(np.float64), ddof=1), rtol=1e-6)


def test_the_single_normalization_kernels_give_nan_where_their_statistics_overflow_never_zeros():
    # They check no values (for speed: compute_advantages is the checked entry point), so their answer to
    # statistics beyond float32 is NaN; before, it was a z-score of 0 for every entry.
    from prm_jax.config import GiGPOConfig
    from prm_jax.credit import decoupled_normalization, gigpo
    from prm_jax.kernels import normalize
    from prm_jax.kernels._normalization import NormConfig

    x = spread_rewards()
    for norm in (NormConfig(), NormConfig("group", "group", group_size=4)):
        assert np.abs(np.asarray(normalize(x, norm=norm))).max() > 0.5  # the same values, unscaled: fine
        assert np.isnan(np.asarray(normalize(x * HUGE, norm=norm))).all()
    rewards = np.stack([x, x[::-1]], axis=1)
    groups = np.repeat(np.arange(2), 4)
    assert np.abs(np.asarray(decoupled_normalization(rewards, None, groups))).max() > 0.5
    assert np.isnan(np.asarray(decoupled_normalization(rewards * HUGE, None, groups))).all()
    turns, mask, z_scored = np.zeros((8, 2), np.float32), np.ones((8, 2), bool), GiGPOConfig(norm="mean_std_norm")
    assert np.abs(np.asarray(gigpo(turns, mask, x, config=z_scored).advantages)).max() > 0.5
    assert np.isnan(np.asarray(gigpo(turns, mask, x * HUGE, config=z_scored).advantages)).all()  # the episode's
    steps = np.asarray(gigpo(np.tile(x[:, None], (1, 2)) * HUGE, mask, np.zeros(8, np.float32), config=z_scored)
                       .step_advantages)
    assert np.isnan(steps).all()  # the step groups' statistics
    # mean_norm divides by no std: the same huge rewards give their exact differences from the mean.
    centred = np.asarray(gigpo(turns, mask, x * HUGE).advantages)[:, 0]
    np.testing.assert_allclose(centred, (x * HUGE).astype(np.float64) - (x * HUGE).astype(np.float64).mean(), rtol=1e-6)


def test_a_normalization_with_eps_0_over_equal_values_is_named_in_the_pipelines_check():
    from prm_jax import AdvantageConfig, compute_advantages

    batch = {"attention_mask": np.ones((4, 5), np.int32), "loss_mask": np.array([[0, 1, 1, 1, 1]] * 4, np.int32),
             "logprobs": np.zeros((4, 5), np.float32), "rewards": np.full(4, 0.5, np.float32),
             "is_truncated": np.zeros(4, bool)}
    config = AdvantageConfig(kl_ctl=0.0, reward_norm={"mean_level": "batch", "std_level": "batch", "eps": 0.0})
    with pytest.raises(ValueError, match=r"a float32 overflow inside a stage .*\(Or a normalization with eps 0 over a "
                                         r"group of equal values: 0 / 0"):
        compute_advantages(batch, config)
    with_eps = AdvantageConfig(kl_ctl=0.0, reward_norm={"mean_level": "batch", "std_level": "batch"})  # eps 1e-5
    np.testing.assert_array_equal(np.asarray(compute_advantages(batch, with_eps).advantages), 0.0)


@pytest.mark.parametrize("credit", ["group_norm", "gigpo", "pure", "prime"])
def test_the_pipelines_overflowing_statistics_are_raised_eagerly_and_counted_under_jit(credit):
    # Rewards of 2**70 (reward_clip raised to let them through; PURE's come as process rewards): every
    # z-score of these stages gave 0 before, a finite and wrong advantage that no check counted.
    from prm_jax import AdvantageConfig, compute_advantages

    rows, width = 4, 6
    loss = np.array([[0, 1, 1, 1, 1, 1]] * rows, np.int32)
    batch = {"attention_mask": np.ones((rows, width), np.int32), "loss_mask": loss,
             "logprobs": np.zeros((rows, width), np.float32), "rewards": spread_rewards()[:rows] * HUGE,
             "is_truncated": np.zeros(rows, bool), "group_sizes": np.array([2, 2], np.int32),
             "turn_ids": np.array([[-1, 0, 0, 1, 1, 1]] * rows, np.int32)}
    fields = {"group_norm": {"reward_norm": {"mean_level": "group", "std_level": "group"}},
              "gigpo": {"credit_assignment": {"mode": "gigpo", "norm": "mean_std_norm"}},
              "pure": {"credit_assignment": {"mode": "pure"}},
              "prime": {"credit_assignment": {"mode": "prime"}}}[credit]
    if credit == "pure":
        batch["token_rewards"] = (np.arange(rows * width, dtype=np.float32).reshape(rows, width) * loss) * HUGE
        batch["rewards"] = spread_rewards()[:rows]
    if credit == "prime":
        batch["prm_logprobs"] = batch["ref_logprobs"] = np.zeros((rows, width), np.float32)
    config = AdvantageConfig(kl_ctl=0.0, reward_clip=3e38, **fields)
    if credit in ("pure", "prime"):
        # Issue 55.6: their whitening (verl's masked_whiten) is finite for every finite input now, scaled by a
        # power of two: the float64 pipeline's advantages, nothing to count.
        import reference

        out = compute_advantages(batch, config)
        want = reference.compute_advantages(batch, {"kl_ctl": 0.0, "reward_clip": 3e38, **fields})
        np.testing.assert_allclose(np.asarray(out.advantages), want["advantages"], rtol=1e-4, atol=1e-5)
        assert int(jax.jit(lambda b: compute_advantages(b, config))(batch).diagnostics["checks/outputs_not_finite"]) == 0
        return
    with pytest.raises(ValueError, match=r"non-finite advantage .* a float32 overflow inside a stage"):
        compute_advantages(batch, config)
    out = jax.jit(lambda b: compute_advantages(b, config))(batch)
    assert int(out.diagnostics["checks/outputs_not_finite"]) > 0


def test_the_whitening_scales_finite_values_and_leaves_a_non_finite_one_non_finite():
    # Issue 55.6's whitening: finite for every finite input (rewards of 1e20 and 3e38, scaled by a power of two),
    # verl's values below 2**32 bit for bit, and an infinite entry is never turned into a finite 0.
    from prm_jax.kernels._normalization import whiten

    active = np.ones((2, 3), bool)
    for scale in (1.0, 1e20, 3e37):
        x = np.array([[1.0, 3.0, 2.0], [-3.0, 4.0, 5.0]]) * scale
        mean, var = x.mean(), x.var(ddof=1)
        want = (x - mean) / np.sqrt(var + 1e-8)
        np.testing.assert_allclose(np.asarray(whiten(jnp.asarray(x, jnp.float32), active)), want, rtol=2e-6, atol=1e-6)
    small = jnp.asarray([[1.0, 3.0, 2.0], [-3.0, 4.0, 5.0]], jnp.float32)
    moments = segment_moments(small, jnp.asarray(active), ddof=1)
    np.testing.assert_array_equal(np.asarray(whiten(small, active)), np.asarray(moments.centred / jnp.sqrt(moments.var + 1e-8)))
    assert np.isnan(np.asarray(whiten(jnp.asarray([[1.0, np.inf, 2.0]], jnp.float32), np.ones((1, 3), bool)))).all()
