
import jax.numpy as jnp
import numpy as np
import pytest
import reference

from prm_jax.kernels import broadcast_turn_rewards, shift_to_next_token


@pytest.mark.parametrize("fill", [0, -1, 7])
def test_shift_matches_loop(fill):
    x = np.random.default_rng(0).integers(-5, 5, size=(3, 6)).astype(np.int32)
    np.testing.assert_array_equal(shift_to_next_token(x, fill=fill), reference.shift(x, fill))


def test_shift_writes_the_fill_instead_of_rolling():
    x = np.array([[9.0, 1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(shift_to_next_token(x), [[1.0, 2.0, 0.0]])
    assert shift_to_next_token(jnp.ones((2, 3), jnp.bfloat16)).dtype == jnp.bfloat16


def test_broadcast_turn_rewards_prompt_zero_alignment():
    # Parent [1,2]->[3,4] scored 0.5, child [..,5]->[6,7] scored -1: token rewards of the concat export.
    turn_ids = np.array([[-1, -1, 0, 0, -1, 1, 1]])
    got = broadcast_turn_rewards(np.array([[0.5, -1.0]], np.float32), turn_ids)
    np.testing.assert_array_equal(got, [[0, 0, 0.5, 0.5, 0, -1, -1]])


def test_broadcast_turn_rewards_matches_loop():
    rng = np.random.default_rng(1)
    turn_rewards = rng.normal(size=(4, 3)).astype(np.float32)
    turn_ids = rng.integers(-1, 5, size=(4, 10)).astype(np.int32)  # ids 3, 4 name no turn
    want = np.zeros((4, 10), np.float32)
    for b in range(4):
        for t in range(10):
            k = turn_ids[b, t]
            want[b, t] = turn_rewards[b, k] if 0 <= k < 3 else 0.0
    np.testing.assert_array_equal(broadcast_turn_rewards(turn_rewards, turn_ids), want)


def test_broadcast_turn_rewards_errors():
    with pytest.raises(TypeError, match="turn_ids"):
        broadcast_turn_rewards(np.zeros((1, 2), np.float32), np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="batch axis"):
        broadcast_turn_rewards(np.zeros((2, 2), np.float32), np.zeros((1, 3), np.int32))
