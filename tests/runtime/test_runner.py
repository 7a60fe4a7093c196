import math
import warnings

import anyio
import jax.numpy as jnp
import numpy as np
import pytest
import scorers_for_tests as st
from scorers_for_tests import chain, committed, scorer_of

from prm_jax import (
    BaseScorer,
    BaseTrajectoryScorer,
    Interaction,
    InteractionCache,
    PRMMetricObservation,
    PRMRunner,
    PRMScorerResult,
)
from prm_jax.config import ConfigError, PRMConfig, ScorerSpec
from prm_jax.runtime import RunnerClosedError, RunnerState

pytestmark = pytest.mark.anyio


def branch(n_turns=3, out_len=2, rewards=None):
    return chain(n_turns, out_len, rewards, messages=True)


async def test_scalar_broadcast_weight_and_commit():
    cache = branch()
    runner = PRMRunner(scorers=(st.ConstantScorer(0.5, weight=2.0),))
    results = await runner.run(cache)
    assert committed(cache) == [[1.0, 1.0]] * 3
    assert [r.reward for r in results] == [1.0] * 3 and all(r.token_rewards.dtype == np.float32 for r in results)


async def test_arrays_keep_positions_and_scorers_add_up():
    cache = branch(rewards=[[0.25, 0.25], None, [1.0, -1.0]])
    runner = PRMRunner(scorers=(st.PositionScorer(weight=0.5), st.ConstantScorer(1.0)))
    await runner.run(cache)
    assert committed(cache) == [[1.25, 1.75], [1.0, 1.5], [2.0, 0.5]]


@pytest.mark.parametrize("raw", [0.5, np.float32(0.5), np.array([0.5, 0.5]), jnp.array([0.5, 0.5]), [0.5, 0.5],
                                 jnp.float32(0.5), 1])
async def test_accepted_result_types(raw):
    async def evaluate(self, interaction, ctx):
        return raw
    cache = branch(1)
    await PRMRunner(scorers=(scorer_of(evaluate),)).run(cache)
    assert committed(cache) == [[float(np.asarray(raw).ravel()[0])] * 2]


@pytest.mark.parametrize("raw,want", [(True, [1.0, 1.0]), (np.bool_(False), [0.0, 0.0]), (np.True_, [1.0, 1.0])])
async def test_bool_verdicts_are_numbers(raw, want):
    # Issue 14.10: a scorer returning np.bool_ (or a Python bool) is accepted like a Python number; bool
    # lists and arrays stay errors (issue 10.14, tests/runtime/test_runner_faults.py).
    async def evaluate(self, interaction, ctx):
        return raw
    cache = branch(1)
    await PRMRunner(scorers=(scorer_of(evaluate),)).run(cache)
    assert committed(cache) == [want]


@pytest.mark.parametrize("raw,error,match", [
    ([1.0, 2.0, 3.0], ValueError, r"must return shape \(n,\)"),
    (np.ones((2, 1)), ValueError, r"must return shape \(n,\)"),
    (float("nan"), ValueError, "non-finite"),
    ([1.0, float("inf")], ValueError, "non-finite"),
    (1e38, ValueError, "non-finite"),  # finite, but raw * weight overflows float32
    ("high", TypeError, "expected a float"),
])
async def test_invalid_results_commit_nothing(raw, error, match):
    calls = []

    async def evaluate(self, interaction, ctx):
        calls.append(interaction.interaction_id)
        return 0.5 if interaction.interaction_id == "t0" else raw
    cache = branch(rewards=[[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    runner = PRMRunner(scorers=(scorer_of(evaluate, weight=10.0),))
    with pytest.raises(error, match=match):
        await runner.run(cache)
    assert committed(cache) == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert sorted(calls) == ["t0", "t1", "t2"]


async def test_none_rejects_and_names_the_scorer():
    async def evaluate(self, interaction, ctx):
        return None if interaction.interaction_id != "t1" else 1.0
    cache = branch()
    with pytest.raises(RuntimeError, match=r"'fn' returned None for 2 of 3 turns"):
        await PRMRunner(scorers=(scorer_of(evaluate),)).run(cache)
    assert committed(cache) == [None] * 3


async def test_exception_rejects_cancels_siblings_and_commits_nothing():
    finished = []

    async def evaluate(self, interaction, ctx):
        if interaction.interaction_id == "t0":
            raise KeyError("judge exploded")
        await anyio.sleep(5)
        finished.append(interaction.interaction_id)
        return 1.0
    cache = branch()
    with anyio.fail_after(2):
        with pytest.raises(KeyError, match="judge exploded") as info:
            await PRMRunner(scorers=(scorer_of(evaluate),)).run(cache)
    assert finished == [] and committed(cache) == [None] * 3
    assert any("'fn'" in note and "'t0'" in note for note in info.value.__notes__)


async def test_a_later_scorer_failing_commits_nothing_of_the_earlier_ones():
    # Issue 10.2: all scorers are validated, then committed at once (AReaL commits scorer by scorer).
    async def evaluate(self, interaction, ctx):
        return [1.0]  # wrong shape
    cache = branch(2)
    with pytest.raises(ValueError):
        await PRMRunner(scorers=(st.ConstantScorer(0.5), scorer_of(evaluate, "bad"))).run(cache)
    assert committed(cache) == [None, None]


async def test_non_result_from_evaluate_result():
    class Odd(BaseScorer):
        name = "odd"

        async def evaluate_result(self, interaction, ctx):
            return {"reward": 1.0}
    with pytest.raises(TypeError, match="PRMScorerResult"):
        await PRMRunner(scorers=(Odd(),)).run(branch(1))


async def test_zero_length_turn_cannot_be_scored():
    # The input's fault, found before any scorer runs (issue 29.23: never a scorer failure, so never
    # error_policy's fallback).
    from prm_jax.errors import NotScorableError
    cache = InteractionCache([Interaction("e", [1, 2], [])])
    with pytest.raises(NotScorableError, match="interaction 'e' has no output tokens: there is nothing to score"):
        await PRMRunner(scorers=(st.ConstantScorer(),)).run(cache)


async def test_message_only_turn_is_rejected():
    cache = InteractionCache([Interaction("m", None, None)])
    with pytest.raises(ValueError, match="token-backed"):
        await PRMRunner(scorers=(st.ConstantScorer(),)).run(cache)


async def test_ctx_holds_branch_messages_and_is_read_only():
    seen = {}

    async def evaluate(self, interaction, ctx):
        seen[interaction.interaction_id] = ctx
        with pytest.raises(TypeError):
            ctx["is_eval"] = False
        return 0.0
    cache = branch(2)
    await PRMRunner(scorers=(scorer_of(evaluate),)).run(cache, {"step": 3}, is_eval=True)
    ctx = seen["t0"]
    assert ctx["is_eval"] is True and ctx["step"] == 3
    assert [m["content"] for m in ctx["messages"]] == ["q1", "a1"]


async def test_mutating_scorer_fails_and_changes_nothing():
    async def evaluate(self, interaction, ctx):
        interaction.output_tokens[0] = -1
        return 1.0
    cache = branch(1)
    with pytest.raises(ValueError, match="read-only"):
        await PRMRunner(scorers=(scorer_of(evaluate),)).run(cache)
    assert cache.get("t0").output_tokens[0] == 1 and cache.get("t0").token_rewards is None


async def test_trajectory_scorer_rules():
    joint = st.JointScorer({"t0": 1.0, "t2": [0.5, 0.25]})
    cache = branch()
    await PRMRunner(scorers=(joint,)).run(cache)
    assert joint.seen == ["t0", "t1", "t2"]
    assert committed(cache) == [[1.0, 1.0], [0.0, 0.0], [0.5, 0.25]]
    with pytest.raises(ValueError, match="unknown interaction ids"):
        await PRMRunner(scorers=(st.JointScorer({"t9": 1.0}),)).run(branch())
    with pytest.raises(TypeError, match="mapping"):
        await PRMRunner(scorers=(st.JointScorer([1.0]),)).run(branch())
    with pytest.raises(RuntimeError, match="returned None for 3 of 3"):
        await PRMRunner(scorers=(st.JointScorer(None),)).run(branch())
    with pytest.raises(RuntimeError, match="evaluate_trajectory"):
        await st.JointScorer().evaluate(cache.get("t0"), {})


async def test_observation_rules():
    def obs_scorer(make, name="obs"):
        class S(BaseScorer):
            async def evaluate(self, interaction, ctx):
                return 1.0

            def prepare_result(self, interaction, raw, ctx):
                return PRMScorerResult(raw, make(interaction))
        S.name = name
        return S()
    wrong_target = obs_scorer(lambda i: (PRMMetricObservation("m", "turn", "other", True, "boolean", ("count",)),))
    with pytest.raises(ValueError, match="its own turn"):
        await PRMRunner(scorers=(wrong_target,)).run(branch(1))
    twice = obs_scorer(lambda i: (PRMMetricObservation("m", "trajectory", "branch", 1.0, "float", ("sum",)),))
    cache = branch(2)
    with pytest.raises(ValueError, match="more than once"):
        await PRMRunner(scorers=(twice,)).run(cache)
    assert committed(cache) == [None, None]


async def test_metric_schema_is_stable_for_the_runner_life():
    scorer = st.BudgetObservationScorer("boolean")
    runner = PRMRunner(scorers=(scorer,))
    await runner.run(branch(1))
    scorer.value_type = "float"
    cache = branch(1)
    with pytest.raises(ValueError, match="changed schema"):
        await runner.run(cache)
    assert committed(cache) == [None]


def obs(**kwargs):
    return dict(metric_id="m", target_id="a", **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(metric_id="", scope="turn", target_id="a", value=True, value_type="boolean", aggregations=("count",)), "metric_id"),
    (obs(scope="branch", value=True, value_type="boolean", aggregations=("count",)), "scope"),
    (obs(scope="turn", value=True, value_type="boolean", aggregations=()), "not be empty"),
    (obs(scope="turn", value=True, value_type="boolean", aggregations=("count", "count")), "unique"),
    (obs(scope="turn", value=True, value_type="boolean", aggregations=("mean",)), "allows only"),
    (obs(scope="turn", value=1.0, value_type="float", aggregations=("rate",)), "allows only"),
    (obs(scope="turn", value=1, value_type="boolean", aggregations=("count",)), "must be a bool"),
    (obs(scope="turn", value=True, value_type="float", aggregations=("sum",)), "non-bool"),
    (obs(scope="turn", value=math.inf, value_type="float", aggregations=("sum",)), "finite"),
])
def test_observation_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PRMMetricObservation(**kwargs)


def test_scorer_construction_rules():
    class Nameless(BaseScorer):
        pass
    with pytest.raises(ValueError, match="name"):
        Nameless()
    with pytest.raises(ValueError, match="weight"):
        st.ConstantScorer(weight=float("nan"))
    with pytest.raises(ValueError, match="unique"):
        PRMRunner(scorers=(st.ConstantScorer(), st.ConstantScorer()))
    with pytest.raises(ValueError, match="non-empty"):
        PRMRunner({"scorers": [{"path": ""}]})
    with pytest.raises(TypeError, match="not a BaseScorer"):
        PRMRunner({"scorers": [{"path": "scorers_for_tests.NotAScorer"}]})
    with pytest.raises(ValueError, match="cannot import"):
        PRMRunner({"scorers": [{"path": "no_such_module.Scorer"}]})


async def test_disabled_scorers_are_built_skipped_and_closed():
    runner = await PRMRunner.create({"scorers": [
        {"path": "scorers_for_tests.ClosingA", "kwargs": {"label": "a"}},
        {"path": "scorers_for_tests.ClosingB", "enabled": False, "kwargs": {"label": "b"}},
    ]})
    results = await runner.run(branch(1))
    assert [r.scorer for r in results] == ["closing_a"]
    await runner.aclose()
    assert st.EVENTS == ["close:b", "close:a"]


async def test_borrowed_scorers_are_not_closed():
    borrowed = st.ClosingC(label="borrowed")
    config = PRMConfig(scorers=(ScorerSpec("scorers_for_tests.ClosingA", kwargs={"label": "a"}),
                                ScorerSpec("scorers_for_tests.ClosingB", kwargs={"label": "b"})))
    async with await PRMRunner.create(config, scorers=(borrowed,)) as runner:
        assert [s.name for s in runner.scorers] == ["closing_a", "closing_b", "closing_c"]
        assert runner.state is RunnerState.OPEN
    assert st.EVENTS == ["close:b", "close:a"] and borrowed.closed == 0
    assert runner.state is RunnerState.CLOSED


def test_scorer_instances_are_not_configuration():
    # Issue 11.8: borrowed instances go to the runner, not into a PRMConfig.
    with pytest.raises(ValueError, match="PRMRunner"):
        PRMConfig(scorers=(st.ConstantScorer(),))


def owned(*specs):
    return {"scorers": [{"path": f"scorers_for_tests.{cls}", "kwargs": kw} for cls, kw in specs]}


async def test_aclose_failures_are_grouped_after_all_were_tried_and_not_retried():
    runner = await PRMRunner.create(owned(("ClosingA", {"label": "a", "fail": True}), ("ClosingB", {"label": "b"}),
                                          ("ClosingC", {"label": "c", "fail": True})))
    with pytest.raises(ExceptionGroup) as info:
        await runner.aclose()
    assert [str(e) for e in info.value.exceptions] == ["cleanup of c failed", "cleanup of a failed"]
    assert st.EVENTS == ["close:c", "close:b", "close:a"]
    await runner.aclose()
    assert st.EVENTS == ["close:c", "close:b", "close:a"]


async def test_concurrent_aclose_share_one_cleanup():
    runner = await PRMRunner.create(owned(("ClosingA", {"label": "a"}), ("ClosingB", {"label": "b"})))
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(runner.aclose)
    assert st.EVENTS == ["close:b", "close:a"]
    assert all(s.closed == 1 for s in runner.scorers)


async def test_run_is_rejected_once_closing_starts():
    runner = await PRMRunner.create(owned(("ClosingA", {"label": "a", "hang": True})))
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.aclose)
        await anyio.sleep(0.01)
        assert runner.state is RunnerState.CLOSING and runner.closed
        with pytest.raises(RuntimeError, match="closed"):
            await runner.run(branch(1))
        tg.cancel_scope.cancel()
    assert runner.state is RunnerState.INTERRUPTED  # the cancelled aclose left the hanging scorer to a later one
    with pytest.raises(RunnerClosedError):
        await runner.run(branch(1))


async def test_cancellation_propagates_and_interrupted_hook_is_not_retried():
    runner = await PRMRunner.create(owned(("ClosingA", {"label": "a"}), ("ClosingB", {"label": "b", "hang": True})))
    with anyio.move_on_after(0.05) as scope:
        await runner.aclose()
    assert scope.cancelled_caught
    assert st.EVENTS == ["close:b"] and runner.state is RunnerState.INTERRUPTED
    with pytest.raises(RunnerClosedError, match="interrupted"):  # (issue 31.8: a state, not a field beside it)
        async with runner:
            pass
    await runner.aclose()  # resumes with the scorers never tried; b is not retried
    assert st.EVENTS == ["close:b", "close:a"] and runner.state is RunnerState.CLOSED


async def test_create_rolls_back_owned_scorers_with_notes():
    config = owned(("ClosingA", {"label": "a", "fail": True}), ("ClosingB", {"label": "b"}))
    config["scorers"].append({"path": "scorers_for_tests.BrokenConstructor", "kwargs": {"label": "broken"}})
    with pytest.raises(RuntimeError, match="constructor failed") as info:
        await PRMRunner.create(config)
    assert st.EVENTS == ["close:b", "close:a"]  # reverse order; the broken one is not closed
    assert any("closing_a" in note and "cleanup of a failed" in note for note in info.value.__notes__)


async def test_duplicate_names_are_rejected_before_any_scorer_is_built():
    # Issue 10.10: found from the classes, so no scorer (and no client) is built and none needs closing.
    config = owned(("ClosingA", {"label": "a"}), ("ClosingA", {"label": "again"}))
    with pytest.raises(ValueError, match="unique"):
        await PRMRunner.create(config)
    assert st.EVENTS == []


async def test_cancellation_during_rollback_propagates():
    config = owned(("ClosingA", {"label": "a", "hang": True}))
    config["scorers"].append({"path": "scorers_for_tests.BrokenConstructor"})
    with anyio.move_on_after(0.05) as scope:
        await PRMRunner.create(config)
    assert scope.cancelled_caught and st.EVENTS == ["close:a"]


def test_sync_constructor_has_no_rollback_but_names_what_it_leaves_unclosed():
    # AReaL's v1 semantics: PRMRunner(config) stays without the rollback; issue 31.8: not silently (a ResourceWarning
    # names the owned scorers left open and the constructor that closes them).
    config = owned(("ClosingA", {"label": "a"}))
    config["scorers"].append({"path": "scorers_for_tests.BrokenConstructor"})
    with pytest.raises(RuntimeError, match="constructor failed"), \
            pytest.warns(ResourceWarning, match=r"1 scorer\(s\) it built unclosed: \['closing_a'\].*PRMRunner.create"):
        PRMRunner(config)
    assert st.EVENTS == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing built before the failure: nothing to warn about
        with pytest.raises(RuntimeError, match="constructor failed"):
            PRMRunner({"scorers": [{"path": "scorers_for_tests.BrokenConstructor"}]})


async def test_one_instance_serves_100_concurrent_sessions():
    class EchoScorer(BaseScorer):
        name = "echo"

        async def evaluate(self, interaction, ctx):
            request_id = ctx["session"]
            await anyio.sleep(0.001 * (request_id % 7))
            return float(request_id + interaction.output_len)

    scorer = EchoScorer()
    runner = PRMRunner(scorers=(scorer,))
    caches = [branch(2) for _ in range(100)]
    async with anyio.create_task_group() as tg:
        for i, cache in enumerate(caches):
            tg.start_soon(runner.run, cache, {"session": i})
    for i, cache in enumerate(caches):
        assert committed(cache) == [[i + 2.0] * 2] * 2


async def test_runner_disabled_scores_nothing():
    cache = branch(1)
    assert await PRMRunner(PRMConfig(enabled=False), scorers=(st.ConstantScorer(),)).run(cache) == []
    assert committed(cache) == [None]


async def test_session_with_several_branches_must_be_cloned_first():
    cache = InteractionCache([Interaction("r", [1], [2]), Interaction("x", [1, 2, 3], [4], parent_id="r"),
                              Interaction("y", [1, 2, 5], [6], parent_id="r")])
    runner = PRMRunner(scorers=(st.ConstantScorer(),))
    with pytest.raises(ValueError, match="clone_chain"):
        await runner.run(cache)
    clone = cache.clone_chain("x")
    await runner.run(clone)
    assert cache.get("r").token_rewards is None and clone.get("r").token_rewards.tolist() == [0.5]


class SharedTrajectoryScorer(BaseTrajectoryScorer):
    name = "shared_traj"

    async def evaluate_trajectory(self, interactions, ctx):
        return {interactions[-1].interaction_id: 1.0}


async def test_trajectory_scorer_missing_ids_get_zero():
    cache = branch(3)
    await PRMRunner(scorers=(SharedTrajectoryScorer(weight=0.5),)).run(cache)
    assert committed(cache) == [[0.0, 0.0], [0.0, 0.0], [0.5, 0.5]]


async def test_one_scorer_commits_exactly_what_the_general_sum_gives():
    # Issue 12: with one scorer and no earlier rewards the commit skips the zeros-plus-sum-and-check per
    # turn; it must still store 0 + weight * raw in float32 (so -0.0 becomes 0.0, as the sum makes it), in an
    # array of the turn's own that the scorer's returned value does not share.
    returned = {}

    async def evaluate(self, interaction, ctx):
        value = {"t0": -0.0, "t1": np.array([3.0, -1.5], np.float32), "t2": 1e-30}[interaction.interaction_id]
        returned[interaction.interaction_id] = value
        return value
    cache = branch()
    await PRMRunner(scorers=(scorer_of(evaluate, weight=0.5),)).run(cache)
    want = {k: np.float32(0) + (np.asarray(v, np.float64) * 0.5 * np.ones(2)).astype(np.float32)
            for k, v in returned.items()}
    for turn in cache:
        got = turn.token_rewards
        assert got.dtype == np.float32 and got.tobytes() == want[turn.interaction_id].tobytes()
        assert not np.shares_memory(got, np.asarray(returned[turn.interaction_id]))
    assert np.signbit(cache.get("t0").token_rewards).sum() == 0


@pytest.mark.parametrize("path", ["asyncio", "anyio"])
def test_both_fan_outs_cancel_the_siblings_of_a_failed_turn(monkeypatch, path):
    # Issue 21: the anyio task group (trio, Python 3.10) was never run by a test; both fan-outs must score
    # every turn, and on a failure cancel the others and commit nothing.
    import time

    from prm_jax.runtime import _concurrency as concurrency

    if path == "anyio":
        monkeypatch.setattr(concurrency, "_on_asyncio", lambda: False)
    finished: list[str] = []

    class FailsOnOneTurn(BaseScorer):
        name = "fails_on_one"

        def __init__(self, fail: bool, **kwargs):
            super().__init__(**kwargs)
            self.fail = fail

        async def evaluate(self, interaction, ctx):
            if interaction.interaction_id == "t1" and self.fail:
                await anyio.sleep(0.01)
                raise RuntimeError("boom")
            await anyio.sleep(0.02 if not self.fail else 5.0)
            finished.append(interaction.interaction_id)
            return 0.5

    def chain():
        turns, tokens = [], [1]
        for k in range(4):
            turns.append(Interaction(f"t{k}", list(tokens), [5, 6], parent_id=f"t{k - 1}" if k else None))
            tokens = tokens + [5, 6, 2]
        return InteractionCache(turns)

    ok = chain()
    anyio.run(PRMRunner(scorers=(FailsOnOneTurn(False),)).run, ok)
    assert sorted(finished) == ["t0", "t1", "t2", "t3"]
    assert [t.token_rewards.tolist() for t in ok] == [[0.5, 0.5]] * 4
    finished.clear()
    bad = chain()
    start = time.monotonic()
    with pytest.raises(BaseException) as caught:
        anyio.run(PRMRunner(scorers=(FailsOnOneTurn(True),)).run, bad)
    assert "boom" in repr(caught.value) or any("boom" in repr(e) for e in getattr(caught.value, "exceptions", ()))
    assert time.monotonic() - start < 2.0 and finished == []  # the siblings were cancelled, not awaited
    assert all(t.token_rewards is None for t in bad)


async def test_entering_a_closed_runner_is_refused():
    # Issue 31.8: as httpx refuses a closed client, a closed runner cannot be entered again.
    from prm_jax.runtime import RunnerClosedError

    async with PRMRunner(scorers=(st.ConstantScorer(),)) as runner:
        await runner.run(branch())
    with pytest.raises(RunnerClosedError, match="PRMRunner is closed: it cannot be entered again"):
        async with runner:
            pass


def test_a_prm_section_mappings_advantage_shaping_is_honoured_or_refused_naming_it():
    # Issue 55.7: PRMRunner(mapping) dropped a prm-section advantage_shaping: {"mode": "gvpo"} ran as additive,
    # and so did {"mode": "nonsense"}. Now it is read as in the full rollout.agent.prm shape.
    for mode in ("additive", "gvpo", "process_weighted"):
        assert PRMRunner({"advantage_shaping": {"mode": mode}}).shaping_mode == mode
        full = {"rollout": {"agent": {"prm": {"advantage_shaping": {"mode": mode}}}}}
        assert PRMRunner(full).shaping_mode == mode
    assert PRMRunner({}).shaping_mode == "additive"
    with pytest.raises(ConfigError, match=r"rollout\.agent\.prm\.advantage_shaping\.mode must be one of .*'nonsense'"):
        PRMRunner({"advantage_shaping": {"mode": "nonsense"}})
    with pytest.raises(ConfigError, match=r"advantage_shaping\.colour|unknown keys \['colour'\]"):
        PRMRunner({"advantage_shaping": {"mode": "gvpo", "colour": 1}})
