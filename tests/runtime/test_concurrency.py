"""Issue 31.10: ``prm_jax.runtime._concurrency`` (the fan-out of scored turns and branches) on its own."""

import anyio
import pytest

from prm_jax.runtime._concurrency import LoopLocal, cancellation_requested, concurrently

pytestmark = pytest.mark.anyio


async def test_one_job_is_awaited_in_place_and_its_failure_is_its_own_unless_grouped():
    async def fails():
        raise KeyError("k")

    with pytest.raises(KeyError):
        await concurrently([fails()])
    with pytest.raises(ExceptionGroup) as info:
        await concurrently([fails()], group_one=True)
    assert [type(e) for e in info.value.exceptions] == [KeyError]


async def test_the_first_failure_cancels_the_others():
    finished = []

    async def slow(i):
        await anyio.sleep(1.0)
        finished.append(i)

    async def fails():
        await anyio.sleep(0.01)
        raise ValueError("first")

    with anyio.fail_after(0.5):  # the slow jobs were cancelled, not waited for
        with pytest.raises(ExceptionGroup):
            await concurrently([slow(0), fails(), slow(1)])
    assert finished == []


async def test_cancellation_requested_tells_an_asked_cancellation_from_a_raised_one():
    seen = []

    async def watch():
        try:
            await anyio.sleep(1)
        except anyio.get_cancelled_exc_class():
            seen.append(cancellation_requested())
            raise

    assert cancellation_requested() is False
    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        await anyio.sleep(0.01)
        group.cancel_scope.cancel()
    assert seen == [True]


def test_a_loop_local_primitive_is_rebuilt_for_each_event_loop():
    local = LoopLocal(lambda: anyio.Semaphore(1))
    made = []

    async def use():
        first, second = local.get(), local.get()
        assert first is second
        made.append(first)

    anyio.run(use)
    anyio.run(use)
    assert made[0] is not made[1]
