"""Concurrency on anyio, with asyncio's faster paths where they exist: the fan-out of scored turns and
branches, and whether a cancellation was asked for."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.lowlevel


async def concurrently(jobs: list[Coroutine[Any, Any, None]], *, group_one: bool = False) -> None:
    """Runs the coroutines concurrently; the first failure cancels the others and the group raises.

    The fan-out of every scored turn, so its shape matters: one job is awaited in place (unless
    ``group_one``: then its failure too comes in an ``ExceptionGroup``); on asyncio the native
    ``asyncio.TaskGroup`` (same cancel-the-siblings semantics, a fraction of the cost per task); on trio an
    anyio task group.
    """
    if len(jobs) == 1 and not group_one:
        await jobs[0]
        return
    if _on_asyncio():
        async with asyncio.TaskGroup() as native_group:
            for job in jobs:
                native_group.create_task(job)
        return
    async with anyio.create_task_group() as group:
        for job in jobs:
            group.start_soon(_await, job)


async def _await(job: Coroutine[Any, Any, None]) -> None:
    await job


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # trio, or no event loop
        return False
    return True


def cancellation_requested() -> bool:
    """Whether the current asyncio task was asked to cancel (True where that cannot be told, e.g. trio)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return True
    cancelling = getattr(task, "cancelling", None)
    return task is None or cancelling is None or cancelling() > 0


class _CollectorClock:
    """Seconds this process spent in the cyclic garbage collector, so far: a pause of the collector that
    lands inside a scorer's step is not the scorer's own time (8,000 live coroutines make a full
    collection take ~0.1 s)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._start = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._start


COLLECTOR = _CollectorClock()


class LoopLocal:
    """A synchronization primitive per event loop (a runner may serve several loops in turn, e.g. one
    ``anyio.run`` after another): rebuilt when the current loop changes."""

    def __init__(self, factory: Callable[[], Any]):
        self._factory = factory
        self._token: Any = None
        self._value: Any = None

    def get(self) -> Any:
        token = anyio.lowlevel.current_token().native_token  # (the token object is new on every call)
        if token is not self._token:
            self._token, self._value = token, self._factory()
        return self._value
