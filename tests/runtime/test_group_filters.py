import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref

from prm_jax.filters import (
    filter_function,
    filter_mixed_or_penalized_all_wrong,
    filter_mixed_or_penalized_all_wrong_mask_no_eos,
    group_filter_flags,
)

FILTERS = {"plain": filter_function, "penalized": filter_mixed_or_penalized_all_wrong,
           "penalized_mask_no_eos": filter_mixed_or_penalized_all_wrong_mask_no_eos}


def group(rewards, token_rewards=None, loss_mask=None, **extra):
    g = dict(rewards=np.asarray(rewards, np.float32), **extra)
    if token_rewards is not None:
        g["token_rewards"] = np.asarray(token_rewards, np.float32)
        g["loss_mask"] = np.asarray(loss_mask)
    return g


def test_mixed_group_is_accepted():
    assert filter_mixed_or_penalized_all_wrong(group([1.0, 0.0, 1.0])) == (True, 0, 0, 0, 0)


def test_all_correct_is_rejected_with_areal_counters():
    # (accepted, rejected_by_failed_or_perfect, rejected_by_all_correct, rejected_by_all_wrong, penalized)
    assert filter_mixed_or_penalized_all_wrong(group([1.0, 1.0])) == (False, 1, 1, 0, 0)


def test_all_wrong_without_process_signal_is_rejected():
    assert filter_mixed_or_penalized_all_wrong(group([0.0, 0.0])) == (False, 1, 0, 1, 0)
    # A negative process reward on a prompt token (raw loss_mask 0) does not count.
    g = group([0.0, 0.0], [[-1.0, 0.0], [0.0, 0.0]], [[0, 1], [0, 1]])
    assert filter_mixed_or_penalized_all_wrong(g) == (False, 1, 0, 1, 0)


def test_all_wrong_with_negative_process_is_accepted():
    g = group([0.0, 0.0], [[0.0, -0.5], [0.0, 0.0]], [[0, 1], [0, 1]])
    assert filter_mixed_or_penalized_all_wrong(g) == (True, 0, 0, 0, 1)


def test_equal_positive_rewards_below_one_are_all_wrong_for_the_plain_filter():
    # filter_function's all-correct threshold is r >= 1 - 1e-3; the PRM filters' is r > 0.
    assert filter_function(group([0.5, 0.5])) == (False, 1, 0, 1, 0)
    assert filter_mixed_or_penalized_all_wrong(group([0.5, 0.5])) == (False, 1, 1, 0, 0)
    assert filter_function(group([0.9995, 0.9995])) == (False, 1, 1, 0, 0)
    assert filter_function(group([1.0, 0.0])) == (True, 0, 0, 0, 0)


def test_original_rewards_take_precedence():
    g = group([0.0, 0.0], original_rewards=np.array([1.0, 0.0]))
    assert filter_mixed_or_penalized_all_wrong(g).accepted
    assert filter_function(g).accepted


@pytest.mark.parametrize("bad", [None, [], [np.nan, 1.0]])
def test_bad_rewards(bad):
    with pytest.raises(ValueError, match="rewards"):
        filter_mixed_or_penalized_all_wrong({"rewards": bad})


def test_rewards_are_flattened_like_areal():
    assert filter_function({"rewards": [[1.0], [0.0]]}).accepted


def test_shape_mismatch_is_checked_when_the_penalty_check_runs():
    with pytest.raises(ValueError, match="token_rewards"):
        filter_mixed_or_penalized_all_wrong(group([0.0, 0.0], [[0.0, 1.0]], [[1, 1], [1, 1]]))


def test_mask_no_eos_decides_mixed_over_all_rows():
    # Issue 9.13: rewards [1, 0], is_truncated [True, False]: AReaL accepts (mixed over every row).
    g = group([1.0, 0.0], is_truncated=np.array([True, False]))
    assert filter_mixed_or_penalized_all_wrong_mask_no_eos(g) == (True, 0, 0, 0, 0)
    # An all-truncated group is decided like any other (and counted).
    g = group([1.0, 0.0], is_truncated=np.array([True, True]))
    assert filter_mixed_or_penalized_all_wrong_mask_no_eos(g) == (True, 0, 0, 0, 0)
    g = group([0.0, 0.0], is_truncated=np.array([True, True]))
    assert filter_mixed_or_penalized_all_wrong_mask_no_eos(g) == (False, 1, 0, 1, 0)


def test_mask_no_eos_ignores_penalties_of_truncated_rows_only():
    # Truncation from attention_mask: seqlen == width. Row 1 is truncated and carries the only penalty.
    g = group([0.0, 0.0], [[0.0, 0.0], [0.0, -1.0]], [[1, 1], [1, 1]], attention_mask=np.array([[1, 0], [1, 1]]))
    assert filter_mixed_or_penalized_all_wrong(g) == (True, 0, 0, 0, 1)
    assert filter_mixed_or_penalized_all_wrong_mask_no_eos(g) == (False, 1, 0, 1, 0)
    # is_truncated overrides the seqlen fallback.
    g["is_truncated"] = np.array([False, False])
    assert filter_mixed_or_penalized_all_wrong_mask_no_eos(g) == (True, 0, 0, 0, 1)


def test_mask_no_eos_needs_attention_mask_only_when_the_penalty_check_runs():
    # Issue 9.15: not needed for a mixed group, nor without token rewards.
    assert filter_mixed_or_penalized_all_wrong_mask_no_eos(group([1.0, 0.0])).accepted
    assert not filter_mixed_or_penalized_all_wrong_mask_no_eos(group([0.0, 0.0])).accepted
    # Needed when the check runs, even with is_truncated given.
    g = group([0.0, 0.0], [[0.0, -1.0], [0.0, 0.0]], [[1, 1], [1, 1]], is_truncated=np.array([False, False]))
    with pytest.raises(ValueError, match="attention_mask"):
        filter_mixed_or_penalized_all_wrong_mask_no_eos(g)


def test_non_finite_token_rewards_are_an_error_when_the_penalty_check_runs():
    g = group([0.0, 0.0], [[0.0, np.nan], [0.0, 0.0]], [[1, 1], [1, 1]])
    with pytest.raises(ValueError, match="finite"):
        filter_mixed_or_penalized_all_wrong(g)
    # A mixed group never reads them.
    g["rewards"] = np.array([1.0, 0.0])
    assert filter_mixed_or_penalized_all_wrong(g).accepted


def _random_group(rng):
    size, width = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    outcome = rng.choice([-1.0, 0.0, 0.5, 1.0], p=[0.1, 0.5, 0.1, 0.3])
    rewards = np.where(rng.random(size) < 0.3, rng.choice([0.0, 1.0], size=size), outcome)
    lengths = rng.integers(1, width + 1, size=size)
    attention = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
    g = dict(rewards=rewards, attention_mask=attention,
             loss_mask=attention * (rng.random((size, width)) < 0.7),
             token_rewards=rng.choice([-0.5, 0.0, 0.5], size=(size, width)))
    if rng.random() < 0.5:
        g["is_truncated"] = rng.random(size) < 0.4
    return g


@pytest.mark.parametrize("kind", sorted(FILTERS))
def test_filters_match_the_loop_reference_on_random_groups(kind):
    rng = np.random.default_rng(9)
    for _ in range(200):
        g = _random_group(rng)
        assert tuple(FILTERS[kind](g)) == ref.group_filter(g, kind), g


def test_jitted_core_agrees_with_host_filter():
    rng = np.random.default_rng(0)
    for _ in range(20):
        rewards = rng.choice([0.0, 1.0, -1.0], size=4)
        negative = rng.random(4) < 0.3
        got = [bool(x) for x in group_filter_flags(jnp.asarray(rewards, jnp.float32), negative)]
        assert got == [bool((rewards != rewards[0]).any()), bool((rewards <= 0).all()), bool(negative.any())]
    with jax.checking_leaks():
        group_filter_flags(jnp.zeros(3), jnp.zeros(3, bool))
