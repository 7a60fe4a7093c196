"""The ``process`` executor: a plain function in ``max_workers`` worker processes, each holding a pickled
copy of the scorer (its own module, apart from the other executors: a pool, its workers and their
dispatcher threads). A worker says when it holds the scorer, and only then gets calls; calls go to it
``PROCESS_CHUNK`` at a time and come back one by one; a worker past a call's deadline is ended and
replaced, the rest of its calls resent; a worker exits with the process that owns it."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import multiprocessing
import os
import pickle
import sys
import threading
import time
from typing import Any

import anyio

from prm_jax.runtime._executors import PROCESS_CHUNK, Executor, describe
from prm_jax.runtime._lifecycle import Lifecycle
from prm_jax.runtime._scoring import BaseScorer
from prm_jax.runtime._worker import _GAVE_UP, _UNLOADABLE, _worker_main

_WORKER_MODULE = "prm_jax.runtime._worker"  # what the forkserver preloads (no jax: a scorer imports it if it needs it)


class _Call:
    __slots__ = ("args", "future", "on")

    def __init__(self, args: tuple[Any, ...], on: Any):
        self.args, self.on = args, on
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()




class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, context: Any, blob: bytes):
        self.conn, child = context.Pipe(duplex=True)
        self.process = context.Process(target=_worker_main, args=(child, blob, os.getpid()), daemon=True,
                                       name="prm-jax scorer worker")
        self.process.start()
        child.close()  # so that the worker's death is an EOF here
        self._ending = threading.Lock()

    def end(self) -> None:
        """Kills the process and closes the pipe, once: closing a runner ends a worker stuck in a call while
        its dispatcher, woken by the EOF, ends it too (two threads closing one pipe raised EBADF)."""
        with self._ending:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(5)
            if not self.conn.closed:
                self.conn.close()


def _process_context() -> Any:
    """Workers start from a fresh interpreter (never ``fork``: the parent runs JAX's threads): Linux's
    forkserver, which imports prm-jax once and forks each worker from it, else spawn."""
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


class WorkerPool(Lifecycle, Executor):
    """The rules every pool of workers keeps (the ``process`` executor's processes, the ``ray`` executor's
    actors): one dispatcher thread per worker feeds it calls ``PROCESS_CHUNK`` at a time (fewer when few are
    waiting), one chunk in flight, and enforces each call's deadline from the moment the worker starts it;
    results come back one call at a time; a worker past a deadline, or dead, is ended and replaced and the
    rest of its chunk resent; a scorer no worker can load fails every call with why, once, and no worker
    starts again. Its lifecycle is ``Lifecycle``'s: a close refuses new calls, cancels the queued ones, then
    ends the workers (its one cleanup).

    A subclass says what a worker is: ``_prepare`` (once, before the first worker: a pickled scorer, a
    cluster), ``_spawn`` (a started worker), ``_loaded`` (waits for it to hold the scorer), ``_chunk`` (runs
    calls on it), ``_kill`` and ``_stop``; ``WORKERS`` names them in messages."""

    WORKERS = "workers"  # what the workers are, in messages ("its worker processes were closed")

    def __init__(self, scorer: BaseScorer, method: str, timeout: float | None):
        Executor.__init__(self, scorer, method, timeout)
        self._open()
        self._owns(f"the {self.WORKERS} of scorer {scorer.name!r}", self._end_workers)
        self.workers = int(getattr(scorer, "max_workers", None) or 1)
        self._queue: collections.deque[_Call] = collections.deque()
        self._ready = threading.Condition()
        self._starting = threading.Lock()
        self._started = False
        self._threads: list[threading.Thread] = []
        self._live: set[Any] = set()
        self._unusable: str | None = None  # why no worker can run the scorer: every call fails with it
        self.restarts = 0

    @property
    def _closed_why(self) -> str:
        return f"its {self.WORKERS} were closed"

    # What a worker is (the subclass's) ------------------------------------------------------------------------
    def _prepare(self) -> None:
        """Once, before the first worker starts (raises to fail the call that started it)."""

    def _spawn(self) -> Any:
        """A started worker (raises where none can start)."""
        raise NotImplementedError

    def _loaded(self, worker: Any, calls: list[_Call]) -> str | None:
        """Waits for a new worker to hold the scorer: None once it does; ``_GAVE_UP`` where it cannot load it
        (``_give_up`` failed ``calls`` and the queue with why); else why it is gone."""
        raise NotImplementedError

    def _chunk(self, worker: Any, calls: list[_Call]) -> tuple[list[_Call], bool]:
        """Runs ``calls`` on ``worker``; returns the calls not run (their worker is to be ended) and whether
        the worker lives on."""
        raise NotImplementedError

    def _kill(self, worker: Any) -> None:
        """Ends a worker at once (idempotent)."""
        raise NotImplementedError

    def _stop(self, worker: Any) -> None:
        """Ends an idle worker, politely first."""
        self._kill(worker)

    def _shrink(self, calls: list[_Call]) -> bool:
        """A replacement worker cannot start but others run: True where ``calls`` went back to the queue for
        them and this dispatcher ends (the pool shrinks); False gives up (the default: a worker that cannot
        start says the scorer cannot run)."""
        return False

    # The rules (shared) ---------------------------------------------------------------------------------------
    def _start(self) -> None:
        with self._starting:
            if self._started:
                return
            if self._unusable is not None:
                raise RuntimeError(self._unusable)
            try:
                self._prepare()
            except _Unusable as err:  # no worker can ever run the scorer: this call and every later one fail
                self._unusable = f"scorer {self.scorer.name!r}: {err}"
                raise RuntimeError(self._unusable) from None
            for i in range(self.workers):
                thread = threading.Thread(target=self._serve, name=f"prm-jax {self.scorer.name} dispatcher {i}",
                                          daemon=True)
                thread.start()
                self._threads.append(thread)
            self._started = True

    async def _start_workers(self) -> None:
        """``_start`` from the event loop (a subclass whose preparation takes seconds runs it in a thread)."""
        self._start()

    async def _run(self, args: tuple[Any, ...], on: Any) -> Any:
        if self.closed:
            raise RuntimeError(f"scorer {self.scorer.name!r}: {self._closed_why}")
        if self._unusable is not None:
            raise self._unusable_error(on)
        if not self._started:
            await self._start_workers()
        call = _Call(args, on)
        with self._ready:
            self._queue.append(call)
            self._ready.notify()
        return await _result(call.future)

    def _take(self) -> list[_Call] | None:
        with self._ready:
            while not self._queue and not self.closed:
                self._ready.wait()
            if self.closed:
                return None
            count = max(1, min(PROCESS_CHUNK, len(self._queue) // self.workers))
            return [self._queue.popleft() for _ in range(min(count, len(self._queue)))]

    def _serve(self) -> None:
        worker: Any = None
        try:
            while (chunk := self._take()) is not None:
                # (a call a shrinking pool put back is running already)
                calls = [call for call in chunk if call.future.running() or call.future.set_running_or_notify_cancel()]
                while calls:
                    if worker is None and (worker := self._new_worker(calls)) is None:
                        break
                    calls, alive = self._chunk(worker, calls)
                    if not alive:
                        self._live.discard(worker)
                        self._kill(worker)
                        worker, self.restarts = None, self.restarts + 1
        except _Retire:  # the pool shrank by this worker (``_shrink``)
            pass
        finally:
            if worker is not None:
                self._live.discard(worker)
                self._stop(worker)

    def _new_worker(self, calls: list[_Call]) -> Any:
        """A started worker, now live; or None, each of ``calls`` failed, where it could not start or the
        executor closed before or while it started. (A start takes seconds where the forkserver first imports
        the scorer's module, or Ray places an actor: a close meanwhile ended the workers it saw, so one that
        started after it runs nothing and is ended here; and a worker a close ended mid-chunk is not
        replaced.)"""
        if self._unusable is not None and not self.closed:  # no worker can run the scorer: start none
            for call in calls:
                call.future.set_exception(self._unusable_error(call.on))
            return None
        why = self._closed_why if self.closed else None
        worker = None
        if why is None:
            try:
                worker = self._spawn()
            except _Unusable as err:
                if self._shrink(calls):
                    raise _Retire from None
                self._give_up(f"scorer {self.scorer.name!r}: {err}", calls)
                return None
            except Exception as err:
                why = f"could not start a worker: {err!r}"
        if worker is not None:
            with self._ready:
                if self.closed:
                    why = self._closed_why
                else:
                    self._live.add(worker)
        if why is None and worker is not None:
            why = self._loaded(worker, calls)
            if why is _GAVE_UP:
                self._live.discard(worker)
                self._kill(worker)
                return None
        if why is None:
            return worker
        if worker is not None:
            self._live.discard(worker)
            self._kill(worker)
        for call in calls:
            call.future.set_exception(RuntimeError(f"scorer {self.scorer.name!r}: {why}"))
        return None

    def _answer(self, call: _Call, payload: bytes) -> None:
        """Settles ``call`` with a worker's whole answer (``_worker.run_calls``'s bytes): its result, its
        error, or a ``TypeError`` where the result does not unpickle here (the worker lives on)."""
        try:
            ok, value = pickle.loads(payload)
        except Exception as err:
            call.future.set_exception(TypeError(
                f"scorer {self.scorer.name!r} on {describe(call.on)}: the scorer's return value could not be "
                f"unpickled in the parent process: {err!r}"))
            return
        if ok:
            call.future.set_result(value)
        else:
            call.future.set_exception(value)

    def _give_up(self, why: str, calls: list[_Call]) -> None:
        """No worker can run the scorer (``why``): ``calls`` and every queued call fail with it, and no worker
        starts again."""
        self._unusable = why
        with self._ready:
            waiting = list(self._queue)
            self._queue.clear()
        for call in calls:
            call.future.set_exception(self._unusable_error(call.on))
        for call in waiting:
            if call.future.set_running_or_notify_cancel():
                call.future.set_exception(self._unusable_error(call.on))

    def _unusable_error(self, on: Any) -> RuntimeError:
        return RuntimeError(f"{self._unusable} (on {describe(on)})")

    async def _before_close(self) -> None:
        """New calls are refused (the state, read by the dispatchers under the lock) and queued ones
        cancelled."""
        with self._ready:
            waiting = list(self._queue)
            self._queue.clear()
            self._ready.notify_all()
        for call in waiting:
            call.future.cancel()

    async def _end_workers(self) -> None:
        threads, live = self._threads, self._live

        def join() -> None:
            # Idle workers are told to stop by their dispatcher; a worker still in a call (its run was
            # cancelled before the executor closes) is ended, which ends its dispatcher's wait too.
            for thread in threads:
                thread.join(1.0)
            for worker in list(live):
                self._kill(worker)
            for thread in threads:
                thread.join(5.0)

        await anyio.to_thread.run_sync(join)


class _Retire(Exception):
    """A dispatcher ends: its worker could not be replaced, and its calls went to the others (``_shrink``)."""


class _Unusable(Exception):
    """Raised by ``_spawn`` where no worker can ever run the scorer (the message says why): every call fails
    with it, once, and no worker starts again."""


class ProcessExecutor(WorkerPool):
    """A plain function in ``max_workers`` worker processes; see the module docstring and ``WorkerPool``
    (the rules it keeps).

    Args:
        scorer: The scorer whose calls run in the workers (pickled into each).
        method: The scorer's method the workers call (``evaluate`` or ``evaluate_trajectory``).
        timeout: Seconds a call may run in its worker before the worker is ended; ``None``: no deadline.

    Example:
        >>> prm_jax.runtime.ProcessExecutor.WORKERS
        'worker processes'
    """

    WORKERS = "worker processes"

    def __init__(self, scorer: BaseScorer, method: str, timeout: float | None):
        super().__init__(scorer, method, timeout)
        self._blob: bytes | None = None

    def _prepare(self) -> None:
        module = sys.modules.get(type(self.scorer).__module__)
        main_file = getattr(module, "__file__", None)
        if type(self.scorer).__module__ == "__main__" and not (main_file and os.path.isfile(main_file)):
            self._unusable = (f"scorer {self.scorer.name!r} runs with executor 'process', but its class is defined "
                              "in a script without a file (stdin, python -c, a notebook), which its worker "
                              "processes cannot import: define the scorer in an importable module")
            raise RuntimeError(self._unusable)
        try:
            self._blob = pickle.dumps(self.scorer)
        except Exception as err:
            raise TypeError(f"scorer {self.scorer.name!r} runs with executor 'process', so it is pickled into its "
                            f"workers, but it does not pickle: {err!r} (keep clients and locks out of its "
                            "state, or open them lazily in the worker)") from None
        context = _process_context()
        if context.get_start_method() == "forkserver":
            context.set_forkserver_preload([_WORKER_MODULE, type(self.scorer).__module__])
        self._context = context

    def _spawn(self) -> _Worker:
        return _Worker(self._context, self._blob or b"")

    def _kill(self, worker: _Worker) -> None:
        worker.end()

    def _stop(self, worker: _Worker) -> None:
        try:
            worker.conn.send(None)
            worker.process.join(1)
        except OSError:
            pass
        worker.end()

    def _loaded(self, worker: _Worker, calls: list[_Call]) -> str | None:
        try:
            ok, why = pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):
            if self.closed:
                return self._closed_why
            worker.process.join(1)
            return f"its worker process exited while loading the scorer (exit code {worker.process.exitcode})"
        if ok is _UNLOADABLE:
            self._give_up(f"scorer {self.scorer.name!r}: {why}", calls)
            return _GAVE_UP
        return None

    def _chunk(self, worker: _Worker, calls: list[_Call]) -> tuple[list[_Call], bool]:
        """Runs ``calls`` on ``worker``; returns the calls not run (their worker was ended) and whether the
        worker lives on."""
        try:
            worker.conn.send((self.method, [call.args for call in calls]))
        except Exception as err:  # an argument that does not pickle fails this chunk's calls
            alive = not isinstance(err, OSError)
            for call in calls:
                call.future.set_exception(TypeError(
                    f"scorer {self.scorer.name!r} on {describe(call.on)}: its arguments could not be sent to its "
                    f"worker process: {err!r}"))
            return [], alive
        for k, call in enumerate(calls):
            started = time.monotonic()
            if self.timeout is not None and not worker.conn.poll(self.timeout):
                call.future.set_exception(TimeoutError(
                    f"scorer {self.scorer.name!r} on {describe(call.on)} took longer than its timeout of "
                    f"{self.timeout} s in its worker process (the worker was ended and replaced)"))
                return calls[k + 1:], False
            try:
                message = worker.conn.recv_bytes()
            except (EOFError, OSError):
                worker.process.join(1)
                call.future.set_exception(RuntimeError(
                    f"scorer {self.scorer.name!r} on {describe(call.on)}: its worker process died (exit code "
                    f"{worker.process.exitcode}) after {time.monotonic() - started:.3f} s"))
                return calls[k + 1:], False
            self._answer(call, message)
        return [], True


async def _result(future: concurrent.futures.Future[Any]) -> Any:
    """Awaits a thread's future: natively on asyncio (cancelling the wait cancels a call not yet started),
    through a waiting thread elsewhere."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
    return await asyncio.wrap_future(future)
