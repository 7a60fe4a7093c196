"""Issue 59: the auditor's core (``prm_jax.audit``). The exact policy gradient of a tabular softmax
policy by enumeration is the finite difference of the expected reward; the pipeline's expected gradient, over
every enumerated group, equals a plain float64 loop; and the known results come out: no baseline and RLOO's
leave-one-out baseline are unbiased (scale 1), the group mean that includes the sample's own reward shrinks the
gradient to (G - 1) / G of it (Dr. GRPO, "Understanding R1-Zero-Like Training", Liu et al. 2025; RLOO),
and GRPO's per-sequence token mean biases it when the policy controls length (Dr. GRPO's length bias) where
the token sum does not, and std normalization weighs questions by their reward spread (Dr. GRPO's
question-difficulty bias)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

import prm_jax
from prm_jax.audit import Problem, compare, expected_estimate, log_prob_grads, responses, true_gradient

CONTROL = Problem("control", vocab=2, max_len=2, reward=lambda s: float(sum(s)))  # fixed length
LENGTH = Problem("length", vocab=3, max_len=3, reward=lambda s: float(s[0] == 1), eos=2)  # length free, unrewarded
THETA2 = np.array([[0.3, -0.2], [-0.4, 0.1]])
SUM = "seq-mean-token-sum"  # verl's loss_agg_mode: 1 / G a row, the plain REINFORCE sum
THETA3 = np.array([[0.2, -0.1, 0.4], [-0.3, 0.5, 0.0], [0.1, 0.2, -0.2]])


def config(**norm):
    return prm_jax.AdvantageConfig(kl_ctl=0.0, reward_norm=norm or None, adv_norm=None)


def expected_reward(problem, theta):
    return sum(np.exp(log_prob_grads(theta, s)[0]) * problem.reward(s) for s in responses(problem))


@pytest.mark.parametrize("problem, theta", [(CONTROL, THETA2), (LENGTH, THETA3)], ids=["control", "length"])
def test_the_true_gradient_is_the_finite_difference_of_the_expected_reward(problem, theta):
    step, numeric = 1e-6, np.zeros(theta.shape)
    for index in np.ndindex(theta.shape):
        up, down = theta.copy(), theta.copy()
        up[index] += step
        down[index] -= step
        numeric[index] = (expected_reward(problem, up) - expected_reward(problem, down)) / (2 * step)
    np.testing.assert_allclose(true_gradient(problem, theta), numeric, atol=1e-8)
    assert len(responses(LENGTH)) == 1 + 2 + 4 + 8  # (EOS at 1, 2 or 3 tokens, or 3 tokens without it)


def loop_estimate(problem, theta, group_size, baseline, per_token):
    """A plain float64 loop: every ordered group, each response's advantage its reward less ``baseline``
    (on every token: an outcome reward, gamma = lambda = 1), the tokens' gradients weighted by ``per_token``."""
    seqs = responses(problem)
    out = np.zeros(theta.shape)
    for group in itertools.product(seqs, repeat=group_size):
        p = np.prod([np.exp(log_prob_grads(theta, s)[0]) for s in group])
        rewards = [problem.reward(s) for s in group]
        for i, seq in enumerate(group):
            advantage = rewards[i] - baseline(rewards, i)
            weight = per_token(group, i)
            out += p * weight * advantage * log_prob_grads(theta, seq)[1].sum(axis=0)
    return out


@pytest.mark.parametrize("aggregation, per_token", [
    ("seq-mean-token-sum", lambda group, i: 1 / len(group)),
    ("seq-mean-token-mean", lambda group, i: 1 / (len(group) * len(group[i]))),
    ("token-mean", lambda group, i: 1 / sum(len(s) for s in group)),
])
def test_the_pipelines_expected_gradient_is_the_plain_loops(aggregation, per_token):
    group_mean = lambda rewards, i: float(np.mean(rewards))
    got = expected_estimate(LENGTH, THETA3, config(mean_level="group", std_level=None), 2, aggregation)
    want = loop_estimate(LENGTH, THETA3, 2, group_mean, per_token)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("norm, scale", [
    ({}, 1.0),                                                                # REINFORCE: unbiased
    ({"mean_level": "group", "std_level": None, "mean_leave1out": True}, 1.0),  # RLOO: unbiased
    ({"mean_level": "group", "std_level": None}, 3 / 4),                      # the mean with its own reward
], ids=["no-baseline", "leave-one-out", "group-mean"])
def test_the_baselines_scale_the_gradient_as_known(norm, scale):
    comparison = compare(expected_estimate(CONTROL, THETA2, config(**norm), 4, SUM), true_gradient(CONTROL, THETA2))
    assert comparison.cosine == pytest.approx(1.0, abs=1e-9) and comparison.across < 1e-6
    assert comparison.scale == pytest.approx(scale, rel=1e-6)


def test_the_per_sequence_token_mean_biases_the_gradient_when_the_policy_controls_length():
    truth = true_gradient(LENGTH, THETA3)
    rloo = config(mean_level="group", std_level=None, mean_leave1out=True)
    summed = compare(expected_estimate(LENGTH, THETA3, rloo, 3, "seq-mean-token-sum"), truth)
    per_sequence = compare(expected_estimate(LENGTH, THETA3, rloo, 3, "seq-mean-token-mean"), truth)
    assert summed.across < 1e-6 and summed.scale == pytest.approx(1.0, rel=1e-6)
    assert per_sequence.across > 0.05 and per_sequence.cosine < 0.99  # (0.142 and 0.967 at this theta)


def test_a_zero_true_gradient_is_refused():
    with pytest.raises(ValueError, match="true gradient is zero"):
        compare(np.ones(3), np.zeros(3))


def test_std_normalization_reweights_questions_by_their_difficulty():
    # Dr. GRPO's question-difficulty bias: an easy question (P(R=1) = 0.99, a small reward spread) and a hard one
    # (0.13). Group std normalization weighs each question's gradient by its groups' spread: in expectation over
    # groups of 8 the easy question's block comes out 1.15x as large, relative to its truth, as the hard one's, and
    # the sum turns; the group mean alone scales both alike ((G - 1) / G) and keeps the direction.
    from prm_jax.audit import AuditProblem, audit_problem

    easy = Problem("easy", vocab=2, max_len=2, reward=lambda s: float(1 in s))
    hard = Problem("hard", vocab=2, max_len=2, reward=lambda s: float(s == (1, 1)))
    thetas = [np.array([[-1.0, 1.0], [-1.0, 1.0]]), np.array([[0.3, -0.3], [0.3, -0.3]])]
    mean_only, with_std = config(mean_level="group", std_level=None), config(mean_level="group", std_level="group")
    scales = {name: [compare(expected_estimate(p, t, norm, 8, SUM), true_gradient(p, t)).scale
                     for p, t in zip((easy, hard), thetas, strict=True)]
              for name, norm in (("mean", mean_only), ("std", with_std))}
    assert scales["mean"] == pytest.approx([7 / 8, 7 / 8], rel=1e-6)
    assert scales["std"][0] / scales["std"][1] > 1.1  # (1.146: the low-spread question weighs more)
    both = AuditProblem("difficulty", "", "", tuple(zip((easy, hard), thetas, strict=True)), group_size=8)
    exact = 4 ** 8  # (every group enumerated, as above)
    assert audit_problem(both, mean_only, SUM, max_groups=exact).across < 1e-6
    assert audit_problem(both, with_std, SUM, max_groups=exact).cosine < 1 - 1e-4


@dataclasses.dataclass(frozen=True)
class OwnRewardBaseline:
    """A planted mistake: ``A_i = R_i - R_i ** 2``, a baseline made of the sample's own reward."""


def _own_reward(stage, outcome, active, real_rows, row_group, num_groups, dtype):
    import jax.numpy as jnp

    from prm_jax.estimators import StageResult

    advantage = outcome - outcome * outcome
    return StageResult(jnp.where(active, advantage[:, None], jnp.zeros((), dtype)), {})


def test_a_planted_baseline_of_the_samples_own_reward_is_caught_and_rloo_passes():
    # Issue 59.3: an estimator plugged in as a user plugs one in, whose baseline uses the sample's own reward, is
    # flagged (the estimate turns away from the true gradient); the RLOO plug-in (tests/rloo_estimator.py, the
    # same shape with the leave-one-out mean) is exact.
    from prm_jax.estimators import EstimatorSpec, register_estimator, unregister_estimator

    planted = EstimatorSpec(OwnRewardBaseline, _own_reward, "credit_assignment 'own_reward'", mode="own_reward",
                            units=("token",))
    register_estimator(planted)
    try:
        truth = true_gradient(CONTROL, THETA2)
        mistaken = compare(expected_estimate(CONTROL, THETA2, prm_jax.AdvantageConfig(
            kl_ctl=0.0, reward_norm=None, adv_norm=None, credit_assignment={"mode": "own_reward"}), 3, SUM), truth)
    finally:
        unregister_estimator(planted)
    rloo = compare(expected_estimate(CONTROL, THETA2, prm_jax.AdvantageConfig(
        kl_ctl=0.0, reward_norm=None, adv_norm=None, credit_assignment={"mode": "rloo"}), 3, SUM), truth)
    assert mistaken.across > 0.1 and mistaken.cosine < 0.99, mistaken  # (cosine -0.97: it points the wrong way)
    assert rloo.across < 1e-6 and rloo.scale == pytest.approx(1.0, rel=1e-6), rloo


def test_the_sampled_estimate_brackets_the_enumerated_one_with_its_standard_error():
    # Monte Carlo (issue 59.1, where groups are too many to enumerate): 4,000 groups with a fixed seed; the exact
    # expectation lies within 4 standard errors in every parameter, the same seed gives the same numbers, and the
    # error shrinks as one over the square root of the samples.
    from prm_jax.audit import sampled_estimate

    norm = config(mean_level="group", std_level=None, mean_leave1out=True)
    exact = expected_estimate(LENGTH, THETA3, norm, 3, "seq-mean-token-mean")
    mean, error = sampled_estimate(LENGTH, THETA3, norm, 3, 4000, seed=7, aggregation="seq-mean-token-mean")
    assert np.all(np.abs(mean - exact) <= 4 * error + 1e-12), (mean - exact) / error
    again, _ = sampled_estimate(LENGTH, THETA3, norm, 3, 4000, seed=7, aggregation="seq-mean-token-mean")
    np.testing.assert_array_equal(mean, again)
    _, quarter = sampled_estimate(LENGTH, THETA3, norm, 3, 16000, seed=8, aggregation="seq-mean-token-mean")
    np.testing.assert_allclose(quarter, error / 2, rtol=0.15)
    with pytest.raises(ValueError, match="samples must be >= 2"):
        sampled_estimate(LENGTH, THETA3, norm, 3, 1)
