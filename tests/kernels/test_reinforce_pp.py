"""Issue 44.2: REINFORCE++ with its return carried across tool outputs (verl's #7300) and REINFORCE++-baseline,
as ``prm_jax.credit.reinforce_pp`` and as the credit modes ``reinforce_pp`` / ``reinforce_pp_baseline``,
against the worked numbers of the authors' code and a float64 loop (``reference.reinforce_pp``). The option matrix runs
both modes against the pipeline's reference (tests/kernels/test_matrix.py)."""

import chex
import jax
import numpy as np
import pytest
import reference
from batches import make_batch

import prm_jax
from prm_jax.config import AdvantageConfig
from prm_jax.credit import reinforce_pp

HOLE = np.array([[1, 1, 0, 0, 1, 1]], bool)


def test_the_return_crosses_a_tool_output_unchanged_as_in_verls_issue_7278():
    # verl's REINFORCE++ after its fix #7300 (verl-project/verl @ 1dda039b, core_algos.py
    # compute_reinforce_plus_plus_outcome_advantage; arXiv 2501.03262): m = (1,1,0,0,1,1), r = (0,0,0,0,0,1), gamma 0.9 -> G =
    # (.729, .81, 0, 0, .9, 1); the rule
    # before #7300 cut the return at the hole and gave (0, 0, 0, .81, .9, 1).
    out = reinforce_pp(np.array([[0, 0, 0, 0, 0, 1.0]], np.float32), HOLE, gamma=0.9)
    np.testing.assert_allclose(np.asarray(out.returns), [[0.729, 0.81, 0, 0, 0.9, 1]], rtol=1e-6)
    want, _ = reference.reinforce_pp(np.array([[0, 0, 0, 0, 0, 1.0]]), HOLE, 0.9, [0], [True])
    np.testing.assert_allclose(np.asarray(out.advantages), want, rtol=1e-5, atol=1e-6)
    assert int(out.degenerate) == 0


def test_a_reward_on_a_masked_token_is_not_read():
    rewards = np.array([[0, 0, 7.0, np.nan, 0, 1]], np.float32)  # (NaN on a hole: replaced before any arithmetic)
    out = reinforce_pp(rewards, HOLE, gamma=0.9)
    np.testing.assert_allclose(np.asarray(out.returns), [[0.729, 0.81, 0, 0, 0.9, 1]], rtol=1e-6)
    assert np.isfinite(np.asarray(out.advantages)).all()


@pytest.mark.parametrize("baseline", [False, True])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_both_variants_match_a_float64_loop_on_rows_with_holes_groups_of_one_and_empty_rows(baseline, gamma):
    rng = np.random.default_rng(int(baseline) + 2 * int(gamma == 1.0))
    rows, width = 7, 24
    mask = rng.random((rows, width)) < 0.6
    mask[3] = False  # an empty row: counted in its group's mean by the baseline variant
    rewards = rng.normal(size=(rows, width)).astype(np.float32)
    sizes = np.array([3, 3, 1], np.int32)  # the last row is a group of one: its raw score
    out = reinforce_pp(rewards, mask, gamma=gamma, baseline=baseline, group_sizes=sizes)
    groups = np.repeat(np.arange(3), sizes).tolist()
    want_a, want_r = reference.reinforce_pp(rewards.astype(np.float64), mask, gamma, groups, [True] * rows, baseline)
    np.testing.assert_allclose(np.asarray(out.advantages), want_a, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(out.returns), want_r, rtol=2e-5, atol=2e-5)
    assert (np.asarray(out.advantages)[~mask] == 0).all()


def test_without_groups_the_batch_is_one_group():
    rng = np.random.default_rng(6)
    rewards, mask = rng.normal(size=(5, 9)).astype(np.float32), rng.random((5, 9)) < 0.7
    alone = reinforce_pp(rewards, mask, baseline=True)
    whole = reinforce_pp(rewards, mask, baseline=True, group_sizes=np.array([5], np.int32))
    np.testing.assert_array_equal(np.asarray(alone.advantages), np.asarray(whole.advantages))


def test_group_ids_give_the_groups_group_sizes_give():
    rng = np.random.default_rng(5)
    rewards, mask = rng.normal(size=(4, 10)).astype(np.float32), rng.random((4, 10)) < 0.7
    by_sizes = reinforce_pp(rewards, mask, baseline=True, group_sizes=np.array([2, 2], np.int32))
    by_ids = reinforce_pp(rewards, mask, baseline=True, group_ids=np.array([0, 0, 1, 1], np.int32))
    np.testing.assert_allclose(np.asarray(by_sizes.advantages), np.asarray(by_ids.advantages), rtol=1e-6, atol=1e-7)


def test_degenerate_batches_give_zero_and_are_counted():
    # verl raises for fewer than two valid tokens; prm-jax's rules where verl's break (the credit-assignment guide states each):
    # 0 and a diagnostic. Constant returns: 0.
    one = reinforce_pp(np.ones((1, 4), np.float32), np.array([[0, 0, 1, 0]], bool))
    assert int(one.degenerate) == 1 and (np.asarray(one.advantages) == 0).all()
    none = reinforce_pp(np.ones((2, 4), np.float32), np.zeros((2, 4), bool))
    assert int(none.degenerate) == 1 and (np.asarray(none.advantages) == 0).all()
    flat = reinforce_pp(np.array([[0, 0, 1.0], [0, 0, 1.0]], np.float32), np.array([[0, 0, 1], [0, 0, 1]], bool))
    assert int(flat.degenerate) == 0 and (np.asarray(flat.advantages) == 0).all()


def test_bad_input_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="token_rewards must be finite"):
        reinforce_pp(np.array([[np.inf, 1.0]], np.float32), np.ones((1, 2), bool))
    with pytest.raises(ValueError, match="gamma"):
        reinforce_pp(np.ones((1, 2), np.float32), np.ones((1, 2), bool), gamma=1.5)
    with pytest.raises(ValueError, match="mask"):
        reinforce_pp(np.ones((1, 2), np.float32), np.ones((1, 3), bool))


@pytest.mark.parametrize("mode", ["reinforce_pp", "reinforce_pp_baseline"])
def test_the_credit_modes_run_in_the_pipeline_without_retracing_and_report_degenerate_batches(mode):
    batch = make_batch(np.random.default_rng(11), rows=4, width=16)
    config = AdvantageConfig(credit_assignment={"mode": mode}, discount=0.9, kl_ctl=0.0)
    chex.clear_trace_counter()
    step = chex.assert_max_traces(lambda b: prm_jax.compute_advantages(b, config), n=1)
    jitted = jax.jit(step)
    out = jitted(batch)
    jitted(dict(batch, rewards=np.asarray(batch["rewards"]) + 1))
    want = reference.compute_advantages(batch, {"credit_assignment": {"mode": mode}, "discount": 0.9, "kl_ctl": 0.0})
    np.testing.assert_allclose(np.asarray(out.advantages), want["advantages"], rtol=2e-5, atol=2e-5)
    assert int(out.diagnostics["reinforce_pp/degenerate"]) == 0
    empty = dict(batch, loss_mask=np.zeros_like(batch["loss_mask"]))
    assert int(prm_jax.compute_advantages(empty, config).diagnostics["reinforce_pp/degenerate"]) == 1


def test_groups_that_do_not_cover_the_batch_are_refused():
    # (The review of issue 44: the kernels' groups go through the one check of group_sizes and group_ids.)
    with pytest.raises(ValueError, match="group_sizes"):
        reinforce_pp(np.ones((4, 3), np.float32), np.ones((4, 3), bool), baseline=True,
                     group_sizes=np.array([2, 1], np.int32))
    with pytest.raises(ValueError, match="group_ids"):
        reinforce_pp(np.ones((2, 3), np.float32), np.ones((2, 3), bool), baseline=True,
                     group_ids=np.array([0, 5], np.int32))


@pytest.mark.parametrize("baseline", [False, True])
@pytest.mark.parametrize("scale", [1e20, 1e30, 3e37])
def test_rewards_near_float32s_range_whiten_finite_as_the_float64_loop(baseline, scale):
    # Issue 55.6: finite rewards of 1e20 gave all-NaN advantages (the whitening's variance overflowed float32),
    # while compute_advantages stayed finite. The whitening scales by a power of two: the float64 loop's values.
    rng = np.random.default_rng(int(baseline))
    mask = rng.random((5, 8)) < 0.7
    mask[1] = False
    rewards = (rng.normal(size=(5, 8)) * scale / (8 if baseline else 20)).astype(np.float32)
    out = reinforce_pp(rewards, mask, gamma=1.0 if baseline else 0.9, baseline=baseline,
                       group_sizes=np.array([2, 3], np.int32))
    want_a, _ = reference.reinforce_pp(rewards.astype(np.float64), mask, 1.0 if baseline else 0.9,
                                       [0, 0, 1, 1, 1], [True] * 5, baseline)
    assert np.isfinite(np.asarray(out.advantages)).all()
    np.testing.assert_allclose(np.asarray(out.advantages), want_a, rtol=2e-5, atol=2e-5)


def test_the_pipeline_and_the_kernel_whiten_alike_at_1e20():
    # One whitening for both: compute_advantages with mode reinforce_pp on rewards of 1e20 gives the kernel's.
    batch = {"attention_mask": np.ones((3, 4), np.int32), "loss_mask": np.array([[0, 1, 1, 1]] * 3, np.int32),
             "logprobs": np.full((3, 4), -1.0, np.float32), "rewards": np.array([1e20, -3e19, 5e19], np.float32),
             "is_truncated": np.zeros(3, bool)}
    config = AdvantageConfig(credit_assignment={"mode": "reinforce_pp"}, kl_ctl=0.0, discount=0.9,
                             reward_clip=1e38)
    out = prm_jax.compute_advantages(batch, config)
    token_rewards = np.zeros((3, 4), np.float32)
    token_rewards[:, 2] = batch["rewards"]  # (on timesteps: the last generated token's reward, one step earlier)
    kernel = reinforce_pp(token_rewards[:, :3], np.ones((3, 3), bool), gamma=0.9)
    assert np.isfinite(np.asarray(out.advantages)).all()
    np.testing.assert_allclose(np.asarray(out.advantages)[:, :3], np.asarray(kernel.advantages), rtol=1e-5, atol=1e-6)
