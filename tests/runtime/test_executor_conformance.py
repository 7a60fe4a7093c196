"""Issue 41 ("close the classes"): every executor behaves the same. The same cases run on ``async``,
``thread``, ``process`` and ``batch`` (``executor_cases``: one scorer per kind, one behaviour per row), and
each asserts the same row-level outcome and the same error type and wording: results refused after the call
(41.5, 41.20), a return value that cannot cross back (41.10, 41.22), a raised error, a scorer that exits (and a
worker process that dies), a deadline, a close while in flight with and without a deadline (41.11, 41.17), and a
failing progress callback (41.16). The death of the training process, which only the process executor has
children to outlive, is tested in test_executors.py (41.13)."""

import os
import threading
import time
import warnings

import numpy as np
import pytest
from executor_cases import KINDS, make
from processes import alive, descendants, title

from prm_jax import BlockingRunner, PRMRunner
from prm_jax.runtime import RunnerClosedError
from prm_jax.runtime._arrays import score_arrays

pytestmark = pytest.mark.anyio
ONE_RAY_PER_MODULE = True  # (in the Ray suite, where KINDS holds "ray": tests/conftest.py)


def rows(n, turns=1, out_len=2):
    """``n`` rows of ``turns`` turns (a one-token prompt, then ``out_len`` output tokens per turn)."""
    width = 1 + turns * out_len
    input_ids = np.arange(1, 1 + n * width, dtype=np.int32).reshape(n, width)
    turn_ids = np.full((n, width), -1, np.int32)
    for k in range(turns):
        turn_ids[:, 1 + k * out_len:1 + (k + 1) * out_len] = k
    return input_ids, turn_ids


async def masked(scorer, n, **kwargs):
    runner = PRMRunner(scorers=(scorer,))
    try:
        out = await score_arrays(runner, *rows(n), on_error="mask", **kwargs)
        return out, runner.scorer_stats()["case"]
    finally:
        await runner.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_results_refused_after_the_call_fail_their_rows_and_count_as_failures(kind):
    # 41.5: NaN, a wrong shape, None and a wrong type failed their rows but counted 0 failures (3 of 4 rows
    # failed, failures=0), and the count differed between thread and process. 41.20/41.22: every row's error
    # names the scorer and its turn.
    modes = {1: "nan", 2: "wrong_shape", 3: "none", 4: "wrong_type"}
    out, stats = await masked(make(kind, modes), 5)
    assert out.failed.tolist() == [False, True, True, True, True]
    assert stats["failures"] == 4
    np.testing.assert_array_equal(out.token_rewards[0, 1:], [1.0, 1.0])
    expected = {1: "ValueError", 2: "ValueError", 3: "RuntimeError", 4: "TypeError"}
    for row, kind_of_error in expected.items():
        text = out.errors[row]
        assert text.startswith(kind_of_error + ":"), text
        assert "'case'" in text and f"row{row}/t0" in text, text


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["local", "unloadable"])
async def test_a_return_value_that_cannot_cross_back_fails_its_row_alone(kind, mode):
    # 41.10: a result that pickles in a worker but not back in the parent killed the dispatcher thread, and
    # with max_workers=1 every later call hung. On every executor the row fails with a located TypeError and
    # the rows after it score (one worker, so they ride the same dispatcher).
    out, stats = await masked(make(kind, {1: mode}, max_workers=1, timeout=10.0), 4)
    assert out.failed.tolist() == [False, True, False, False]
    assert stats["failures"] == 1
    text = out.errors[1]
    assert text.startswith("TypeError:") and "row1/t0" in text and "'case'" in text, text
    if kind == "process":
        crossing = "could not be pickled" if mode == "local" else "could not be unpickled in the parent process"
        assert f"the scorer's return value {crossing}" in text, text


@pytest.mark.parametrize("kind", KINDS)
async def test_a_raised_error_fails_the_rows_it_was_raised_for(kind):
    out, stats = await masked(make(kind, {2: "raises"}), 4)
    failed = out.failed.tolist()
    # A batch's one call covers every item in it: its error fails them all (the same error object).
    assert failed == ([True] * 4 if kind == "batch" else [False, False, True, False])
    assert stats["failures"] == sum(failed)
    for row in np.flatnonzero(out.failed):
        assert out.errors[row].startswith("KeyError: 'no answer for this turn'"), out.errors[row]
        assert "'case'" in out.errors[row]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_scorer_that_exits_fails_its_row_and_the_run_goes_on(kind):
    # "A worker or thread that dies": sys.exit() inside a scorer ended the run (a BaseException through the task
    # group) on async, thread and batch scorers; on every executor it is the row's RuntimeError now, and a
    # worker process that dies (os._exit) fails only the calls it held.
    out, stats = await masked(make(kind, {2: "exits"}), 4)
    failed = out.failed.tolist()
    assert failed == ([True] * 4 if kind == "batch" else [False, False, True, False])
    assert stats["failures"] == sum(failed)
    text = out.errors[2]
    assert text.startswith("RuntimeError:") and "SystemExit(3)" in text and "'case'" in text and "row2/t0" in text
    if kind == "process":
        out, stats = await masked(make(kind, {2: "crash"}, max_workers=1), 4)
        assert out.failed.tolist()[2] and "its worker process died (exit code 3)" in out.errors[2]
        assert not out.failed[3]  # a new worker took the calls after it
    if kind == "ray":  # issue 45: the actor that dies fails exactly its call, with the cause
        out, stats = await masked(make(kind, {2: "crash"}, max_workers=1), 4)
        assert out.failed.tolist() == [False, False, True, False], out.errors
        assert "its Ray actor died" in out.errors[2] and "row2/t0" in out.errors[2], out.errors[2]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_past_its_deadline_fails_with_the_same_timeout_error(kind):
    start = time.monotonic()
    out, stats = await masked(make(kind, {1: "slow"}, timeout=0.5), 2)
    assert time.monotonic() - start < 10
    # (a batch's one call covers both rows: both fail with its error)
    assert out.failed.tolist() == ([True, True] if kind == "batch" else [False, True])
    assert out.errors[1].startswith("TimeoutError: scorer 'case' on "), out.errors[1]
    assert "took longer than its timeout of 0.5 s" in out.errors[1]
    assert stats["timeouts"] == 1 and stats["failures"] == sum(out.failed)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_network_wait_is_bounded_on_every_executor(kind):
    # Issue 55, "every network wait is bounded": a scorer that waits on a peer that never answers (connected,
    # no timeout of its own) is ended by its deadline on every executor; an address where nothing listens
    # fails its row at once. The rest of the run goes on.
    import socket

    with socket.socket() as silent, socket.socket() as closed:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        closed.bind(("127.0.0.1", 0))  # (bound, never listening: connections are refused)
        modes = {1: f"silent:{silent.getsockname()[1]}", 2: f"refused:{closed.getsockname()[1]}"}
        start = time.monotonic()
        out, stats = await masked(make(kind, modes, timeout=1.0), 4)
        assert time.monotonic() - start < 15
    assert out.failed[1] and out.failed[2] and (kind == "batch" or (not out.failed[0] and not out.failed[3]))
    if kind != "batch":  # (a batch's one call holds every row: its deadline fails them together)
        assert "took longer than its timeout of 1.0 s" in out.errors[1], out.errors[1]
        assert any(said in out.errors[2] for said in ("Connection refused", "ConnectionRefused", "connection attempts failed"))
    assert stats["timeouts"] >= 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("timeout", [None, 20.0])
def test_closing_a_blocking_runner_abandons_runs_in_flight_on_every_executor(kind, timeout, tmp_path):
    # 41.11: a stuck thread scorer without a timeout blocked close() forever; 41.17: the thread executor's close
    # gave a bare TimeoutError() and CancelledError where the process executor gave RunnerClosedError.
    started = tmp_path / "started"
    runner = BlockingRunner(scorers=(make(kind, {0: "slow"}, started=str(started), timeout=timeout),))
    outcome: list[BaseException] = []

    def score():
        try:
            runner.score_arrays(*rows(1))
        except BaseException as err:  # (what the caller's thread sees is the point)
            outcome.append(err)

    caller = threading.Thread(target=score)
    caller.start()
    deadline = time.monotonic() + 20
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started.exists()
    begin = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner.close()
    closed_in = time.monotonic() - begin
    caller.join(10)
    assert not caller.is_alive() and closed_in < 6, closed_in
    assert len(outcome) == 1 and type(outcome[0]) is RunnerClosedError, repr(outcome)
    assert "closed while this run was in flight; nothing was committed" in str(outcome[0])
    if kind == "thread":  # the abandoned call still runs in its thread: the close says so, naming it
        assert any("abandoned while still running in worker threads" in str(w.message) and "row0/t0" in
                   str(w.message) for w in caught), [str(w.message) for w in caught]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failing_progress_callback_is_reported_once_and_scoring_goes_on(kind):
    # 41.16: a progress callback that raised aborted the whole call (even with on_error="mask").
    calls = []

    def progress(done, total):
        calls.append(done)
        raise ZeroDivisionError("a bad progress bar")

    with pytest.warns(RuntimeWarning, match="progress callback .*progress.* raised ZeroDivisionError") as caught:
        out, stats = await masked(make(kind), 4, progress=progress)
    assert out.failed.tolist() == [False] * 4 and stats["failures"] == 0
    assert sorted(calls) == [1, 2, 3, 4]
    assert sum("progress callback" in str(w.message) for w in caught) == 1


OWNER = """
import os, sys, threading, time
import anyio
import numpy as np
from executor_cases import make
from prm_jax import PRMRunner
from prm_jax.runtime._arrays import score_arrays

KIND, STARTED = sys.argv[1], sys.argv[2]

def report():
    while not os.path.exists(STARTED):
        time.sleep(0.02)
    print("started", flush=True)

async def main():
    threading.Thread(target=report, daemon=True).start()
    runner = PRMRunner(scorers=(make(KIND, {0: "slow", 1: "slow"}, started=STARTED),))
    await score_arrays(runner, np.arange(1, 7, dtype=np.int32).reshape(2, 3), np.array([[-1, 0, 0]] * 2, np.int32))

if __name__ == "__main__":
    anyio.run(main)
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("signum", ["SIGTERM", "SIGKILL"])
def test_nothing_outlives_a_killed_training_process(kind, signum, tmp_path):
    # Issue 41.13: SIGTERM or SIGKILL of the training process left the process executor's workers (mid-call), its
    # forkserver and the resource tracker running ten minutes later. On every executor, every process the
    # training process started is gone within 5 s of its death (workers watch the process that owns them; a
    # local Ray cluster, within 10 s: its watchdog ends it).
    import signal
    import subprocess
    import sys

    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    owner = subprocess.Popen([sys.executable, str(script), kind, str(tmp_path / "started")], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert owner.stdout.readline().strip() == "started"  # a call is in flight (sleeping 30 s)
        spawned = descendants(owner.pid)
        # process: workers, the forkserver, the tracker; ray: the local cluster it started (GCS, raylet, agents,
        # the actors) and its watchdog
        assert (len(spawned) >= 3) == (kind in ("process", "ray")), spawned
        owner.send_signal(getattr(signal, signum))
        owner.wait(10)
        # Issue 45: Ray's agents outlived a killed driver by 45 s and more; its watchdog ends them within 10 s.
        deadline = time.monotonic() + (10.0 if kind == "ray" else 5.0)
        while time.monotonic() < deadline and any(alive(p) for p in spawned):
            time.sleep(0.05)
        assert [(p, title(p)) for p in spawned if alive(p)] == []
    finally:
        if owner.poll() is None:
            owner.kill()
