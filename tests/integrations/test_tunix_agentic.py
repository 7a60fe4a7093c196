"""prm-jax's advantages inside tunix's agentic GRPOLearner (issue 33.1), at its ``_process_results`` seam.

Needs the `tunix` extra (`python3 dev.py tunix`); skipped without it. The trajectories are what tunix's
trajectory engine returns in its "Token" mode (tunix's own agentic tests drive ``_process_results`` the
same way): a prompt, then assistant turns (``conversation_masks`` 1) and the environment's tokens between
them (0). The cluster is the tunix example's (tunix's toy transformer, vanilla rollout, MockVocab).
"""

import types

import numpy as np
import pytest

tunix = pytest.importorskip("tunix")

from grain import python as grain  # noqa: E402 (after the skip: the tunix extra brings it)
from tunix.rl import algo_core  # noqa: E402
from tunix.rl.agentic import agentic_grpo_learner  # noqa: E402
from tunix_rules import tunix_promotion_rules  # noqa: E402, F401 (an autouse fixture)

import prm_jax  # noqa: E402
from examples.tunix_agentic.__main__ import ChatParser  # noqa: E402
from examples.tunix_grpo.__main__ import make_cluster  # noqa: E402
from prm_jax.integrations import tunix as adapter  # noqa: E402

GROUP = 2
WIDTH = 8  # max_response_length (the example cluster generates 8 tokens)
# Two trajectories of one group: turns of 3 and 2 assistant tokens around 2 environment tokens (ids 3-21:
# MockVocab's words), and one of a single turn, its environment answer last.
TRAJECTORIES = [
    dict(tokens=[5, 6, 7, 10, 11, 8, 9], masks=[1, 1, 1, 0, 0, 1, 1], reward=1.0, steps=[0.5, -0.25],
         states=["", "'obs a'"]),
    dict(tokens=[12, 13, 14, 15, 16], masks=[1, 1, 1, 0, 0], reward=0.0, steps=[0.75], states=[""]),
]


def items(trajectories=TRAJECTORIES, recorded=True):
    out = []
    for k, t in enumerate(trajectories):
        traj = {"conversation_text": [{"role": "user", "content": "task"}, {"role": "assistant", "content": f"move {k}"}],
                "prompt_tokens": np.array([1, 4, 3]), "conversation_tokens": np.array(t["tokens"]),
                "conversation_masks": np.array(t["masks"]), "old_logprobs": None, "policy_version": 0,
                "trajectory_reward": t["reward"], "original_input": {"prompts": "task"}, "group_id": 0}
        if recorded:
            traj[adapter.STEP_REWARDS_KEY], traj[adapter.STEP_STATES_KEY] = t["steps"], t["states"]
        out.append(types.SimpleNamespace(traj=traj))
    return out


def learner(**kwargs):
    config = agentic_grpo_learner.GRPOConfig(num_generations=GROUP, beta=0.0, max_response_length=WIDTH,
                                             use_rollout_logps=False)  # (the example cluster returns none)
    return adapter.ProcessRewardAgenticGRPOLearner(rl_cluster=make_cluster(1), algo_config=config,
                                                   chat_parser=ChatParser(), **kwargs)  # outcome: the trajectory's reward


def turns_of(mask):
    """Each token's assistant turn in one row's mask (the k-th run of 1s is turn k), -1 elsewhere."""
    m = np.asarray(mask, bool)
    starts = m & ~np.concatenate([[False], m[:-1]])
    return np.where(m, np.cumsum(starts) - 1, -1)


def trained_and_turns():
    """``[B, C]`` the trained (assistant) tokens and each one's turn, -1 on the environment's and padding."""
    masks = np.zeros((len(TRAJECTORIES), WIDTH), bool)
    for row, t in enumerate(TRAJECTORIES):
        masks[row, :len(t["masks"])] = t["masks"]
    return masks, np.stack([turns_of(m) for m in masks])


def completion_ids():
    """``[B, C]`` the trajectories' conversation tokens, right-padded."""
    ids = np.zeros((len(TRAJECTORIES), WIDTH), int)
    for row, t in enumerate(TRAJECTORIES):
        ids[row, :len(t["tokens"])] = t["tokens"]
    return ids


def grpo(rewards):
    """tunix's own `grpo` advantages of one group."""
    return np.asarray(algo_core.compute_advantages(np.asarray(rewards, np.float32), len(rewards)))


class SeenTurns(prm_jax.BaseScorer):
    """0.01 x each token id of the turn, and a record of the turns it was asked about."""

    name = "seen_turns"

    def __init__(self, fail_on=None):
        super().__init__()
        self.seen, self.fail_on = [], fail_on

    async def evaluate(self, interaction, ctx):
        self.seen.append((ctx["conversation"][-1]["content"], list(map(int, interaction.output_tokens))))
        if ctx["conversation"][-1]["content"] == self.fail_on:
            raise ConnectionError("judge unreachable")
        return np.asarray(interaction.output_tokens, np.float32) * 0.01


def test_without_process_rewards_the_advantages_are_tunixs_own_grpo():
    [example] = learner()._process_results(items())
    trained, _ = trained_and_turns()
    assert np.array_equal(np.asarray(example.completion_mask, bool), trained)
    want = np.broadcast_to(grpo([t["reward"] for t in TRAJECTORIES])[:, None], trained.shape)
    np.testing.assert_allclose(np.asarray(example.advantages)[trained], want[trained], rtol=0, atol=1e-6)


def test_scorer_rewards_land_on_their_turns_tokens_and_the_environments_tokens_get_none():
    scorer = SeenTurns()
    with prm_jax.BlockingRunner(scorers=[scorer]) as runner:
        [example] = learner(scorers=runner)._process_results(items())
    trained, turns = trained_and_turns()
    ids = completion_ids()
    # The scorer saw each assistant turn's tokens, exactly, and no environment token.
    want_seen = sorted((f"move {row}", [int(i) for i in ids[row][turns[row] == k]])
                       for row in range(len(TRAJECTORIES)) for k in range(turns[row].max() + 1))
    assert sorted(scorer.seen) == want_seen
    outcome = np.broadcast_to(grpo([t["reward"] for t in TRAJECTORIES])[:, None], trained.shape)
    np.testing.assert_allclose(np.asarray(example.advantages)[trained], (outcome + 0.01 * ids)[trained], rtol=1e-5,
                               atol=1e-6)


def test_a_failed_trajectory_is_dropped_from_the_loss():
    with prm_jax.BlockingRunner(scorers=[SeenTurns(fail_on="move 1")]) as runner:
        [example] = learner(scorers=runner)._process_results(items())
    trained, _ = trained_and_turns()
    mask = np.asarray(example.completion_mask, bool)
    assert np.array_equal(mask[0], trained[0]) and not mask[1].any()


@pytest.mark.parametrize("with_scorer", [False, True])
def test_environment_step_rewards_as_process_rewards_reach_every_token_of_their_turn(with_scorer):
    # With a scorer too, a turn's token gets both: the scorer's reward and its step's.
    with prm_jax.BlockingRunner(scorers=[SeenTurns()]) as runner:
        [example] = learner(env_rewards="process", scorers=runner if with_scorer else None)._process_results(items())
    trained, turns = trained_and_turns()
    steps = np.zeros(trained.shape)
    for row, t in enumerate(TRAJECTORIES):
        steps[row] = np.where(turns[row] >= 0, np.asarray(t["steps"])[np.maximum(turns[row], 0)], 0.0)
    outcome = np.broadcast_to(grpo([t["reward"] for t in TRAJECTORIES])[:, None], trained.shape)
    want = outcome + steps + (0.01 * completion_ids() if with_scorer else 0.0)
    np.testing.assert_allclose(np.asarray(example.advantages)[trained], want[trained], rtol=1e-5, atol=1e-6)


def test_missing_step_rewards_and_a_changed_tunix_fail_loudly(monkeypatch):
    with pytest.raises(RuntimeError, match=r"trajectory 0 has 2 assistant turns .* no recorded step rewards"):
        learner(env_rewards="process")._process_results(items(recorded=False))
    masked_out = items()
    masked_out[0].traj["conversation_masks"] = np.zeros(7, int)  # tunix's overlong filter: nothing trained
    [example] = learner(env_rewards="process")._process_results(masked_out)
    assert not np.asarray(example.completion_mask)[0].any()
    with pytest.raises(ValueError, match="env_rewards='gigpo' and advantage_config's credit_assignment: gigpo"):
        learner(env_rewards="gigpo")
    hooked = learner()
    parent = agentic_grpo_learner.GRPOLearner._process_results
    monkeypatch.setattr(agentic_grpo_learner.GRPOLearner, "_process_results",
                        lambda self, *a, **k: parent(self, *a, **k) * 2)
    with pytest.raises(RuntimeError, match="returned 2 examples for a group of 2"):
        hooked._process_results(items())


@pytest.mark.parametrize("with_scorer", [False, True])
def test_environment_step_rewards_as_gigpo_step_rewards_equal_the_pipeline_on_the_packed_batch(with_scorer):
    config = adapter.grpo_config(credit_assignment={"mode": "gigpo", "step_discount": 0.9})
    with prm_jax.BlockingRunner(scorers=[SeenTurns()]) as runner:
        [example] = learner(env_rewards="gigpo", advantage_config=config,
                            scorers=runner if with_scorer else None)._process_results(items())
    trained, _ = trained_and_turns()
    # The same group by hand: turn rewards and anchors per turn ("" is the task's state, shared), and with a
    # scorer its rewards on the turns' positions (GiGPO's step rewards stay the environment's).
    rollout = adapter.rollout_from_tunix(example.prompt_ids, example.prompt_mask, example.completion_ids, trained,
                                         turns="runs")
    scores = np.where(rollout.turn_ids >= 0, 0.01 * rollout.input_ids, 0.0).astype(np.float32)
    batch = rollout.batch([t["reward"] for t in TRAJECTORIES], group_size=GROUP,
                          token_rewards=scores if with_scorer else None)
    batch.update(turn_ids=rollout.turn_ids, turn_rewards=np.array([[0.5, -0.25], [0.75, 0.0]], np.float32),
                 turn_reward_mask=np.array([[True, True], [True, False]]), anchor_ids=np.array([[0, 1], [0, -1]]))
    want = rollout.on_completion(prm_jax.compute_advantages(batch, config).advantages)
    np.testing.assert_allclose(np.asarray(example.advantages)[trained], np.asarray(want)[trained], rtol=1e-6,
                               atol=1e-6)
    # Both first steps share the task's state: their step advantages differ (0.5 vs 0.75), so GiGPO moves them.
    plain = np.asarray(learner()._process_results(items())[0].advantages)
    assert not np.allclose(np.asarray(example.advantages)[trained], plain[trained])


def test_the_example_rewards_each_turns_own_tokens_and_two_steps_teach_what_the_outcome_alone_does_not(
        monkeypatch):
    # Issue 33.1: tunix's own agentic learner end to end on the CPU: its trajectory engine, the vanilla rollout
    # of its toy transformer, a two-turn environment; every group it trains on gets grpo(outcome) plus 0.5 on
    # each "Tunix" token of an assistant turn, and nothing on the environment's tokens (they are not trained).
    from examples.tunix_agentic import __main__ as example

    seen = []
    process = example.Learner._process_results

    def recorded(self, trajectories, *args, **kwargs):
        examples = process(self, trajectories, *args, **kwargs)
        seen.append((trajectories, examples[0]))
        return examples

    monkeypatch.setattr(example.Learner, "_process_results", recorded)
    result = example.main(["--steps", "2"])
    assert len(seen) == len(result["tunix_share"]) == 4  # two steps of two groups
    two_turns = 0
    for trajectories, trained_on in seen:
        ids, mask = np.asarray(trained_on.completion_ids), np.asarray(trained_on.completion_mask, bool)
        conversation = np.zeros(mask.shape, bool)
        for row, item in enumerate(trajectories):
            masks = np.asarray(item.traj["conversation_masks"], bool)[:mask.shape[1]]
            conversation[row, :len(masks)] = masks
            two_turns += int((np.diff(masks.astype(int)) == 1).any())  # an assistant turn after the environment's
        assert np.array_equal(mask, conversation)
        outcome = grpo([item.traj["trajectory_reward"] for item in trajectories])
        want = outcome[:, None] + 0.5 * (ids == example.TARGET)
        np.testing.assert_allclose(np.asarray(trained_on.advantages)[mask], want[mask], rtol=1e-5, atol=1e-6)
    assert two_turns > 0
    # The outcome (both answers all "Tunix") is never met in two steps: alone it trains nothing, while the
    # per-turn reward raises the share of "Tunix" in the second step's samples (the guide's run: 0.49 vs 0.26).
    monkeypatch.setattr(example.Learner, "_process_results", process)
    alone = example.main(["--steps", "2", "--no-process"])
    assert not any(result["outcome"]) and not any(alone["outcome"])
    assert np.mean(result["tunix_share"][2:]) > np.mean(alone["tunix_share"][2:]) + 0.15


def test_the_environments_step_rewards_are_recorded_in_a_real_rollout_and_reach_their_turns():
    # env_rewards="process" through tunix's own trajectory engine: the learner's engine records each step's
    # reward (here 0.25 per "Tunix" token of the step's answer), and each assistant turn's tokens get it.
    from examples.tunix_agentic import __main__ as example

    class StepRewardEnv(example.TwoTurnEnv):
        def _step_impl(self, action):
            result = super()._step_impl(action)
            result.reward += 0.25 * str(getattr(action, "action", action)).split().count("Tunix")
            return result

    seen = []
    process = example.Learner._process_results

    def recorded(self, trajectories, *args, **kwargs):
        seen.append((trajectories, process(self, trajectories, *args, **kwargs)[0]))
        return [seen[-1][1]]

    config = agentic_grpo_learner.GRPOConfig(num_generations=4, beta=0.0, max_response_length=example.RESPONSE,
                                             use_rollout_logps=False, max_concurrency=1)
    learner = example.Learner(rl_cluster=example.make_cluster(1, generate=example.RESPONSE, prompt=24, cache=64),
                              chat_parser=ChatParser(), env_class=StepRewardEnv, algo_config=config,
                              env_rewards="process")
    learner._process_results = types.MethodType(recorded, learner)
    learner.train(grain.MapDataset.source(["hello world", "My name"]).batch(2).map(lambda b: {"prompts": b}))
    assert seen
    for trajectories, trained_on in seen:
        ids, mask = np.asarray(trained_on.completion_ids), np.asarray(trained_on.completion_mask, bool)
        steps = np.zeros(mask.shape)
        for row, item in enumerate(trajectories):
            recorded_rewards = item.traj[adapter.STEP_REWARDS_KEY]
            turn_of = turns_of(mask[row])  # each completion token's assistant turn
            counts = [0.25 * int(((ids[row] == example.TARGET) & (turn_of == k)).sum()) for k in range(turn_of.max() + 1)]
            np.testing.assert_allclose(recorded_rewards, counts)  # the engine recorded the environment's rewards
            # and each step's anchor state (GiGPO's): the task's for the first, the environment's reply after
            assert item.traj[adapter.STEP_STATES_KEY] == ["", repr("hello there")][:len(counts)]
            assert item.traj["trajectory_reward"] == pytest.approx(sum(counts))  # (no step met the outcome)
            steps[row] = np.where(turn_of >= 0, np.asarray(counts)[np.maximum(turn_of, 0)], 0.0)
        outcome = grpo([item.traj["trajectory_reward"] for item in trajectories])
        np.testing.assert_allclose(np.asarray(trained_on.advantages)[mask], (outcome[:, None] + steps)[mask], rtol=1e-5,
                                   atol=1e-6)
