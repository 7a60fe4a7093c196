"""The event loop's watchdog: a task that notices the loop was blocked outside every scorer's step."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from prm_jax.runtime._concurrency import COLLECTOR
from prm_jax.runtime._executors import BLOCKING_STEP_S, LAST_LONG_STEP, RUNNING_THREADS, STARTING

LAG_CHECK_S = 0.01


async def watch_loop(warn: Callable[[str], None], stop: anyio.Event) -> None:
    """A watchdog task: wakes every ``LAG_CHECK_S``; a wake-up late by more than ``BLOCKING_STEP_S`` means the
    loop was blocked. A scorer step that held it has been named by its executor already (once per scorer,
    with its own time); otherwise ``warn`` is told that code outside every scorer's evaluate held it."""
    clock = time.perf_counter
    while not stop.is_set():
        before, collected = clock(), COLLECTOR.total
        with anyio.move_on_after(LAG_CHECK_S):
            await stop.wait()
        now = clock()
        lag = now - before - LAG_CHECK_S - (COLLECTOR.total - collected)  # a collector's pause is no one's
        if lag > BLOCKING_STEP_S and not +STARTING:  # (an executor's start is not scoring: STARTING)
            ended = LAST_LONG_STEP[2]
            if before <= ended <= now:
                continue  # the scorer named in LAST_LONG_STEP held it: its executor warned (or failed the call)
            threads = sorted(name for name, count in RUNNING_THREADS.items() if count > 0)
            who = (f"thread scorer(s) {threads} were running: their Python code holds the GIL (the process "
                   "executor does not)" if threads else
                   "no scorer was running: the caller's own code on this loop, result validation, or another "
                   "thread holding the GIL (JAX tracing)")
            warn(f"the event loop was blocked for {lag:.3f} s while scoring, outside every scorer's evaluate; "
                 f"{who}; scorers' deadlines kept running")
