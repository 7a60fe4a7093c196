"""One scorer per executor kind with the same behaviour per row (``ctx["row"]``), for the executor
conformance tests (``tests/runtime/test_executor_conformance.py``); importable, so worker processes load it."""

from __future__ import annotations

import math
import os
import time

import anyio
import numpy as np

from prm_jax import BaseScorer
from prm_jax.runtime._scoring import BatchScorer, SyncScorer

# ``ray`` joins where the Ray suite runs (python3 dev.py ray: the ray extra installed, inside a private network
# namespace); the main suite has no Ray.
KINDS = ("async", "thread", "process", "batch") + (("ray",) if os.environ.get("PRM_JAX_RAY_SUITE") else ())
SLEEP_S = 30.0


def _explode() -> None:
    raise ValueError("this value cannot be rebuilt here")


class Unloadable:
    """Pickles anywhere; unpickling it raises (a result that crosses out of a worker but not into the parent)."""

    def __reduce__(self):
        return (_explode, ())


def outcome(mode: str, output_len: int):
    """What a call returns for ``mode`` (``ok``: 1.0)."""
    if mode == "ok":
        return 1.0
    if mode == "nan":
        return math.nan
    if mode == "wrong_shape":
        return np.ones(output_len + 3)
    if mode == "none":
        return None
    if mode == "wrong_type":
        return "high"
    if mode == "local":  # does not pickle: cannot cross back from a worker process
        return lambda: 1.0
    if mode == "unloadable":
        return Unloadable()
    if mode == "raises":
        raise KeyError("no answer for this turn")
    if mode == "crash":
        os._exit(3)
    if mode == "exits":  # sys.exit() in a scorer: its thread (or worker process) must not end with it
        raise SystemExit(3)
    raise AssertionError(mode)


def network_wait(mode: str) -> None:
    """``silent:<port>``: connect to 127.0.0.1:<port> (a listener that never answers) and wait for its answer,
    with no timeout of the scorer's own: only the executor's deadline ends the wait. ``refused:<port>``: an
    address where nothing listens (the connection is refused at once)."""
    import socket

    _, port = mode.split(":")
    with socket.create_connection(("127.0.0.1", int(port))) as connection:
        connection.recv(1)


async def network_wait_async(mode: str) -> None:
    _, port = mode.split(":")
    async with await anyio.connect_tcp("127.0.0.1", int(port)) as connection:
        await connection.receive(1)


def _mode(modes, interaction, ctx) -> str:
    return modes.get(ctx.get("row"), modes.get(interaction.interaction_id, "ok"))


class _Modes:
    def _setup(self, modes, started):
        self.modes = dict(modes or {})
        self.started = started


class AsyncCase(BaseScorer, _Modes):
    name = "case"

    def __init__(self, modes=None, started=None, **kwargs):
        super().__init__(**kwargs)
        self._setup(modes, started)

    async def evaluate(self, interaction, ctx):
        mode = _mode(self.modes, interaction, ctx)
        if mode == "slow":
            if self.started is not None:
                open(self.started, "w").close()
            await anyio.sleep(SLEEP_S)
        if mode.startswith(("silent:", "refused:")):
            await network_wait_async(mode)
        return outcome("ok" if mode == "slow" else mode, interaction.output_len)


class SyncCase(SyncScorer, _Modes):
    name = "case"

    def __init__(self, modes=None, started=None, **kwargs):
        super().__init__(**kwargs)
        self._setup(modes, started)

    def evaluate(self, interaction, ctx):
        mode = _mode(self.modes, interaction, ctx)
        if mode == "slow":
            if self.started is not None:
                open(self.started, "w").close()
            time.sleep(SLEEP_S)
        if mode.startswith(("silent:", "refused:")):
            network_wait(mode)
        return outcome("ok" if mode == "slow" else mode, interaction.output_len)


class BatchCase(BatchScorer, _Modes):
    name = "case"

    def __init__(self, modes=None, started=None, **kwargs):
        super().__init__(**kwargs)
        self._setup(modes, started)

    async def evaluate_batch(self, items):
        modes = [_mode(self.modes, interaction, ctx) for interaction, ctx in items]
        if "slow" in modes:
            if self.started is not None:
                open(self.started, "w").close()
            await anyio.sleep(SLEEP_S)
        for mode in modes:
            if mode.startswith(("silent:", "refused:")):
                await network_wait_async(mode)
        if "raises" in modes:  # the batch's one call fails: every item in it fails with its error
            raise KeyError("no answer for this turn")
        if "exits" in modes:
            raise SystemExit(3)
        return [outcome("ok" if mode == "slow" else mode, interaction.output_len)
                for mode, (interaction, _) in zip(modes, items)]


def make(kind: str, modes=None, started=None, **kwargs) -> BaseScorer:
    """The case scorer on executor ``kind`` (``max_workers`` applies to thread, process and ray)."""
    workers = kwargs.pop("max_workers", 2)
    if kind == "async":
        return AsyncCase(modes, started, **kwargs)
    if kind in ("thread", "process", "ray"):
        return SyncCase(modes, started, executor=kind, max_workers=workers, **kwargs)
    return BatchCase(modes, started, max_wait=kwargs.pop("max_wait", 0.005), **kwargs)
