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
