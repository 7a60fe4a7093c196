"""Issue 45: the ``ray`` executor keeps the executor rules on a real (local) Ray cluster: the same numbers as the
process executor, placement by resources (and one clear error where the cluster cannot place an actor), a
deadline that kills its actor and resends the rest of its chunk, an actor death that fails exactly the call
that killed it, a scorer the actors cannot load as one located error, a close that ends every actor it made
and leaves a driver's own connection alone, and an event loop never blocked by the waits.

Runs only in the Ray suite (``python3 dev.py ray``: the ray extra, a private network namespace); one local Ray
per module (tests/conftest.py), with two CPUs and two units of a custom ``verifier`` resource."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

if not os.environ.get("PRM_JAX_RAY_SUITE"):  # (set by python3 dev.py ray: tests/conftest.py)
    pytest.skip("the Ray suite runs through python3 dev.py ray (the ray extra, inside a private network namespace)",
                allow_module_level=True)

import anyio
import ray
import scorers_for_tests as st
from executor_cases import make
from processes import alive

from prm_jax import PRMRunner
from prm_jax.runtime._arrays import score_arrays
from prm_jax.runtime._ray_pool import RayExecutor

pytestmark = pytest.mark.anyio
ONE_RAY_PER_MODULE = True


def rows(n, out_len=3):
    """``n`` one-turn rows: a one-token prompt, then ``out_len`` output tokens (distinct per row)."""
    width = 1 + out_len
    input_ids = np.arange(1, 1 + n * width, dtype=np.int32).reshape(n, width)
    turn_ids = np.full((n, width), -1, np.int32)
    turn_ids[:, 1:] = 0
    return input_ids, turn_ids


async def scored(scorer, n, **kwargs):
    """``score_arrays`` of ``n`` rows (failures masked), the scorer's executor and its stats."""
    runner = PRMRunner(scorers=(scorer,))
    try:
        out = await score_arrays(runner, *rows(n), on_error="mask", **kwargs)
        return out, runner._executors[id(scorer)], runner.scorer_stats()[scorer.name]
    finally:
        await runner.aclose()


async def test_a_cpu_bound_verifier_on_actors_gives_the_process_executors_numbers():
    # The same busy verifier (pure Python, holds the GIL) through "process" and "ray": identical rewards on
    # every row, and the actors ran in processes other than this one.
    on_ray, executor, stats = await scored(st.BusyVerifier(work=3000, executor="ray", max_workers=2), 24)
    in_processes, _, _ = await scored(st.BusyVerifier(work=3000, executor="process", max_workers=2), 24)
    assert not on_ray.failed.any() and stats["failures"] == 0 and stats["calls"] == 24
    np.testing.assert_array_equal(on_ray.token_rewards, in_processes.token_rewards)
    expected = [st.busy_score(type("T", (), {"output_tokens": row[1:]}), 3000) for row in rows(24)[0]]
    np.testing.assert_allclose(on_ray.token_rewards[:, 1], np.float32(expected))
    assert isinstance(executor, RayExecutor) and executor.workers == 2 and len(executor.nodes) == 1


async def test_max_workers_defaults_to_the_cpus_the_cluster_offers_at_num_cpus_each():
    # Two CPUs in the module's cluster: two actors at num_cpus=1, one at num_cpus=2.
    _, one_each, _ = await scored(make("ray", max_workers=None), 4)
    _, two_each, _ = await scored(make("ray", max_workers=None, num_cpus=2), 4)
    assert (one_each.workers, two_each.workers) == (2, 1)


async def test_actors_are_placed_by_their_custom_resources():
    out, executor, _ = await scored(make("ray", actor_options={"resources": {"verifier": 1}}), 6)
    assert not out.failed.any() and executor.asked() == {"CPU": 1.0, "verifier": 1.0}


async def test_resources_the_cluster_does_not_have_are_one_error_at_once():
    # Ray waits forever for an actor it cannot place; here it is one error, at once, naming what one actor asks
    # for and what the cluster has.
    start = time.monotonic()
    out, _, stats = await scored(make("ray", actor_options={"resources": {"gpu_box": 1}}), 3)
    assert time.monotonic() - start < 5
    assert out.failed.all() and stats["failures"] == 3
    text = out.errors[0]
    assert "{'CPU': 1.0, 'gpu_box': 1.0}" in text and "'verifier': 2.0" in text and "row0/t0" in text, text


async def test_an_actor_the_cluster_cannot_place_in_time_is_one_clear_error():
    # The cluster has the resource, but another actor holds all of it: after placement_timeout (1 s) every row
    # fails with one error naming the resources asked for, the cluster's and the free ones.
    @ray.remote(resources={"verifier": 2}, num_cpus=0)
    class Holder:
        def ready(self):
            return True

    holder = Holder.remote()
    ray.get(holder.ready.remote())
    try:
        start = time.monotonic()
        out, _, _ = await scored(make("ray", actor_options={"resources": {"verifier": 1}}, placement_timeout=1.0,
                                      max_workers=1), 3)
        took = time.monotonic() - start
    finally:
        ray.kill(holder)
    assert 1.0 <= took < 8, took
    assert out.failed.all()
    text = out.errors[2]
    assert "could not be placed within placement_timeout=1.0 s" in text, text
    assert "each actor asks for {'CPU': 1.0, 'verifier': 1.0}" in text and "'verifier': 0.0" in text, text


async def test_a_call_past_its_deadline_kills_its_actor_and_the_rest_of_its_chunk_is_resent(tmp_path):
    started = tmp_path / "started"
    scorer = st.Misbehaves(slow=("row1/t0",), started=str(started), executor="ray", max_workers=1, timeout=1.0)
    runner = PRMRunner(scorers=(scorer,))
    try:
        start = time.monotonic()
        out = await score_arrays(runner, *rows(6), on_error="mask")
        took = time.monotonic() - start
        executor = runner._executors[id(scorer)]
        restarts, stats = executor.restarts, runner.scorer_stats()["misbehaves"]
    finally:
        await runner.aclose()
    assert took < 20 and started.exists()  # the 30 s sleep was cut short
    assert out.failed.tolist() == [False, True, False, False, False, False]
    assert out.errors[1].startswith("TimeoutError: scorer 'misbehaves' on interaction 'row1/t0' took longer than its "
                                    "timeout of 1.0 s in its Ray actor (the actor was killed and replaced)")
    assert restarts == 1 and stats["timeouts"] == 1 and stats["failures"] == 1


async def test_an_actor_that_dies_mid_chunk_fails_exactly_the_call_that_killed_it(tmp_path):
    # One actor, the eight calls in one chunk (its dispatcher takes them once all eight wait), row 3 crashes the
    # process: the calls whose answers were lost with it (those after it, and those before it whose answers
    # were still on their way: Ray reports a streamed answer asynchronously) are rerun one at a time on new
    # actors; only the crashing row fails, with the cause. Ray's own retries are off: row 3 ran twice (in its
    # chunk, then alone), every other row once or, if its answer was lost, twice.
    log = tmp_path / "calls"
    scorer = st.Counted(str(log), crash=("row3/t0",), executor="ray", max_workers=1)
    runner = PRMRunner(scorers=(scorer,))
    executor = runner._executors[id(scorer)]
    take, first = executor._take, [True]

    def take_all_eight():
        if first.pop() if first else False:
            deadline = time.monotonic() + 20
            while len(executor._queue) < 8 and time.monotonic() < deadline:
                time.sleep(0.005)
        return take()

    executor._take = take_all_eight
    try:
        out = await score_arrays(runner, *rows(8), on_error="mask")
        stats = runner.scorer_stats()["counted"]
    finally:
        await runner.aclose()
    assert out.failed.tolist() == [False, False, False, True, False, False, False, False], out.errors
    assert "its Ray actor died" in out.errors[3] and "row3/t0" in out.errors[3], out.errors[3]
    runs = log.read_text().split()
    assert runs.count("row3/t0") == 2 and all(runs.count(f"row{r}/t0") in (1, 2) for r in range(8) if r != 3), runs
    assert executor.restarts == 2 and stats["failures"] == 1


async def test_a_scorer_the_actors_cannot_import_is_one_located_error_without_a_restart_loop(tmp_path):
    # The scorer's module is importable here (this process's sys.path) but not where Ray runs its actors: every
    # row fails with the cause, and no actor is started again.
    (tmp_path / "only_here.py").write_text(textwrap.dedent("""
        from prm_jax import SyncScorer

        class OnlyHere(SyncScorer):
            name = "only_here"
            executor = "ray"

            def evaluate(self, interaction, ctx):
                return 1.0
    """))
    sys.path.insert(0, str(tmp_path))
    try:
        import only_here

        out, executor, _ = await scored(only_here.OnlyHere(max_workers=2), 5)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("only_here", None)
    assert out.failed.all() and executor.restarts == 0
    for row in range(5):
        assert "its worker could not load the scorer: ModuleNotFoundError" in out.errors[row], out.errors[row]
        assert "only_here" in out.errors[row] and f"row{row}/t0" in out.errors[row]


async def test_a_scorer_that_does_not_pickle_says_so_on_its_rows():
    import threading

    scorer = make("ray")
    scorer.lock = threading.Lock()
    out, _, _ = await scored(scorer, 2)
    assert out.failed.all()
    assert "runs with executor 'ray', so it is pickled into its actors, but it does not pickle" in out.errors[0]


async def test_close_ends_every_actor_it_made_and_leaves_the_drivers_own_connection():
    scorer = st.WorkerPid(executor="ray", max_workers=2)
    runner = PRMRunner(scorers=(scorer,))
    out = await score_arrays(runner, *rows(8))
    executor = runner._executors[id(scorer)]
    pids = {actor.pid for actor in executor._live}
    assert len(pids) == 2 and set(np.unique(out[:, 1]).astype(int).tolist()) <= pids  # scored in the actors
    start = time.monotonic()
    await runner.aclose()
    while any(alive(pid) for pid in pids) and time.monotonic() - start < 10:
        await anyio.sleep(0.05)
    assert not [pid for pid in pids if alive(pid)] and time.monotonic() - start < 10
    assert ray.is_initialized()  # the module's ray.init(): reused, never disconnected by a close


async def test_waiting_for_actors_never_blocks_the_event_loop():
    # A ticker beside 40 busy calls on two actors: the loop answers every 10 ms tick within 50 ms (the waits run
    # in the dispatcher threads; results come back through futures).
    lags: list[float] = []

    async def ticker(stop):
        while not stop.is_set():
            before = time.perf_counter()
            await anyio.sleep(0.01)
            lags.append(time.perf_counter() - before - 0.01)

    scorer = st.BusyVerifier(work=20000, executor="ray", max_workers=2)
    runner = PRMRunner(scorers=(scorer,))
    try:
        await score_arrays(runner, *rows(2))  # (the actors start: their placement is not the point here)
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(ticker, stop)
            for _ in range(10):  # (bounded) until the ticker has seen enough ticks while calls ran: 40 calls can
                await score_arrays(runner, *rows(40))  # finish within 60 ms on a quiet machine (CI saw 5 ticks)
                if len(lags) > 5:
                    break
            stop.set()
    finally:
        await runner.aclose()
    assert len(lags) > 5 and max(lags) < 0.05, max(lags)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_on_trio_the_waits_go_through_a_thread(anyio_backend):
    pytest.importorskip("trio")
    out, _, _ = await scored(st.BusyVerifier(work=100, executor="ray", max_workers=1), 4)
    assert not out.failed.any()


DRIVER = """
import os, sys, time, anyio, numpy as np
from prm_jax import PRMRunner, SyncScorer
from prm_jax.runtime._arrays import score_arrays
from prm_jax.runtime._ray_pool import _CLUSTER
from prm_jax.runtime._ray_watchdog import cluster_processes

class Pid(SyncScorer):
    name = "pid"
    executor = "ray"

    def evaluate(self, interaction, ctx):
        return float(os.getpid())

async def main():
    import ray
    runner = PRMRunner(scorers=(Pid(max_workers=1),))
    out = await score_arrays(runner, np.arange(1, 9, dtype=np.int32).reshape(2, 4), np.array([[-1, 0, 0, 0]] * 2, np.int32))
    marker, temp = _CLUSTER.marker, _CLUSTER.temp_dir
    started = len(cluster_processes(marker, set()))
    await runner.aclose()
    print(int(out[0, 1]) != os.getpid(), started, ray.is_initialized(), cluster_processes(marker, set()),
          os.path.exists(temp), flush=True)

anyio.run(main)
"""


def test_a_local_cluster_the_executor_started_is_stopped_by_its_close(tmp_path):
    # Without a ray.init() of the caller's and without an address, the executor starts a local cluster (its own
    # temp dir, every process marked); its close disconnects, stops every process of it and removes the dir.
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr[-3000:]
    remote, started, connected, left, temp_left = done.stdout.split(maxsplit=4)
    assert remote == "True" and int(started) >= 3, done.stdout
    assert (connected, left.strip(), temp_left.strip()) == ("False", "set()", "False"), done.stdout


UNREACHABLE_DRIVER = """
import sys, time, anyio, numpy as np
import scorers_for_tests as st
from prm_jax import PRMRunner
from prm_jax.runtime._arrays import score_arrays

async def main():
    scorer = st.Sleepy(executor="ray", ray_address=sys.argv[1], connect_timeout=5)
    try:
        await score_arrays(PRMRunner(scorers=(scorer,)), np.arange(1, 9, dtype=np.int32).reshape(2, 4),
                           np.array([[-1, 0, 0, 0]] * 2, np.int32))
    except Exception as err:
        print(f"{type(err).__name__}: {err}")

anyio.run(main)
"""


@pytest.mark.parametrize("listening", [False, True], ids=["nothing listens", "a port that never answers"])
def test_an_unreachable_ray_address_fails_within_connect_timeout_naming_it(listening, tmp_path):
    # Issue 55.8: ray_address 127.0.0.1:1 hung score_arrays past 300 s with only Ray's log lines; with
    # connect_timeout 5 the driver says which address and what to check, and exits.
    import socket

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.path.dirname(tests)]))
    env.pop("RAY_ADDRESS", None)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        if listening:
            listener.listen(4)
        address = "127.0.0.1:1" if not listening else "{}:{}".format(*listener.getsockname())
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", UNREACHABLE_DRIVER, address], env=env, capture_output=True,
                              text=True, timeout=120)
    assert time.monotonic() - started < 60, done.stderr[-2000:]
    assert f"ConnectionError: ray_address '{address}'" in done.stdout, (done.stdout, done.stderr[-2000:])
    assert "check that the cluster's head is running there" in done.stdout
