import math

import numpy as np
import pytest
import reference

from prm_jax.kernels import kl_estimate, kl_rewards


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_match_loop_and_clamp(estimator):
    logp = np.array([[-0.1, -2.0, -30.0, -0.5]], np.float32)
    ref = np.array([[-0.3, -1.0, -0.1, -40.0]], np.float32)
    got = np.asarray(kl_estimate(logp, ref, estimator))
    want = [reference.kl(float(a), float(b), estimator) for a, b in zip(logp[0], ref[0])]
    np.testing.assert_allclose(got[0], want, rtol=1e-5)
    assert np.abs(got).max() <= 10.0


def test_kl_rewards_mask_with_where():
    logp = np.array([[np.nan, -1.0, -np.inf]], np.float32)
    ref = np.array([[0.0, -1.5, 0.0]], np.float32)
    got = np.asarray(kl_rewards(logp, ref, np.array([[0, 1, 0]]), kl_ctl=0.1))
    np.testing.assert_allclose(got, [[0.0, -0.05, 0.0]], rtol=1e-6)
    assert math.isfinite(got.sum())


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("clamp", [5.0, 10.0, 0.5])
def test_the_kl_clamp_is_configurable_and_meets_every_estimator(estimator, clamp):
    # Issue 44.5: AReaL clamps at 10, tunix at 5 (its tests); actor.kl_clamp sets it, in compute_advantages too.
    from batches import make_batch

    from prm_jax import compute_advantages
    from prm_jax.config import AdvantageConfig

    logp = np.array([[-0.1, -2.0, -30.0, -0.5]], np.float32)
    ref = np.array([[-0.3, -1.0, -0.1, -40.0]], np.float32)
    got = np.asarray(kl_estimate(logp, ref, estimator, clamp=clamp))[0]
    np.testing.assert_allclose(got, [reference.kl(float(a), float(b), estimator, clamp) for a, b in zip(logp[0], ref[0])],
                               rtol=1e-5)
    assert np.abs(got).max() <= clamp
    batch = make_batch(np.random.default_rng(44), rows=3, width=12)
    batch["ref_logprobs"] = (np.asarray(batch["logprobs"]) - 8.0).astype(np.float32)  # estimates beyond the clamp
    settings = dict(kl_ctl=0.2, kl_estimator=estimator, kl_clamp=clamp)
    out = compute_advantages(batch, AdvantageConfig(**settings))
    want = reference.compute_advantages(batch, settings)
    np.testing.assert_allclose(np.asarray(out.kl_rewards), want["kl_rewards"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.advantages), want["advantages"], rtol=1e-4, atol=1e-4)


def test_a_kl_clamp_that_is_not_a_positive_number_is_refused():
    from prm_jax.config import AdvantageConfig, ConfigError

    for bad in (0.0, -1.0, float("inf"), "5"):
        with pytest.raises(ConfigError, match="kl_clamp"):
            AdvantageConfig(kl_clamp=bad)
    with pytest.raises(ValueError, match="clamp"):
        kl_estimate(np.zeros((1, 2), np.float32), np.zeros((1, 2), np.float32), clamp=0.0)
