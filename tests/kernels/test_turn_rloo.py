"""Issue 59.4: credit_assignment turn_rloo's refusals and a worked batch (the option matrix runs it against its
float64 reference with every other stage; tests/test_audit.py proves it unbiased under variable turn counts)."""

import numpy as np
import pytest
import reference

import prm_jax
from prm_jax.errors import ConfigError


def test_it_replaces_gae_so_the_turn_unit_is_refused_naming_both_keys():
    with pytest.raises(ConfigError, match=r"gae_timestep_unit 'turn'.*credit_assignment\.mode"):
        prm_jax.AdvantageConfig(credit_assignment={"mode": "turn_rloo"}, gae_timestep_unit="turn")


def batch():
    """Three rows of one group: row 0 takes two turns and earns 1, row 1 one turn and 0, row 2 two turns and 2
    (a tool's output, untrained, between turns)."""
    return {"attention_mask": np.array([[1] * 6, [1] * 3 + [0] * 3, [1] * 6], np.int32),
            "loss_mask": np.array([[0, 1, 1, 0, 1, 1], [0, 1, 1, 0, 0, 0], [0, 1, 0, 0, 1, 1]], np.int32),
            "turn_ids": np.array([[-1, 0, 0, -1, 1, 1], [-1, 0, 0, -1, -1, -1], [-1, 0, -1, -1, 1, 1]]),
            "logprobs": np.zeros((3, 6), np.float32), "rewards": np.array([1.0, 0.0, 2.0], np.float32),
            "is_truncated": np.zeros(3, bool), "group_sizes": np.array([3], np.int32)}


def test_each_turn_gets_its_return_less_the_other_rows_mean_return_at_that_turn():
    # Turn 0: returns 1, 0, 2, so baselines (0 + 2) / 2 = 1, 1.5, 0.5 and advantages 0, -1.5, 1.5; turn 1 (rows 0
    # and 2 reach it): returns 1 and 2, each the other's baseline: -1 and 1.
    config = prm_jax.AdvantageConfig(credit_assignment={"mode": "turn_rloo"}, kl_ctl=0.0, adv_norm=None)
    out = prm_jax.compute_advantages(batch(), config)
    want = [[0.0, 0.0, 0.0, -1.0, -1.0, 0.0], [-1.5, -1.5, 0.0, 0.0, 0.0, 0.0], [1.5, 0.0, 0.0, 1.0, 1.0, 0.0]]
    np.testing.assert_allclose(np.asarray(out.advantages), want, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.returns)[0], [1.0, 1.0, 0.0, 1.0, 1.0, 0.0], atol=1e-6)
    b = batch()
    m = reference.shift(b["loss_mask"].astype(bool), fill=False)
    tids = reference.shift(b["turn_ids"], -1)
    rewards = np.zeros((3, 6))
    rewards[[0, 1, 2], [4, 1, 4]] = b["rewards"]  # (the outcome at timestep seqlen - 2)
    advantages, _ = reference.turn_rloo(rewards, m, tids, 1.0, [0, 0, 0], [True] * 3)
    np.testing.assert_allclose(advantages, want, atol=1e-12)
    assert int(out.diagnostics["turn_rloo/turns_without_baseline"]) == 0


def test_without_turn_ids_it_is_refused_naming_them():
    b = batch()
    del b["turn_ids"]
    with pytest.raises(ValueError, match="turn_ids"):
        prm_jax.compute_advantages(b, prm_jax.AdvantageConfig(credit_assignment={"mode": "turn_rloo"}, kl_ctl=0.0))
