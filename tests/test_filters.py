import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prm_jax import (filter_mixed_or_penalized_all_wrong, filter_mixed_or_penalized_all_wrong_mask_no_eos,
                     group_filter_flags)


def group(rewards, token_rewards=None, loss_mask=None, **extra):
    g = dict(rewards=np.asarray(rewards, np.float32), **extra)
    if token_rewards is not None:
        g["token_rewards"] = np.asarray(token_rewards, np.float32)
        g["loss_mask"] = np.asarray(loss_mask)
    return g


def test_mixed_group_is_accepted():
    assert filter_mixed_or_penalized_all_wrong(group([1.0, 0.0, 1.0])) == (True, 0, 0, 0)


def test_all_correct_is_rejected():
    assert filter_mixed_or_penalized_all_wrong(group([1.0, 1.0])) == (False, 0, 1, 0)


def test_all_wrong_without_process_signal_is_rejected():
    assert filter_mixed_or_penalized_all_wrong(group([0.0, 0.0])) == (False, 0, 0, 1)
    # A negative process reward on a prompt token (raw loss_mask 0) does not count.
    g = group([0.0, 0.0], [[-1.0, 0.0], [0.0, 0.0]], [[0, 1], [0, 1]])
    assert filter_mixed_or_penalized_all_wrong(g) == (False, 0, 0, 1)


def test_all_wrong_with_negative_process_is_accepted():
    g = group([0.0, 0.0], [[0.0, -0.5], [0.0, 0.0]], [[0, 1], [0, 1]])
    assert filter_mixed_or_penalized_all_wrong(g) == (True, 1, 0, 0)


def test_all_equal_negative_rewards_are_all_wrong():
    assert filter_mixed_or_penalized_all_wrong(group([-1.0, -1.0])) == (False, 0, 0, 1)


def test_original_rewards_take_precedence():
    g = group([0.0, 0.0], original_rewards=np.array([1.0, 0.0]))
    assert filter_mixed_or_penalized_all_wrong(g).accepted


@pytest.mark.parametrize("bad", [None, [], [np.nan, 1.0], [[1.0]]])
def test_bad_rewards(bad):
    with pytest.raises(ValueError, match="rewards"):
        filter_mixed_or_penalized_all_wrong({"rewards": bad})


def test_shape_mismatch():
    with pytest.raises(ValueError, match="token_rewards"):
        filter_mixed_or_penalized_all_wrong(group([0.0, 1.0], [[0.0, 1.0]], [[1, 1]]))


def test_mask_no_eos_ignores_truncated_rows():
    # Mixed only because of a truncated row: rejected once it is ignored.
    g = group([1.0, 0.0, 1.0], is_truncated=np.array([False, True, False]))
    assert filter_mixed_or_penalized_all_wrong(g).accepted
    assert filter_mixed_or_penalized_all_wrong_mask_no_eos(g) == (False, 0, 1, 0)
    # Truncation from attention_mask: seqlen == width.
    g = group([0.0, 0.0], [[0.0, 0.0], [0.0, -1.0]], [[1, 1], [1, 1]],
              attention_mask=np.array([[1, 0], [1, 1]]))
    assert filter_mixed_or_penalized_all_wrong(g) == (True, 1, 0, 0)
    assert filter_mixed_or_penalized_all_wrong_mask_no_eos(g) == (False, 0, 0, 1)


def test_mask_no_eos_needs_truncation_info():
    with pytest.raises(ValueError, match="attention_mask"):
        filter_mixed_or_penalized_all_wrong_mask_no_eos(group([1.0, 0.0]))


def test_all_rows_truncated_is_rejected_without_counter():
    g = group([1.0, 0.0], is_truncated=np.array([True, True]))
    assert filter_mixed_or_penalized_all_wrong_mask_no_eos(g) == (False, 0, 0, 0)


def test_jitted_core_agrees_with_host_filter():
    rng = np.random.default_rng(0)
    for _ in range(20):
        rewards = rng.choice([0.0, 1.0, -1.0], size=4)
        rows = rng.random(4) < 0.8
        rows[0] = True
        negative = rng.random(4) < 0.3
        got = [bool(x) for x in jax.jit(group_filter_flags)(jnp.asarray(rewards, jnp.float32), rows, negative)]
        taken = rewards[rows]
        want = [bool((taken != taken[0]).any()), bool((taken <= 0).all()), bool(negative[rows].any())]
        assert got == want
