"""Issue 10: nothing lost, nothing silently wrong, under retries, faults and bad numbers (the runtime).

The command-line cases are in ``test_cli_faults.py`` (they run the installed ``prm-jax``).
"""

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
import time

import anyio
import numpy as np
import pytest
import scorers_for_tests as st
from scorers_for_tests import chain, committed, scorer_of

from prm_jax import BaseScorer, BaseTrajectoryScorer, PRMRunner
from prm_jax.config import PRMConfig, ScorerSpec
from prm_jax.native._build import find_compiler
from prm_jax.runtime._export import TrajectoryStore, export_group

pytestmark = pytest.mark.anyio


def branch(n_turns=2, out_len=2, rewards=None):
    return chain(n_turns, out_len, rewards, outcome=1.0)


# --- 10.1 concurrent or retried export of one group -----------------------------------------------------

class SlowJudge(BaseScorer):
    name = "slow_judge"

    async def evaluate(self, interaction, ctx):
        await anyio.sleep(0.05)
        return 1.0


def fill(store, keys):
    for key in keys:
        for turn in branch():
            store.add(key, turn)
        store.mark_ready(key, "t1")


async def test_a_duplicate_export_of_a_group_in_flight_is_rejected_and_loses_nothing():
    store = TrajectoryStore()
    fill(store, ["s0", "s1"])
    runner = PRMRunner(scorers=(SlowJudge(),))
    results = {}

    async def export(name):
        results[name] = await export_group(store, ["s0", "s1"], runner=runner)

    async with anyio.create_task_group() as tg:
        tg.start_soon(export, "first")
        await anyio.sleep(0.01)  # the first is scoring when the retry arrives
        tg.start_soon(export, "retry")
    assert results["first"].status == "accepted"
    assert len(results["first"].trajectories) == 2
    assert all(t.sequence.token_rewards is not None for t in results["first"].trajectories)
    assert results["retry"].status == "rejected"
    assert set(results["retry"].rejected_sessions) == {"s0", "s1"}
    assert store.keys() == []  # the owner removed its sessions when it finished


async def test_a_retry_after_an_export_finished_finds_the_group_missing():
    store = TrajectoryStore()
    fill(store, ["s0"])
    first = await export_group(store, ["s0"], remove_session=False)
    retry = await export_group(store, ["s0"], remove_session=False)
    assert first.status == "accepted" and retry.status == "rejected"


# --- 10.2 all-or-nothing commit across scorers ------------------------------------------------------------

@pytest.mark.parametrize("failure", ["raise", "none", "shape", "cancel"])
async def test_a_failing_later_scorer_commits_nothing_and_a_retry_does_not_double(failure):
    async def later(self, interaction, ctx):
        if failure == "raise":
            raise RuntimeError("judge down")
        if failure == "none":
            return None
        if failure == "shape":
            return [1.0, 2.0, 3.0]
        await anyio.sleep_forever()

    cache = branch()
    runner = PRMRunner(scorers=(st.ConstantScorer(0.5), scorer_of(later, "later")))
    for _ in range(2):  # the trainer retries: before, 0.5 then 1.0 was committed
        if failure == "cancel":
            with anyio.move_on_after(0.05):
                await runner.run(cache)
        else:
            with pytest.raises((RuntimeError, ValueError)):
                await runner.run(cache)
        assert committed(cache) == [None, None]
    # Once the judge is back, the retry commits every scorer exactly once.
    async def back(self, interaction, ctx):
        return 0.25
    await PRMRunner(scorers=(st.ConstantScorer(0.5), scorer_of(back, "later"))).run(cache)
    assert committed(cache) == [[0.75, 0.75], [0.75, 0.75]]


# --- 10.3 aclose stops runs in flight -------------------------------------------------------------------

class ClientScorer(BaseScorer):
    name = "client"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.closed = False
        self.started = anyio.Event()
        self.finished_after_close = 0

    async def evaluate(self, interaction, ctx):
        self.started.set()
        await anyio.sleep(0.2)
        if self.closed:
            self.finished_after_close += 1
        return 1.0

    async def aclose(self):
        self.closed = True


async def test_aclose_cancels_runs_in_flight_before_closing_scorers_and_commits_nothing():
    scorer = ClientScorer()
    runner = PRMRunner(scorers=(scorer,))
    cache = branch()
    errors = []

    async def run():
        try:
            await runner.run(cache)
        except RuntimeError as err:
            errors.append(err)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await scorer.started.wait()
        await runner.aclose()  # returns once the run was cancelled and the scorer closed
    assert errors and "closed while this run was in flight" in str(errors[0])
    assert committed(cache) == [None, None]
    assert scorer.finished_after_close == 0
    with pytest.raises(RuntimeError, match="closed"):
        await runner.run(branch())


ORDER: list[str] = []


class Tracking(BaseScorer):
    """Records when its evaluation stops and when it is closed."""

    name = "tracking"

    async def evaluate(self, interaction, ctx):
        try:
            await anyio.sleep(1)
        finally:
            ORDER.append("run stopped")
        return 1.0

    async def aclose(self):
        ORDER.append("closed")


async def test_aclose_closes_an_owned_scorer_only_after_the_cancelled_run_stopped():
    ORDER.clear()
    runner = await PRMRunner.create(PRMConfig(scorers=(ScorerSpec("test_runner_faults.Tracking"),)))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: _swallow(runner.run(branch(1))))
        await anyio.sleep(0.02)
        await runner.aclose()
    assert ORDER == ["run stopped", "closed"]


async def _swallow(coro):
    try:
        await coro
    except RuntimeError:
        pass


# --- 10.4 deadlines -------------------------------------------------------------------------------------

class Hang(BaseScorer):
    name = "hang"

    async def evaluate(self, interaction, ctx):
        await anyio.sleep_forever()


class HangTrajectory(BaseTrajectoryScorer):
    name = "hang_trajectory"

    async def evaluate_trajectory(self, interactions, ctx):
        await anyio.sleep_forever()


@pytest.mark.parametrize("path,name", [("test_runner_faults.Hang", "hang"),
                                       ("test_runner_faults.HangTrajectory", "hang_trajectory")])
async def test_a_scorer_past_its_timeout_fails_like_a_raising_scorer(path, name):
    runner = await PRMRunner.create(PRMConfig(scorers=(ScorerSpec(path, timeout=0.1),)))
    cache = branch()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=f"scorer '{name}' on .*timeout of 0.1 s"):
        await runner.run(cache)
    assert time.monotonic() - start < 2
    assert committed(cache) == [None, None]
    await runner.aclose()


async def test_timeout_is_validated_in_config():
    for bad in (0, -1.0, float("inf"), "1s", True):
        with pytest.raises(ValueError, match="timeout"):
            PRMConfig.from_mapping({"scorers": [{"path": "test_runner_faults.Hang", "timeout": bad}]})
    spec = PRMConfig.from_mapping({"scorers": [{"path": "test_runner_faults.Hang", "timeout": 2.5}]}).scorers[0]
    assert spec.timeout == 2.5


@pytest.mark.parametrize("kind", [Hang, HangTrajectory])
async def test_a_borrowed_instance_carries_its_own_deadline(kind):
    # Issue 23.2: a timeout given with an instance (it was a TypeError: only a config entry had one).
    runner = PRMRunner(scorers=(kind(timeout=0.1),))
    cache = branch()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=f"scorer '{kind.name}' on .*timeout of 0.1 s"):
        await runner.run(cache)
    assert time.monotonic() - start < 2 and committed(cache) == [None, None]
    for bad in (0, -1.0, float("nan"), "1s"):
        with pytest.raises(ValueError, match="timeout"):
            kind(timeout=bad)


# --- 10.5 sums that overflow ----------------------------------------------------------------------------

async def test_a_non_finite_sum_over_scorers_is_a_failure_and_commits_nothing():
    big = float(np.finfo(np.float32).max) * 0.75
    cache = branch()
    async def also_big(self, interaction, ctx):
        return big
    runner = PRMRunner(scorers=(st.ConstantScorer(big), scorer_of(also_big)))
    with pytest.raises(ValueError, match="non-finite"):
        await runner.run(cache)
    assert committed(cache) == [None, None]
    # ... also with rewards committed earlier.
    cache = branch(rewards=[[big, 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="non-finite"):
        await PRMRunner(scorers=(st.ConstantScorer(big),)).run(cache)
    assert committed(cache)[0] == [np.float32(big), 0.0]


# --- 10.14 what a scorer returns ------------------------------------------------------------------------

@pytest.mark.parametrize("raw", ["0.5", b"1", [True, False], np.array(["1", "2"]), {"score": True}])
async def test_text_and_bools_are_not_scores(raw):
    async def evaluate(self, interaction, ctx):
        return raw
    cache = branch()
    with pytest.raises(TypeError, match="expected a float"):
        await PRMRunner(scorers=(scorer_of(evaluate),)).run(cache)
    assert committed(cache) == [None, None]


async def test_a_scorer_raising_cancelled_error_is_a_failure_not_a_none():
    async def evaluate(self, interaction, ctx):
        raise asyncio.CancelledError()
    cache = branch()
    with pytest.raises(RuntimeError, match="raised CancelledError without being cancelled"):
        await PRMRunner(scorers=(scorer_of(evaluate),)).run(cache)
    assert committed(cache) == [None, None]


async def test_an_outer_cancellation_still_cancels():
    async def evaluate(self, interaction, ctx):
        await anyio.sleep_forever()
    cache = branch()
    with anyio.move_on_after(0.05) as scope:
        await PRMRunner(scorers=(scorer_of(evaluate),)).run(cache)
    assert scope.cancelled_caught and committed(cache) == [None, None]


# --- 10.15 the native kernel's first build --------------------------------------------------------------

@pytest.mark.e2e  # (a source build of the native library in a process of its own: python3 dev.py e2e)
@pytest.mark.skipif(find_compiler() is None, reason="no C++ compiler")
def test_the_native_build_is_published_only_when_finished_and_built_once(tmp_path):
    script = textwrap.dedent("""
        import sys, threading
        from prm_jax.native import _ffi as native
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(native.available())) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(answers)
        sys.exit(0 if answers == [True] * 4 else 1)
    """)
    env = dict(os.environ, PRM_JAX_CACHE=str(tmp_path), JAX_PLATFORMS="cpu", PRM_JAX_NATIVE="build")  # (no wheel's)
    (tmp_path / "prm_jax_cpu_00stale00key0000.so").write_bytes(b"an older build")  # issue 11.3: removed
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (out, err[-2000:])
    assert len(list(tmp_path.glob("prm_jax_cpu_*.so"))) == 1
    assert not list(tmp_path.glob(".prm_jax_cpu_*"))  # no half-written temporaries left


def test_the_native_build_key_does_not_depend_on_where_the_sources_are(tmp_path):
    # Issue 12: the key hashed the absolute compile command, so two checkouts (or an install and a checkout)
    # of one version removed each other's build as stale and rebuilt it, ~4 s, whenever they alternated:
    # the "8-10 s outliers" of bench_cli after a CI run in a clean clone.
    from prm_jax.native import _build as native

    copies = []
    for folder in ("a", "b/deeper"):
        target = tmp_path / folder
        target.mkdir(parents=True)
        for source in native.INPUTS:
            shutil.copy(source, target / source.name)
        copies.append([target / source.name for source in native.INPUTS])
    assert native.build_key("c++", copies[0]) == native.build_key("c++", copies[1]) == \
        native.build_key("c++", native.INPUTS)
    copies[1][0].write_text(copies[1][0].read_text() + "\n// changed\n")
    assert native.build_key("c++", copies[0]) != native.build_key("c++", copies[1])
    # The shared header is part of the key: a change to it alone rebuilds.
    assert copies[1][-1].name == "row_tasks.h"
    copies[0][-1].write_text(copies[0][-1].read_text() + "\n// changed\n")
    assert native.build_key("c++", copies[0]) != native.build_key("c++", native.INPUTS)


# --- issue 29: where options meet, where scorers block, where processes must exit -------------------------

class BlocksTheLoop(BaseScorer):
    """Sleeps synchronously inside ``async def evaluate``: nothing can interrupt it."""

    name = "blocks_the_loop"

    async def evaluate(self, interaction, ctx):
        time.sleep(0.3)
        return 1.0


async def test_a_scorer_that_blocks_the_loop_past_its_deadline_fails_and_commits_nothing():
    # Issue 29.4: a call that slept 0.3 s synchronously with timeout 0.05 was accepted and committed.
    runner = PRMRunner(scorers=(BlocksTheLoop(timeout=0.05),))
    cache = branch(n_turns=1)
    with pytest.raises(TimeoutError, match=r"'blocks_the_loop' on interaction 't0' ran synchronous code for 0\.[3-9]"):
        await runner.run(cache)
    assert committed(cache) == [None]


async def test_a_blocking_scorer_without_a_deadline_is_named_once():
    runner = PRMRunner(scorers=(BlocksTheLoop(),))
    with pytest.warns(RuntimeWarning, match="'blocks_the_loop' blocked the event loop"):
        await runner.run(branch(n_turns=1))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per scorer, not per call
        await runner.run(branch(n_turns=1))


async def test_the_deadline_counts_the_scorers_own_time_not_its_waiting():
    # An async scorer that awaits longer than its deadline still fails (anyio's deadline); one that is quick
    # and awaits briefly passes: waiting is not blocking.
    async def waits(self, interaction, ctx):
        await anyio.sleep(0.01)
        return 1.0
    await PRMRunner(scorers=(scorer_of(waits, timeout=0.5),)).run(branch())


async def test_run_many_refuses_the_same_branch_twice():
    # Issue 29.18: the same branch object given twice committed twice (rewards doubled).
    runner = PRMRunner(scorers=(st.ConstantScorer(0.5),))
    cache = branch()
    with pytest.raises(ValueError, match=r"interaction 't0' in branches 0 and 2: its rewards would be committed twice"):
        await runner.run_many([cache, branch(), cache])
    assert committed(cache) == [None, None]
    chain_list = list(branch())
    with pytest.raises(ValueError, match="in branches 0 and 1"):  # two lists holding the same turns
        await runner.run_many([chain_list, list(chain_list)])


async def test_a_closed_runner_is_one_error_type_whatever_the_path():
    # Issue 29.25: "runner closed" came as an ExceptionGroup of RunnerClosedError, a bare RunnerClosedError,
    # or RuntimeError('BlockingRunner is closed').
    from prm_jax.runtime import RunnerClosedError
    from prm_jax.runtime._arrays import score_arrays
    runner = PRMRunner(scorers=(st.ConstantScorer(0.5),))
    await runner.aclose()
    with pytest.raises(RunnerClosedError):
        await runner.run(branch())
    with pytest.raises(RunnerClosedError):
        await runner.run_many([branch(), branch()])
    with pytest.raises(RunnerClosedError):
        await score_arrays(runner, np.array([[1, 2, 3]]), np.array([[-1, 0, 0]]))


def test_a_closed_blocking_runner_raises_the_same_type():
    from prm_jax import BlockingRunner
    from prm_jax.runtime import RunnerClosedError
    runner = BlockingRunner(scorers=[st.ConstantScorer(0.5)])
    runner.close()
    with pytest.raises(RunnerClosedError):
        runner.score_arrays(np.array([[1, 2, 3]]), np.array([[-1, 0, 0]]))


@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_a_script_that_never_closes_its_blocking_runner_still_exits_and_closes_it(tmp_path, ending):
    # Issue 29.1: the portal's worker thread was not a daemon: a script that ended, or died of an exception,
    # without close() never exited. Now it exits, and the runner's owned scorers are closed at exit.
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np, prm_jax

        class Judge(prm_jax.BaseScorer):
            name = "judge"
            async def evaluate(self, interaction, ctx):
                return 1.0
            async def aclose(self):
                print("judge closed", flush=True)

        config = prm_jax.ExperimentConfig.from_mapping({{"rollout": {{"agent": {{"prm": {{"enabled": True,
            "scorers": [{{"path": "__main__.Judge"}}]}}}}}}}})
        runner = prm_jax.BlockingRunner(config)
        print(runner.score_arrays(np.array([[1, 2, 3]]), np.array([[-1, 0, 0]])).tolist(), flush=True)
        if {ending == "raises"!r}:
            raise RuntimeError("the training step failed")
    """))
    import prm_jax
    package_root = os.path.dirname(os.path.dirname(prm_jax.__file__))  # the prm_jax these tests import
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root, os.path.dirname(st.__file__)]),
               JAX_PLATFORMS="cpu")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert time.monotonic() - start < 60
    assert proc.returncode == (1 if ending == "raises" else 0), proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["[[0.0, 1.0, 1.0]]", "judge closed"]
    assert "Exception ignored" not in proc.stderr


async def test_a_collector_pause_inside_a_step_is_not_the_scorers_time(monkeypatch):
    # A full collection of 8,000 live coroutines takes ~0.1 s and can land inside any scorer's step: it is
    # not the scorer's own time (bench_runner's asynchronous scorer was warned about as blocking).
    from prm_jax.runtime._concurrency import COLLECTOR

    class PausedByTheCollector(BaseScorer):
        name = "paused"

        async def evaluate(self, interaction, ctx):
            time.sleep(0.2)
            COLLECTOR.total += 0.2  # as the collector's callbacks count a pause of its own
            return 1.0

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await PRMRunner(scorers=(PausedByTheCollector(timeout=0.05),)).run(branch(n_turns=1))
