import chex
import jax
import numpy as np
import pytest

from prm_jax import AdvantageConfig, Interaction, InteractionCache, compute_advantages, pack_branches
from prm_jax.runtime._batching import bucket_width


def sequences():
    a = InteractionCache([Interaction("a", [1, 2], [3, 4], token_rewards=[0.5, 0.5], reward=1.0)])
    b = InteractionCache([Interaction("p", [1], [2], reward=0.0),
                          Interaction("c", [1, 2, 3], [4, 5, 6], parent_id="p", reward=0.0, stop_reason="length")])
    return [a.to_sequence("a"), b.to_sequence("c")]


@pytest.mark.parametrize("length,bucket,want", [(1, 128, 128), (128, 128, 128), (129, 128, 256), (5, "pow2", 8),
                                                (8, "pow2", 8), (300, 64, 320)])
def test_bucket_width(length, bucket, want):
    assert bucket_width(length, bucket) == want


def test_pack_pads_and_keeps_every_field():
    batch = pack_branches(sequences(), bucket=4, rows=3)
    assert batch["input_ids"].shape == (3, 8) and batch["rewards"].shape == (3,)
    np.testing.assert_array_equal(batch["attention_mask"], [[1] * 4 + [0] * 4, [1] * 6 + [0] * 2, [0] * 8])
    np.testing.assert_array_equal(batch["turn_ids"][1], [-1, 0, -1, 1, 1, 1, -1, -1])
    np.testing.assert_array_equal(batch["token_rewards"][0], [0, 0, 0.5, 0.5, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch["token_rewards"][1], 0)
    np.testing.assert_array_equal(batch["is_truncated"], [False, True, False])
    assert batch["input_ids"].dtype == np.int32 and batch["logprobs"].dtype == np.float32


def test_pack_errors():
    with pytest.raises(ValueError, match="width"):
        pack_branches(sequences(), width=5)
    with pytest.raises(ValueError, match="rows"):
        pack_branches(sequences(), rows=1)
    no_reward = InteractionCache([Interaction("x", [1], [2])]).to_sequence("x")
    with pytest.raises(ValueError, match="outcome reward"):
        pack_branches([no_reward])


def test_one_transfer_and_the_pipeline_accepts_it():
    batch = jax.device_put(pack_branches(sequences(), bucket="pow2"))
    assert all(isinstance(v, jax.Array) for v in batch.values())
    out = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0))
    assert out.advantages.shape == (2, 8)
    # Row 0: outcome 1 and process 0.5 on both generated tokens (timesteps 1, 2).
    np.testing.assert_allclose(np.asarray(out.advantages)[0, 1:3], [1.5, 1.5])


def test_the_keys_do_not_depend_on_the_content():
    # Issue 14.6: token_rewards was emitted only when some branch had them, so a batch without them
    # retraced the caller's jitted step.
    plain = InteractionCache([Interaction("a", [1, 2], [3, 4], reward=1.0)]).to_sequence("a")
    with_rewards, without = pack_branches(sequences(), bucket=8), pack_branches([plain, plain], bucket=8)
    assert sorted(with_rewards) == sorted(without)
    np.testing.assert_array_equal(without["token_rewards"], 0.0)
    step = jax.jit(chex.assert_max_traces(lambda b: compute_advantages(b, AdvantageConfig(kl_ctl=0.0)).advantages,
                                          n=1))
    step(with_rewards)
    step(without)
    assert "token_rewards" not in pack_branches([plain], token_rewards=False)


def test_group_ids_mark_groups_and_padding_rows():
    # Issue 14.4: a [rows] group description of fixed shape, -1 on the rows added for a fixed size.
    seqs = sequences() * 2
    np.testing.assert_array_equal(pack_branches(seqs, rows=6, group_sizes=[1, 3])["group_ids"], [0, 1, 1, 1, -1, -1])
    np.testing.assert_array_equal(pack_branches(seqs, rows=5)["group_ids"], [0, 0, 0, 0, -1])
    with pytest.raises(ValueError, match="group_sizes"):
        pack_branches(seqs, group_sizes=[2, 1])


def test_per_turn_inputs_have_a_fixed_width_and_leave_missing_step_rewards_to_the_pipeline():
    cache = InteractionCache([Interaction("p", [1], [2, 3], token_rewards=[0.25, 0.5], reward=0.0, anchor_id=7),
                              Interaction("c", [1, 2, 3], [4], parent_id="p", reward=1.0, step_reward=2.0)])
    batch = pack_branches([cache.to_sequence("c")], rows=2, per_turn=True, turns=4)
    np.testing.assert_array_equal(batch["anchor_ids"], [[0, -1, -1, -1], [-1] * 4])  # dense ids (issue 20.6)
    # A turn without a step reward is turn_reward_mask False (issue 29.10: not NaN, which a failed score could
    # be): compute_advantages derives it (GiGPOConfig.step_reward).
    np.testing.assert_allclose(batch["turn_rewards"], [[0.0, 2.0, 0, 0], [0] * 4])
    np.testing.assert_array_equal(batch["turn_reward_mask"], [[False, True, False, False], [False] * 4])
    with pytest.raises(ValueError, match="turns"):
        pack_branches([cache.to_sequence("c")], per_turn=True, turns=1)


def test_empty_batch_is_a_template_of_pack_branches():
    from prm_jax.runtime._batching import empty_batch

    for per_turn in (False, True):
        packed = pack_branches(sequences(), bucket=8, rows=4, per_turn=per_turn, turns=3 if per_turn else None)
        template = empty_batch(4, 8, turns=3 if per_turn else None)
        assert {k: (v.shape, v.dtype) for k, v in packed.items()} == {k: (v.shape, v.dtype) for k, v in template.items()}
        np.testing.assert_array_equal(template["attention_mask"], 0)
        np.testing.assert_array_equal(template["group_ids"], -1)
        np.testing.assert_array_equal(template["turn_ids"], -1)


def test_batch_buffers_are_aligned_so_the_cpu_backend_aliases_instead_of_copying():
    # Issue 12 (memory): numpy's buffers start 16 bytes into their allocation; XLA's CPU client copies
    # anything not 64-byte aligned, which held the 2,000-session batch twice (172 MB more at the peak).
    from prm_jax.runtime._batching import ALIGNMENT, aligned_full, empty_batch

    for batch in (pack_branches(sequences(), bucket=4, rows=3, per_turn=True), empty_batch(5, 7, turns=3)):
        for name, value in batch.items():
            assert value.ctypes.data % ALIGNMENT == 0, name
            assert value.flags.c_contiguous and value.flags.writeable, name
    for shape, fill, dtype in (((3, 5), -1, np.int32), ((7,), 0.5, np.float32), ((2, 3), True, np.bool_),
                               ((0, 4), 1, np.int64), ((4, 1), -1, np.int64)):
        value = aligned_full(shape, fill, dtype)
        np.testing.assert_array_equal(value, np.full(shape, fill, dtype))
        assert value.dtype == dtype and value.shape == shape
    big = pack_branches(sequences(), width=4096, rows=64)
    on_device = jax.device_put(big)
    if jax.default_backend() == "cpu":
        assert on_device["logprobs"].unsafe_buffer_pointer() == big["logprobs"].ctypes.data
    np.testing.assert_array_equal(np.asarray(on_device["turn_ids"]), big["turn_ids"])
