"""Issue 44.3 (its kernels): on-policy distillation as a dense token reward (``credit.distillation_rewards``),
AReaL's capped surrogate (``losses.distillation_loss``) and verl's supervised losses
(``losses.supervised_distillation_loss``), against on-policy distillation as verl computes it (verl-project/verl @ 1dda039b,
verl/trainer/distillation/losses.py) and AReaL's MOPD (areal/trainer/mopd/loss.py)'s worked numbers and float64 loops."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prm_jax import credit, losses

ONE = np.array([[True]])


def test_the_worked_example_of_areal_mopd():
    # on-policy distillation as verl computes it (verl-project/verl @ 1dda039b, verl/trainer/distillation/losses.py) and AReaL's
    # MOPD (areal/trainer/mopd/loss.py): l = -1, l_old = -1.2; teachers -0.5 (w 0.3) and -2.0 (w 0.7): S_T = -1.55, W = 1, R =
    # -0.55,
    # rho = e^0.2 = 1.2214, loss 0.6718 = d loss / d l; with l_old = -3 rho is capped at 5 and the loss is 2.75.
    r = credit.distillation_rewards(np.array([[[-0.5]], [[-2.0]]], np.float32), np.array([[-1.0]], np.float32), ONE,
                                    weights=[0.3, 0.7])
    assert float(r[0, 0]) == pytest.approx(-0.55, abs=1e-6)

    def loss(logp, old):
        return losses.distillation_loss(logp, np.array([[old]], np.float32), r, ONE)[0]

    logp = jnp.array([[-1.0]], jnp.float32)
    assert float(loss(logp, -1.2)) == pytest.approx(0.55 * math.exp(0.2), rel=1e-6)
    assert float(jax.grad(loss)(logp, -1.2)[0, 0]) == pytest.approx(0.55 * math.exp(0.2), rel=1e-6)
    assert float(loss(logp, -3.0)) == pytest.approx(2.75, rel=1e-6)
    assert float(losses.distillation_loss(logp, np.array([[-3.0]], np.float32), r, ONE)[1].capped) == 1.0


def test_verls_pg_distillation_is_the_k1_reward_as_ppos_advantage_and_k3_is_a_supervised_loss():
    # on-policy distillation as verl computes it (verl-project/verl @ 1dda039b, verl/trainer/distillation/losses.py) and AReaL's
    # MOPD (areal/trainer/mopd/loss.py): two tokens, l = (-1, -0.5), l_T = (-0.4, -2.5): k1 rewards (0.6, -2.0), PPO loss 0.7 on
    # policy; k3's supervised loss 0.6787 (its rewards would be -0.2221, -1.1353: the preferred token pushed down).
    logp, teacher, mask = np.array([[-1.0, -0.5]], np.float32), np.array([[-0.4, -2.5]], np.float32), np.ones((1, 2))
    rewards = credit.distillation_rewards(teacher, logp, mask)
    np.testing.assert_allclose(np.asarray(rewards), [[0.6, -2.0]], rtol=1e-6)
    assert float(losses.vanilla_ppo_loss(logp, logp, rewards, mask)[0]) == pytest.approx(0.7, rel=1e-6)
    assert float(losses.supervised_distillation_loss(logp, teacher, mask, estimator="k3")) == pytest.approx(
        (0.2221 + 1.1353) / 2, abs=1e-4)
    for estimator in ("k2", "k3", "abs"):
        with pytest.raises(ValueError, match=f"estimator='{estimator}'.*never positive"):
            credit.distillation_rewards(teacher, logp, mask, estimator=estimator)


def loop_rewards(teachers, logp, mask, weights, normalize, low, high):
    _, rows, width = teachers.shape
    out = np.zeros((rows, width))
    total = math.fsum(weights)
    for b in range(rows):
        for t in range(width):
            if mask[b, t]:
                scored = math.fsum(w * float(teachers[j, b, t]) for j, w in enumerate(weights))
                r = scored / max(total, 1e-8) - float(logp[b, t]) if normalize else scored - total * float(logp[b, t])
                out[b, t] = min(max(r, -math.inf if low is None else low), math.inf if high is None else high)
    return out


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("bounds", [(None, None), (0.1, 2.0), (-1.0, -0.2)])
def test_multi_teacher_rewards_match_a_float64_loop_and_a_clip_leaves_padding_at_zero(normalize, bounds):
    rng = np.random.default_rng(int(normalize) + 3 * len(str(bounds)))
    teachers = (-rng.exponential(1.0, (3, 4, 9))).astype(np.float32)
    logp = (-rng.exponential(1.0, (4, 9))).astype(np.float32)
    mask = rng.random((4, 9)) < 0.6
    teachers[:, ~mask] = np.nan  # padding may hold anything
    weights = [0.5, 1.5, 2.0]
    got = credit.distillation_rewards(teachers, logp, mask, weights, normalize_teacher_weights=normalize,
                                      reward_min=bounds[0], reward_max=bounds[1])
    want = loop_rewards(teachers, logp, mask, weights, normalize, *bounds)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert (np.asarray(got)[~mask] == 0).all()  # (AReaL's clip moved a bound excluding 0 into the padding)


def test_the_loss_matches_a_float64_loop_with_a_normalization_mask_and_its_gradient_is_areals():
    rng = np.random.default_rng(9)
    logp = (-rng.exponential(1.0, (3, 7))).astype(np.float32)
    old = (logp + rng.normal(0, 0.8, logp.shape)).astype(np.float32)
    rewards = rng.normal(size=logp.shape).astype(np.float32)
    mask = rng.random((3, 7)) < 0.6
    pre_filter = mask | (rng.random((3, 7)) < 0.3)  # dropped tokens still count in the denominator
    count = max(int(pre_filter.sum()), 1)
    rho = np.minimum(np.exp(logp.astype(np.float64) - old), 5.0)
    want = -(rho * rewards * mask).sum() / count

    def loss(x):
        return losses.distillation_loss(x, old, rewards, mask, normalization_mask=pre_filter)[0]

    assert float(loss(jnp.asarray(logp))) == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(np.asarray(jax.grad(loss)(jnp.asarray(logp))), -rho * rewards * mask / count,
                               rtol=1e-5, atol=1e-7)


def test_it_composes_with_a_policy_loss():
    rng = np.random.default_rng(2)
    logp = (-rng.exponential(1.0, (2, 6))).astype(np.float32)
    old, adv, mask = logp - 0.1, rng.normal(size=(2, 6)).astype(np.float32), np.ones((2, 6), bool)
    rewards = credit.distillation_rewards((logp - 0.5)[None], logp, mask)

    def combined(x, rl_coef, distill_coef):
        return (rl_coef * losses.ppo_clip_loss(x, old, adv, mask)[0]
                + distill_coef * losses.distillation_loss(x, old, rewards, mask)[0])

    x = jnp.asarray(logp)
    both = jax.grad(combined)(x, 1.0, 0.5)
    np.testing.assert_allclose(np.asarray(both), np.asarray(jax.grad(combined)(x, 1.0, 0.0))
                               + np.asarray(jax.grad(combined)(x, 0.0, 0.5)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("estimator", ["k1", "abs", "k2", "k3"])
def test_supervised_losses_match_verls_estimators_in_float64(estimator):
    rng = np.random.default_rng(4)
    logp = (-rng.exponential(1.0, (3, 8))).astype(np.float32)
    teacher = (-rng.exponential(1.0, (3, 8))).astype(np.float32)
    mask = rng.random((3, 8)) < 0.7

    def estimate(a, b):
        d = float(a) - float(b)
        if estimator == "k1":
            return d
        if estimator == "abs":
            return abs(d)
        if estimator == "k2":
            return d * d / 2
        x = min(max(-d, -20.0), 20.0)
        return min(max(math.exp(x) - x - 1, -10.0), 10.0)

    values = [min(max(estimate(logp[b, t], teacher[b, t]), -0.5), 0.5) for b in range(3) for t in range(8) if mask[b, t]]
    got = losses.supervised_distillation_loss(logp, teacher, mask, estimator=estimator, loss_max_clamp=0.5)
    assert float(got) == pytest.approx(math.fsum(values) / len(values), rel=1e-5, abs=1e-7)


def test_non_finite_inputs_at_trained_tokens_are_refused_and_an_empty_batch_gives_zero():
    logp, mask = np.array([[-1.0, np.nan]], np.float32), np.array([[True, True]])
    with pytest.raises(ValueError, match="logprobs must be finite"):
        credit.distillation_rewards(np.zeros((1, 2), np.float32), logp, mask)
    with pytest.raises(ValueError, match="weights"):
        credit.distillation_rewards(np.zeros((2, 1, 2), np.float32), np.zeros((1, 2), np.float32), mask, [1.0, 0.0])
    empty = np.zeros((1, 2), bool)
    value, grad = jax.value_and_grad(lambda x: losses.distillation_loss(x, x, np.ones((1, 2), np.float32), empty)[0])(
        jnp.zeros((1, 2), jnp.float32))
    assert float(value) == 0.0 and not np.asarray(grad).any()


@pytest.mark.parametrize("clamp", [None, 0.5])
def test_k3_plus_is_k3s_value_with_k2s_gradient_as_the_float64_loop(clamp):
    # Issue 55.19: verl's '+' suffix keeps the estimator's value and takes the k2 gradient; "k3+" was refused.
    rng = np.random.default_rng(9)
    logp = (-rng.exponential(1.0, (3, 8))).astype(np.float32)
    teacher = (-rng.exponential(1.0, (3, 8))).astype(np.float32)
    mask = rng.random((3, 8)) < 0.7
    n = int(mask.sum())
    bound = math.inf if clamp is None else clamp
    value, grad = 0.0, np.zeros((3, 8))
    for b, t in zip(*np.nonzero(mask)):
        d = float(logp[b, t]) - float(teacher[b, t])
        x = min(max(-d, -20.0), 20.0)
        k3 = min(max(math.exp(x) - x - 1, -10.0), 10.0)
        value += min(max(k3, -bound), bound) / n
        grad[b, t] = d / n if abs(k3) < bound else 0.0  # torch.clamp: no gradient at or past a bound
    loss = lambda lp: losses.supervised_distillation_loss(lp, teacher, mask, estimator="k3+", loss_max_clamp=clamp)
    assert float(loss(logp)) == pytest.approx(value, rel=1e-5, abs=1e-7)
    np.testing.assert_allclose(np.asarray(jax.grad(loss)(logp)), grad, rtol=1e-5, atol=1e-7)
    k3 = losses.supervised_distillation_loss(logp, teacher, mask, estimator="k3", loss_max_clamp=clamp)
    assert float(k3) == pytest.approx(float(loss(logp)), rel=1e-6)  # the same value
    assert "k3+" in losses.DISTILLATION_ESTIMATORS


def test_numpy_scalar_weights_are_numbers_and_booleans_are_not():
    # Issue 55.20: weights=np.array([0.3, 0.7], np.float32) was refused with "weights[0] must be a finite number,
    # got np.float32(0.3)". A numpy scalar is a number (one rule: prm_jax._validation.is_number); a bool is not.
    from prm_jax import credit
    from prm_jax._validation import finite_number, integer

    teachers = [np.full((1, 2), -1.0, np.float32), np.full((1, 2), -2.0, np.float32)]
    student, mask = np.full((1, 2), -1.5, np.float32), np.ones((1, 2), bool)
    as_list = credit.distillation_rewards(teachers, student, mask, weights=[0.3, 0.7])
    for weights in (np.array([0.3, 0.7], np.float32), np.array([0.3, 0.7]), (np.float32(0.3), np.float64(0.7))):
        np.testing.assert_allclose(np.asarray(credit.distillation_rewards(teachers, student, mask, weights=weights)),
                                   np.asarray(as_list), rtol=1e-6)
    with pytest.raises(ValueError, match=r"weights\[0\] must be a finite number, got np.True_|weights\[0\] must be"):
        credit.distillation_rewards(teachers, student, mask, weights=np.array([True, False]))
    assert finite_number("x", np.float32(0.5)) == 0.5 and integer("n", np.int64(3)) == 3
    for bad in (True, np.True_, np.float32("nan")):
        with pytest.raises(ValueError):
            finite_number("x", bad)
    with pytest.raises(ValueError):
        integer("n", np.bool_(True))


def test_k3_plus_is_refused_as_a_policy_gradient_reward_like_k3():
    # Where options meet: k3+ has k3's value (never negative), so as a PG reward it is refused as k3 is.
    from prm_jax import credit

    with pytest.raises(ValueError, match=r"distillation_rewards\(estimator='k3\+'\): k3\+ is never positive"):
        credit.distillation_rewards(np.full((1, 2), -1.0, np.float32), np.full((1, 2), -1.5, np.float32),
                                    np.ones((1, 2), bool), estimator="k3+")
