"""Turn-level GAE and AReaL's turn-id rules (``prm_jax.kernels._turns``)."""

import numpy as np
import pytest
import reference
from batches import timestep_inputs

import prm_jax

METHODS = ("scan", "associative", "blocked", "native", "pallas")  # (pallas: interpreted on the CPU, issue 56.4)


@pytest.mark.parametrize("method,gamma,lam", [(m, g, lam) for m in METHODS for g, lam in [(1.0, 1.0), (0.9, 0.7)]]
                         + [("cumsum", 1.0, 1.0)])
def test_turn_gae_matches_loop(method, gamma, lam):
    rng = np.random.default_rng(21)
    rewards, values, mask, bootstrap = timestep_inputs(rng, 4, 40)
    turn_ids = np.where(mask, np.cumsum(rng.random((4, 40)) < 0.15, axis=1), -1).astype(np.int32)
    out = prm_jax.kernels.turn_gae(rewards, values, mask, turn_ids, gamma=gamma, lam=lam, bootstrap=bootstrap,
                           method=method)
    want_adv, want_ret = reference.turn_gae(rewards, values, mask, turn_ids, gamma, lam, bootstrap, 40)
    np.testing.assert_allclose(out.advantages, want_adv, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(out.returns, want_ret, rtol=2e-5, atol=2e-5)


def test_turn_gae_outside_turns_is_zero_advantage_and_value_return():
    # Issue 9.6, AReaL's unit-test batch: values 0.1 .. 0.8, gamma = lam = 1, the outcome in turn 1.
    # AReaL: advantages [0, .8, .8, 0, .5, .5, .5, 0]; the old carry gave [.8, .8, .8, .5, .5, .5, .5, 0].
    mask = np.array([[0, 1, 1, 0, 1, 1, 1, 0]], bool)
    turn_ids = np.array([[-1, 0, 0, -1, 1, 1, 1, -1]], np.int32)
    values = np.arange(1, 9, dtype=np.float32)[None] / 10
    rewards = np.zeros((1, 8), np.float32)
    rewards[0, 6] = 1.0
    for method in ("scan", "associative", "blocked", "auto"):
        out = prm_jax.kernels.turn_gae(rewards, values, mask, turn_ids, method=method)
        np.testing.assert_allclose(out.advantages, [[0, .8, .8, 0, .5, .5, .5, 0]], atol=1e-6)
        np.testing.assert_allclose(out.returns, [[.1, 1, 1, .4, 1, 1, 1, .8]], atol=1e-6)


@pytest.mark.parametrize("ids,mask,problem", [
    ([[-1, 0, -1, 1]], [[0, 1, 1, 1]], "turn id >= 0"),            # an active timestep without a turn
    ([[-1, 1, 1, 0]], [[0, 1, 1, 1]], "must not decrease"),         # ids that go back
    ([[-1, 1, -1, 0]], [[0, 1, 0, 1]], "must not decrease"),        # ... across a gap
    ([[-1, 0, 0, 4]], [[0, 1, 1, 1]], "below the number of turn slots 4"),
])
def test_turn_gae_rejects_invalid_turn_ids(ids, mask, problem):
    # Issue 9.8: AReaL validates turn ids; before, these gave silent zeros or order-dependent results.
    z = np.zeros((1, 4), np.float32)
    with pytest.raises(ValueError, match=problem):
        prm_jax.kernels.turn_gae(z, z, np.asarray(mask, bool), np.asarray(ids, np.int32))
    # Gaps in the ids and any id on inactive timesteps are fine.
    prm_jax.kernels.turn_gae(z, z, np.array([[0, 1, 0, 1]], bool), np.array([[7, 0, -5, 2]], np.int32))


@pytest.mark.parametrize("method", ["native", "scan", "associative", "blocked"])
def test_turn_steps_follow_the_turn_ids_across_holes_on_every_method(method):
    # Issue 29.14: a turn is what turn_ids say; a hole in the loss mask inside a turn does not split it. The
    # native reverse pass and every scan's masked fill give a loop's answer, ragged widths and decreasing
    # ids included (the rows' tails without a next active timestep too).
    import jax
    import jax.numpy as jnp

    from prm_jax.kernels._turns import turn_steps
    rng = np.random.default_rng(14)
    for rows, width in ((5, 37), (8, 1), (3, 130)):
        active = rng.random((rows, width)) < 0.6
        ids = np.cumsum(rng.random((rows, width)) < 0.2, axis=1).astype(np.int32)
        ids[0, ::7] -= 3  # some decreasing ids
        steps = jax.jit(lambda a, i: turn_steps(a, i, method))(jnp.asarray(active), jnp.asarray(ids))
        same = np.zeros((rows, width), bool)
        decreasing = np.zeros((rows, width), bool)
        for b in range(rows):
            for t in range(width):
                later = [u for u in range(t + 1, width) if active[b, u]]
                if active[b, t] and later:
                    same[b, t] = ids[b, later[0]] == ids[b, t]
                    decreasing[b, t] = ids[b, later[0]] < ids[b, t]
        np.testing.assert_array_equal(steps.same, same)
        np.testing.assert_array_equal(steps.ends, active & ~same)
        np.testing.assert_array_equal(steps.decreasing, decreasing)
        adjacent = active & np.concatenate([active[:, 1:], np.zeros((rows, 1), bool)], axis=1)
        assert bool(steps.holes) == bool((same & ~adjacent).any())
