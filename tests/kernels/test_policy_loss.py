"""The loss helpers (issue 23.5) against a float64 loop of AReaL's ppo_actor_loss_fn and against values of
its formula worked by hand."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference

from prm_jax.losses import logprobs_on_timesteps, ppo_clip_loss


def test_areal_values_worked_by_hand():
    # ratio = exp([0.2, 0, -1]) = [1.2214, 1, 0.3679]; clipped to [0.8, 1.2]: [1.2, 1, 0.8];
    # -A r = [-1.2214, 1, -0.7358], -A clip(r) = [-1.2, 1, -1.6]; max: [-1.2, 1, -0.7358]; mean -0.31193.
    logp = np.array([[-1.0, -0.5, -2.0]], np.float32)
    prox = np.array([[-1.2, -0.5, -1.0]], np.float32)
    adv = np.array([[1.0, -1.0, 2.0]], np.float32)
    mask = np.ones((1, 3), bool)
    loss, stats = ppo_clip_loss(logp, prox, adv, mask)
    np.testing.assert_allclose(float(loss), (-1.2 + 1.0 - 2.0 * np.exp(-1.0)) / 3, rtol=1e-6)
    np.testing.assert_allclose(float(stats.clip_fraction), 1 / 3, rtol=1e-6)  # the first timestep's l1 < l2
    # Dual clip 3: with A = -1 and r = 5, pg = max(5, 1.2) = 5 is cut to 3.
    dual, dual_stats = ppo_clip_loss(np.log([[5.0]]), np.zeros((1, 1)), -np.ones((1, 1)), np.ones((1, 1)), c_clip=3.0)
    np.testing.assert_allclose(float(dual), 3.0, rtol=1e-6)
    assert float(dual_stats.dual_clip_fraction) == 1.0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("options", [{}, {"eps_clip_higher": 0.28}, {"c_clip": 3.0}, {"decoupled": True},
                                     {"decoupled": True, "cap": 1.5}])
def test_matches_the_float64_loop(agg, options):
    rng = np.random.default_rng(hash((agg, str(options))) % 2**32)
    rows, width = 5, 12
    logp = (-rng.exponential(size=(rows, width))).astype(np.float32)
    prox = (logp + rng.normal(0, 0.3, (rows, width))).astype(np.float32)
    old = (prox + rng.normal(0, 0.3, (rows, width))).astype(np.float32) if options.get("decoupled") else None
    adv = rng.normal(size=(rows, width)).astype(np.float32)
    mask = rng.random((rows, width)) < 0.7
    mask[0] = False  # a row with nothing trained
    got, _ = ppo_clip_loss(logp, prox, adv, mask, old_logprobs=old, eps_clip_higher=options.get("eps_clip_higher"),
                           c_clip=options.get("c_clip"), behav_imp_weight_cap=options.get("cap"), loss_agg_mode=agg)
    want = reference.ppo_clip_loss(logp, prox, adv, mask, old=old, eps_clip_higher=options.get("eps_clip_higher"),
                                   c_clip=options.get("c_clip"), cap=options.get("cap"), agg=agg)
    np.testing.assert_allclose(float(got), want, rtol=2e-5, atol=1e-6)


def test_gradients_flow_through_logprobs_only_and_vanish_where_clipped():
    logp = jnp.array([[0.3, 0.0, -0.05]], jnp.float32)   # ratio 1.35 (clipped, A > 0), 1, 0.95
    prox = jnp.zeros((1, 3), jnp.float32)
    adv = jnp.array([[1.0, 1.0, -1.0]], jnp.float32)
    mask = jnp.ones((1, 3), bool)
    grad = jax.jit(jax.grad(lambda lp, pr, a: ppo_clip_loss(lp, pr, a, mask)[0], argnums=(0, 1, 2)))(logp, prox, adv)
    np.testing.assert_allclose(grad[0], [[0.0, -1 / 3, np.exp(-0.05) / 3]], rtol=1e-5)  # d/dlogp of -A r / 3
    assert not np.any(grad[1]) and not np.any(grad[2])


def test_logprobs_on_timesteps_against_a_loop_and_under_jit():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    ids = rng.integers(0, 7, size=(2, 5)).astype(np.int32)
    got = np.asarray(logprobs_on_timesteps(logits, ids))
    for b in range(2):
        for t in range(5):
            z = logits[b, t].astype(np.float64)
            want = z[ids[b, t + 1]] - np.log(np.exp(z).sum()) if t + 1 < 5 else 0.0
            np.testing.assert_allclose(got[b, t], want, rtol=1e-5, atol=1e-6)
    step = jax.jit(chex.assert_max_traces(lambda lg, i: ppo_clip_loss(logprobs_on_timesteps(lg, i), jnp.zeros((2, 5)),
                                                                   jnp.ones((2, 5)), jnp.ones((2, 5), bool))[0], n=1))
    for _ in range(2):
        assert np.isfinite(float(step(rng.normal(size=(2, 5, 7)).astype(np.float32), ids)))


def test_bad_arguments_are_named():
    x = np.zeros((1, 2), np.float32)
    with pytest.raises(ValueError, match="c_clip must be > 1"):
        ppo_clip_loss(x, x, x, x, c_clip=1.0)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        ppo_clip_loss(x, x, x, x, loss_agg_mode="sum")
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(x, x, np.zeros((2, 2)), x)


def test_a_clipped_timestep_whose_ratio_overflows_has_a_finite_gradient():
    # Issue 29.17: one clipped timestep with a log-ratio above ~88.7 gave a finite loss and a NaN gradient (the
    # ratio overflowed to inf before the clip's zero multiplied it).
    logp = jnp.array([[89.0, 0.1, -0.3]], jnp.float32)
    prox = jnp.zeros((1, 3), jnp.float32)
    adv = jnp.array([[1.0, 1.0, -1.0]], jnp.float32)   # A > 0 and r = exp(89): the clipped side
    mask = jnp.ones((1, 3), bool)
    for options in ({}, {"c_clip": 3.0}, {"loss_agg_mode": "seq-mean-token-mean"}):
        loss, grad = jax.jit(jax.value_and_grad(lambda lp, o=options: ppo_clip_loss(lp, prox, adv, mask, **o)[0]))(logp)
        assert np.isfinite(float(loss)) and np.isfinite(np.asarray(grad)).all(), options
        assert float(grad[0, 0]) == 0.0  # the clipped side passes nothing
    # A < 0 with the dual clip: the loss is the constant c |A| there, finite, and its gradient 0.
    loss, grad = jax.jit(jax.value_and_grad(lambda lp: ppo_clip_loss(lp, prox, -adv, mask, c_clip=3.0)[0]))(logp)
    assert np.isfinite(float(loss)) and np.isfinite(np.asarray(grad)).all() and float(grad[0, 0]) == 0.0


def test_the_gradient_at_a_clip_bound_and_at_ties_is_torchs():
    # torch's gradient rules, as verl's and AReaL's losses get them (torch.clamp: 1 strictly inside, 0 at a bound and beyond;
    # torch.min/max: 1/2 each at a tie): torch.clamp passes nothing at exactly a bound and the max's tie halves, so d pg / d
    # logp is
    # -A r / 2 there (a naive jnp.clip passes 0.5 and gave 3/4); inside the range and on the unclipped side
    # -A r; on the clipped side 0. The dual clip's tie halves too.
    bound = np.float32(1.25)  # exact in float32: 1 + eps_clip with eps_clip 0.25
    logp = jnp.log(jnp.array([[bound, 1.1, 1.6, 0.5]], jnp.float32))
    prox = jnp.zeros((1, 4), jnp.float32)
    adv = jnp.array([[1.0, 1.0, -1.0, -1.0]], jnp.float32)  # the last: A < 0, r below the range: clipped side
    mask = jnp.ones((1, 4), bool)
    loss_fn = lambda lp: ppo_clip_loss(lp, prox, adv, mask, eps_clip=0.25, loss_agg_mode="seq-mean-token-sum")[0]
    ratio = np.exp(np.asarray(logp, np.float64))[0]
    grad = np.asarray(jax.jit(jax.grad(loss_fn))(logp))[0]
    np.testing.assert_allclose(grad, [-ratio[0] / 2, -ratio[1], ratio[2], 0.0], rtol=1e-6)
    tie = jnp.log(jnp.array([[3.0]], jnp.float32))  # A = -1, r = 3: max(3, 1.25) = 3 = c |A|
    grad = jax.jit(jax.grad(lambda lp: ppo_clip_loss(lp, jnp.zeros((1, 1)), -jnp.ones((1, 1)), jnp.ones((1, 1), bool),
                                             eps_clip=0.25, c_clip=3.0)[0]))(tie)
    np.testing.assert_allclose(float(grad[0, 0]), 3.0 / 2, rtol=1e-6)


def test_masks_and_token_ids_are_checked_as_everywhere_else():
    # Issue 29.17: masks holding 0.5 or 2 were taken as 1; ids outside [0, V) were silently clipped.
    x = jnp.zeros((1, 3), jnp.float32)
    for bad in (0.5, 2.0):
        with pytest.raises(ValueError, match=r"loss_mask must be bool or hold only 0 and 1; row 0, position 1 holds"):
            ppo_clip_loss(x, x, x, jnp.array([[1.0, bad, 0.0]]))
    _, stats = jax.jit(lambda m: ppo_clip_loss(x, x, x, m))(jnp.array([[1.0, 0.5, 2.0]]))
    assert int(stats.checks["checks/loss_mask_not_binary"]) == 2
    logits = jnp.zeros((1, 3, 4), jnp.float32)
    for bad in (4, -1):
        with pytest.raises(ValueError, match=rf"in \[0, 4\).*row 0, position 2 holds {bad}"):
            logprobs_on_timesteps(logits, np.array([[0, 1, bad]]))
    traced = jax.jit(logprobs_on_timesteps)(logits, jnp.array([[0, 1, 4]]))
    assert np.isnan(float(traced[0, 1])) and float(traced[0, 0]) == float(np.log(np.float32(0.25)))
