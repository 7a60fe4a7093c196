"""Issue 30, section 1-2: executors by scorer kind (async, thread, process, batch), their deadlines, bounded
fan-out, the loop-lag watchdog, and batching across branches."""

import os
import pickle
import re
import threading
import time
import warnings

import anyio
import numpy as np
import pytest
import scorers_for_tests as st
from scorers_for_tests import chain, committed

from prm_jax import (
    BaseScorer,
    BaseTrajectoryScorer,
    BatchScorer,
    BatchTrajectoryScorer,
    PRMRunner,
    PRMScorerResult,
    SyncScorer,
    SyncTrajectoryScorer,
)
from prm_jax.config import PRMConfig, ScorerSpec
from prm_jax.runtime import RunnerClosedError
from prm_jax.runtime import _process_pool as process_pool
from prm_jax.runtime._context import ScorerContext
from prm_jax.runtime._specs import check_scorer_specs

pytestmark = pytest.mark.anyio


def branches(n, turns=4, out_len=3):
    """``n`` branches of ``turns`` turns, interaction ids ``b{i}t{k}``, with messages."""
    out = []
    for i in range(n):
        cache = chain(turns, out_len, messages=True)
        out.append([turn.clone() for turn in cache])
        for k, turn in enumerate(out[-1]):
            turn.interaction_id = f"b{i}t{k}"
            turn.parent_id = f"b{i}t{k - 1}" if k else None
    return out


def rewards_of(chains):
    return [[None if t.token_rewards is None else t.token_rewards.tolist() for t in c] for c in chains]


# --- kinds are checked when the scorer is built -------------------------------------------------------------

class PlainOnAsyncBase(BaseScorer):
    name = "plain_on_async"

    def evaluate(self, interaction, ctx):  # a plain function on an async base
        return 1.0


class AsyncOnSyncBase(SyncScorer):
    name = "async_on_sync"

    async def evaluate(self, interaction, ctx):
        return 1.0


class PlainTrajectoryOnAsyncBase(BaseTrajectoryScorer):
    name = "plain_trajectory_on_async"

    def evaluate_trajectory(self, interactions, ctx):
        return {}


def test_a_plain_evaluate_on_an_async_base_is_refused_when_built_naming_the_base_to_use():
    # Issue 30: it failed only at scoring time (TypeError: object float can't be used in 'await' expression).
    with pytest.raises(TypeError, match=r"evaluate is a plain function.*prm_jax.runtime.SyncScorer"):
        PlainOnAsyncBase()
    with pytest.raises(TypeError, match=r"evaluate_trajectory is a plain function.*SyncTrajectoryScorer"):
        PlainTrajectoryOnAsyncBase()
    with pytest.raises(TypeError, match=r"evaluate is 'async def'.*prm_jax.runtime.BaseScorer"):
        AsyncOnSyncBase()
    # ... and by the config check, before anything is built (validate-config, prm-jax score's preflight).
    with pytest.raises(TypeError, match="SyncScorer"):
        check_scorer_specs(PRMConfig(scorers=(ScorerSpec(f"{__name__}.PlainOnAsyncBase"),)))


def test_sync_scorer_settings_are_checked_naming_the_argument():
    with pytest.raises(ValueError, match="executor must be one of"):
        st.BusyVerifier(executor="gpu")
    with pytest.raises(ValueError, match="max_workers"):
        st.BusyVerifier(max_workers=0)
    with pytest.raises(ValueError, match="max_concurrency"):
        st.ConstantScorer(max_concurrency=0)
    with pytest.raises(ValueError, match="max_batch_size"):
        type("B", (BatchScorer,), {"name": "b", "evaluate_batch": _echo_batch})(max_batch_size=0)


async def _echo_batch(self, items):
    return [float(turn.output_len) for turn, _ in items]


# --- thread executor ----------------------------------------------------------------------------------------

class SleepsInAThread(SyncScorer):
    name = "sleeps_in_a_thread"

    def __init__(self, seconds=0.1, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds
        self.threads = set()

    def evaluate(self, interaction, ctx):
        self.threads.add(threading.get_ident())
        time.sleep(self.seconds)
        return float(interaction.output_tokens[0])


async def test_thread_executor_runs_off_the_loop_and_its_deadline_starts_with_the_thread():
    # One worker, four turns of 0.1 s, timeout 0.15: each waits for the worker up to 0.3 s, which is not
    # its own time; a deadline counted from the call would fail three of them.
    scorer = SleepsInAThread(0.1, max_workers=1, timeout=0.15)
    cache = chain(4)
    await PRMRunner(scorers=(scorer,)).run(cache)
    assert committed(cache) == [[1.0, 1.0], [11.0, 11.0], [21.0, 21.0], [31.0, 31.0]]
    assert threading.get_ident() not in scorer.threads


async def test_thread_executor_past_its_deadline_fails_and_discards_the_late_result():
    scorer = SleepsInAThread(0.5, timeout=0.1)
    cache = chain(1)
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"'sleeps_in_a_thread'.*timeout of 0.1 s in its worker thread.*discarded"):
        await PRMRunner(scorers=(scorer,)).run(cache)
    assert time.perf_counter() - started < 0.45  # the run did not wait for the thread
    assert committed(cache) == [None]


class ThreadTrajectory(SyncTrajectoryScorer):
    name = "thread_trajectory"

    def evaluate_trajectory(self, interactions, ctx):
        return {turn.interaction_id: float(k) for k, turn in enumerate(interactions)}


async def test_sync_trajectory_scorer_scores_the_branch_in_one_thread_call():
    cache = chain(3)
    runner = PRMRunner(scorers=(ThreadTrajectory(),))
    await runner.run(cache)
    assert committed(cache) == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    assert runner.scorer_stats()["thread_trajectory"]["calls"] == 1


class PreparesInAThread(SyncScorer):
    name = "prepares_in_a_thread"

    def evaluate(self, interaction, ctx):
        return 2.0

    def prepare_result(self, interaction, raw, ctx):
        return PRMScorerResult(raw * 3)


async def test_a_sync_scorers_prepare_result_is_applied_to_what_evaluate_returned():
    cache = chain(2)
    await PRMRunner(scorers=(PreparesInAThread(),)).run(cache)
    assert committed(cache) == [[6.0, 6.0], [6.0, 6.0]]


# --- process executor ---------------------------------------------------------------------------------------

def test_what_a_worker_process_receives_pickles_and_stays_read_only():
    cache = chain(2, messages=True)
    leaf = cache.branches()[0][-1]
    view = leaf.readonly()
    view.messages  # noqa: B018 (builds the frozen cache, which must not travel)
    ctx = ScorerContext({"offset": 1.5, "nested": {"a": [1, 2]}}, leaf, True)
    assert ctx["messages"]
    view2, ctx2 = pickle.loads(pickle.dumps((view, ctx)))
    assert view2.interaction_id == view.interaction_id and view2.messages == view.messages
    np.testing.assert_array_equal(view2.input_tokens, view.input_tokens)
    with pytest.raises(AttributeError, match="read-only"):
        view2.reward = 1.0
    assert ctx2["offset"] == 1.5 and ctx2["nested"]["a"] == (1, 2) and ctx2["is_eval"] is True
    assert ctx2["messages"] == ctx["messages"]
    with pytest.raises(TypeError):
        ctx2["nested"]["b"] = 1  # still frozen on the other side


async def test_process_executor_scores_in_worker_processes_with_the_same_numbers():
    work = 300
    scorer = st.BusyVerifier(work=work, max_workers=2)
    chains = branches(6)
    runner = PRMRunner(scorers=(scorer, st.WorkerPid(max_workers=2)))
    try:
        results = await runner.run_many(chains)
    finally:
        await runner.aclose()
    # The verifier's numbers equal the same function run here (float64, committed as float32); the other
    # scorer's show that the work ran in (at most two) other processes.
    turns = {turn.interaction_id: turn for c in chains for turn in c}
    pids = set()
    for result in results:
        for r in result:
            if r.scorer == "busy_verifier":
                expected = np.float32(st.busy_score(turns[r.interaction_id], work))
                assert r.token_rewards.tolist() == [expected] * 3
            else:
                pids.add(int(r.token_rewards[0]))
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    stats = runner.scorer_stats()
    assert stats["busy_verifier"]["calls"] == 24 and stats["busy_verifier"]["failures"] == 0


async def test_process_executor_ends_a_worker_past_its_deadline_and_replaces_it():
    chains = branches(3, turns=2)
    scorer = st.Misbehaves(slow=("b1t0",), max_workers=1, timeout=0.5)
    runner = PRMRunner(scorers=(scorer,))
    started = time.perf_counter()
    try:
        results = await runner.run_many(chains, return_exceptions=True)
        executor = runner._executors[id(scorer)]
        assert executor.restarts == 1
    finally:
        await runner.aclose()
    assert time.perf_counter() - started < 25  # the 30 s sleep was cut short
    assert isinstance(results[1], TimeoutError)
    assert "took longer than its timeout of 0.5 s in its worker process (the worker was ended and replaced)" in \
        str(results[1])
    assert rewards_of([chains[0], chains[2]]) == [[[1.0] * 3] * 2] * 2  # the others scored
    assert rewards_of([chains[1]]) == [[None, None]]


async def test_process_executor_reports_a_dead_worker_and_a_raised_error_with_the_workers_traceback():
    chains = branches(3, turns=2)
    runner = PRMRunner(scorers=(st.Misbehaves(crash=("b0t1",), fail=("b2t0",), max_workers=1),))
    try:
        results = await runner.run_many(chains, return_exceptions=True)
    finally:
        await runner.aclose()
    assert isinstance(results[0], RuntimeError) and "worker process died (exit code 3)" in str(results[0])
    assert isinstance(results[2], KeyError) and "no answer for b2t0" in str(results[2])
    assert any("in the scorer's worker process" in note for note in results[2].__notes__)
    assert rewards_of([chains[1]]) == [[[1.0] * 3] * 2]


class NotPicklable(SyncScorer):
    name = "not_picklable"
    executor = "process"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.lock = threading.Lock()

    def evaluate(self, interaction, ctx):
        return 0.0


async def test_process_executor_says_when_a_scorer_does_not_pickle():
    runner = PRMRunner(scorers=(NotPicklable(),))
    with pytest.raises(TypeError, match=r"'not_picklable' runs with executor 'process'.*does not pickle"):
        await runner.run(chain(1))
    await runner.aclose()


class SlowAsync(BaseScorer):
    name = "slow_async"

    async def evaluate(self, interaction, ctx):
        await anyio.sleep(0.02)
        return 1.0


async def test_an_async_scorer_beside_a_cpu_bound_one_in_processes_never_times_out():
    # Issue 30: inside an async evaluate, an ~8 ms CPU-bound verifier failed 57-106 of 256 rows of a 20 ms
    # async scorer with timeout=0.5 beside it. Through the process executor the loop stays free.
    chains = branches(32)
    runner = PRMRunner(scorers=(st.BusyVerifier(work=20000, max_workers=2), SlowAsync(timeout=0.5)))
    try:
        results = await runner.run_many(chains, return_exceptions=True)
    finally:
        await runner.aclose()
    assert not [r for r in results if isinstance(r, Exception)]


# --- bounded fan-out ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_concurrency", [None, 1, 5])
async def test_max_concurrency_bounds_a_scorers_calls_across_every_branch(max_concurrency):
    scorer = st.InFlight(max_concurrency=max_concurrency)
    chains = branches(8)
    await PRMRunner(scorers=(scorer,)).run_many(chains)
    assert scorer.most == (32 if max_concurrency is None else max_concurrency)
    assert rewards_of(chains) == [[[1.0] * 3] * 4] * 8


# --- the loop-lag watchdog ------------------------------------------------------------------------------------

class BlocksInPrepare(BaseScorer):
    name = "blocks_in_prepare"

    async def evaluate(self, interaction, ctx):
        return 1.0

    def prepare_result(self, interaction, raw, ctx):
        time.sleep(0.12)
        return PRMScorerResult(raw)


async def test_a_scorer_that_blocks_the_loop_is_named_once_by_its_own_time_not_twice():
    runner = PRMRunner(scorers=(BlocksInPrepare(),))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await runner.run_many(branches(2, turns=1))
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "scorer 'blocks_in_prepare' blocked the event loop for 0.1" in messages[0]


async def test_the_watchdog_warns_once_when_code_outside_the_scorers_blocks_the_loop():
    runner = PRMRunner(scorers=(SlowAsync(),))

    async def blocks_the_loop():
        await anyio.sleep(0.005)
        time.sleep(0.12)  # the caller's own code on the scoring loop

    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            async with anyio.create_task_group() as group:
                group.start_soon(blocks_the_loop)
                await runner.run_many(branches(2, turns=1))
        if _ == 0:
            assert len(caught) == 1
            assert re.match(r"the event loop was blocked for 0\.1\d\d s while scoring, outside every scorer's "
                            "evaluate; no scorer was running", str(caught[0].message))
        else:
            assert caught == []  # once per runner


# --- batched scorers ------------------------------------------------------------------------------------------

class RecordsBatches(BatchScorer):
    name = "records_batches"
    pads = True

    def __init__(self, fail_on=(), **kwargs):
        super().__init__(**kwargs)
        self.batches, self.fail_on = [], set(fail_on)

    async def evaluate_batch(self, items):
        ids = [turn.interaction_id for turn, _ in items]
        self.batches.append([(i, len(turn.input_tokens) + turn.output_len) for i, (turn, _) in zip(ids, items)])
        await anyio.sleep(0.001)
        if self.fail_on & set(ids):
            raise ValueError(f"batch with {sorted(self.fail_on & set(ids))}")
        return [float(len(turn.input_tokens)) for turn, _ in items]


async def test_batch_scorer_gathers_turns_across_branches_into_full_batches():
    # Issue 30's target in small: 64 turns (16 branches) with max_batch_size=16 make 4 calls.
    scorer = RecordsBatches(max_batch_size=16, max_wait=1.0)
    chains = branches(16)
    runner = PRMRunner(scorers=(scorer,))
    await runner.run_many(chains, limit=None)
    assert [len(b) for b in scorer.batches] == [16, 16, 16, 16]
    assert runner.scorer_stats()["records_batches"]["calls"] == 4
    # pads = True: each batch sorted by length; every turn got its own result (its input length).
    for batch in scorer.batches:
        assert [n for _, n in batch] == sorted(n for _, n in batch)
    for c in chains:
        for turn in c:
            assert turn.token_rewards.tolist() == [float(len(turn.input_tokens))] * turn.output_len


async def test_a_batch_waits_at_most_max_wait_then_goes_with_what_it_has():
    scorer = RecordsBatches(max_batch_size=64, max_wait=0.05)
    started = time.perf_counter()
    await PRMRunner(scorers=(scorer,)).run(chain(3))
    assert [len(b) for b in scorer.batches] == [3]
    assert time.perf_counter() - started < 1.0


async def test_a_failed_batch_call_fails_exactly_the_branches_with_an_item_in_it():
    scorer = RecordsBatches(fail_on={"b5t2"}, max_batch_size=8, max_wait=1.0)
    chains = branches(12)
    results = await PRMRunner(scorers=(scorer,)).run_many(chains, limit=None, return_exceptions=True)
    failed_ids = next(b for b in scorer.batches if "b5t2" in [i for i, _ in b])
    expected = {int(i[1:i.index("t")]) for i, _ in failed_ids}
    assert {i for i, r in enumerate(results) if isinstance(r, Exception)} == expected
    for i, result in enumerate(results):
        if i in expected:
            assert isinstance(result, ValueError) and "b5t2" in str(result)
            assert committed(chains[i]) == [None] * 4  # all or nothing per branch
        else:
            assert all(t.token_rewards is not None for t in chains[i])


class BranchBatches(BatchTrajectoryScorer):
    name = "branch_batches"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.sizes = []

    async def evaluate_batch(self, items):
        self.sizes.append(len(items))
        return [{turn.interaction_id: float(k) for k, turn in enumerate(turns)} for turns, _ in items]


async def test_batch_trajectory_scorer_gets_whole_branches():
    scorer = BranchBatches(max_batch_size=8, max_wait=1.0)
    chains = branches(32, turns=3)
    await PRMRunner(scorers=(scorer,)).run_many(chains, limit=None)
    assert scorer.sizes == [8, 8, 8, 8]
    assert rewards_of(chains) == [[[0.0] * 3, [1.0] * 3, [2.0] * 3]] * 32


class WrongCount(BatchScorer):
    name = "wrong_count"

    async def evaluate_batch(self, items):
        return [1.0]


async def test_a_batch_result_of_the_wrong_length_is_refused():
    with pytest.raises(TypeError, match=r"'wrong_count': evaluate_batch must return one result per item, in order \(3\)"):
        await PRMRunner(scorers=(WrongCount(max_wait=0.01),)).run(chain(3))


async def test_batched_results_equal_per_turn_async_results():
    class PerTurn(BaseScorer):
        name = "per_turn"

        async def evaluate(self, interaction, ctx):
            return float(len(interaction.input_tokens))

    a, b = branches(5), branches(5)
    await PRMRunner(scorers=(PerTurn(),)).run_many(a)
    await PRMRunner(scorers=(RecordsBatches(max_batch_size=7, max_wait=0.01),)).run_many(b)
    assert rewards_of(a) == rewards_of(b)


# --- a shared turn scored once (issue 30.6) -------------------------------------------------------------------

class CountsCalls(BaseScorer):
    name = "counts_calls"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    async def evaluate(self, interaction, ctx):
        self.calls += 1
        await anyio.sleep(0)
        return float(interaction.output_tokens.sum()) / 100.0


class CountsCallsOnce(CountsCalls):
    name = "counts_calls_once"
    prefix_determined = True


def session_tree(depth_shared=2, levels=6):
    """A session: ``depth_shared`` turns every branch shares, then a binary tree of ``levels`` levels
    (64 leaves and depth 8 by default: 2 + 126 distinct turns, 512 turns over the branches)."""
    from prm_jax import Interaction, InteractionCache

    turns, frontier = [], [("r", None, [1])]
    for k in range(depth_shared):
        _, parent, tokens = frontier[0]
        out = [10 + k, 11 + k]
        turns.append(Interaction(f"s{k}", list(tokens), out, parent_id=parent))
        frontier = [(f"s{k + 1}", f"s{k}", tokens + out)]
    for level in range(levels):
        nxt = []
        for i, (_, parent, tokens) in enumerate(frontier):
            for child in range(2):
                iid = f"n{level}.{2 * i + child}"
                out = [20 + level, 30 + 2 * i + child]
                turns.append(Interaction(iid, list(tokens), out, parent_id=parent))
                nxt.append((None, iid, tokens + out))
        frontier = nxt
    return InteractionCache(turns)


@pytest.mark.parametrize("limit", [None, 8])
async def test_a_prefix_determined_scorer_scores_each_shared_turn_once_per_session(limit):
    # Issue 30.6's target: 64 leaves, depth 8: 512 calls become the 128 distinct turns, numbers unchanged.
    session = session_tree()
    leaves = session.leaves()
    once, every = CountsCallsOnce(), CountsCalls()
    a = [session.clone_chain(leaf) for leaf in leaves]
    b = [session.clone_chain(leaf) for leaf in leaves]
    await PRMRunner(scorers=(once,)).run_many(a, limit=limit)
    await PRMRunner(scorers=(every,)).run_many(b, limit=limit)
    assert len(leaves) == 64 and every.calls == 512 and once.calls == 128
    assert [committed(c) for c in a] == [committed(c) for c in b]
    # Two sessions never share: the same turns in another session are scored again.
    other = session_tree()
    more = [session.clone_chain(leaf) for leaf in leaves[:2]] + [other.clone_chain(leaf) for leaf in leaves[:2]]
    once.calls = 0
    await PRMRunner(scorers=(once,)).run_many(more)
    assert once.calls == 2 * (8 + 1)  # each session: the 8 turns of its first branch, 1 more for the second


class FailsFirstTime(CountsCallsOnce):
    name = "fails_first_time"

    async def evaluate(self, interaction, ctx):
        self.calls += 1
        if self.calls == 1:
            await anyio.sleep(0.01)
            raise ConnectionError("the first try fails")
        return 1.0


async def test_a_failed_shared_call_fails_its_own_branch_only_and_the_others_score_it():
    session = session_tree(depth_shared=1, levels=1)
    branches = [session.clone_chain(leaf) for leaf in session.leaves()]
    results = await PRMRunner(scorers=(FailsFirstTime(),)).run_many(branches, return_exceptions=True)
    failed = [r for r in results if isinstance(r, Exception)]
    assert len(failed) == 1 and isinstance(failed[0], ConnectionError)
    scored = [c for c, r in zip(branches, results) if not isinstance(r, Exception)]
    assert [committed(c) for c in scored] == [[[1.0, 1.0], [1.0, 1.0]]]


async def test_the_branch_limit_never_starves_a_batched_scorer():
    # Issue 30: with limit branches in flight and batches of limit branches, one batch at a time went to
    # the server (1.75x the engine time against 1.35x); the limit is raised to two batches.
    scorer = BranchBatches(max_batch_size=8, max_wait=1.0)
    chains = branches(32, turns=1)
    await PRMRunner(scorers=(scorer,)).run_many(chains, limit=4)
    assert scorer.sizes == [8, 8, 8, 8]
    plain = st.InFlight()
    await PRMRunner(scorers=(plain,)).run_many(branches(8, turns=1), limit=3)
    assert plain.most == 3  # without a batched scorer, limit is what it says


async def test_a_sync_trajectory_scorer_runs_in_worker_processes_too():
    chains = branches(4, turns=3)
    runner = PRMRunner(scorers=(st.BranchInAProcess(max_workers=1),))
    try:
        await runner.run_many(chains, {"parent_pid": os.getpid()})
    finally:
        await runner.aclose()
    assert rewards_of(chains) == [[[1.0] * 3, [2.0] * 3, [3.0] * 3]] * 4  # +1: not this process



class HoldsTheGIL(SyncScorer):
    """Pure Python in a worker thread: it holds the GIL for most of its call."""

    name = "holds_the_gil"

    def evaluate(self, interaction, ctx):
        deadline = time.perf_counter() + 0.3
        total = 0
        while time.perf_counter() < deadline:
            total += 1
        return 1.0


async def test_the_watchdog_names_the_thread_scorers_running_when_the_loop_stalls():
    import sys

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.2)  # the thread keeps the GIL for 0.2 s at a time: the loop stalls
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            await PRMRunner(scorers=(HoldsTheGIL(),)).run_many(branches(1, turns=1))
    finally:
        sys.setswitchinterval(old)
    messages = [str(w.message) for w in caught]
    assert any("thread scorer(s) ['holds_the_gil'] were running" in m for m in messages), messages


async def close_while_scoring(runner, ready, rows=1) -> tuple[float, list]:
    """Runs ``rows`` one-turn branches on ``runner``, closes it once ``ready()`` holds (waiting at most 60 s),
    and returns the close's seconds and the ``RunnerClosedError``s the run raised."""
    closed = []

    async def scores():
        try:
            await runner.run_many(branches(rows, turns=1))
        except RunnerClosedError as err:
            closed.append(err)

    async with anyio.create_task_group() as group:
        group.start_soon(scores)
        with anyio.fail_after(60):
            while not ready():
                await anyio.sleep(0.01)
        started = time.perf_counter()
        await runner.aclose()
    return time.perf_counter() - started, closed


async def test_closing_a_runner_ends_a_worker_process_stuck_in_a_call_at_once(tmp_path):
    started_file = tmp_path / "started"
    scorer = st.Misbehaves(slow=("b0t0",), max_workers=1, started=str(started_file))  # sleeps 30 s, no timeout
    runner = PRMRunner(scorers=(scorer,))
    # Closed once the call is in the worker (a cold start imports the scorer's module first).
    seconds, closed = await close_while_scoring(runner, started_file.exists)
    assert seconds < 4.0 and len(closed) == 1  # the run: closed, nothing committed
    assert not [w for w in runner._executors[id(scorer)]._live if w.process.is_alive()]


async def test_closing_a_runner_while_its_worker_process_starts_runs_nothing_there(monkeypatch):
    # A worker's start takes seconds where the forkserver first imports the scorer's module (a clean clone:
    # no .pyc files). A close in that time saw no worker to end; the worker then took the 30 s call and
    # outlived the close, which gave up on its dispatcher after 6 s.
    starting, workers = threading.Event(), []

    class SlowStart(process_pool._Worker):
        def __init__(self, *args):
            starting.set()
            super().__init__(*args)
            workers.append(self)
            time.sleep(1.5)  # the start's handshake, as a cold forkserver makes it

    monkeypatch.setattr(process_pool, "_Worker", SlowStart)
    scorer = st.Misbehaves(slow=("b0t0",), max_workers=1)
    runner = PRMRunner(scorers=(scorer,))
    seconds, closed = await close_while_scoring(runner, starting.is_set)
    assert seconds < 3.0 and len(closed) == 1
    executor = runner._executors[id(scorer)]
    assert len(workers) == 1 and not workers[0].process.is_alive() and not executor._live
    assert not [thread for thread in executor._threads if thread.is_alive()]


async def test_closing_a_runner_mid_chunk_starts_no_worker_for_the_rest_of_the_chunk(monkeypatch, tmp_path):
    # Four calls go to the one worker as one message; the first is stuck. The close ends that worker, and the
    # other three calls fail with the run instead of a new worker starting (seconds, cold) to be ended at once.
    started_file, workers = tmp_path / "started", []

    class Counted(process_pool._Worker):
        def __init__(self, *args):
            super().__init__(*args)
            workers.append(self)

    monkeypatch.setattr(process_pool, "_Worker", Counted)
    scorer = st.Misbehaves(slow=("b0t0",), max_workers=1, started=str(started_file))
    runner = PRMRunner(scorers=(scorer,))
    seconds, closed = await close_while_scoring(runner, started_file.exists, rows=4)
    assert seconds < 4.0 and len(closed) == 1
    assert len(workers) == 1 and not workers[0].process.is_alive()


class SeesBatches(BatchScorer):
    name = "sees_batches"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.batches: list[list[str]] = []

    async def evaluate_batch(self, items):
        self.batches.append([interaction.interaction_id for interaction, _ in items])
        return [1.0] * len(items)


class FailsRowZero(BaseScorer):
    name = "fails_row_zero"

    async def evaluate(self, interaction, ctx):
        if ctx["row"] == 0:
            await anyio.sleep(0.2)
            raise ConnectionError("row 0's judge is down")
        return 0.0


async def test_a_cancelled_branch_ends_its_batch_wait_at_once_and_leaves_the_batch():
    # Issue 41.12: with max_wait=20, another scorer's failure under on_error="raise" surfaced after 20 s, and the
    # batch was then called for branches that were gone.
    from prm_jax.runtime._arrays import score_arrays

    batched = SeesBatches(max_batch_size=64, max_wait=20.0)
    runner = PRMRunner(scorers=(FailsRowZero(), batched))
    input_ids = np.arange(1, 13, dtype=np.int32).reshape(4, 3)
    turn_ids = np.array([[-1, 0, 0]] * 4, np.int32)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="row 0's judge is down"):
        await score_arrays(runner, input_ids, turn_ids)
    assert time.monotonic() - start < 2.0
    await anyio.sleep(0.1)
    assert batched.batches == []  # never called for the rows that were cancelled
    # Some items cancelled, some not: the batch goes with the live ones only, at once when its lead goes.
    batched = SeesBatches(max_batch_size=64, max_wait=0.5)
    runner = PRMRunner(scorers=(batched,))
    branches = [chain(1) for _ in range(3)]
    results: list = [None] * 3

    async def one(i):
        results[i] = await runner.run(branches[i])

    async with anyio.create_task_group() as group:
        scopes = []
        for i in range(3):
            scope = anyio.CancelScope()
            scopes.append(scope)

            async def run_in(scope=scope, i=i):
                with scope:
                    await one(i)
            group.start_soon(run_in)
        await anyio.sleep(0.05)
        scopes[0].cancel()  # the lead goes: the lead passes to the next live item
        scopes[2].cancel()
    assert results[0] is None and results[2] is None and results[1] is not None
    assert len(batched.batches) == 1 and len(batched.batches[0]) == 1
    assert committed(branches[1]) == [[1.0, 1.0]] and committed(branches[0]) == [None]


class RetriesOut(BatchScorer):
    name = "retries_out"

    async def evaluate_batch(self, items):
        from prm_jax.runtime import RetryError

        cause = ConnectionError("connection reset")
        raise RetryError("_post_once failed 4 times; last error: ConnectionError('connection reset')",
                         [cause] * 4) from cause


async def test_every_branch_of_a_failed_batch_gets_the_batchs_own_error_never_a_rebuilt_one():
    # Issue 41.15: each branch got copy.copy(error); an exception whose constructor does not take its own args
    # became "TypeError: __init__() missing 1 required positional argument" (prm-jax's RetryError is one).
    from prm_jax.runtime import RetryError

    branches = [chain(1) for _ in range(3)]
    results = await PRMRunner(scorers=(RetriesOut(max_wait=0.05),)).run_many(branches, return_exceptions=True)
    assert all(isinstance(r, RetryError) for r in results), results
    assert results[0] is results[1] is results[2]  # the same object: no reconstruction
    assert len(results[0].errors) == 4 and isinstance(results[0].__cause__, ConnectionError)
    notes = results[0].__notes__
    assert len(notes) == 1 and "on a batch of 3 items" in notes[0]  # one note, naming the batch's turns


class ReturnsText(BatchScorer):
    name = "returns_text"

    async def evaluate_batch(self, items):
        return "abc"


async def test_evaluate_batch_returning_a_string_is_named_as_a_string_not_three_results():
    # Issue 41.20: "got 3 results" for the string "abc".
    with pytest.raises(TypeError, match=r"one result per item, in order \(1\), got a str"):
        await PRMRunner(scorers=(ReturnsText(max_wait=0.01),)).run(chain(1))


MAIN_SCORER = """
import numpy as np
from prm_jax import PRMRunner, SyncScorer
from prm_jax.runtime import _process_pool as process_pool
from prm_jax.runtime._arrays import score_arrays
import anyio

class InMain(SyncScorer):
    name = "in_main"
    executor = "process"

    def evaluate(self, interaction, ctx):
        return 1.0

started = []
original = process_pool._Worker.__init__
def counting(self, *args):
    started.append(1)
    original(self, *args)
process_pool._Worker.__init__ = counting

async def main():
    runner = PRMRunner(scorers=(InMain(max_workers=2),))
    out = await score_arrays(runner, np.arange(1, 10, dtype=np.int32).reshape(3, 3),
                             np.array([[-1, 0, 0]] * 3, np.int32), on_error="mask")
    await runner.aclose()
    print("FAILED", out.failed.tolist(), "WORKERS", len(started))
    print("ERROR", out.errors[0])

anyio.run(main)
"""


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_a_process_scorer_defined_in_a_script_without_a_file_fails_its_rows_with_the_cause(how):
    # Issue 41.18: a class the workers cannot import (stdin, python -c, a notebook) failed every row with "its
    # worker process died (exit code 1)", the cause only on stderr, one worker started and dead per call.
    import subprocess
    import sys

    argv, stdin = ([sys.executable, "-c", MAIN_SCORER], None) if how == "-c" else ([sys.executable, "-"], MAIN_SCORER)
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FAILED [True, True, True] WORKERS 0" in proc.stdout, proc.stdout
    assert "define the scorer in an importable module" in proc.stdout and "in_main" in proc.stdout


def test_a_worker_that_cannot_load_the_scorer_fails_the_calls_with_why_and_no_more_start(monkeypatch):
    # Issue 41.18 at the first failure: the worker says why it cannot unpickle the scorer, once.
    started = []
    original = process_pool._Worker.__init__

    def counting(self, *args):
        started.append(1)
        original(self, *args)
    monkeypatch.setattr(process_pool._Worker, "__init__", counting)
    monkeypatch.setattr(pickle, "dumps", lambda obj, *a, **k: b"not a pickle" if isinstance(obj, st.WorkerPid)
                        else pickle._dumps(obj, *a, **k))  # type: ignore[attr-defined]

    async def main():
        runner = PRMRunner(scorers=(st.WorkerPid(max_workers=1),))
        results = await runner.run_many([chain(1) for _ in range(4)], return_exceptions=True)
        await runner.aclose()
        return results

    results = anyio.run(main)
    assert all(isinstance(r, RuntimeError) and "could not load the scorer" in str(r) for r in results), results
    assert len(started) == 1


class ReadsMessages(BaseScorer):
    name = "reads_messages"
    prefix_determined = True

    async def evaluate(self, interaction, ctx):
        return float(len(ctx["messages"]))


class GetsMessages(ReadsMessages):
    name = "gets_messages"

    async def evaluate(self, interaction, ctx):
        return float(len(ctx.get("messages") or ()))


@pytest.mark.parametrize("scorer", [ReadsMessages, GetsMessages])
async def test_a_prefix_determined_scorer_that_reads_the_branchs_messages_fails_loudly(scorer):
    # Issue 41.24: such a scorer shared the first branch's score (2.0 and 2.0 where alone it scored 2.0 and 4.0).
    from prm_jax.errors import PrefixRuleError

    session = session_tree(depth_shared=1, levels=1)
    branches = [session.clone_chain(leaf) for leaf in session.leaves()]
    results = await PRMRunner(scorers=(scorer(),)).run_many(branches, return_exceptions=True)
    assert all(isinstance(r, PrefixRuleError) for r in results), results
    assert "prefix_determined" in str(results[0]) and "interaction.messages" in str(results[0])
    assert all(committed(b) == [None, None] for b in branches)  # nothing committed


async def test_a_workers_loading_is_not_its_first_calls_time():
    # Issue 42.3: MathVerifyScorer imports math-verify and sympy as its worker loads it (seconds); the
    # first call's 10 s deadline ran from the job's dispatch, so a slow load timed the first call out.
    from scorers_for_tests import SlowToLoad, chain

    scorer = SlowToLoad(load_s=1.5, timeout=1.0, max_workers=1)
    branches = [chain(2), chain(2)]
    async with PRMRunner(scorers=(scorer,)) as runner:
        results = await runner.run_many(branches, return_exceptions=True)
        stats = runner.scorer_stats()["slow_to_load"]
    assert not any(isinstance(r, Exception) for r in results), results
    assert [t.token_rewards.tolist() for b in branches for t in b] == [[1.0, 1.0]] * 4
    assert stats["timeouts"] == 0


# --- issue 45: the ray executor's settings, and what needs no Ray ---------------------------------------------

@pytest.mark.parametrize("executor", ["thread", "process"])
@pytest.mark.parametrize("setting, value", [("ray_address", "auto"), ("num_cpus", 2), ("actor_options", {}),
                                            ("placement_timeout", 5.0), ("connect_timeout", 5.0)])
def test_a_ray_setting_beside_another_executor_is_refused_naming_both_keys(executor, setting, value):
    # Where options meet: the ray executor's settings mean nothing to a thread or process pool; given there they
    # are refused at construction and in a config file, naming the setting and the executor.
    with pytest.raises(ValueError, match=rf"{setting} applies to executor 'ray' only, and executor is '{executor}'"):
        st.Sleepy(executor=executor, **{setting: value})
    spec = PRMConfig(scorers=[ScorerSpec(path="scorers_for_tests.Sleepy",
                                         kwargs={"executor": executor, setting: value})])
    with pytest.raises(ValueError, match=rf"scorers\[0\]\.kwargs: scorers_for_tests\.Sleepy: {setting} applies to "
                                         rf"executor 'ray' only, and executor is '{executor}'"):
        check_scorer_specs(spec)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_cpus": 0}, "num_cpus"), ({"num_cpus": float("nan")}, "num_cpus"),
    ({"placement_timeout": 0}, "placement_timeout"), ({"ray_address": ""}, "ray_address must be a non-empty string"),
    ({"connect_timeout": 0}, "connect_timeout"), ({"connect_timeout": float("inf")}, "connect_timeout"),
    ({"actor_options": ["resources"]}, "actor_options must be a mapping"),
    ({"actor_options": {"max_restarts": 3}}, r"actor_options: \['max_restarts'\] are set by the ray executor"),
])
def test_bad_ray_settings_are_refused_naming_them(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        st.Sleepy(executor="ray", **kwargs)


def test_ray_settings_are_kept_and_max_workers_is_left_to_the_cluster():
    scorer = st.Sleepy(executor="ray", num_cpus=0.5, actor_options={"resources": {"verifier": 1}},
                       ray_address="auto", placement_timeout=5)
    assert (scorer.num_cpus, scorer.actor_options, scorer.ray_address, scorer.placement_timeout) == (
        0.5, {"resources": {"verifier": 1}}, "auto", 5.0)
    assert scorer.max_workers is None  # the executor starts one actor per num_cpus the cluster offers
    assert st.Sleepy(executor="ray", max_workers=3).max_workers == 3


async def test_executor_ray_without_ray_installed_says_how_to_install_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # (import ray raises ImportError)
    runner = PRMRunner(scorers=(st.Sleepy(executor="ray"),))
    try:
        results = await runner.run_many([chain(1)], return_exceptions=True)
    finally:
        await runner.aclose()
    assert isinstance(results[0], ImportError)
    assert "executor 'ray' needs Ray: pip install 'prm-jax[ray]'" in str(results[0])


# Issue 55.8: executor "ray" with an unreachable ray_address (127.0.0.1:1) hung score_arrays past 300 s with only
# Ray's own log lines. Joining is bounded by connect_timeout (30 s by default) and fails with one line naming
# the address and what to check. These run without Ray: ``join`` takes the ray module, here a stand-in whose
# handshake never answers (as Ray's retries do); the Ray suite (tests/ray) runs the real one.
class _RayThatNeverAnswers:
    def __init__(self):
        self.called, self.shutdowns = 0, 0

    def init(self, address):
        self.called += 1
        time.sleep(3.0)

    def shutdown(self):
        self.shutdowns += 1


def test_joining_an_address_where_nothing_listens_fails_at_once_naming_it():
    from prm_jax.runtime._ray_pool import join

    ray = _RayThatNeverAnswers()
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=r"ray_address '127\.0\.0\.1:1': cannot connect .*: check that the "
                                              r"cluster's head is running there.*connect_timeout \(30 s\)"):
        join(ray, "127.0.0.1:1", 30.0)
    assert time.monotonic() - started < 5 and ray.called == 0


def test_joining_an_address_that_accepts_but_never_answers_as_ray_fails_within_connect_timeout():
    import socket

    from prm_jax.runtime._ray_pool import join

    with socket.socket() as listener:  # accepts connections (the kernel's backlog) and never speaks
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        address = "{}:{}".format(*listener.getsockname())
        ray = _RayThatNeverAnswers()
        started = time.monotonic()
        with pytest.raises(ConnectionError, match=rf"ray_address '{address}': no Ray cluster answered within "
                                                  r"connect_timeout \(1 s\)"):
            join(ray, address, 1.0)
        assert 0.9 < time.monotonic() - started < 2.5 and ray.called == 1
        deadline_ = time.monotonic() + 10
        while ray.shutdowns == 0 and time.monotonic() < deadline_:  # (its late connection is closed)
            time.sleep(0.05)
        assert ray.shutdowns == 1


def test_ray_addresses_are_read_as_ray_reads_them():
    from prm_jax.runtime._ray_pool import _host_port

    assert _host_port("127.0.0.1:6379") == ("127.0.0.1", 6379) and _host_port("ray://head:10001") == ("head", 10001)
    assert _host_port("ray://head") == ("head", 10001) and _host_port("[::1]:6379") == ("::1", 6379)
    assert _host_port("auto") is None and _host_port("head") is None
