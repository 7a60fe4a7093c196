"""Issue 43.4: one lifecycle shape. ``PRMRunner``, ``BlockingRunner``, ``ExportService`` and the process executor
share one base (``prm_jax.runtime._lifecycle.Lifecycle``): a ``RunnerState``, one exit stack, entering refused
unless open, an idempotent close, and the cleanups' failures raised together after every one was tried
(``ExportService`` refused nothing after close, and the process executor kept booleans)."""

import anyio
import pytest
import scorers_for_tests as st

from prm_jax import BlockingRunner, ExperimentConfig, PRMRunner
from prm_jax.errors import RunnerClosedError
from prm_jax.runtime._export import ExportService
from prm_jax.runtime._lifecycle import Lifecycle, RunnerState
from prm_jax.runtime._process_pool import ProcessExecutor

pytestmark = pytest.mark.anyio


def owners():
    """Each async owner, freshly built."""
    config = ExperimentConfig.from_mapping({"rollout": {"_version": "v2"}})
    return {
        "PRMRunner": lambda: PRMRunner(scorers=[st.ConstantScorer()]),
        "ExportService": lambda: ExportService(config, None, clients=[]),
        "ProcessExecutor": lambda: ProcessExecutor(st.WorkerPid(), "evaluate", None),
    }


@pytest.mark.parametrize("name", sorted(owners()))
async def test_every_owner_has_the_one_lifecycle(name):
    owner = owners()[name]()
    assert isinstance(owner, Lifecycle) and owner.state is RunnerState.OPEN and not owner.closed
    async with owner as entered:
        assert entered is owner
    assert owner.state is RunnerState.CLOSED and owner.closed
    await owner.aclose()  # idempotent
    with pytest.raises(RunnerClosedError, match=f"{name} is closed: it cannot be entered again"):
        async with owner:
            pass


def test_the_blocking_runner_has_the_one_lifecycle_and_refuses_async_with():
    runner = BlockingRunner(scorers=[st.ConstantScorer()])
    assert isinstance(runner, Lifecycle)
    runner.close()
    runner.close()
    assert runner.state is RunnerState.CLOSED
    with pytest.raises(RunnerClosedError, match="BlockingRunner is closed: it cannot be entered again"):
        with runner:
            pass

    async def entered():
        async with BlockingRunner(scorers=[st.ConstantScorer()]):
            pass

    with pytest.raises(TypeError, match="BlockingRunner is synchronous"):
        anyio.run(entered)


async def test_an_export_service_refuses_export_after_close():
    service = ExportService(ExperimentConfig.from_mapping({"rollout": {"_version": "v2"}}), None, clients=[])
    await service.aclose()
    with pytest.raises(RunnerClosedError, match="ExportService is closed: export"):
        await service.export(["s0"])


async def test_every_cleanup_is_tried_and_their_failures_come_together():
    st.EVENTS.clear()
    config = ExperimentConfig.from_mapping({"rollout": {"_version": "v2"}})
    service = ExportService(config, None, clients=[st.Client("a", fail=True), st.Client("b"), st.Client("c", fail=True)])
    with pytest.raises(ExceptionGroup, match="export service shutdown failed") as info:
        await service.aclose()
    assert st.EVENTS == ["client:c", "client:b", "client:a"]
    assert [str(e) for e in info.value.exceptions] == ["client c failed to close", "client a failed to close"]
    await service.aclose()
    assert len(st.EVENTS) == 3


async def test_a_cancelled_close_is_resumed_by_the_next_with_the_cleanups_never_tried():
    st.EVENTS.clear()
    runner = await PRMRunner.create(scorers=[])
    hang = st.ClosingScorer("hang", hang=True)
    runner._owns("after", st.Client("after").aclose)   # registered first: closed last
    runner._owns("hang", hang.aclose)
    with anyio.move_on_after(0.2):
        await runner.aclose()
    assert runner.state is RunnerState.INTERRUPTED and st.EVENTS == ["close:hang"]
    with pytest.raises(RunnerClosedError, match="interrupted"):
        await runner.run(st.chain(1))
    await runner.aclose()
    assert runner.state is RunnerState.CLOSED and st.EVENTS == ["close:hang", "client:after"]
