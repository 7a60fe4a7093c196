"""Issue 45.3 (end to end): scoring on a two-node Ray cluster built with Ray's own test helper
(``ray.cluster_utils.Cluster``) on loopback: the executor joins it by address, places actors on both nodes,
loses one node mid-run without losing a row silently, a driver killed by SIGTERM or SIGKILL leaves no actor
of ours running within 10 s, and the test tears down everything it started (it checks: no process of the cluster is
left). Runs in the Ray suite's e2e step (``python3 dev.py ray``), inside a private network namespace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

if not os.environ.get("PRM_JAX_RAY_SUITE"):  # (set by python3 dev.py ray: tests/conftest.py)
    pytest.skip("the Ray suite runs through python3 dev.py ray (the ray extra, inside a private network namespace)",
                allow_module_level=True)

import anyio
import scorers_for_tests as st
from processes import alive, descendants, left_running, title, with_marker
from ray.cluster_utils import Cluster

from prm_jax import PRMRunner
from prm_jax.runtime._arrays import score_arrays

TESTS = Path(__file__).resolve().parent.parent
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}


def actors_running():
    return [pid for pid in descendants(os.getpid()) if alive(pid) and title(pid).startswith("ray::ScorerActor")]


KILLED_DRIVER = """
import sys, anyio, numpy as np
from prm_jax import PRMRunner
from prm_jax.runtime._arrays import score_arrays
import scorers_for_tests as st
from processes import alive, descendants, left_running, title, with_marker

async def main():
    scorer = st.Misbehaves(slow=("row0/t0", "row1/t0"), started=sys.argv[2], executor="ray", max_workers=2,
                           ray_address=sys.argv[1])
    await score_arrays(PRMRunner(scorers=(scorer,)), np.arange(1, 9, dtype=np.int32).reshape(2, 4),
                       np.array([[-1, 0, 0, 0]] * 2, np.int32))

anyio.run(main)
"""


@pytest.mark.e2e
def test_a_two_node_cluster_scores_loses_a_node_without_losing_a_row_and_is_torn_down(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(TESTS.parent)]))  # (the nodes' workers)
    start = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args=dict(NODE))
    try:
        second = cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        print(f"two nodes up in {time.monotonic() - start:.1f} s")

        # Two actors of one CPU each on two one-CPU nodes: one on each. 40 calls of 0.15 s; the second node is
        # removed 1 s in. Its actor's calls are rerun one at a time on the surviving actor (its replacement
        # cannot be placed within 3 s: the pool shrinks); every row scores or fails with its cause.
        scorer = st.Sleepy(0.15, executor="ray", max_workers=2, ray_address=cluster.address, placement_timeout=3.0)
        runner = PRMRunner(scorers=(scorer,))
        executor = runner._executors[id(scorer)]
        removed = threading.Timer(1.0, lambda: cluster.remove_node(second, allow_graceful=False))

        async def score():
            try:
                # Both actors up (placed, loaded): eight rows, so that each dispatcher takes some while the other
                # places its actor.
                await score_arrays(runner, np.arange(1, 33, dtype=np.int32).reshape(8, 4),
                                   np.array([[-1, 0, 0, 0]] * 8, np.int32))
                assert len(executor.nodes) == 2, executor.nodes  # actors were placed on both nodes
                removed.start()
                width = 4
                ids = np.arange(1, 1 + 40 * width, dtype=np.int32).reshape(40, width)
                return await score_arrays(runner, ids, np.array([[-1, 0, 0, 0]] * 40, np.int32), on_error="mask")
            finally:
                await runner.aclose()

        out = anyio.run(score)
        removed.join()
        assert executor.shrunk == 1 and executor.restarts >= 1
        for row in range(40):  # never lost silently: a reward of 1.0, or a failure with the actor's death in it
            if out.failed[row]:
                assert "its Ray actor died" in out.errors[row], out.errors[row]
            else:
                np.testing.assert_array_equal(out.token_rewards[row, 1:], [1.0, 1.0, 1.0])
        assert out.failed.sum() <= 1, out.errors
        print(f"node removed: {int(out.failed.sum())} row(s) failed, {40 - int(out.failed.sum())} scored")

        # A driver joined to the cluster and killed by SIGTERM or SIGKILL mid-call: no actor of its is left
        # within 10 s (Ray ends the actors whose owner died).
        script = tmp_path / "driver.py"
        script.write_text(KILLED_DRIVER)
        for signum in (signal.SIGTERM, signal.SIGKILL):
            started = tmp_path / f"started-{signum}"
            driver = subprocess.Popen([sys.executable, str(script), cluster.address, str(started)])
            deadline = time.monotonic() + 60
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert started.exists() and actors_running()
            driver.send_signal(signum)
            killed = time.monotonic()
            driver.wait(10)
            while actors_running() and time.monotonic() - killed < 10:
                time.sleep(0.1)
            assert actors_running() == [], f"actors outlived their driver's {signum.name} by 10 s"
            print(f"actors of the driver gone {time.monotonic() - killed:.1f} s after its {signum.name}")
        started_here = descendants(os.getpid())
    finally:
        cluster.shutdown()
    assert left_running(started_here, within=10) == []  # nothing the test started is left


def coding_turn(code: str, iid: str):
    from prm_jax import Interaction

    return Interaction(iid, [1], [2], output_messages=[{"role": "assistant", "content": f"```python\n{code}\n```"}])


@pytest.mark.e2e
def test_the_code_scorer_on_two_nodes_kills_a_stuck_sandbox_there_and_leaves_nothing(monkeypatch):
    # Issue 58.9: CodeExecutionScorer with executor: ray on the two-node cluster. (a) Code stuck in its sandbox
    # on either node is killed at time_per_test and scores as a timeout; (b) a call past the scorer's own
    # deadline kills its actor, and the sandbox dies with it (bubblewrap's --die-with-parent): no process of
    # the stuck code is left on either node.
    import uuid

    from prm_jax import InteractionCache
    from prm_jax.scorers import CodeExecutionScorer

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(TESTS.parent)]))
    marker = f"prm-jax-stuck-{uuid.uuid4().hex}"
    stuck, good = f"import time  # {marker}\ntime.sleep(600)", "print(int(input()) * 2)"
    ctx = {"metadata": {"tests": [{"input": "21\n", "output": "42"}]}}
    cluster = Cluster(initialize_head=True, head_node_args=dict(NODE))
    try:
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()

        def scored(scorer, rows):
            runner = PRMRunner(scorers=(scorer,))
            executor = runner._executors[id(scorer)]
            caches = [InteractionCache([coding_turn(code, f"row{i}")]) for i, code in enumerate(rows)]

            async def score():
                try:
                    return await runner.run_many(caches, ctx, return_exceptions=True)
                finally:
                    await runner.aclose()
            started = time.monotonic()
            results = anyio.run(score)
            return results, caches, executor, time.monotonic() - started

        rows = [stuck if i % 2 else good for i in range(8)]
        scorer = CodeExecutionScorer(executor="ray", max_workers=2, ray_address=cluster.address, time_per_test=1.0,
                                     placement_timeout=30.0)
        results, caches, executor, seconds = scored(scorer, rows)
        assert len(executor.nodes) == 2, executor.nodes  # actors (and so sandboxes) on both nodes
        assert not [r for r in results if isinstance(r, BaseException)], results
        rewards = [float(next(iter(cache)).token_rewards[-1]) for cache in caches]
        assert rewards == [1.0, 0.0] * 4, rewards
        print(f"4 stuck and 4 good turns on two nodes in {seconds:.1f} s")
        assert with_marker(marker) == []

        # (b) the call's deadline (1.5 s) comes before the sandbox's (60 s): the actor is killed and replaced,
        # the stuck row fails with the deadline, and its sandbox is gone within 5 s.
        scorer = CodeExecutionScorer(executor="ray", max_workers=2, ray_address=cluster.address, time_per_test=60.0,
                                     timeout=1.5, placement_timeout=30.0)
        results, caches, executor, seconds = scored(scorer, [stuck, good])
        assert isinstance(results[0], BaseException) and not isinstance(results[1], BaseException), results
        assert executor.restarts >= 1
        deadline = time.monotonic() + 5
        while with_marker(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert with_marker(marker) == [], "the stuck sandbox outlived its killed actor"
        started_here = descendants(os.getpid())
    finally:
        cluster.shutdown()
    assert left_running(started_here, within=10) == []
