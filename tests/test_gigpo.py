"""Issue 13: GiGPO step groups and discounted step returns against a dict-and-loop reference."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from batches import compile_log

from prm_jax.kernels.gigpo import GiGPOConfig, dense_anchor_ids, gigpo

CONFIGS = [
    dict(),
    dict(norm="mean_std_norm", step_weight=0.5, step_discount=0.9),
    dict(episode_stats="step", step_discount=1.0),
    dict(norm="mean_std_norm", episode_stats="step", step_weight=2.0, step_discount=0.0),
]


def random_batch(rng, rows=12, turns=6, anchors=5):
    mask = rng.random((rows, turns)) < 0.75
    mask[0] = False                                   # a row with no turns
    mask[1, 3:] = False                               # a short row
    mask[2, 1::2] = False                             # a masked turn between active ones
    rewards = rng.normal(size=(rows, turns)).astype(np.float32)
    anchor_ids = rng.integers(-1, anchors, size=(rows, turns)).astype(np.int32)
    anchor_ids[3, :3] = 2                             # an anchor shared within one row
    outcome = rng.choice([0.0, 1.0, 0.5], size=rows).astype(np.float32)
    return rewards, mask, anchor_ids, outcome


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("with_anchors", [True, False])
def test_matches_the_loop_reference_on_random_batches(cfg, with_anchors):
    rng = np.random.default_rng(13)
    for sizes in ([12], [1, 4, 3, 4], [5, 7], [2, 1, 9]):
        rewards, mask, anchors, outcome = random_batch(rng)
        out = gigpo(rewards, mask, outcome, anchor_ids=anchors if with_anchors else None,
                    group_sizes=np.array(sizes), config=GiGPOConfig(**cfg))
        want = reference.gigpo(rewards, mask, outcome, anchors if with_anchors else None, sizes, **cfg)
        for got, expected, name in zip((out.advantages, out.episode_advantages, out.step_advantages,
                                        out.step_returns), want, ("advantages", "episode", "step", "returns")):
            np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5, err_msg=f"{name} {sizes}")


def test_properties():
    rng = np.random.default_rng(131)
    rewards, mask, anchors, outcome = random_batch(rng, rows=8)
    sizes = np.array([4, 4])
    base = gigpo(rewards, mask, outcome, anchor_ids=anchors, group_sizes=sizes)
    # Permuting rows within a group permutes the output.
    perm = np.array([2, 0, 3, 1, 4, 5, 6, 7])
    permuted = gigpo(rewards[perm], mask[perm], outcome[perm], anchor_ids=anchors[perm], group_sizes=sizes)
    np.testing.assert_allclose(permuted.advantages, np.asarray(base.advantages)[perm], rtol=1e-6, atol=1e-6)
    # omega = 0 gives the episode advantage on every active turn.
    episode_only = gigpo(rewards, mask, outcome, anchor_ids=anchors, group_sizes=sizes,
                         config=GiGPOConfig(step_weight=0.0))
    np.testing.assert_allclose(episode_only.advantages,
                               np.where(mask, np.asarray(base.episode_advantages)[:, None], 0.0), atol=1e-6)
    # A step group of identical returns gives 0; so does a step group of one and a turn without anchor.
    flat = np.zeros((2, 2), np.float32)
    same = gigpo(flat, np.ones((2, 2), bool), np.array([1.0, 0.0], np.float32), anchor_ids=np.array([[0, 1], [0, -1]]))
    np.testing.assert_array_equal(same.step_advantages, 0.0)
    np.testing.assert_array_equal(same.step_group_sizes, [[2, 1], [2, 0]])
    # Values at inactive turns change nothing.
    noisy = np.where(mask, rewards, 1e6).astype(np.float32)
    out = gigpo(noisy, mask, outcome, anchor_ids=np.where(mask, anchors, 7), group_sizes=sizes)
    np.testing.assert_allclose(out.advantages, base.advantages, rtol=1e-6, atol=1e-6)


def test_a_group_of_one_has_mean_zero_and_std_one():
    out = gigpo(np.zeros((1, 2), np.float32), np.ones((1, 2), bool), np.array([0.7], np.float32),
                config=GiGPOConfig(norm="mean_std_norm", eps=0.0))
    np.testing.assert_allclose(out.episode_advantages, [0.7])


def test_jit_vmap_and_no_retrace():
    rng = np.random.default_rng(132)
    rewards, mask, anchors, outcome = random_batch(rng, rows=6)
    step = jax.jit(chex.assert_max_traces(
        lambda r, m, a, o: gigpo(r, m, o, anchor_ids=a, group_sizes=jnp.array([3, 3])).advantages, n=1))
    want = gigpo(rewards, mask, outcome, anchor_ids=anchors, group_sizes=np.array([3, 3])).advantages
    for _ in range(2):
        np.testing.assert_allclose(step(rewards, mask, anchors, outcome), want, rtol=1e-6, atol=1e-6)
    batched = jax.vmap(lambda r, m, a, o: gigpo(r, m, o, anchor_ids=a).advantages)(
        np.stack([rewards, rewards]), np.stack([mask, mask]), np.stack([anchors, anchors]), np.stack([outcome, outcome]))
    np.testing.assert_allclose(batched[1], gigpo(rewards, mask, outcome, anchor_ids=anchors).advantages, atol=1e-6)
    with compile_log() as compiled:
        for _ in range(3):
            gigpo(rewards, mask, outcome, anchor_ids=anchors, config=GiGPOConfig(step_weight=0.5))
    assert sum("Compiling jit(_gigpo_jit)" in m for m in compiled) <= 1


def test_dense_anchor_ids_from_64_bit_hashes():
    hashes = np.array([[2**40 + 5, -1], [2**40 + 5, 2**62]], np.int64)
    dense = dense_anchor_ids(hashes)
    assert dense.dtype == np.int32 and dense[0, 0] == dense[1, 0] != dense[1, 1] and dense[0, 1] == -1


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="turn_mask"):
        gigpo(np.zeros((2, 3), np.float32), np.ones((2, 2), bool), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="group_sizes"):
        gigpo(np.zeros((2, 3), np.float32), np.ones((2, 3), bool), np.zeros(2, np.float32), group_sizes=[1, 2])
    with pytest.raises(ValueError, match="norm"):
        GiGPOConfig(norm="per_turn")
