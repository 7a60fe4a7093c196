import time

import anyio
import numpy as np
import pytest
import scorers_for_tests as st

from prm_jax import BaseScorer, ExperimentConfig, Interaction, PRMRunner, pack_branches
from prm_jax.config import PRMConfig
from prm_jax.filters import filter_mixed_or_penalized_all_wrong
from prm_jax.runtime._export import HITL_SESSION, ExportService, TrajectoryStore, export_group

pytestmark = pytest.mark.anyio


CALLS: list[tuple] = []


class LeafAware(BaseScorer):
    """Scores a turn by the leaf of the branch being scored, so a shared ancestor scores per branch."""

    name = "leaf_aware"

    async def evaluate(self, interaction, ctx):
        CALLS.append((ctx["session_key"], interaction.interaction_id, ctx["messages"][-1]["content"]))
        if ctx["messages"][-1]["content"] == "explode":
            raise RuntimeError("judge failed")
        return 1.0 if ctx["messages"][-1]["content"] == "good" else -1.0


class Slow(BaseScorer):
    name = "slow"

    async def evaluate(self, interaction, ctx):
        CALLS.append(("start", ctx["session_key"], ctx["messages"][-1]["content"]))
        await anyio.sleep(0.2)
        CALLS.append(("end", ctx["session_key"], ctx["messages"][-1]["content"]))
        return 0.0


class Hang(BaseScorer):
    name = "hang"

    async def evaluate(self, interaction, ctx):
        await anyio.sleep_forever()


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()


def add_chain(store, key, answers=("good",), reward=1.0, branch_answers=()):
    """A chain of turns; the last gets ``reward``; ``branch_answers`` add sibling leaves of the last turn."""
    tokens, parent = [1, 2], None
    for k, answer in enumerate(answers):
        iid = f"{key}-t{k}"
        last = k == len(answers) - 1
        store.add(key, Interaction(iid, list(tokens), [10 + k, 20 + k], parent_id=parent, reward=reward if last else None,
                                   output_messages=[{"role": "assistant", "content": answer}]))
        if not last:
            tokens, parent = tokens + [10 + k, 20 + k, 5], iid
    leaves = [f"{key}-t{len(answers) - 1}"]
    for j, answer in enumerate(branch_answers):
        iid = f"{key}-b{j}"
        store.add(key, Interaction(iid, list(tokens), [30 + j], parent_id=parent, reward=reward,
                                   output_messages=[{"role": "assistant", "content": answer}]))
        leaves.append(iid)
    for leaf in leaves:
        store.mark_ready(key, leaf)
    return leaves


def runner_of(*scorers):
    return PRMRunner(scorers=scorers)


async def test_branches_are_cloned_and_shared_ancestors_score_per_branch():
    store = TrajectoryStore()
    add_chain(store, "s", ("first", "good"), branch_answers=("bad",))
    result = await export_group(store, ["s"], runner=runner_of(LeafAware()), remove_session=False,
                                normalize_rewards=False)
    assert result.status == "accepted"
    by_leaf = {t.leaf_id: t.sequence for t in result.trajectories}
    # The shared first turn scores +1 on the "good" branch and -1 on the "bad" one.
    assert by_leaf["s-t1"].token_rewards[2:4].tolist() == [1.0, 1.0]
    assert by_leaf["s-b0"].token_rewards[2:4].tolist() == [-1.0, -1.0]
    assert all(i.token_rewards is None for i in store.session("s"))
    assert result.prm_stats.branch_totals["s"] == {"s-t1": {"leaf_aware": 2.0}, "s-b0": {"leaf_aware": -2.0}}


async def test_failed_branch_rejects_its_session_and_the_group_but_others_report_stats():
    store = TrajectoryStore()
    add_chain(store, "ok", ("good",))
    add_chain(store, "bad", ("good",), branch_answers=("explode",))
    result = await export_group(store, ["ok", "bad"], runner=runner_of(LeafAware()))
    assert result.status == "rejected" and result.trajectories == []
    assert set(result.rejected_sessions) == {"bad"} and "judge failed" in result.rejected_sessions["bad"]
    assert set(result.prm_stats.turn_results) == {"ok"}
    assert result.prm_stats.metrics.values()["rollout/prm_turn_reward/leaf_aware"] == 1.0
    assert not store.has_session("ok") and not store.has_session("bad")


async def test_sessions_concurrent_branches_in_order():
    store = TrajectoryStore()
    add_chain(store, "a", ("x",), branch_answers=("y",))
    add_chain(store, "b", ("x",))
    start = time.monotonic()
    await export_group(store, ["a", "b"], runner=runner_of(Slow()))
    assert time.monotonic() - start < 0.55  # a's two branches in order (0.4 s), b alongside
    a_events = [(e[0], e[2]) for e in CALLS if e[1] == "a"]
    assert a_events == [("start", "x"), ("end", "x"), ("start", "y"), ("end", "y")]
    assert CALLS.index(("start", "b", "x")) < CALLS.index(("end", "a", "x"))


async def test_missing_session_rejects_the_group_without_scoring():
    store = TrajectoryStore()
    add_chain(store, "a")
    result = await export_group(store, ["a", "ghost"], runner=runner_of(LeafAware()))
    assert result.status == "rejected" and "ghost" in result.rejected_sessions and CALLS == []


async def test_discard_skips_scoring_and_removes():
    store = TrajectoryStore()
    add_chain(store, "a")
    result = await export_group(store, ["a"], runner=runner_of(LeafAware()), discard=True)
    assert result.status == "discarded" and CALLS == [] and not store.has_session("a")


async def test_remove_session_on_cancellation_and_keep_when_asked():
    store = TrajectoryStore()
    add_chain(store, "a")
    with anyio.move_on_after(0.05) as scope:
        await export_group(store, ["a"], runner=runner_of(Hang()))
    assert scope.cancelled_caught and not store.has_session("a")
    add_chain(store, "b")
    await export_group(store, ["b"], runner=runner_of(LeafAware()), remove_session=False)
    assert store.has_session("b") and store.ready("b") == []


async def test_consumed_trajectory_is_not_scored_again():
    store = TrajectoryStore()
    add_chain(store, "a")
    first = await export_group(store, ["a"], runner=runner_of(LeafAware()), remove_session=False)
    assert first.status == "accepted" and len(CALLS) == 1
    retry = await export_group(store, ["a"], runner=runner_of(LeafAware()), remove_session=False)
    assert retry.status == "rejected" and len(CALLS) == 1


async def test_hitl_session_is_persistent_and_consumes_only_the_selected_trajectory():
    store = TrajectoryStore()
    leaves = add_chain(store, HITL_SESSION, ("good",), branch_answers=("bad",))
    gate = anyio.Event()

    class Gated(BaseScorer):
        name = "gated"

        async def evaluate(self, interaction, ctx):
            await gate.wait()
            return 0.5

    async with anyio.create_task_group() as tg:
        results = []

        async def export():
            results.append(await export_group(store, [HITL_SESSION], runner=runner_of(Gated()),
                                              select={HITL_SESSION: leaves[1]}, persistent=(HITL_SESSION,)))
        tg.start_soon(export)
        await anyio.sleep(0.01)
        # The agent keeps working on the session while the export is in flight.
        store.add(HITL_SESSION, Interaction("late", [1, 2, 10, 20, 5, 9], [9], parent_id=leaves[0], reward=0.0))
        store.mark_ready(HITL_SESSION, "late")
        gate.set()
    assert [t.leaf_id for t in results[0].trajectories] == [leaves[1]]
    assert store.has_session(HITL_SESSION) and "late" in store.session(HITL_SESSION)
    assert store.ready(HITL_SESSION) == [leaves[0], "late"]


async def test_hitl_rule_applies_only_where_the_caller_asks():
    # Issue 20.3: a session keyed "__hitl__" is an ordinary session unless the caller names it persistent
    # (3 ready trajectories in, 3 out, session removed).
    store = TrajectoryStore()
    leaves = add_chain(store, HITL_SESSION, ("good",), branch_answers=("bad", "ok"))
    assert len(leaves) == 3
    result = await export_group(store, [HITL_SESSION], runner=runner_of(LeafAware()))
    assert result.status == "accepted"
    assert [t.leaf_id for t in result.trajectories] == leaves
    assert not store.has_session(HITL_SESSION)
    leaves = add_chain(store, HITL_SESSION, ("good",), branch_answers=("bad", "ok"))
    result = await export_group(store, [HITL_SESSION], runner=runner_of(LeafAware()), persistent=(HITL_SESSION,))
    assert [t.leaf_id for t in result.trajectories] == leaves[:1] and store.has_session(HITL_SESSION)


async def test_result_shape_without_prm_is_unchanged():
    store = TrajectoryStore()
    add_chain(store, "a")
    add_chain(store, "b", reward=0.0)
    for runner in (None, PRMRunner(PRMConfig(enabled=False), scorers=(LeafAware(),))):
        result = await export_group(store, ["a", "b"], runner=runner, remove_session=False)
        assert result.status == "accepted" and (result.prm_stats, result.prm_fallbacks, result.filter) == (None,) * 3
        assert result.trajectories[0].original_reward == 1.0 and result.rejected_sessions == {}
        for key in ("a", "b"):
            store.mark_ready(key, f"{key}-t0")


async def test_group_normalization_after_scoring_leaves_process_rewards_alone():
    store = TrajectoryStore()
    add_chain(store, "a", ("good",), reward=1.0)
    add_chain(store, "b", ("bad",), reward=0.0)
    add_chain(store, "c", ("good",), reward=0.0)
    result = await export_group(store, ["a", "b", "c"], runner=runner_of(LeafAware()))
    rewards = [t.reward for t in result.trajectories]
    # population z-score of [1, 0, 0]: mean 1/3, std sqrt(2)/3
    np.testing.assert_allclose(rewards, [2 / 2**0.5, -1 / 2**0.5, -1 / 2**0.5], rtol=1e-6)
    assert [t.original_reward for t in result.trajectories] == [1.0, 0.0, 0.0]
    assert [t.sequence.token_rewards[2:].tolist() for t in result.trajectories] == [[1, 1], [-1, -1], [1, 1]]


async def test_the_normalized_reward_is_where_the_batch_reads_it():
    # Issue 14.5: t.reward was normalized but t.sequence.reward, which pack_branches reads, stayed raw.
    store = TrajectoryStore()
    add_chain(store, "a", ("good",), reward=1.0)
    add_chain(store, "b", ("bad",), reward=0.0)
    result = await export_group(store, ["a", "b"], runner=runner_of(LeafAware()))
    batch = pack_branches([t.sequence for t in result.trajectories])
    np.testing.assert_allclose(batch["rewards"], [1.0, -1.0], rtol=1e-6)  # population z-score of [1, 0]
    assert [t.sequence.reward for t in result.trajectories] == [t.reward for t in result.trajectories]


def test_proxy_normalize_population_z_score():
    from prm_jax.kernels._normalization import proxy_normalize
    np.testing.assert_allclose(proxy_normalize([1.0, 0.0]), [1.0, -1.0], rtol=1e-6)
    np.testing.assert_allclose(proxy_normalize([3.0]), [0.0])
    rng = np.random.default_rng(3)
    for n in (2, 3, 9, 40):
        r = rng.normal(size=n)
        mean = sum(r) / n
        std = (sum((x - mean) ** 2 for x in r) / n) ** 0.5
        np.testing.assert_allclose(proxy_normalize(r.tolist()), [(x - mean) / (std + 1e-8) for x in r], rtol=1e-12)


async def test_group_filter_applies_to_the_complete_group():
    store = TrajectoryStore()
    add_chain(store, "a", ("good",), reward=0.0)
    add_chain(store, "b", ("good",), reward=0.0)
    result = await export_group(store, ["a", "b"], runner=runner_of(LeafAware()),
                                group_filter=filter_mixed_or_penalized_all_wrong)
    assert result.status == "filtered"  # all wrong, no negative process reward
    add_chain(store, "c", ("bad",), reward=0.0)
    add_chain(store, "d", ("good",), reward=0.0)
    result = await export_group(store, ["c", "d"], runner=runner_of(LeafAware()),
                                group_filter=filter_mixed_or_penalized_all_wrong)
    assert result.status == "accepted"  # all wrong, but penalized by the process reward


def config(version="v2", **scorer_kwargs):
    scorers = [{"path": "scorers_for_tests.ClosingA", "kwargs": {"label": "a", **scorer_kwargs}},
               {"path": "scorers_for_tests.ClosingB", "kwargs": {"label": "b"}}]
    return ExperimentConfig.from_mapping({"rollout": {"_version": version, "agent": {"prm": {"scorers": scorers}}}})


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_service_closes_runner_then_clients_even_when_scorer_cleanup_fails(version):
    service = await ExportService.start(config(version, fail=True), clients=[st.Client("bridge"), st.Client("http")])
    with pytest.raises(ExceptionGroup) as info:
        await service.aclose()
    assert st.EVENTS == ["close:b", "close:a", "client:http", "client:bridge"]
    assert "cleanup of a failed" in str(info.value.exceptions[0].exceptions[0])
    await service.aclose()
    assert len(st.EVENTS) == 4


async def test_v2_startup_error_closes_scorers_and_clients_and_keeps_the_error():
    data = {"rollout": {"_version": "v2", "agent": {"prm": {"scorers": [
        {"path": "scorers_for_tests.ClosingA", "kwargs": {"label": "a"}},
        {"path": "scorers_for_tests.BrokenConstructor"}]}}}}
    with pytest.raises(RuntimeError, match="constructor failed") as info:
        await ExportService.start(ExperimentConfig.from_mapping(data), clients=[st.Client("bridge", fail=True)])
    assert st.EVENTS == ["close:a", "client:bridge"]
    assert any("client" in note and "failed to close" in note for note in info.value.__notes__)


async def test_v1_startup_has_no_scorer_rollback_but_closes_clients():
    data = {"rollout": {"_version": "v1", "agent": {"prm": {"scorers": [
        {"path": "scorers_for_tests.ClosingA", "kwargs": {"label": "a"}},
        {"path": "scorers_for_tests.BrokenConstructor"}]}}}}
    with pytest.raises(RuntimeError, match="constructor failed"):
        await ExportService.start(ExperimentConfig.from_mapping(data), clients=[st.Client("bridge")])
    assert st.EVENTS == ["client:bridge"]


async def test_service_export_uses_its_runner():
    async with await ExportService.start(config("v2")) as service:
        add_chain(service.store, "a")
        result = await service.export(["a"])
        assert result.status == "accepted" and result.prm_stats is not None
    assert st.EVENTS == ["close:b", "close:a"]


# --- issue 20.15: AReaL's error_policy (PR #1747) ----------------------------------------------------------

def original_session(store, key, answers=("good", "explode")):
    """A root turn with pre-existing token rewards and two leaves: the first scores, the second explodes."""
    store.add(key, Interaction(f"{key}-r", [1, 2], [3, 4], token_rewards=[0.25, -0.5],
                               output_messages=[{"role": "assistant", "content": "root"}]))
    for j, answer in enumerate(answers):
        store.add(key, Interaction(f"{key}-l{j}", [1, 2, 3, 4, 5], [6 + j], parent_id=f"{key}-r", reward=float(j),
                                   output_messages=[{"role": "assistant", "content": answer}]))
        store.mark_ready(key, f"{key}-l{j}")


async def test_keep_original_exports_the_whole_session_unscored_when_a_scorer_fails():
    store = TrajectoryStore()
    original_session(store, "a")
    add_chain(store, "b")
    want = {leaf: store.session("a").to_sequence(leaf) for leaf in ("a-l0", "a-l1")}
    result = await export_group(store, ["a", "b"], runner=runner_of(LeafAware()), error_policy="keep_original")
    assert result.status == "accepted"
    got = {t.leaf_id: t.sequence for t in result.trajectories if t.session_key == "a"}
    assert sorted(got) == ["a-l0", "a-l1"]
    for leaf, sequence in got.items():  # the first branch scored before the second failed: not kept
        np.testing.assert_array_equal(sequence.token_rewards, want[leaf].token_rewards)
        assert [t.original_reward for t in result.trajectories if t.leaf_id == leaf] == [want[leaf].reward]
    scored_b = next(t.sequence for t in result.trajectories if t.session_key == "b")
    assert scored_b.token_rewards is not None and scored_b.token_rewards.max() == 1.0  # b was scored
    assert list(result.prm_fallbacks) == ["a"] and "judge failed" in result.prm_fallbacks["a"]
    metrics = result.prm_stats.metrics.values()
    assert metrics["rollout/prm_fallback"] == 1.0
    assert "a" not in result.prm_stats.turn_results and "b" in result.prm_stats.turn_results
    assert not store.has_session("a") and not store.has_session("b")  # cleanup unchanged


async def test_reject_stays_the_default():
    store = TrajectoryStore()
    original_session(store, "a")
    result = await export_group(store, ["a"], runner=runner_of(LeafAware()))
    assert result.status == "rejected" and result.prm_fallbacks is None


async def test_keep_original_never_catches_cancellation_or_a_closed_runner():
    store = TrajectoryStore()
    add_chain(store, "a")
    with anyio.move_on_after(0.05) as scope:
        await export_group(store, ["a"], runner=runner_of(Hang()), error_policy="keep_original")
    assert scope.cancelled_caught
    store = TrajectoryStore()
    add_chain(store, "a")
    runner = runner_of(LeafAware())
    await runner.aclose()
    result = await export_group(store, ["a"], runner=runner, error_policy="keep_original")
    assert result.status == "rejected" and result.prm_fallbacks == {}
    assert "closed" in result.rejected_sessions["a"]


def test_error_policy_config():
    base = {"rollout": {"agent": {"prm": {"error_policy": "keep_original", "scorers": [
        {"path": "prm_jax.scorers.LengthBudgetScorer"}]}}}}
    assert ExperimentConfig.from_mapping(base).prm.error_policy == "keep_original"
    v2 = {"rollout": {**base["rollout"], "_version": "v2"}}
    with pytest.raises(ValueError, match=r"rollout\.agent\.prm\.error_policy keep_original is not implemented for "
                                         r"rollout\._version v2"):
        ExperimentConfig.from_mapping(v2)
    v2["rollout"]["agent"]["prm"]["enabled"] = False  # only an enabled keep_original is refused
    ExperimentConfig.from_mapping(v2)
    with pytest.raises(ValueError, match="error_policy must be one of"):
        ExperimentConfig.from_mapping({"rollout": {"agent": {"prm": {"error_policy": "ignore"}}}})


async def test_turn_discount_is_applied_per_tree_and_keeps_the_raw_rewards():
    # Issue 22.1, the two-branch example of AReaL's PR #1666: root -> A1 -> A2 (reward 1), root -> B1 (reward 0), gamma 0.9,
    # inserted root, A1, B1, A2. A ready trajectory at A1 (raw reward 0) gets 0 + 0.9 * 1; AReaL's running
    # discount would also hand A2's reward to B1 (0.9), the tree rule keeps B1 at 0.
    store = TrajectoryStore()
    root = Interaction("root", [1], [2], reward=None)
    a1 = Interaction("A1", [1, 2], [3], parent_id="root", reward=0.0)
    b1 = Interaction("B1", [1, 2], [4], parent_id="root", reward=0.0)
    a2 = Interaction("A2", [1, 2, 3], [5], parent_id="A1", reward=1.0)
    for turn in (root, a1, b1, a2):
        store.add("s", turn)
    for leaf in ("A2", "B1", "A1"):
        store.mark_ready("s", leaf)
    result = await export_group(store, ["s"], normalize_rewards=False, turn_discount=0.9, remove_session=False)
    got = {t.leaf_id: (t.reward, t.original_reward, t.sequence.reward) for t in result.trajectories}
    assert got["A2"] == (1.0, 1.0, 1.0) and got["B1"] == (0.0, 0.0, 0.0)
    np.testing.assert_allclose(got["A1"], (0.9, 0.0, 0.9), rtol=1e-6)
    # Without the key nothing is discounted.
    for leaf in ("A2", "B1", "A1"):
        store.mark_ready("s", leaf)
    plain = await export_group(store, ["s"], normalize_rewards=False)
    assert {t.leaf_id: t.reward for t in plain.trajectories} == {"A2": 1.0, "B1": 0.0, "A1": 0.0}


def test_turn_discount_is_read_from_the_top_of_an_areal_config():
    from prm_jax.config import ConfigError, ExperimentConfig
    assert ExperimentConfig.from_mapping({"turn_discount": 0.9}).turn_discount == 0.9
    with pytest.raises(ConfigError, match="turn_discount"):
        ExperimentConfig.from_mapping({"turn_discount": 1.5})


class OncePerTurn(BaseScorer):
    """A prefix-determined scorer: its score of a turn depends on the turn alone."""

    name = "once_per_turn"
    prefix_determined = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = []

    async def evaluate(self, interaction, ctx):
        self.calls.append(interaction.interaction_id)
        return float(interaction.output_tokens[0]) / 100


async def test_a_groups_export_scores_a_shared_turn_once_for_a_prefix_determined_scorer():
    # Issue 30.6: in a session tree, the export scored each shared turn once per branch.
    store = TrajectoryStore()
    add_chain(store, "s", ("first", "second"), branch_answers=("x", "y", "z"))
    add_chain(store, "t", ("first", "second"), branch_answers=("x",))
    scorer = OncePerTurn()
    result = await export_group(store, ["s", "t"], runner=runner_of(scorer), normalize_rewards=False)
    assert result.status == "accepted"
    assert sorted(scorer.calls) == sorted(["s-t0", "s-t1", "s-b0", "s-b1", "s-b2", "t-t0", "t-t1", "t-b0"])
    by_leaf = {t.leaf_id: t.sequence for t in result.trajectories}
    for leaf in ("s-b0", "s-b1", "s-b2"):  # every branch carries the shared turns' scores
        assert by_leaf[leaf].token_rewards[2:4].tolist() == [np.float32(0.1)] * 2
