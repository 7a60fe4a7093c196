"""Which executor runs a scorer: ``EXECUTORS`` by the scorer's kind (``BaseScorer.executor``), never by
``isinstance`` checks in the runner; ``make_executor`` builds one."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from prm_jax.runtime._executors import AsyncExecutor, BatchExecutor, Executor, ThreadExecutor
from prm_jax.runtime._process_pool import ProcessExecutor
from prm_jax.runtime._ray_pool import RayExecutor
from prm_jax.runtime._scoring import BaseScorer

#: The executor of each scorer kind (``BaseScorer.executor``: async, thread, process, ray, batch).
EXECUTORS: Mapping[str, type[Executor]] = MappingProxyType({
    "async": AsyncExecutor, "thread": ThreadExecutor, "process": ProcessExecutor, "ray": RayExecutor,
    "batch": BatchExecutor,
})


def make_executor(scorer: BaseScorer, timeout: float | None) -> Executor:
    """The executor of ``scorer``'s kind, calling the method of its unit."""
    kind = scorer.executor
    if kind not in EXECUTORS:
        raise TypeError(f"scorer {scorer.name!r}: executor {kind!r} is not one of {sorted(EXECUTORS)}")
    method = "evaluate_batch" if kind == "batch" else (
        "evaluate_trajectory" if scorer.unit == "trajectory" else "evaluate")
    return EXECUTORS[kind](scorer, method, timeout)
