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
import select
import signal
import sys
import threading
import time
import traceback
from typing import Any

import anyio

from prm_jax.runtime._executors import (
    PROCESS_CHUNK,
    WORKER_TRACEBACK_NOTE,
    Executor,
    describe,
)
from prm_jax.runtime._lifecycle import Lifecycle
from prm_jax.runtime._scoring import BaseScorer


class _Call:
    __slots__ = ("args", "future", "on")

    def __init__(self, args: tuple[Any, ...], on: Any):
        self.args, self.on = args, on
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()


_CLOSED = "its worker processes were closed"  # (a process executor's calls after its close)


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


_UNLOADABLE = None  # a worker's first message when it cannot unpickle the scorer: (None, why)
_GAVE_UP = "gave up"  # (``ProcessExecutor._loaded``: the calls already failed with why)
_LOADED = "loaded"  # its first message once it holds the scorer: (_LOADED, None); deadlines start after it


PARENT_POLL_S = 0.5  # where the OS has no process descriptors, how often a worker looks for its parent


def _exit_with(parent_pid: int) -> None:
    """A daemon thread of a worker process: the worker exits at once when the process that owns it (the
    training process, ``parent_pid``; the worker's own parent is the forkserver) dies, even mid-call and
    even from SIGKILL, which runs no cleanup there. Linux: a pidfd that becomes readable at the process's
    exit; elsewhere a poll of the pid."""
    def watch() -> None:
        pidfd = None
        try:
            pidfd = os.pidfd_open(parent_pid)  # (Linux >= 5.3)
        except ProcessLookupError:
            os._exit(0)  # already gone
        except (AttributeError, OSError):
            pidfd = None
        if pidfd is not None:
            select.select([pidfd], [], [])
            os._exit(0)
        while True:
            time.sleep(PARENT_POLL_S)
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:  # alive (another user's pid would say so too: reuse is rare)
                pass

    threading.Thread(target=watch, name="prm-jax parent watch", daemon=True).start()


def _worker_main(conn: Any, blob: bytes, parent_pid: int | None = None) -> None:
    """A worker process: unpickles the scorer once, then runs the calls of each message in order, sending
    each result (or error) back as soon as it is done. A scorer it cannot unpickle (its class defined in a
    script without a file: stdin, ``python -c``, a notebook) is said once, and the worker exits. It exits
    with the process that owns it (``_exit_with``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    if parent_pid is not None:
        _exit_with(parent_pid)
    try:
        scorer = pickle.loads(blob)
    except BaseException as err:
        conn.send((_UNLOADABLE, f"its worker process could not load the scorer: {err!r} (define the scorer's class "
                                "in an importable module, not in a script read from stdin, python -c or a "
                                "notebook)"))
        return
    conn.send((_LOADED, None))  # loading (imports, a scorer's own set-up) is not a call's time
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        method, calls = job
        fn = getattr(scorer, method)
        for args in calls:
            try:
                result = fn(*args)
            except BaseException as err:  # (a scorer's sys.exit() too: the parent fails its turn, ``exited``)
                conn.send((False, _portable(err)))
                continue
            try:
                payload = pickle.dumps((True, result))
            except BaseException as err:
                conn.send((False, _portable(TypeError(
                    f"the scorer's return value could not be pickled to cross back from its worker process: "
                    f"{err!r}"))))
                continue
            conn.send_bytes(payload)


def _portable(err: BaseException) -> BaseException:
    """The error as it can cross to the parent: itself if it pickles, else a RuntimeError with its repr; the
    worker's traceback in a note either way."""
    note = WORKER_TRACEBACK_NOTE + "\n" + "".join(traceback.format_exception(err)).rstrip()
    try:
        pickle.loads(pickle.dumps(err))
        out = err
    except Exception:
        out = RuntimeError(repr(err))
    out.add_note(note)
    return out


def _process_context() -> Any:
    """Workers start from a fresh interpreter (never ``fork``: the parent runs JAX's threads): Linux's
    forkserver, which imports prm-jax once and forks each worker from it, else spawn."""
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


class ProcessExecutor(Lifecycle, Executor):
    """A plain function in ``max_workers`` worker processes; see the module docstring. One dispatcher thread
    per worker feeds it calls ``PROCESS_CHUNK`` at a time (fewer when few are waiting) and enforces each
    call's deadline from the moment the worker starts it. Its lifecycle is ``Lifecycle``'s: a close refuses
    new calls, cancels the queued ones, then ends the workers (its one cleanup)."""

    def __init__(self, scorer: BaseScorer, method: str, timeout: float | None):
        Executor.__init__(self, scorer, method, timeout)
        self._open()
        self._owns(f"the worker processes of scorer {scorer.name!r}", self._end_workers)
        self.workers = int(getattr(scorer, "max_workers", 1))
        self._queue: collections.deque[_Call] = collections.deque()
        self._ready = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._live: set[_Worker] = set()
        self._blob: bytes | None = None
        self._unusable: str | None = None  # why no worker can run the scorer: every call fails with it
        self.restarts = 0

    def _start(self) -> None:
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
            context.set_forkserver_preload(["prm_jax.runtime._process_pool", type(self.scorer).__module__])
        self._context = context
        for i in range(self.workers):
            thread = threading.Thread(target=self._serve, name=f"prm-jax {self.scorer.name} dispatcher {i}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    async def _run(self, args: tuple[Any, ...], on: Any) -> Any:
        if self.closed:
            raise RuntimeError(f"scorer {self.scorer.name!r}: {_CLOSED}")
        if self._unusable is not None:
            raise self._unusable_error(on)
        if self._blob is None:
            self._start()
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
        worker: _Worker | None = None
        try:
            while (chunk := self._take()) is not None:
                calls = [call for call in chunk if call.future.set_running_or_notify_cancel()]
                while calls:
                    if worker is None and (worker := self._new_worker(calls)) is None:
                        break
                    calls, alive = self._chunk(worker, calls)
                    if not alive:
                        self._live.discard(worker)
                        worker.end()
                        worker, self.restarts = None, self.restarts + 1
        finally:
            if worker is not None:
                self._live.discard(worker)
                try:
                    worker.conn.send(None)
                    worker.process.join(1)
                except OSError:
                    pass
                worker.end()

    def _new_worker(self, calls: list[_Call]) -> _Worker | None:
        """A started worker, now live; or None, each of ``calls`` failed, where it could not start or the
        executor closed before or while it started. (A start takes seconds where the forkserver first imports
        the scorer's module: a close meanwhile ended the workers it saw, so one that started after it runs
        nothing and is ended here; and a worker a close ended mid-chunk is not replaced.)"""
        if self._unusable is not None and not self.closed:  # no worker can run the scorer: start none
            for call in calls:
                call.future.set_exception(self._unusable_error(call.on))
            return None
        why = _CLOSED if self.closed else None
        worker = None
        if why is None:
            try:
                worker = _Worker(self._context, self._blob or b"")
            except Exception as err:
                why = f"could not start a worker process: {err!r}"
        if worker is not None:
            with self._ready:
                if self.closed:
                    why = _CLOSED
                else:
                    self._live.add(worker)
        if why is None and worker is not None:
            why = self._loaded(worker, calls)
            if why is _GAVE_UP:
                worker.end()
                return None
        if why is None:
            return worker
        if worker is not None:
            worker.end()
        for call in calls:
            call.future.set_exception(RuntimeError(f"scorer {self.scorer.name!r}: {why}"))
        return None

    def _loaded(self, worker: _Worker, calls: list[_Call]) -> str | None:
        """Waits for a new worker to load the scorer (its imports and set-up are not a call's time: the
        first call's deadline starts after them): None once it has; ``_GAVE_UP`` where it cannot load the
        scorer (``calls`` and the queue failed with why); else why it is gone (a close, its death)."""
        try:
            ok, why = pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):
            if self.closed:
                return _CLOSED
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
            try:
                ok, value = pickle.loads(message)
            except Exception as err:  # the whole message arrived: the worker lives on
                call.future.set_exception(TypeError(
                    f"scorer {self.scorer.name!r} on {describe(call.on)}: the scorer's return value could not be "
                    f"unpickled in the parent process: {err!r}"))
                continue
            if ok:
                call.future.set_result(value)
            else:
                call.future.set_exception(value)
        return [], True

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
                worker.end()
            for thread in threads:
                thread.join(5.0)

        await anyio.to_thread.run_sync(join)


async def _result(future: concurrent.futures.Future[Any]) -> Any:
    """Awaits a thread's future: natively on asyncio (cancelling the wait cancels a call not yet started),
    through a waiting thread elsewhere."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
    return await asyncio.wrap_future(future)
