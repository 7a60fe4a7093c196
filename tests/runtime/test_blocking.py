"""Issue 31.10: ``prm_jax.runtime._blocking.BlockingRunner`` (a runner behind synchronous calls) on its own."""

import threading

import pytest
import scorers_for_tests as st
from scorers_for_tests import chain, committed

from prm_jax import BlockingRunner
from prm_jax.runtime import RunnerClosedError, RunnerState


def test_synchronous_calls_score_on_the_runners_own_loop_thread():
    with BlockingRunner(scorers=[st.ConstantScorer(0.5)]) as runner:
        one, many = chain(2), [chain(1), chain(3)]
        runner.run(one)
        runner.run_many(many)
        assert runner._thread.name == "prm-jax BlockingRunner" and runner._thread.daemon
        assert runner._thread is not threading.current_thread()
    assert committed(one) == [[0.5, 0.5]] * 2 and [committed(c) for c in many] == [[[0.5, 0.5]], [[0.5, 0.5]] * 3]


def test_a_closed_blocking_runner_refuses_every_call_and_closes_once():
    runner = BlockingRunner(scorers=[st.ConstantScorer()])
    assert runner.state is RunnerState.OPEN
    runner.close()
    assert runner.state is RunnerState.CLOSED  # the same states as PRMRunner's (issue 31.8)
    runner.close()  # idempotent
    assert not runner._thread.is_alive()
    for call in (lambda: runner.run(chain(1)), lambda: runner.run_many([chain(1)]),
                 lambda: runner.score_arrays([[1, 2]], [[-1, 0]])):
        with pytest.raises(RunnerClosedError, match="BlockingRunner is closed"):
            call()


def test_blocking_runner_has_run_many_progress_and_scorer_stats_as_prm_runner_does():
    # Issue 41.23: documented as "PRMRunner behind synchronous methods" without run_many(progress=) and
    # scorer_stats().
    seen = []
    with BlockingRunner(scorers=[st.ConstantScorer(0.5)]) as runner:
        runner.run_many([chain(1), chain(2)], progress=lambda done, total: seen.append((done, total)))
        stats = runner.scorer_stats()
    assert sorted(seen) == [(1, 2), (2, 2)]
    assert stats["constant"]["calls"] == 3 and stats["constant"]["failures"] == 0


def test_a_blocking_runner_whose_loop_thread_ended_says_why_on_the_next_call():
    # Issue 41.23: BlockingRunner._done was never read: an exception that ended its loop thread was lost.
    runner = BlockingRunner(scorers=[st.ConstantScorer()])
    try:
        runner._portal.call(runner._portal.stop, True)  # the loop ends under the runner
        runner._thread.join(5)
        with pytest.raises(RunnerClosedError, match="event loop thread has ended"):
            runner.run(chain(1))
    finally:
        runner.close()
    assert runner.state is RunnerState.CLOSED


def test_entering_a_closed_blocking_runner_or_export_service_is_refused():
    # Issue 41.23: both accepted entering after close; PRMRunner refuses it.
    import anyio

    from prm_jax.config import ExperimentConfig
    from prm_jax.runtime._export import ExportService

    runner = BlockingRunner(scorers=[st.ConstantScorer()])
    runner.close()
    with pytest.raises(RunnerClosedError, match="BlockingRunner is closed"):
        with runner:
            pass

    async def enter_closed_service():
        service = await ExportService.start(ExperimentConfig())
        async with service:
            pass
        with pytest.raises(RunnerClosedError, match="ExportService is closed"):
            async with service:
                pass
    anyio.run(enter_closed_service)
