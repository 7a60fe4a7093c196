"""Issue 31.10: ``prm_jax.runtime.blocking.BlockingRunner`` (a runner behind synchronous calls) on its own."""

import threading

import pytest
import scorers_for_tests as st
from scorers_for_tests import chain, committed

from prm_jax import BlockingRunner
from prm_jax.runtime.runner import RunnerClosedError, RunnerState


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
