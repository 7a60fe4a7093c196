"""Concurrency on anyio, with asyncio's faster paths where they exist: the fan-out of scored turns and
branches, and whether a cancellation was asked for."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

import anyio


async def concurrently(jobs: list[Coroutine[Any, Any, None]], *, group_one: bool = False) -> None:
    """Runs the coroutines concurrently; the first failure cancels the others and the group raises.

    The fan-out of every scored turn, so its shape matters: one job is awaited in place (unless
    ``group_one``: then its failure too comes in an ``ExceptionGroup``); on asyncio (Python 3.11+) the
    native ``asyncio.TaskGroup`` (same cancel-the-siblings semantics, a fraction of the cost per task);
    elsewhere (trio, Python 3.10) an anyio task group.
    """
    if len(jobs) == 1 and not group_one:
        await jobs[0]
        return
    if sys.version_info >= (3, 11) and _on_asyncio():
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
