"""Issue 44.1 (its kernel): the optimal token baseline, ``credit.optimal_token_baseline`` (verl's multi-turn
variant with CREDIT2.md 5.1's rules) and ``credit.sum_pi_squared``, against CREDIT2.md 1's worked numbers and
float64 loops."""

import math

import numpy as np
import pytest

from prm_jax.credit import optimal_token_baseline, sum_pi_squared


def loop_otb(rewards, mask, logprobs, pi2, groups, weights=None, zero_tail=True, eps=1e-8):
    """The multi-turn rule in plain loops: each row's trained tokens in order (k), reward-to-go G, running
    score norm W, per group and k the baseline sum(G W) / (sum W + eps) over the rows reaching k; a group of
    fewer than two non-empty rows has none; the zero tail; A = G - B scattered back."""
    rows, width = mask.shape
    seqs = []
    for b in range(rows):
        cols = [t for t in range(width) if mask[b, t]]
        r = [float(rewards[b, t]) for t in cols]
        w = [(1 - 2 * math.exp(float(logprobs[b, t])) + float(pi2[b, t]))
             * (1.0 if weights is None else float(weights[b, t]) ** 2) for t in cols]
        g = [math.fsum(r[k:]) for k in range(len(cols))]
        cum = [math.fsum(w[:k + 1]) for k in range(len(cols))]
        seqs.append((cols, g, cum))
    advantages, returns = np.zeros((rows, width)), np.zeros((rows, width))
    for b in range(rows):
        cols, g, cum = seqs[b]
        members = [j for j in range(rows) if groups[j] == groups[b] and seqs[j][0]]
        lengths = sorted((len(seqs[j][0]) for j in members), reverse=True)
        for k, t in enumerate(cols):
            baseline = 0.0
            if len(members) >= 2:
                reach = [j for j in members if len(seqs[j][0]) > k]
                baseline = (math.fsum(seqs[j][1][k] * seqs[j][2][k] for j in reach)
                            / (math.fsum(seqs[j][2][k] for j in reach) + eps))
                if zero_tail and len(cols) == lengths[0] and lengths[0] > lengths[1] and k >= lengths[1]:
                    baseline = 0.0
            advantages[b, t], returns[b, t] = g[k] - baseline, g[k]
    return advantages, returns


def test_the_worked_example_with_and_without_the_zero_tail():
    # CREDIT2.md 1: W_0 = (.5, .7, 1), W_1 = (.4, 1), G_0 = 1, G_1 = 0: A_0 = (.4444, .5882, 1.0),
    # A_1 = (-.5556, -.4118); without the zero tail A_0[2] = 1 - 1 / (1 + eps), about 0.
    w = np.array([[.5, .2, .3], [.4, .6, 0.0]], np.float32)
    args = (np.array([[0, 0, 1.0], [0, 0, 0]], np.float32), np.array([[1, 1, 1], [1, 1, 0]], bool),
            np.log(np.full((2, 3), 0.5, np.float32)), w)  # pi = 0.5: sum_pi_squared = w
    out = optimal_token_baseline(*args)
    np.testing.assert_allclose(np.asarray(out.advantages), [[5 / 9 * 0.8, 1 - 0.7 / 1.7, 1], [-5 / 9, -0.7 / 1.7, 0]],
                               rtol=1e-5)
    assert abs(float(optimal_token_baseline(*args, handle_zero_tail=False).advantages[0, 2])) < 1e-6


@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("with_weights", [False, True])
def test_groups_with_holes_empty_rows_ties_and_a_group_of_one_match_a_float64_loop(zero_tail, with_weights):
    rng = np.random.default_rng(int(zero_tail) + 2 * int(with_weights))
    rows, width = 9, 14
    mask = rng.random((rows, width)) < 0.6
    mask[2] = False                      # an empty row, dropped from its group
    mask[4] = mask[5]                    # a tie for the longest in their group
    rewards = rng.normal(size=(rows, width)).astype(np.float32)
    logprobs = (-rng.exponential(1.0, (rows, width))).astype(np.float32)
    pi = np.exp(logprobs.astype(np.float64))
    pi2 = (pi ** 2 + rng.uniform(0, 1, (rows, width)) * (1 - pi) ** 2).astype(np.float32)
    weights = rng.uniform(0.5, 1.5, (rows, width)).astype(np.float32) if with_weights else None
    rewards[~mask] = np.nan              # untrained positions may hold anything
    sizes = np.array([4, 4, 1], np.int32)
    out = optimal_token_baseline(rewards, mask, logprobs, pi2, group_sizes=sizes, rollout_is_weights=weights,
                                 handle_zero_tail=zero_tail)
    want_a, want_r = loop_otb(np.nan_to_num(rewards), mask, logprobs, pi2, np.repeat(np.arange(3), sizes), weights,
                              zero_tail)
    np.testing.assert_allclose(np.asarray(out.advantages), want_a, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(out.returns), want_r, rtol=2e-5, atol=2e-5)


def test_a_deterministic_policy_and_an_empty_batch():
    # w = 0 everywhere: B = 0 / eps = 0 and A = G; no trained token: zeros.
    mask = np.array([[1, 1, 0], [1, 0, 1]], bool)
    rewards = np.array([[0.0, 1.0, 0], [2.0, 0, 1.0]], np.float32)
    out = optimal_token_baseline(rewards, mask, np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32))
    np.testing.assert_allclose(np.asarray(out.advantages), [[1, 1, 0], [3, 0, 1]])
    empty = optimal_token_baseline(rewards, np.zeros((2, 3), bool), np.zeros((2, 3), np.float32),
                                   np.ones((2, 3), np.float32))
    assert not np.asarray(empty.advantages).any()


def test_sum_pi_squared_matches_float64_in_one_pass_or_in_chunks():
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(2, 5, 1003)) * 4).astype(np.float32)
    for temperature in (1.0, 0.7):
        z = logits.astype(np.float64) / temperature
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        want = (p * p).sum(-1)
        for chunk in (None, 128, 1003, 4096):
            got = np.asarray(sum_pi_squared(logits, temperature=temperature, chunk=chunk))
            np.testing.assert_allclose(got, want, rtol=2e-5, err_msg=str((temperature, chunk)))


def test_bad_input_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="sum_pi_squared must be finite"):
        optimal_token_baseline(np.zeros((1, 2), np.float32), np.ones((1, 2), bool), np.zeros((1, 2), np.float32),
                               np.array([[np.nan, 1.0]], np.float32))
    with pytest.raises(ValueError, match="temperature"):
        sum_pi_squared(np.zeros((2, 3), np.float32), temperature=0.0)


def test_groups_that_do_not_cover_the_batch_are_refused():
    args = (np.zeros((4, 2), np.float32), np.ones((4, 2), bool), np.zeros((4, 2), np.float32), np.ones((4, 2), np.float32))
    with pytest.raises(ValueError, match="group_sizes"):
        optimal_token_baseline(*args, group_sizes=np.array([3, 3], np.int32))
