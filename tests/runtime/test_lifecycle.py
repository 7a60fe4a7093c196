"""Issue 31.10: ``prm_jax.runtime._lifecycle.rolled_back`` (start-up that can fail half-way) on its own."""

import contextlib

import pytest

pytestmark = pytest.mark.anyio

from prm_jax.runtime._lifecycle import rolled_back  # noqa: E402


async def test_a_failed_start_releases_what_was_acquired_and_raises_the_original_error():
    released, failures = [], []

    async def release(name):
        released.append(name)
        if name == "b":
            failures.append("cleanup of b failed")

    stack = contextlib.AsyncExitStack()
    with pytest.raises(KeyError) as info:
        async with rolled_back(stack, lambda: failures):
            stack.push_async_callback(release, "a")
            stack.push_async_callback(release, "b")
            raise KeyError("the start-up failed")
    assert released == ["b", "a"]  # in reverse, as acquired
    assert info.value.args == ("the start-up failed",) and info.value.__notes__ == ["cleanup of b failed"]


async def test_a_successful_start_keeps_what_it_acquired():
    released = []
    stack = contextlib.AsyncExitStack()
    async with rolled_back(stack, list):
        stack.push_async_callback(lambda: released.append(1) or _done())
    assert released == []
    await stack.aclose()
    assert released == [1]


async def _done():
    return None
