"""Issue 20 on the kernel floor: hidden NaNs (20.4), 64-bit anchor ids (20.6), padding rows that claim a
loss mask (20.8). Each case failed before the fix."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from batches import enable_x64, make_batch

from prm_jax import AdvantageConfig, NormConfig, compute_advantages
from prm_jax.kernels._gigpo import GiGPOConfig, gigpo
from prm_jax.kernels._shaping import SHAPING_MODES, ShapingConfig, shape_advantages
from prm_jax.runtime._batching import pack_branches
from prm_jax.runtime._trajectory import Interaction, InteractionCache

BATCH_NORM = NormConfig("batch", "batch")


def batch_with(rng, **kw):
    batch = make_batch(rng, 6, 24, unit_interval=True, **kw)
    batch["prox_logprobs"] = (-rng.exponential(size=batch["logprobs"].shape)).astype(np.float32)
    return batch


def trained_timestep(batch):
    """A row and timestep that is trained on: the shifted loss mask there is 1."""
    active = (batch["loss_mask"] * batch["attention_mask"])[:, 1:] > 0
    rows, steps = np.nonzero(active)
    return int(rows[0]), int(steps[0])


# --- 20.4: every float input is checked where it is used ----------------------------------------------------

@pytest.mark.parametrize("key", ["values", "logprobs", "ref_logprobs", "prox_logprobs", "token_rewards"])
def test_a_nan_input_on_a_trained_timestep_is_raised_eagerly_and_counted_under_jit(key):
    rng = np.random.default_rng(4)
    batch = batch_with(rng)
    if key == "logprobs":  # with recomputed log-probs the behaviour ones feed no advantage (still checked)
        del batch["prox_logprobs"]
    row, step = trained_timestep(batch)
    on_positions = key in ("logprobs", "token_rewards")  # rollout-side: timestep t is position t + 1
    batch[key] = batch[key].copy()
    batch[key][row, step + 1 if on_positions else step] = np.nan
    config = AdvantageConfig(adv_norm=BATCH_NORM, advantage_shaping=ShapingConfig("process_weighted"))
    with pytest.raises(ValueError, match=rf"batch\['{key}'\] must be finite where it is used; row {row}, "
                                         rf"timestep {step} is nan"):
        compute_advantages(batch, config)
    out = jax.jit(lambda b: compute_advantages(b, config))(batch)
    assert int(out.diagnostics[f"checks/{key}_not_finite"]) == 1
    if key == "token_rewards":  # process_weighted used to turn a NaN P into a finite advantage
        assert not np.isfinite(np.asarray(out.advantages)[row, step])
    else:  # batch normalization spreads the NaN; process_weighted used to turn every trained timestep into P
        active = np.asarray(out.loss_mask) > 0
        assert not np.isfinite(np.asarray(out.advantages)[active]).any()


def test_nan_where_an_input_is_not_used_changes_nothing():
    rng = np.random.default_rng(5)
    batch = batch_with(rng)
    config = AdvantageConfig(adv_norm=BATCH_NORM, advantage_shaping=ShapingConfig("process_weighted"))
    clean = compute_advantages(batch, config)
    dirty = dict(batch)
    active = np.zeros_like(batch["loss_mask"], bool)
    active[:, :-1] = (batch["loss_mask"] * batch["attention_mask"])[:, 1:] > 0
    for key in ("values", "ref_logprobs", "prox_logprobs"):  # timesteps
        dirty[key] = np.where(active, batch[key], np.nan).astype(np.float32)
    positions = np.zeros_like(active)
    positions[:, 1:] = active[:, :-1]
    for key in ("logprobs", "token_rewards"):
        dirty[key] = np.where(positions, batch[key], np.nan).astype(np.float32)
    # A truncated row's bootstrap value V[seqlen - 1] is used: keep it.
    seqlen = batch["attention_mask"].sum(1)
    for b in np.flatnonzero(batch["is_truncated"]):
        dirty["values"][b, max(seqlen[b] - 1, 0)] = batch["values"][b, max(seqlen[b] - 1, 0)]
    got = compute_advantages(dirty, config)
    for field in ("advantages", "returns", "kl_rewards", "tot_rewards"):
        np.testing.assert_array_equal(np.asarray(getattr(got, field))[active],
                                      np.asarray(getattr(clean, field))[active], err_msg=field)


def test_the_bootstrap_value_of_a_truncated_row_is_checked():
    rng = np.random.default_rng(6)
    batch = batch_with(rng)
    batch["is_truncated"] = np.zeros(6, bool)
    batch["is_truncated"][2] = True
    seqlen = int(batch["attention_mask"][2].sum())
    batch["values"] = batch["values"].copy()
    batch["values"][2, seqlen - 1] = np.inf
    with pytest.raises(ValueError, match=r"bootstrap value V\[seqlen - 1\] of a truncated row\) must be finite "
                                         r"where it is used; entry 2 is inf"):
        compute_advantages(batch, AdvantageConfig())
    batch["is_truncated"][2] = False  # not bootstrapped: not used
    compute_advantages(batch, AdvantageConfig())


@pytest.mark.parametrize("mode", SHAPING_MODES)
def test_no_shaping_mode_turns_a_non_finite_advantage_into_a_finite_one(mode):
    advantages = np.array([[np.nan, -np.inf, np.inf, np.nan, 0.5, -0.5]], np.float32)
    process = np.array([[0.5, 0.5, 0.0, -0.3 if mode == "gvpo" else 0.0, 0.5, 0.5]], np.float32)
    if mode == "gvpo":
        process = -np.abs(process) - 0.1
    shaped = np.asarray(shape_advantages(advantages, process, np.ones((1, 6), bool), ShapingConfig(mode)))
    assert not np.isfinite(shaped[0, :4]).any(), shaped
    assert np.isfinite(shaped[0, 4:]).all()


# --- 20.8: a position outside the attention mask is never trained -------------------------------------------

@pytest.mark.parametrize("junk_logprobs", [0.0, np.nan])
def test_padding_rows_with_a_loss_mask_do_not_move_the_real_rows(junk_logprobs):
    rng = np.random.default_rng(8)
    real = make_batch(rng, 5, 16, unit_interval=True)
    config = AdvantageConfig(adv_norm=BATCH_NORM, reward_norm=BATCH_NORM)
    want = compute_advantages(real, config)
    padded = {}
    for key, value in real.items():
        pad = np.zeros((3, *value.shape[1:]), value.dtype)
        padded[key] = np.concatenate([value, pad])
    padded["loss_mask"][5:] = 1  # claims training on rows without attention
    padded["logprobs"][5:] = junk_logprobs
    padded["turn_ids"][5:] = -1
    got = compute_advantages(padded, config)
    for field in ("advantages", "returns", "loss_mask", "kl_rewards"):
        np.testing.assert_allclose(np.asarray(getattr(got, field))[:5], np.asarray(getattr(want, field)),
                                   rtol=1e-6, atol=1e-6, err_msg=field)
    assert not np.asarray(got.loss_mask)[5:].any()


def test_loss_mask_beyond_a_rows_attention_is_not_trained():
    rng = np.random.default_rng(9)
    batch = make_batch(rng, 4, 16)
    want = compute_advantages(batch, AdvantageConfig(adv_norm=BATCH_NORM))
    spill = dict(batch, loss_mask=np.where(batch["attention_mask"] > 0, batch["loss_mask"], 1).astype(np.int32),
                 logprobs=np.where(batch["attention_mask"] > 0, batch["logprobs"], np.nan).astype(np.float32))
    got = compute_advantages(spill, AdvantageConfig(adv_norm=BATCH_NORM))
    np.testing.assert_array_equal(np.asarray(got.advantages), np.asarray(want.advantages))
    np.testing.assert_array_equal(np.asarray(got.loss_mask), np.asarray(want.loss_mask))


# --- 20.6: 64-bit anchor ids -------------------------------------------------------------------------------

def anchored_batch(rng, anchors):
    rows, turns = anchors.shape
    rewards = rng.normal(size=(rows, turns)).astype(np.float32)
    mask = np.ones((rows, turns), bool)
    outcome = rng.choice([0.0, 1.0], size=rows).astype(np.float32)
    return rewards, mask, outcome


def test_hashes_sharing_their_low_32_bits_stay_apart_with_x64():
    # 2**32 + 7 and 7 share their low half: a cast to int32 merged them into one step group.
    anchors = np.array([[7, 2**32 + 7], [7, 2**32 + 7], [2**32 + 7, 7]], np.int64)
    rng = np.random.default_rng(61)
    rewards, mask, outcome = anchored_batch(rng, anchors)
    want, *_ = reference.gigpo(rewards, mask, outcome, anchors.tolist())
    with enable_x64():
        got = gigpo(jnp.asarray(rewards), mask, outcome, anchor_ids=jnp.asarray(anchors))
        assert jnp.asarray(anchors).dtype == jnp.int64
    np.testing.assert_allclose(got.advantages, want, rtol=2e-5, atol=2e-5)
    merged, *_ = reference.gigpo(rewards, mask, outcome, (anchors & 0xFFFFFFFF).tolist())
    assert not np.allclose(want, merged)  # the case can fail: merging changes the numbers


def test_unsigned_hashes_above_2_63_and_negative_ids_are_anchors():
    # uint64 hashes whose int32 low half is negative were "no anchor"; -5 is an anchor, only -1 is none.
    hashes = np.array([[2**63 + 9, 2**64 - 2, 5], [2**63 + 9, 2**64 - 2, 5]], np.uint64)
    rng = np.random.default_rng(62)
    rewards, mask, outcome = anchored_batch(rng, hashes)
    want, *_ = reference.gigpo(rewards, mask, outcome, [[int(a) for a in row] for row in hashes])
    with enable_x64():
        got = gigpo(rewards, mask, outcome, anchor_ids=jnp.asarray(hashes))
    np.testing.assert_allclose(got.advantages, want, rtol=2e-5, atol=2e-5)
    negative = np.array([[-5, -7, -1], [-5, -7, -1]], np.int32)
    want, _, step, *_ = reference.gigpo(rewards, mask, outcome, negative.tolist())
    got = gigpo(rewards, mask, outcome, anchor_ids=negative)
    np.testing.assert_allclose(got.advantages, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(got.step_group_sizes), [[2, 2, 0], [2, 2, 0]])
    assert np.abs(step[:, :2]).sum() > 0


def test_host_int64_anchors_work_eagerly_without_x64_and_do_not_retrace():
    anchors = np.array([[7, 2**32 + 7], [7, 2**32 + 7], [2**40, 7]], np.int64)
    rng = np.random.default_rng(63)
    rewards, mask, outcome = anchored_batch(rng, anchors)
    want, *_ = reference.gigpo(rewards, mask, outcome, anchors.tolist())
    got = gigpo(rewards, mask, outcome, anchor_ids=anchors)
    np.testing.assert_allclose(got.advantages, want, rtol=2e-5, atol=2e-5)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def run(r, a):
        return gigpo(r, mask, outcome, anchor_ids=a).advantages

    for shift in (0, 1, 2):
        run(rewards + shift, np.roll(np.array([[0, 1], [0, 1], [2, 0]], np.int32), shift))


def turn(iid, parent, inputs, outputs, anchor, reward=None):
    return Interaction(iid, inputs, outputs, parent_id=parent, anchor_id=anchor, reward=reward,
                       token_rewards=np.full(len(outputs), 0.5, np.float32))


def test_pack_branches_to_compute_advantages_keeps_64_bit_anchors_apart():
    # pack_branches emitted the hashes as given; a trainer's jitted step (x64 off) cut them to 32 bits.
    sequences = []
    for s, (a0, a1, reward) in enumerate([(7, 2**32 + 7, 1.0), (7, 2**32 + 7, 0.0), (2**63 + 1, 7, 1.0)]):
        cache = InteractionCache([turn(f"s{s}t0", None, [1, 2], [3, 4], a0),
                                  turn(f"s{s}t1", f"s{s}t0", [1, 2, 3, 4, 9], [5, 6, 7], a1, reward)])
        sequences.append(cache.to_sequence(f"s{s}t1"))
    batch = pack_branches(sequences, bucket=16, per_turn=True)
    assert batch["anchor_ids"].dtype == np.int32
    np.testing.assert_array_equal(batch["anchor_ids"], [[0, 1], [0, 1], [2, 0]])
    assert not batch["turn_reward_mask"].any()  # no step rewards given: compute_advantages derives them
    batch["turn_rewards"] = np.array([[1.0, 2.0], [0.5, 0.25], [3.0, 1.0]], np.float32)
    batch["turn_reward_mask"] = np.ones((3, 2), bool)
    del batch["token_rewards"]  # the step rewards are in turn_rewards; no shaping on top
    config = AdvantageConfig(credit_assignment=GiGPOConfig(), kl_ctl=0.0)
    out = jax.jit(lambda b: compute_advantages(b, config))(batch)
    want, *_ = reference.gigpo(batch["turn_rewards"], np.ones((3, 2), bool), batch["rewards"],
                               [[7, 2**32 + 7], [7, 2**32 + 7], [2**63 + 1, 7]])
    turn_ids = np.concatenate([batch["turn_ids"][:, 1:], np.full((3, 1), -1)], axis=1)
    for b in range(3):
        for k in range(2):
            np.testing.assert_allclose(np.asarray(out.advantages)[b][turn_ids[b] == k], want[b, k], rtol=2e-5)


@pytest.mark.parametrize("anchor", [2**64, -(2**63) - 1, 1.5, True])
def test_an_anchor_beyond_64_bits_is_refused_when_the_turn_is_built(anchor):
    with pytest.raises(ValueError, match="anchor_id must be a 64-bit integer"):
        Interaction("t", [1], [2], anchor_id=anchor)


def test_gigpo_step_rewards_are_checked_on_active_turns():
    rng = np.random.default_rng(64)
    batch = make_batch(rng, 4, 24, with_process=False)
    batch["turn_rewards"] = np.zeros((4, 4), np.float32)
    config = AdvantageConfig(credit_assignment=GiGPOConfig(), kl_ctl=0.0)
    row = int(np.flatnonzero((batch["turn_ids"][:, 1:] >= 0).any(axis=1))[0])
    batch["turn_rewards"][row, 0] = np.inf
    with pytest.raises(ValueError, match=rf"batch\['turn_rewards'\] must be finite where it is used; row {row}, "
                                         r"turn 0 is inf"):
        compute_advantages(batch, config)
    # Issue 29.10: NaN is refused too (a failed score_arrays row holds NaN); "derive" is turn_reward_mask False.
    batch["turn_rewards"][row, 0] = np.nan
    with pytest.raises(ValueError, match=rf"row {row}, turn 0 is nan \(NaN is no step reward"):
        compute_advantages(batch, config)
    derive = np.ones((4, 4), bool)
    derive[row, 0] = False
    compute_advantages(dict(batch, turn_reward_mask=derive), config)
    batch["turn_rewards"][row, 0] = 0.0
    batch["turn_rewards"][:, 3] = np.where(np.arange(4) == row, np.inf, 0.0)  # a turn the row does not have
    if not (batch["turn_ids"][row, 1:] == 3).any():
        compute_advantages(batch, config)


def test_a_host_list_of_unsigned_hashes_beside_minus_one_is_read_whole():
    # No numpy integer dtype holds -1 and 2**63 + 9 together (object dtype): still exact, -1 still none.
    anchors = [[2**63 + 9, -1, 5], [2**63 + 9, 5, -1]]
    rng = np.random.default_rng(65)
    rewards, mask, outcome = anchored_batch(rng, np.zeros((2, 3)))
    want, *_ = reference.gigpo(rewards, mask, outcome, anchors)
    got = gigpo(rewards, mask, outcome, anchor_ids=np.array(anchors, dtype=object))
    np.testing.assert_allclose(got.advantages, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(got.step_group_sizes), [[2, 0, 2], [2, 2, 0]])
    with pytest.raises(ValueError, match="64-bit"):
        gigpo(rewards, mask, outcome, anchor_ids=np.array([[2**64, 1, 1], [1, 1, 1]], dtype=object))


def test_a_nonzero_check_under_jit_warns_once_where_the_diagnostics_are_read(monkeypatch):
    # Issue 55.14: under jit input mistakes only set a count (checks/<name>), so a first train step that logs
    # no diagnostics trained on them unwarned. The first host read of an output's diagnostics warns, once per
    # check per process, naming the check and how to see it.
    import warnings

    import jax

    import prm_jax
    from prm_jax.config import AdvantageConfig
    from prm_jax.kernels import _checks

    monkeypatch.setattr(_checks, "_WARNED", set())
    batch = {"attention_mask": np.ones((2, 4), np.int32), "loss_mask": np.array([[0, 1, 1, 1], [0, 1, 1, 0]], np.int32),
             "logprobs": np.zeros((2, 4), np.float32), "rewards": np.array([1.0, 0.0], np.float32),
             "is_truncated": np.zeros(2, bool)}
    step = jax.jit(lambda b: prm_jax.compute_advantages(b, AdvantageConfig(kl_ctl=0.0)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clean = step(batch)
        assert all(int(v) == 0 for k, v in clean.diagnostics.items() if k.startswith("checks/"))
        bad = step(dict(batch, rewards=np.array([1.0, np.nan], np.float32)))
        assert not caught  # (nothing read yet: nothing said)
        assert int(bad.diagnostics["checks/rewards_not_finite"]) == 1
        again = step(dict(batch, rewards=np.array([1.0, np.nan], np.float32)))  # the same mistake, the next step
        list(again.diagnostics.items())
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1, [s[:40] for s in said]
    assert said[0].startswith("checks/rewards_not_finite = 1 in compute_advantages' diagnostics: under jit an input "
                              "mistake is counted there, not raised")
    assert "outside jit" in said[0] and "check_values='callback'" in said[0]
    with pytest.raises(ValueError, match=r"batch\['rewards'\] must be finite"):  # eagerly it still raises
        prm_jax.compute_advantages(dict(batch, rewards=np.array([1.0, np.nan], np.float32)), AdvantageConfig(kl_ctl=0.0))
