"""What runs inside a scorer's worker (a ``process`` executor's process, a ``ray`` executor's actor): load
the pickled scorer once, then run calls one at a time, each result (or error) handed back as soon as it is
done. Standard library only, so a worker imports jax (or numpy) only when the scorer it loads does."""

from __future__ import annotations

import os
import pickle
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

WORKER_TRACEBACK_NOTE = "in the scorer's worker process:"  # (a worker's traceback, in a note on its error)
_UNLOADABLE = None  # a worker's first message when it cannot unpickle the scorer: (None, why)
_GAVE_UP = "gave up"  # (``WorkerPool._loaded``: the calls already failed with why)
_LOADED = "loaded"  # its first message once it holds the scorer: (_LOADED, None); deadlines start after it

PARENT_POLL_S = 0.5  # where the OS has no process descriptors, how often a worker looks for its parent


def load_scorer(blob: bytes, loads: Callable[[bytes], Any] = pickle.loads) -> tuple[Any, str | None]:
    """The scorer unpickled from ``blob``, or ``(None, why)`` where it cannot be (its class defined in a
    script without a file, a module this worker cannot import)."""
    try:
        return loads(blob), None
    except BaseException as err:
        return None, (f"its worker could not load the scorer: {err!r} (the scorer's class must be importable "
                      "where the worker runs: define it in a module, not in a script read from stdin, python -c "
                      "or a notebook, and install that module there)")


def run_calls(scorer: Any, method: str, calls: Sequence[tuple[Any, ...]],
              dumps: Callable[[Any], bytes] = pickle.dumps) -> Iterator[bytes]:
    """Runs ``calls`` in order and yields, as each is done, its answer pickled by ``dumps``: ``(True,
    result)``, or ``(False, error)`` with an error that crosses back (``_portable``); a result that does not
    pickle is a ``TypeError`` saying so."""
    fn = getattr(scorer, method)
    for args in calls:
        try:
            result = fn(*args)
        except BaseException as err:  # (a scorer's sys.exit() too: the parent fails its turn, ``exited``)
            yield dumps((False, _portable(err)))
            continue
        try:
            yield dumps((True, result))
        except BaseException as err:
            yield dumps((False, _portable(TypeError(
                f"the scorer's return value could not be pickled to cross back from its worker: {err!r}"))))


def _exit_with(parent_pid: int) -> None:
    """A daemon thread of a worker process: the worker exits at once when the process that owns it (the
    training process, ``parent_pid``; the worker's own parent is the forkserver) dies, even mid-call and
    even from SIGKILL, which runs no cleanup there. Linux: a pidfd that becomes readable at the process's
    exit; elsewhere a poll of the pid."""
    threading.Thread(target=wait_for_exit, args=(parent_pid, lambda: os._exit(0)), name="prm-jax parent watch",
                     daemon=True).start()


def wait_for_exit(pid: int, then: Callable[[], object], each: Callable[[], object] | None = None,
                  every: float = PARENT_POLL_S) -> None:
    """Blocks until process ``pid`` has exited, then calls ``then``; meanwhile calls ``each`` (when given) at
    once and every ``every`` seconds. A pidfd on Linux (>= 5.3), a poll of the pid every ``every`` seconds
    elsewhere."""
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        then()  # already gone
        return
    except (AttributeError, OSError):
        pidfd = None
    while True:
        if each is not None:
            each()
        if pidfd is not None:
            if select.select([pidfd], [], [], None if each is None else every)[0]:
                break
            continue
        time.sleep(every)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:  # alive (another user's pid would say so too: reuse is rare)
            pass
    then()


def _worker_main(conn: Any, blob: bytes, parent_pid: int | None = None) -> None:
    """A worker process: unpickles the scorer once, then runs the calls of each message in order, sending
    each result (or error) back as soon as it is done. A scorer it cannot unpickle is said once, and the
    worker exits. It exits with the process that owns it (``_exit_with``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    if parent_pid is not None:
        _exit_with(parent_pid)
    scorer, why = load_scorer(blob)
    if why is not None:
        conn.send((_UNLOADABLE, why))
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
        for payload in run_calls(scorer, method, calls):
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


class ScorerActor:
    """A ``ray`` executor's actor (``ray.remote`` makes it one where the executor starts): it holds one
    scorer, loaded once (``load``), and runs the calls of each chunk in order, yielding each answer as it is
    done (a streaming generator: the driver gets results one call at a time and times each call)."""

    def __init__(self) -> None:
        self.scorer: Any = None

    def where(self) -> tuple[int, str]:
        """The actor's process id and node id (answered once the actor is placed and running)."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def load(self, blob: bytes) -> str | None:
        """Unpickles the scorer: None, or why it cannot be loaded here."""
        self.scorer, why = load_scorer(blob)
        return why

    def run(self, method: str, calls: Sequence[tuple[Any, ...]]) -> Iterator[bytes]:
        from ray import cloudpickle

        yield from run_calls(self.scorer, method, calls, dumps=cloudpickle.dumps)
