"""PRIME's implicit process rewards and recipe (issue 22.4) against the float64 loops of ``tests/reference.py``."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference

from prm_jax.credit import implicit_process_rewards
from prm_jax.kernels._prime import _prime_core
from prm_jax.kernels._recurrence import ScanStrategy

SCAN = ScanStrategy("scan", "scan")  # the path chosen by argument (issue 31.3)


def batch(rng, rows=6, width=20):
    mask = np.zeros((rows, width), bool)
    for b in range(rows):
        start = int(rng.integers(0, 4))
        length = int(rng.integers(0, width - start))
        mask[b, start:start + length] = True
        if length > 4:  # a multi-turn row: a gap of user/tool timesteps
            mask[b, start + 2] = False
    prm = rng.normal(-1, 0.5, (rows, width)).astype(np.float32)
    ref = rng.normal(-1, 0.5, (rows, width)).astype(np.float32)
    return prm, ref, mask, rng.integers(0, 2, rows).astype(np.float32)


@pytest.mark.parametrize("lam,use_gt", [(0.0, False), (0.9, False), (0.9, True), (1.0, True)])
def test_implicit_rewards_match_the_loop(lam, use_gt):
    rng = np.random.default_rng(int(lam * 10) + use_gt)
    prm, ref, mask, outcome = batch(rng)
    got = implicit_process_rewards(prm, ref, mask, beta=0.05, lam=lam, outcome=outcome if use_gt else None)
    want = reference.implicit_rewards(prm, ref, mask, 0.05, lam, outcome if use_gt else None)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_the_last_trained_token_gets_no_reward_and_padding_changes_nothing():
    prm = np.array([[-0.5, -1.0, -2.0, 0.0]], np.float32)
    ref = np.zeros((1, 4), np.float32)
    got = np.asarray(implicit_process_rewards(prm, ref, np.array([[1, 1, 1, 0]]), beta=1.0))
    np.testing.assert_allclose(got, [[-0.5, -1.0, 0.0, 0.0]])  # verl drops the last token's reward
    one = np.asarray(implicit_process_rewards(prm[:, :1], ref[:, :1], np.ones((1, 1)), beta=1.0))
    assert one.tolist() == [[0.0]]  # a one-token response gets none
    padded = np.asarray(implicit_process_rewards(np.pad(prm, ((0, 0), (0, 3)), constant_values=np.nan),
                                                 np.pad(ref, ((0, 0), (0, 3))), np.array([[1, 1, 1, 0, 0, 0, 0]]),
                                                 beta=1.0))
    np.testing.assert_allclose(padded[:, :4], got)


@pytest.mark.parametrize("batch_norm", [True, False])
@pytest.mark.parametrize("lam,use_gt", [(0.0, False), (0.8, True)])
@pytest.mark.parametrize("dpo,gt", [(5.0, 5.0), (0.0, 5.0), (5.0, 0.0)])
def test_the_recipe_matches_the_loop(batch_norm, lam, use_gt, dpo, gt):
    rng = np.random.default_rng(11)
    prm, ref, mask, outcome = batch(rng, rows=8)
    mask[:, 1] = True  # every row trains on something
    groups = np.arange(8) // 4
    out, check = _prime_core(jnp.asarray(prm), jnp.asarray(ref), jnp.asarray(outcome), jnp.asarray(mask),
                            jnp.ones(8, bool), jnp.asarray(groups, jnp.int32), 8, beta=0.05, lam=lam, use_gt=use_gt,
                            dpo_coef=dpo, gt_coef=gt, batch_norm=batch_norm, strategy=SCAN)
    want_adv, want_ret, want_s = reference.prime(prm, ref, outcome, mask, groups, beta=0.05, lam=lam, use_gt=use_gt,
                                                 dpo_coef=dpo, gt_coef=gt, batch_norm=batch_norm)
    np.testing.assert_allclose(out.rewards, want_s, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(out.returns, want_ret, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(out.advantages, want_adv, rtol=2e-4, atol=2e-4)
    assert int(check.count) == 0


def test_all_equal_outcomes_and_zero_implicit_rewards_give_zero():
    mask = np.ones((4, 5), bool)
    same = np.zeros((4, 5), np.float32)
    out, _ = _prime_core(jnp.asarray(same), jnp.asarray(same), jnp.ones(4, jnp.float32), jnp.asarray(mask),
                        jnp.ones(4, bool), jnp.zeros(4, jnp.int32), 1, beta=0.05, lam=0.0, use_gt=False,
                        dpo_coef=5.0, gt_coef=5.0, batch_norm=True, strategy=SCAN)
    np.testing.assert_array_equal(out.advantages, 0)


def test_a_group_of_one_is_refused():
    mask = np.ones((3, 4), bool)
    x = jnp.zeros((3, 4), jnp.float32)
    out, check = _prime_core(x, x, jnp.asarray([1.0, 0.0, 1.0]), jnp.asarray(mask), jnp.ones(3, bool),
                            jnp.asarray([0, 0, 1], jnp.int32), 3, beta=0.05, lam=0.0, use_gt=False, dpo_coef=5.0,
                            gt_coef=5.0, batch_norm=True, strategy=SCAN)
    assert int(check.count) == 1 and "row 2 is alone" in check.message(*[np.asarray(d) for d in check.details])
    np.testing.assert_array_equal(np.asarray(out.advantages)[2], 0)


def test_jit_vmap_bfloat16_no_retrace():
    from prm_jax.kernels._prime import _implicit_rewards_core
    rng = np.random.default_rng(5)
    fn = jax.jit(chex.assert_max_traces(
        lambda p, r, m: jax.vmap(lambda a, b, c: _implicit_rewards_core(a[None], b[None], c[None], 0.05, 0.9,
                                                                       None, SCAN)[0])(p, r, m), n=1))
    for _ in range(2):
        prm, ref, mask, _ = batch(rng)
        np.testing.assert_allclose(fn(prm, ref, mask), reference.implicit_rewards(prm, ref, mask, 0.05, 0.9),
                                   rtol=2e-5, atol=1e-6)
    low = jnp.asarray(prm, jnp.bfloat16)
    out = implicit_process_rewards(low, ref, mask, beta=0.05)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, reference.implicit_rewards(np.asarray(low, np.float32), ref, mask, 0.05),
                               rtol=2e-5, atol=1e-6)
    with pytest.raises(ValueError, match="prm_logprobs must be finite"):
        implicit_process_rewards(np.where(mask, np.nan, prm), ref, mask)
