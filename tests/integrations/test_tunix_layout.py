"""prm_jax.integrations.tunix without tunix: tunix's rollout arrays -> prm-jax's batch and back (issue 23.7)."""

import numpy as np
import pytest

from prm_jax.integrations import tunix as adapter
from prm_jax.kernels._shaping import ShapingConfig


def tunix_rollout(rng, groups=3, group_size=4, prompt_width=6, completion_width=9):
    """Arrays shaped like tunix's TrainExample: left-padded prompts, right-padded completions with holes
    (a pad sampled mid-completion), one empty completion, pad id 0."""
    rows = groups * group_size
    lengths = rng.integers(1, prompt_width + 1, rows)
    prompt_mask = np.arange(prompt_width)[None, :] >= (prompt_width - lengths)[:, None]
    prompt_ids = np.where(prompt_mask, rng.integers(1, 50, (rows, prompt_width)), 0)
    extent = rng.integers(1, completion_width + 1, rows)
    extent[1] = 0
    completion_mask = (np.arange(completion_width)[None, :] < extent[:, None]) & (rng.random((rows, completion_width)) < 0.8)
    ends = np.maximum(extent - 1, 0)
    completion_mask[np.arange(rows), ends] = extent > 0  # the last token of a completion is real
    completion_ids = np.where(completion_mask, rng.integers(1, 50, (rows, completion_width)), 0)
    rewards = rng.normal(size=rows).astype(np.float32)
    return prompt_ids, prompt_mask, completion_ids, completion_mask, rewards


def layout_loop(prompt_ids, prompt_mask, completion_ids, completion_mask):
    """The layout, one row and one token at a time."""
    rows, width_p = prompt_ids.shape
    width = width_p + completion_ids.shape[1]
    ids, attention, loss, turns = (np.zeros((rows, width), int), np.zeros((rows, width), bool),
                                   np.zeros((rows, width), bool), np.full((rows, width), -1))
    lengths = []
    for b in range(rows):
        prompt = [t for t, m in zip(prompt_ids[b], prompt_mask[b]) if m]
        real = [j for j in range(completion_ids.shape[1]) if completion_mask[b, j]]
        extent = real[-1] + 1 if real else 0
        lengths.append(len(prompt))
        for t, token in enumerate(prompt):
            ids[b, t], attention[b, t] = token, True
        for j in range(completion_ids.shape[1]):
            position = len(prompt) + j
            ids[b, position] = completion_ids[b, j]
            loss[b, position] = completion_mask[b, j]
            if j < extent:
                attention[b, position], turns[b, position] = True, 0
    return ids, attention, loss, turns, np.array(lengths)


def grpo_reference(rewards, group_size):
    """tunix's `grpo` estimator in float64: (r - group mean) / (unbiased group std + 1e-6)."""
    r = np.asarray(rewards, np.float64).reshape(-1, group_size)
    return ((r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)


def test_rollout_layout_matches_a_loop_over_tokens():
    rng = np.random.default_rng(0)
    prompt_ids, prompt_mask, completion_ids, completion_mask, _ = tunix_rollout(rng)
    rollout = adapter.rollout_from_tunix(prompt_ids, prompt_mask, completion_ids, completion_mask)
    ids, attention, loss, turns, lengths = layout_loop(prompt_ids, prompt_mask, completion_ids, completion_mask)
    np.testing.assert_array_equal(rollout.attention_mask, attention)
    np.testing.assert_array_equal(np.where(attention | loss, rollout.input_ids, 0), np.where(attention | loss, ids, 0))
    np.testing.assert_array_equal(rollout.loss_mask, loss)
    np.testing.assert_array_equal(rollout.turn_ids, turns)
    np.testing.assert_array_equal(rollout.prompt_lengths, lengths)
    # a timestep array whose value is its own position reads back as p_b + j - 1
    steps = np.broadcast_to(np.arange(ids.shape[1], dtype=np.float32), ids.shape)
    np.testing.assert_array_equal(rollout.on_completion(steps), lengths[:, None] - 1 + np.arange(completion_ids.shape[1]))


def test_agentic_turns_are_the_runs_of_trained_tokens():
    # Issue 33.1: the agentic learner's turns are the runs of conversation_masks (assistant tokens between
    # the environment's); the rest of the layout is the same as for one completion.
    rng = np.random.default_rng(3)
    prompt_ids, prompt_mask, completion_ids, completion_mask, _ = tunix_rollout(rng)
    runs = adapter.rollout_from_tunix(prompt_ids, prompt_mask, completion_ids, completion_mask, turns="runs")
    one = adapter.rollout_from_tunix(prompt_ids, prompt_mask, completion_ids, completion_mask)
    for field in ("input_ids", "attention_mask", "loss_mask", "prompt_lengths"):
        np.testing.assert_array_equal(getattr(runs, field), getattr(one, field))
    want = np.full(runs.turn_ids.shape, -1)
    for b in range(want.shape[0]):
        turn, previous = -1, False
        for t in range(want.shape[1]):
            trained = bool(runs.loss_mask[b, t])
            if trained and not previous:
                turn += 1
            if trained:
                want[b, t] = turn
            previous = trained
    np.testing.assert_array_equal(runs.turn_ids, want)
    assert (want.max(axis=1) >= 1).any()  # some row has two turns or more
    with pytest.raises(ValueError, match="turns must be one of"):
        adapter.rollout_from_tunix(prompt_ids, prompt_mask, completion_ids, completion_mask, turns="steps")


def test_rollout_refuses_what_it_cannot_place():
    ids = np.ones((2, 3), np.int32)
    with pytest.raises(ValueError, match=r"every prompt needs a token.*row 1"):
        adapter.rollout_from_tunix(ids, np.array([[0, 1, 1], [0, 0, 0]], bool), ids, np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="completion_mask must be"):
        adapter.rollout_from_tunix(ids, np.ones((2, 3), bool), ids, np.ones((2, 4), bool))
    rollout = adapter.rollout_from_tunix(ids, np.ones((2, 3), bool), ids, np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="group_size must divide"):
        rollout.batch(np.zeros(2), group_size=3)
    with pytest.raises(ValueError, match=r"rewards must have shape \(2,\)"):
        rollout.batch(np.zeros(3), group_size=2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_without_process_rewards_the_advantages_are_tunix_grpo(seed):
    # Issue 23.8's numbers check: process rewards off, the advantages fed to tunix equal its `grpo`
    # estimator's (the probe: 1.2e-7) on every trained completion token (tunix's loss reads no other).
    rng = np.random.default_rng(seed)
    prompt_ids, prompt_mask, completion_ids, completion_mask, rewards = tunix_rollout(rng)
    rollout = adapter.rollout_from_tunix(prompt_ids, prompt_mask, completion_ids, completion_mask)
    advantages, _ = adapter.process_advantages(rollout, rewards, group_size=4, config=adapter.grpo_config())
    want = np.broadcast_to(grpo_reference(rewards, 4)[:, None], completion_mask.shape)
    np.testing.assert_allclose(np.where(completion_mask, advantages, 0.0), np.where(completion_mask, want, 0.0),
                               rtol=0, atol=2e-6)


@pytest.mark.parametrize("mode", ["additive", "gvpo", "process_weighted"])
def test_a_position_dependent_process_reward_lands_on_its_own_completion_token(mode):
    # Issue 23.8: token j's process reward reshapes the advantage tunix gives completion token j (the
    # timestep before it), not its neighbour's. A reward that differs at every token exposes an off-by-one.
    rng = np.random.default_rng(7)
    prompt_ids, prompt_mask, completion_ids, completion_mask, rewards = tunix_rollout(rng)
    rollout = adapter.rollout_from_tunix(prompt_ids, prompt_mask, completion_ids, completion_mask)
    per_token = rng.uniform(0.05, 0.95, completion_mask.shape).astype(np.float32)
    if mode == "gvpo":
        per_token -= 0.5  # gvpo reads the sign
    token_rewards = np.zeros(rollout.input_ids.shape, np.float32)
    rows = np.arange(len(rewards))[:, None]
    token_rewards[rows, rollout.prompt_lengths[:, None] + np.arange(completion_mask.shape[1])] = per_token
    token_rewards *= rollout.turn_ids >= 0
    config = adapter.grpo_config(ShapingConfig(mode))
    got, _ = adapter.process_advantages(rollout, rewards, group_size=4, config=config, token_rewards=token_rewards)
    a = np.broadcast_to(grpo_reference(rewards, 4)[:, None], completion_mask.shape)
    p = per_token.astype(np.float64)
    # AReaL's shaping rules (the train-step guide's table of shaping modes), per trained token, with the token's own process
    # reward
    if mode == "additive":
        want = a + p
    elif mode == "gvpo":
        bad_turn = np.where(a < -1e-6, 1.2 * a, np.where(a > 1e-6, 0.0, -0.4))  # negative_scale, zero_penalty
        want = np.where(p < 0, bad_turn, a)
    else:
        want = np.where(a >= 0, a * p, np.where(p > 0, p, a))
    np.testing.assert_allclose(np.where(completion_mask, got, 0.0), np.where(completion_mask, want, 0.0),
                               rtol=1e-5, atol=2e-5)


def test_rollout_checks_padding_side_token_ids_and_widths():
    # Issue 29.16: right-padded prompts were taken as prompt tokens, token ids >= 2**31 wrapped into int32,
    # and on_completion accepted an array of the wrong width.
    rng = np.random.default_rng(16)
    prompt_ids, prompt_mask, completion_ids, completion_mask, _ = tunix_rollout(rng)
    right = prompt_mask[:, ::-1].copy()  # the same prompts, right-padded
    right[0] = [True] * (right.shape[1] - 1) + [False]
    with pytest.raises(ValueError, match=r"prompt_mask must be left-padded.*row 0 ends with a pad"):
        adapter.rollout_from_tunix(prompt_ids, right, completion_ids, completion_mask)
    wide = completion_ids.astype(np.int64)
    wide[2, 0] = 2**31
    with pytest.raises(ValueError, match=r"completion_ids must hold token ids in \[0, 2147483647\]; row 2 holds "
                                         "2147483648"):
        adapter.rollout_from_tunix(prompt_ids, prompt_mask, wide, completion_mask)
    negative = prompt_ids.copy()
    negative[3, -1] = -5
    with pytest.raises(ValueError, match=r"prompt_ids must hold token ids.*row 3 holds -5"):
        adapter.rollout_from_tunix(negative, prompt_mask, completion_ids, completion_mask)
    rollout = adapter.rollout_from_tunix(prompt_ids, prompt_mask, completion_ids, completion_mask)
    with pytest.raises(ValueError, match=r"must have the rollout's shape \[B, P \+ C\]"):
        rollout.on_completion(np.zeros((rollout.input_ids.shape[0], rollout.input_ids.shape[1] - 1), np.float32))
    inner = prompt_mask.copy()  # a pad id inside a left-padded prompt stays a prompt token
    inner[4, -2] = False
    adapter.rollout_from_tunix(prompt_ids, inner, completion_ids, completion_mask)


@pytest.mark.parametrize("stage", [
    dict(process_reward_transform={"mode": "min_form", "temperature": 0.5}),
    dict(gae_timestep_unit="turn", discount=0.9, gae_lambda=0.8),
    dict(credit_assignment={"mode": "pure"}),
    dict(process_reward_transform={"mode": "progress", "gamma": 0.9, "level": "turn"}),
])
def test_every_stage_that_reads_turns_sees_the_rollouts_turns_with_holes(stage):
    # Issue 41.7: rollout_from_tunix built turn_ids and Rollout.batch() left them out, so min_form with unit turn
    # counted runs of the loss mask as turns (5 turns for 3 completions with holes). Each stage that reads turns
    # gives, on tunix's layout with holes, what it gives on the same batch with the loop's turn ids.
    from prm_jax import compute_advantages
    from prm_jax.config import AdvantageConfig

    rng = np.random.default_rng(41)
    prompt_ids, prompt_mask, completion_ids, completion_mask, rewards = tunix_rollout(rng, groups=1, group_size=4)
    rollout = adapter.rollout_from_tunix(prompt_ids, prompt_mask, completion_ids, completion_mask)
    _, _, loss, turns, _ = layout_loop(prompt_ids, prompt_mask, completion_ids, completion_mask)
    token_rewards = np.where(loss, rng.normal(size=loss.shape), 0.0).astype(np.float32)
    batch = rollout.batch(rewards[:4], group_size=4, token_rewards=token_rewards)
    np.testing.assert_array_equal(batch["turn_ids"], turns)  # the rollout's turns reach the batch
    holes = [(np.diff(np.flatnonzero(row)) > 1).any() for row in loss]
    assert any(holes)  # some completion has a hole: its loss mask has more runs than it has turns
    config = AdvantageConfig(kl_ctl=0.0, **stage)
    got = compute_advantages(batch, config).advantages
    want = compute_advantages(dict(batch, turn_ids=turns.astype(np.int32)), config).advantages
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    runs = np.where(loss, np.cumsum(loss & ~np.pad(loss, ((0, 0), (1, 0)))[:, :-1], axis=1) - 1, -1)
    as_runs = compute_advantages(dict(batch, turn_ids=runs.astype(np.int32)), config).advantages
    assert not np.allclose(np.asarray(as_runs), np.asarray(want))  # the stage does read the turns
