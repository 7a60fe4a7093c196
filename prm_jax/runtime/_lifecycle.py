"""One lifecycle for every owner of resources (``PRMRunner``, ``BlockingRunner``, ``ExportService``, the
process executor), and the start-up that can fail half-way.

``Lifecycle``: a state (``RunnerState``), one ``AsyncExitStack`` of the cleanups of what the owner holds
(each run once, in reverse order of acquisition), entering refused unless ``OPEN``, an idempotent close
(concurrent callers wait for the first; a cancelled close leaves the cleanups never tried to the next one)
and the cleanups' ordinary failures raised together, as one ``ExceptionGroup``, after every one was tried.

``rolled_back``: start-up that fails half-way releases what was acquired, and the error that stopped it is
the one raised (the runner's rule: the original error, cleanup failures attached as notes; cancellation during the
cleanup propagates). The runner's ``create`` and the export service's ``start`` both go through it.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import ClassVar, Self

import anyio

from prm_jax.errors import RunnerClosedError

logger = logging.getLogger(__name__)


class RunnerState(enum.Enum):
    """A resource owner's lifecycle (``PRMRunner``, ``BlockingRunner``, ``ExportService``, the process
    executor alike): ``OPEN`` (calls accepted), ``CLOSING`` (a close started: calls rejected, calls in flight
    cancelled, what it owns being closed), ``INTERRUPTED`` (a cancelled close left cleanups never tried: calls
    stay rejected, and the next close resumes with them), ``CLOSED`` (every cleanup was tried). Entering an
    owner that is not ``OPEN`` is refused.

    Example:
        >>> [state.name for state in prm_jax.runtime.RunnerState]
        ['OPEN', 'CLOSING', 'INTERRUPTED', 'CLOSED']
    """

    OPEN = "open"
    CLOSING = "closing"
    INTERRUPTED = "interrupted"
    CLOSED = "closed"


class Lifecycle:
    """The base of every owner of resources (see the module docstring). A subclass calls ``_open()`` first,
    registers each resource's cleanup with ``_owns(name, cleanup)`` as it acquires it, checks
    ``_refuse_unless_open(what)`` before a call, and may override ``_before_close`` (what runs before the
    cleanups: cancelling calls in flight). ``CLOSE_FAILED`` is the message of the close's error group.

    Example:
        >>> runner = prm_jax.BlockingRunner(scorers=[prm_jax.scorers.LengthBudgetScorer()])
        >>> runner.state.name
        'OPEN'
        >>> runner.close()
        >>> runner.state.name, isinstance(runner.runner, prm_jax.runtime.Lifecycle)
        ('CLOSED', True)
    """

    CLOSE_FAILED: ClassVar[str] = "{count} cleanup hook(s) failed"
    _state: RunnerState

    def _open(self) -> None:
        self._state = RunnerState.OPEN
        self._stack = contextlib.AsyncExitStack()
        self._close_errors: list[tuple[str, Exception]] = []
        self._untried: list[tuple[str, Callable[[], Awaitable[object]]]] = []
        self._close_event: anyio.Event | None = None

    @property
    def state(self) -> RunnerState:
        return self._state

    @property
    def closed(self) -> bool:
        """True once a close has started: from then on calls are rejected."""
        return self._state is not RunnerState.OPEN

    def _owns(self, name: str, cleanup: Callable[[], Awaitable[object]]) -> None:
        """``cleanup`` runs at close (or a failed start-up's rollback), after those registered later."""
        self._stack.push_async_callback(self._cleanup, name, cleanup)

    def _refuse_unless_open(self, what: str) -> None:
        """``RunnerClosedError`` naming the owner and ``what`` is refused, unless it is ``OPEN``."""
        if self._state is RunnerState.CLOSED:
            raise RunnerClosedError(f"{type(self).__name__} is closed: {what}")
        if self._state is not RunnerState.OPEN:
            raise RunnerClosedError(f"{type(self).__name__} is {self._state.value} (closed to calls): {what}")

    def _cleanup_notes(self, after: str) -> list[str]:
        """The cleanups that failed, as notes for the error of a failed start-up (``rolled_back``)."""
        return [f"cleanup of {name} {after} also failed: {error!r}" for name, error in self._close_errors]

    async def _cleanup(self, name: str, cleanup: Callable[[], Awaitable[object]]) -> None:
        if self._state is RunnerState.INTERRUPTED:  # a cancelled close: kept for the next one
            self._untried.append((name, cleanup))
            return
        try:
            await cleanup()
        except anyio.get_cancelled_exc_class():
            self._state = RunnerState.INTERRUPTED
            raise
        except Exception as err:
            logger.exception("closing %s failed", name)
            self._close_errors.append((name, err))

    async def _before_close(self) -> None:
        """Runs at each close before the cleanups (``PRMRunner``: cancels the runs in flight)."""

    async def aclose(self) -> None:
        """Closes what this owner holds, in reverse order of acquisition; see the module docstring.

        The first caller runs the cleanups and raises an ``ExceptionGroup`` of their ordinary failures after
        every one was tried; concurrent callers wait for it and return. Cancellation propagates; the
        interrupted cleanup is not retried, and a later call runs those never tried.
        """
        if self._state in (RunnerState.OPEN, RunnerState.INTERRUPTED):
            self._state = RunnerState.CLOSING
        await self._before_close()
        while self._state is not RunnerState.CLOSED:
            if self._close_event is not None:
                await self._close_event.wait()
                continue
            if self._state is RunnerState.INTERRUPTED:  # a concurrent close was cancelled: resume it
                self._state = RunnerState.CLOSING
            event = self._close_event = anyio.Event()
            errors = self._close_errors = []
            try:
                await self._stack.aclose()
            finally:
                self._after_close()
                self._close_event = None
                event.set()
            if errors:
                raise ExceptionGroup(self.CLOSE_FAILED.format(count=len(errors)), [e for _, e in errors])

    def _after_close(self) -> None:
        """``CLOSED``, unless a cancellation left cleanups never tried (``INTERRUPTED``): a new stack holds
        them, in order, for the next close."""
        if self._state is not RunnerState.INTERRUPTED:
            self._state = RunnerState.CLOSED
            return
        untried, self._untried = self._untried, []
        self._stack = contextlib.AsyncExitStack()
        for name, cleanup in reversed(untried):
            self._owns(name, cleanup)

    async def __aenter__(self) -> Self:
        """Entering an owner that is closing or closed is refused (as httpx refuses a closed client)."""
        self._refuse_unless_open("it cannot be entered again")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def rolled_back(stack: contextlib.AsyncExitStack, cleanup_failures: Callable[[], Iterable[str]]
                      ) -> AsyncIterator[None]:
    """On an ordinary failure inside: unwinds ``stack`` (what was acquired so far), adds each of
    ``cleanup_failures()`` (read after the unwinding) to the error as a note, and re-raises the error
    unchanged. Nothing is done on success."""
    try:
        yield
    except Exception as err:
        await stack.aclose()
        for note in cleanup_failures():
            err.add_note(note)
        raise


def first_in_group(group: BaseExceptionGroup, kinds: type[BaseException] | tuple[type[BaseException], ...]
                   ) -> BaseException | None:
    """The first exception of ``kinds`` in a (nested) exception group, depth first; ``None`` when none is."""
    for error in group.exceptions:
        if isinstance(error, kinds):
            return error
        if isinstance(error, BaseExceptionGroup):
            found = first_in_group(error, kinds)
            if found is not None:
                return found
    return None
