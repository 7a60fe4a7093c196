"""How a scorer's calls run: one executor per scorer kind (``BaseScorer.executor``), chosen from
``prm_jax.runtime._dispatch.EXECUTORS``, never by ``isinstance`` checks in the runner. This module holds the
base and the async, thread and batch executors; the process executor and its workers are
``prm_jax.runtime._process_pool``; the event loop's watchdog ``prm_jax.runtime._watchdog``.

- ``async``: the call is awaited on the event loop under the scorer's deadline; the time inside its own
  steps is measured, so a step that blocks the loop is named (and past its deadline fails).
- ``thread``: a plain function in a worker thread; the deadline starts when the thread starts the call; a
  late result is discarded (a thread cannot be stopped).
- ``process``: a plain function in worker processes, each holding a pickled copy of the scorer; calls go to
  a worker several at a time (one message per call costs the event loop ~1 ms a turn) and come back one by
  one; a worker past a call's deadline is ended and replaced, the rest of its calls resent.
- ``batch``: the items of concurrent calls (turns or branches of any branch in flight) are gathered into
  one ``evaluate_batch`` call of at most ``max_batch_size`` items within ``max_wait`` seconds.

Every executor bounds the scorer's calls in flight (``max_concurrency``) and keeps its latency, call and
failure counts (``stats``). The runner owns its executors and closes them with itself.
"""

from __future__ import annotations

import collections
import contextlib
import math
import threading
import time
import warnings
from collections.abc import Awaitable, Generator, Iterator, Sequence
from typing import Any

import anyio
import numpy as np

from prm_jax.runtime._concurrency import COLLECTOR, LoopLocal, cancellation_requested
from prm_jax.runtime._scoring import BaseScorer

# A scorer step (the synchronous code between two awaits) longer than this stalls every other scorer on the
# event loop: the runner warns once per scorer, naming it.
BLOCKING_STEP_S = 0.05
PROCESS_CHUNK = 8  # calls sent to a worker process in one message (1.0-1.1x of the cores' ideal, issue 30)
LATENCY_SAMPLES = 4096  # the most recent call latencies kept per scorer for p50 / p95
# The last scorer step that held the loop past BLOCKING_STEP_S: (scorer name, seconds, when it ended), read
# by the loop-lag watchdog to name who was running.
LAST_LONG_STEP: list[Any] = ["", 0.0, -math.inf]
# The thread scorers with a call in a worker thread now (their Python code takes the GIL from the loop).
RUNNING_THREADS: collections.Counter[str] = collections.Counter()
# The executors starting now in a thread (a ray executor connecting to its cluster: seconds of Python that take
# the GIL from the loop once, before any call): the loop-lag watchdog does not report lag while one starts.
STARTING: collections.Counter[str] = collections.Counter()
_STARTING_LOCK = threading.Lock()


@contextlib.contextmanager
def starting(name: str) -> Iterator[None]:
    """Scorer ``name``'s executor is starting (in ``STARTING`` meanwhile; any thread)."""
    with _STARTING_LOCK:
        STARTING[name] += 1
    try:
        yield
    finally:
        with _STARTING_LOCK:
            STARTING[name] -= 1


def scorer_error(scorer: BaseScorer, where: str, err: BaseException, timeout: float | None) -> BaseException:
    """What an exception out of one scorer call becomes: the deadline's ``TimeoutError`` names the scorer and
    its timeout; a ``CancelledError`` the scorer raised itself (no cancellation was asked for) is a scorer
    failure, not a cancellation of the run; anything else stays as it is."""
    if isinstance(err, TimeoutError) and timeout is not None and not str(err):
        return TimeoutError(f"scorer {scorer.name!r} on {where} took longer than its timeout of {timeout} s")
    if isinstance(err, anyio.get_cancelled_exc_class()) and not cancellation_requested():
        return RuntimeError(f"scorer {scorer.name!r} on {where} raised CancelledError without being cancelled")
    if isinstance(err, SystemExit):
        return exited(scorer.name, where, err)
    return err


def exited(name: str, where: str, err: SystemExit) -> RuntimeError:
    """A scorer that raised ``SystemExit`` (``sys.exit()`` in its code): its row's failure, the same on every
    executor, never the end of the run, its thread, or its worker process."""
    return RuntimeError(f"scorer {name!r} on {where} raised {err!r} (sys.exit() inside a scorer): the turn fails, "
                        "the run goes on")




def describe(on: Any) -> str:
    """``on`` (an interaction, or a string saying what a call covers) for messages."""
    return on if isinstance(on, str) else f"interaction {on.interaction_id!r}"


class OwnTime:
    """An awaitable that runs ``call`` and measures the time spent inside its own steps (``busy``, and the
    ``longest`` one): the time a scorer held the event loop, never the time it waited for others, nor a
    pause of the garbage collector that landed in its step (``COLLECTOR``)."""

    __slots__ = ("_call", "busy", "longest")

    def __init__(self, call: Awaitable[Any]):
        self._call = call
        self.busy = 0.0
        self.longest = 0.0

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self._call.__await__()
        send, throw = steps.send, steps.throw
        value: Any = None
        error: BaseException | None = None
        clock, collector = time.perf_counter, COLLECTOR
        busy = longest = 0.0
        try:
            while True:
                start, collected = clock(), collector.total
                try:
                    yielded = send(value) if error is None else throw(error)
                finally:
                    spent = clock() - start - (collector.total - collected)
                    busy += spent
                    if spent > longest:
                        longest = spent
                try:
                    value, error = (yield yielded), None
                except BaseException as thrown:  # a cancellation (or close) goes into the scorer's own step
                    value, error = None, thrown
        except StopIteration as done:
            return done.value
        finally:
            self.busy, self.longest = busy, longest


class Executor:
    """One scorer's calls: ``await run(args, on)`` runs ``method(*args)`` of the scorer (``on``: the turn,
    or what the call covers, for messages) and returns what it returned."""

    def __init__(self, scorer: BaseScorer, method: str, timeout: float | None):
        self.scorer, self.method, self.timeout = scorer, method, timeout
        limit = scorer.max_concurrency
        self._slots = LoopLocal(lambda: anyio.Semaphore(limit)) if limit is not None else None
        self.calls = self.failures = self.timeouts = 0
        self._latencies: collections.deque[float] = collections.deque(maxlen=LATENCY_SAMPLES)
        self._warned_blocking = False

    async def run(self, args: tuple[Any, ...], on: Any) -> Any:
        if self._slots is None:
            return await self._measured(self._run(args, on), on)
        async with self._slots.get():
            return await self._measured(self._run(args, on), on)

    async def _measured(self, call: Awaitable[Any], on: Any) -> Any:
        start = time.perf_counter()
        failed: BaseException | None = None
        try:
            return await call
        except SystemExit as err:  # from the scorer's thread or worker process: its row's failure
            failed = exited(self.scorer.name, describe(on), err)
            raise failed from None
        except BaseException as err:
            failed = err
            raise
        finally:
            self._record(start, failed)

    def _record(self, start: float, failed: BaseException | None) -> None:
        """One call in the stats: its latency since ``start``, and ``failed`` as a timeout when it is a
        ``TimeoutError``. Failures are counted by the runner, per row (branch) the scorer failed, whatever
        refused it: the call, or the validation of what it returned (``count_failure``)."""
        self.calls += 1
        self._latencies.append(time.perf_counter() - start)
        if isinstance(failed, TimeoutError):
            self.timeouts += 1

    def count_failure(self) -> None:
        """One row (branch) this scorer failed."""
        self.failures += 1

    async def _run(self, args: tuple[Any, ...], on: Any) -> Any:
        raise NotImplementedError

    def stats(self) -> dict[str, float]:
        """Calls, failures (rows the scorer failed), timeouts and latency percentiles (seconds, over the most
        recent calls)."""
        latencies = np.asarray(self._latencies, np.float64)
        p50, p95 = (np.percentile(latencies, [50, 95]) if latencies.size else (math.nan, math.nan))
        return {"calls": self.calls, "failures": self.failures, "timeouts": self.timeouts,
                "latency_p50_s": float(p50), "latency_p95_s": float(p95)}

    def abandon(self) -> None:
        """A close: calls in flight that a cancellation of their runs would not end are ended too (a batch
        call, shielded from its branches' cancellation, is cancelled here)."""

    async def aclose(self) -> None:
        """Releases the executor's workers (a no-op for those without)."""



class AsyncExecutor(Executor):
    """Awaits the scorer's coroutine on the loop, under its deadline, timing its own steps. The hot path
    of every async scorer: one coroutine frame per call (``_guarded``) around the scorer's own."""

    def __init__(self, scorer: BaseScorer, method: str, timeout: float | None):
        super().__init__(scorer, method, timeout)
        self._method = getattr(scorer, method)

    async def run(self, args: tuple[Any, ...], on: Any) -> Any:
        if self._slots is None:
            return await self._guarded(self._method(*args), on)
        async with self._slots.get():
            return await self._guarded(self._method(*args), on)

    async def run_call(self, call: Awaitable[Any], on: Any) -> Any:
        """``run`` for a coroutine already made (an async scorer's ``evaluate_result``)."""
        if self._slots is None:
            return await self._guarded(call, on)
        async with self._slots.get():
            return await self._guarded(call, on)

    async def _guarded(self, call: Awaitable[Any], on: Any, counted: bool = True) -> Any:
        """The call under the deadline, its own steps timed, counted in the stats (unless not ``counted``:
        a batch's call, which its executor counts)."""
        timeout = self.timeout
        timed = OwnTime(call)
        start, failed = time.perf_counter(), None
        try:
            if timeout is None:  # no cancel scope per call where no deadline is set
                result = await timed
            else:
                with anyio.fail_after(timeout):
                    result = await timed
            if timed.longest > BLOCKING_STEP_S:
                self._blocking(on, timed)
        except (Exception, SystemExit, anyio.get_cancelled_exc_class()) as err:
            reported = scorer_error(self.scorer, describe(on), err, timeout)
            failed = reported if isinstance(err, Exception) else None
            if reported is err:
                raise
            raise reported from None
        finally:
            if counted:
                self._record(start, failed)
        return result

    def _blocking(self, on: Any, timed: OwnTime) -> None:
        """A call that held the event loop: past its deadline it fails (nothing could interrupt it, but the
        deadline holds); otherwise the runner warns once per scorer (its neighbours waited meanwhile)."""
        LAST_LONG_STEP[:] = [self.scorer.name, timed.longest, time.perf_counter()]
        name, timeout = self.scorer.name, self.timeout
        if timeout is not None and timed.busy > timeout:
            raise TimeoutError(f"scorer {name!r} on {describe(on)} ran synchronous code for {timed.busy:.3f} s, past "
                               f"its timeout of {timeout} s (it blocked the event loop, so nothing could stop it "
                               "earlier; derive from SyncScorer with executor 'thread' or 'process')")
        if not self._warned_blocking:
            self._warned_blocking = True
            warnings.warn(f"scorer {name!r} blocked the event loop for {timed.longest:.3f} s in one step on "
                          f"{describe(on)}: synchronous work inside an async evaluate stalls every other scorer; "
                          "derive from SyncScorer (executor 'thread' for blocking I/O, 'process' for CPU-bound "
                          "Python)", RuntimeWarning, stacklevel=2)


class ThreadExecutor(Executor):
    """A plain function in a worker thread, at most ``max_workers`` at a time. The deadline runs from the
    thread's start; past it the call fails and the thread's eventual result is discarded."""

    def __init__(self, scorer: BaseScorer, method: str, timeout: float | None):
        super().__init__(scorer, method, timeout)
        workers = int(getattr(scorer, "max_workers", 1))
        self._admitted = LoopLocal(lambda: anyio.Semaphore(workers))
        # Admission is ours; anyio's limiter must never make an admitted call wait (an abandoned thread
        # may still hold a token of a bounded one).
        self._unbounded = LoopLocal(lambda: anyio.CapacityLimiter(math.inf))
        self._running: dict[object, str] = {}  # calls in a thread now: what each covers

    async def _run(self, args: tuple[Any, ...], on: Any) -> Any:
        fn = getattr(self.scorer, self.method)
        running = self._running
        key = object()

        def call() -> Any:
            running[key] = describe(on)
            try:
                return fn(*args)
            finally:
                running.pop(key, None)

        async with self._admitted.get():
            RUNNING_THREADS[self.scorer.name] += 1
            try:
                # A cancellation (a sibling's failure, a close) never waits for the thread: a thread cannot be
                # stopped, so its call is abandoned and its result discarded (aclose names what still runs).
                if self.timeout is None:
                    return await anyio.to_thread.run_sync(call, abandon_on_cancel=True, limiter=self._unbounded.get())
                with anyio.fail_after(self.timeout):
                    return await anyio.to_thread.run_sync(call, abandon_on_cancel=True,
                                                          limiter=self._unbounded.get())
            except TimeoutError as err:
                if str(err):  # the scorer's own TimeoutError
                    raise
                raise TimeoutError(f"scorer {self.scorer.name!r} on {describe(on)} took longer than its timeout "
                                   f"of {self.timeout} s in its worker thread (the thread runs on; its result "
                                   "will be discarded)") from None
            finally:
                RUNNING_THREADS[self.scorer.name] -= 1

    async def aclose(self) -> None:
        """Nothing to release (threads cannot be stopped); calls still running in their threads were
        abandoned by the runs that made them, and are named once here."""
        still = sorted(self._running.values())
        if still:
            warnings.warn(f"scorer {self.scorer.name!r}: {len(still)} call(s) abandoned while still running in "
                          f"worker threads (a thread cannot be stopped; their results are discarded): "
                          f"{', '.join(still[:8])}{' ...' if len(still) > 8 else ''}", RuntimeWarning, stacklevel=2)


class _Item:
    __slots__ = ("args", "live", "on")

    def __init__(self, args: tuple[Any, ...], on: Any):
        self.args, self.on, self.live = args, on, True


class _Batch:
    __slots__ = ("deadline", "done", "error", "full", "items", "lead", "results", "started", "wake")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline  # when the lead stops waiting for the batch to fill
        self.items: list[_Item] = []
        self.full = anyio.Event()
        self.done = anyio.Event()
        self.wake = anyio.Event()  # set when the batch is done or its lead changed
        self.lead = 0  # the index of the item whose call waits for the batch to fill and makes the call
        self.started = False  # the call was made: cancelled items' results are dropped from then on
        self.results: dict[int, Any] = {}
        self.error: BaseException | None = None


class BatchExecutor(AsyncExecutor):
    """Gathers concurrent calls' items into ``evaluate_batch`` calls (see ``BatchScorer``). The call that
    opens a batch leads it: it waits up to ``max_wait`` for the batch to fill, then makes the call for every
    live item in it, shielded from its own branch's cancellation (the others' items ride on it): a batch call
    runs to its end, its deadline or a close of the runner (``abandon``), and the results of branches that
    have gone are dropped. A cancellation before the call ends that item's wait
    at once and removes it from the batch; a lead that goes hands the lead to the next live item (a batch
    whose items all went is never called). A failed call's error is raised, as the same object, by every
    branch with an item in it (one note names the batch)."""

    def __init__(self, scorer: BaseScorer, method: str, timeout: float | None):
        super().__init__(scorer, method, timeout)
        self.max_batch_size: int = scorer.max_batch_size  # type: ignore[attr-defined]
        self.max_wait: float = scorer.max_wait  # type: ignore[attr-defined]
        self.pads = bool(getattr(scorer, "pads", False))
        self._open: _Batch | None = None
        self.batches = 0
        self._batch_slots = self._slots
        self._slots = None  # max_concurrency bounds batch calls, not items
        self._flushing: set[anyio.CancelScope] = set()  # the batch calls in flight (abandon cancels them)

    async def run(self, args: tuple[Any, ...], on: Any) -> Any:
        batch = self._open
        if batch is None:
            batch = self._open = _Batch(anyio.current_time() + self.max_wait)
        index = len(batch.items)
        item = _Item(args, on)
        batch.items.append(item)
        if len(batch.items) >= self.max_batch_size:
            self._open = None
            batch.full.set()
        try:
            while not batch.done.is_set():
                if batch.lead == index and not batch.started:
                    with anyio.move_on_after(max(batch.deadline - anyio.current_time(), 0.0)):
                        await batch.full.wait()
                    batch.started = True
                    if self._open is batch:
                        self._open = None
                    with anyio.CancelScope(shield=True) as scope:
                        self._flushing.add(scope)
                        try:
                            await self._flush(batch)
                        finally:
                            self._flushing.discard(scope)
                    break
                wake = batch.wake
                await wake.wait()
        except anyio.get_cancelled_exc_class():
            item.live = False
            if not batch.started:  # gone before the call: out of the batch, and the lead passes on
                self._pass_lead(batch, index)
            raise
        if batch.error is not None:  # the batch's own error (the same object for every branch in it)
            raise batch.error
        if index not in batch.results:  # the call was abandoned by a close (abandon)
            await anyio.sleep(0)  # the close cancelled this run too: it ends here
            raise RuntimeError(f"scorer {self.scorer.name!r} on {describe(on)}: its batch call was abandoned by a "
                               "close")
        return batch.results[index]

    def abandon(self) -> None:
        for scope in list(self._flushing):
            scope.cancel()

    def _pass_lead(self, batch: _Batch, index: int) -> None:
        if batch.lead != index:
            return
        following = [i for i, item in enumerate(batch.items) if item.live]
        if not following:  # every item went: the batch is never called
            batch.started = True
            if self._open is batch:
                self._open = None
            return
        batch.lead = following[0]
        batch.wake.set()
        batch.wake = anyio.Event()

    async def _flush(self, batch: _Batch) -> None:
        live = [i for i, item in enumerate(batch.items) if item.live]
        items = [(batch.items[i].args, batch.items[i].on) for i in live]
        order = list(range(len(items)))
        if self.pads:
            order.sort(key=lambda k: _length(items[k][0]))
        start = time.perf_counter()
        try:
            if self._batch_slots is None:
                results = await self._call([items[k][0] for k in order], items)
            else:
                async with self._batch_slots.get():
                    results = await self._call([items[k][0] for k in order], items)
            for position, k in enumerate(order):
                batch.results[live[k]] = results[position]
        except Exception as err:
            batch.error = err
            err.add_note(f"raised by scorer {self.scorer.name!r} on {_batch_on(items)}")
            err.prm_batch = True  # type: ignore[attr-defined]  # (the runner adds no per-turn note to it)
        finally:
            self._record(start, batch.error)
            self.batches += 1
            batch.done.set()
            batch.wake.set()

    async def _call(self, argument_lists: list[tuple[Any, ...]], items: list[tuple[tuple[Any, ...], Any]]) -> list[Any]:
        results = await self._guarded(self.scorer.evaluate_batch(argument_lists),  # type: ignore[attr-defined]
                                      _batch_on(items), counted=False)
        if isinstance(results, np.ndarray):
            results = list(results)
        if not isinstance(results, Sequence) or isinstance(results, (str, bytes)) or len(results) != len(items):
            got = (f"{len(results)} results" if isinstance(results, Sequence) and not isinstance(results, (str, bytes))
                   else f"a {type(results).__name__}")
            raise TypeError(f"scorer {self.scorer.name!r}: evaluate_batch must return one result per item, in order "
                            f"({len(items)}), got {got}")
        return list(results)


def _batch_on(items: list[tuple[tuple[Any, ...], Any]]) -> str:
    """What a batch call covers, for messages: every item's turn (the first eight, then how many more)."""
    if len(items) == 1:
        return describe(items[0][1])
    names = [describe(on) for _, on in items[:8]]
    more = f" and {len(items) - 8} more" if len(items) > 8 else ""
    return f"a batch of {len(items)} items ({', '.join(names)}{more})"


def _length(args: tuple[Any, ...]) -> int:
    """An item's length for sorting a padded batch: its tokens (a turn's input and output, or a branch's
    leaf)."""
    turn = args[0]
    if isinstance(turn, tuple):  # a branch: its leaf holds every token
        turn = turn[-1]
    return len(turn.input_tokens) + int(turn.output_len)
