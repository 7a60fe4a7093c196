"""``BlockingRunner``: a ``PRMRunner`` for synchronous training loops.

A JAX training loop is usually plain synchronous Python. ``BlockingRunner`` keeps an event loop in a
worker thread (an anyio blocking portal) and runs the runner there, so the loop calls
``runner.score_arrays(...)`` like any function and never becomes ``async def main``. Scorers run, and are
closed, on that loop; ``close()`` (or leaving the ``with`` block) closes them and stops the thread.

A batch job must end: the worker thread is a daemon, so a script that ends, or dies of an exception,
without ``close()`` still exits; at interpreter exit every runner still open is closed first (its owned
scorers' ``aclose``, at most ``EXIT_CLOSE_S`` seconds for all of them), so clients are not left open.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import inspect
import logging
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import numpy as np
from anyio.from_thread import BlockingPortal

from prm_jax.errors import RunnerClosedError
from prm_jax.runtime._arrays import (
    ScoredArrays,
    call_checks,
    count_failures,
    refuse_closed,
    row_models,
    score_arrays,
    score_rows_now,
)
from prm_jax.runtime._lifecycle import Lifecycle, RunnerState
from prm_jax.runtime._runner import PRMRunner, guarded_progress
from prm_jax.runtime._scoring import BaseScorer
from prm_jax.runtime._trajectory import Interaction, InteractionCache

logger = logging.getLogger(__name__)
EXIT_CLOSE_S = 10.0  # at interpreter exit, how long the runners still open get to close their scorers
CLOSE_TIMEOUT_S = 30.0  # close()'s default bound on the scorers' cleanup
_OPEN: weakref.WeakSet[BlockingRunner] = weakref.WeakSet()


def _start_portal(backend: str) -> tuple[BlockingPortal, threading.Thread, concurrent.futures.Future]:
    """An anyio blocking portal whose event loop runs in a daemon thread (anyio's own portal runs in a pool
    thread that the interpreter joins at exit, so an unclosed one kept the process alive)."""
    ready: concurrent.futures.Future[BlockingPortal] = concurrent.futures.Future()
    done: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def serve() -> None:
        async with BlockingPortal() as portal:
            ready.set_result(portal)
            await portal.sleep_until_stopped()

    def main() -> None:
        try:
            anyio.run(serve, backend=backend)
            done.set_result(None)
        except BaseException as err:  # the loop's end, or a failed start: handed to the caller
            if not ready.done():
                ready.set_exception(err)
            done.set_exception(err)

    thread = threading.Thread(target=main, name="prm-jax BlockingRunner", daemon=True)
    thread.start()
    return ready.result(), thread, done


class BlockingRunner(Lifecycle):
    """``PRMRunner(config, scorers=...)`` behind synchronous methods; a context manager.

    Its methods are ``PRMRunner``'s, blocking: ``run``, ``run_many`` (with ``progress``), ``score_arrays``,
    ``scorer_stats``, ``close`` (``aclose``'s, with a ``timeout``), plus ``close_scorer``; its ``state`` is a
    ``RunnerState``. A loop thread that ended on its own is reported by the next call, with its error.

    ``backend`` is anyio's (``"asyncio"`` or ``"trio"``). Build it outside any running event loop. Every call
    after ``close()`` raises ``RunnerClosedError`` (the runner's own type for a closed runner).

    ``scorers`` stay the caller's, as with ``PRMRunner``; but their clients live on this runner's loop,
    which the caller cannot reach: ``own_scorers=True`` hands them over (``close()`` closes them there,
    after the runner's own), or ``close_scorer(scorer)`` closes one on the loop at any time.

    Args:
        config: What to build the runner from: an ``ExperimentConfig``, a ``PRMConfig``, a mapping of either, or
            ``None`` (borrowed scorers only).
        scorers: Scorer instances the caller owns, run after the configured ones and never closed here.
        backend: anyio's event-loop backend for the runner's thread: ``asyncio`` or ``trio``.
        own_scorers: Whether ``close`` closes the ``scorers`` given too (``True``: the runner owns them).

    Example:
        >>> class Half(prm_jax.BaseScorer):
        ...     name = "half"
        ...     async def evaluate(self, interaction, ctx):
        ...         return 0.5
        ...
        >>> with prm_jax.BlockingRunner(scorers=[Half()]) as runner:
        ...     rewards = runner.score_arrays(np.array([[1, 2, 3]]), np.array([[-1, 0, 0]]))
        ...
        >>> rewards.tolist()
        [[0.0, 0.5, 0.5]]
    """

    def __init__(self, config: Any = None, *, scorers: Sequence[BaseScorer] = (), backend: str = "asyncio",
                 own_scorers: bool = False):
        self._portal, self._thread, self._done = _start_portal(backend)
        self._open()
        for scorer in scorers if own_scorers else ():  # (closed after the runner: registered first)
            self._owns(f"handed-over scorer {scorer.name!r}", scorer.aclose)
        try:
            self.runner: PRMRunner = self._portal.call(functools.partial(PRMRunner.create, config, scorers=scorers))
        except BaseException:
            self._stop()
            raise
        self._owns("the PRM runner", self.runner.aclose)
        _OPEN.add(self)

    def run(self, branch: InteractionCache | Sequence[Interaction], ctx: Mapping[str, Any] | None = None, *,
            is_eval: bool = False) -> list:
        """``PRMRunner.run``, blocking (its parameters are ``PRMRunner.run``'s)."""
        return self._call(self.runner.run, branch, ctx, is_eval=is_eval)

    def run_many(self, branches: Sequence[InteractionCache | Sequence[Interaction]], ctx: Any = None, *,
                 limit: int | None = 64, is_eval: bool = False, return_exceptions: bool = False,
                 progress: Callable[[int, int], None] | None = None) -> list:
        """``PRMRunner.run_many``, blocking (``progress`` is called on the runner's loop thread; the parameters are
        ``PRMRunner.run_many``'s)."""
        return self._call(self.runner.run_many, branches, ctx, limit=limit, is_eval=is_eval,
                          return_exceptions=return_exceptions, progress=progress)

    def scorer_stats(self) -> dict[str, dict[str, float]]:
        """``PRMRunner.scorer_stats`` (read on the runner's loop, where the counts are kept): per scorer, its
        calls, failures (rows it failed), timeouts and latency p50 / p95 in seconds.

        >>> class Half(prm_jax.BaseScorer):
        ...     name = "half"
        ...     async def evaluate(self, interaction, ctx):
        ...         return 0.5
        >>> with prm_jax.BlockingRunner(scorers=[Half()]) as runner:
        ...     _ = runner.score_arrays(np.array([[1, 2, 3]]), np.array([[-1, 0, 0]]))
        ...     stats = runner.scorer_stats()
        >>> stats["half"]["calls"], stats["half"]["failures"]
        (1, 0)
        """
        return self._call(self.runner.scorer_stats)

    def score_arrays(self, input_ids: Any, turn_ids: Any, **kwargs: Any) -> np.ndarray | ScoredArrays:
        """``prm_jax.runtime._arrays.score_arrays`` with this runner, blocking: ``token_rewards [B, T]``, or
        with ``on_error="mask"`` a ``ScoredArrays`` (the failed rows flagged instead of raising).

        When every enabled scorer is a ``ModelScorer`` (a model on this process's devices), the rows are
        scored here, in the calling thread, with no hop to the runner's loop and back (issue 56.6: on a GPU
        the host path is all there is beside the model); the same numbers, the same errors, the failures
        counted on the runner's loop.

        Args:
            kwargs: ``prm_jax.runtime.score_arrays``' keyword arguments (``attention_mask``, ``ctx``, ``on_error``,
                ...).
        """
        models = row_models(self.runner)
        if models is None or not set(kwargs) <= ROW_PATH_OPTIONS:
            return self._call(score_arrays, self.runner, input_ids, turn_ids, **kwargs)
        self._check_open()
        refuse_closed(self.runner)
        on_error = kwargs.get("on_error", "raise")
        call_checks(input_ids, on_error, kwargs.get("metadata"))
        failures: list[Any] = []
        try:
            return score_rows_now(models, input_ids, turn_ids, kwargs.get("attention_mask"), on_error,
                                  bool(kwargs.get("per_turn", False)), guarded_progress(kwargs.get("progress")),
                                  failures, self.runner.shaping_mode)
        finally:
            if failures:
                self._call(count_failures, self.runner, failures)

    def close_scorer(self, scorer: BaseScorer) -> None:
        """``await scorer.aclose()`` on this runner's loop (where its client lives), blocking.

        Args:
            scorer: A scorer this runner runs.
        """
        self._call(scorer.aclose)

    def _check_open(self) -> None:
        if self._state is not RunnerState.OPEN:  # (said as "closed" in every state after close() started)
            raise RunnerClosedError("BlockingRunner is closed: calls are rejected once close() has started")
        if self._done.done():  # the loop's thread ended on its own: say why, once per call
            raise RunnerClosedError(f"BlockingRunner's event loop thread has ended ({self._ended()}); the runner "
                                    "cannot run anything: close() it and build another") from self._done.exception()

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self._check_open()
        try:
            return self._portal.call(functools.partial(fn, *args, **kwargs))
        except concurrent.futures.CancelledError:  # the loop was stopped under the call: a close
            if self._state is RunnerState.OPEN and not self._done.done():
                raise
            raise RunnerClosedError("PRMRunner was closed while this run was in flight; nothing was committed"
                                    ) from None

    def _ended(self) -> str:
        error = self._done.exception()
        return f"it raised {error!r}" if error is not None else "it returned"

    def close(self, timeout: float | None = CLOSE_TIMEOUT_S) -> None:
        """Closes the runner on its loop (runs in flight are abandoned: they commit nothing, and a thread
        scorer's call still running in its thread is named in a ``RuntimeWarning``), then stops the loop's
        thread. Idempotent. ``timeout`` (30 s by default; None: no bound) bounds the scorers' cleanup; past
        it the thread is stopped anyway and a ``RuntimeWarning`` says what was left."""
        if self._state is not RunnerState.OPEN:
            return
        self._state = RunnerState.CLOSING
        _OPEN.discard(self)
        try:
            self._portal.start_task_soon(self.aclose).result(timeout)
        except concurrent.futures.TimeoutError:
            warnings.warn(f"BlockingRunner.close(): its scorers' cleanup did not finish within {timeout} s; the "
                          "loop's thread was stopped without it (a scorer's aclose still awaited)", RuntimeWarning,
                          stacklevel=2)
        except RuntimeError:  # the loop's thread had ended already (_done says why)
            if not self._done.done():
                raise
        finally:
            self._stop(timeout)

    def _stop(self, timeout: float | None = None) -> None:
        self._state = RunnerState.CLOSED
        try:
            self._portal.start_task_soon(self._portal.stop, True).result(timeout)
        except (RuntimeError, concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            pass  # the loop has already stopped, or is stuck (a daemon thread: it goes with the process)
        self._thread.join(timeout)

    def __enter__(self) -> BlockingRunner:
        """Entering a runner that is closing or closed is refused, as ``PRMRunner`` refuses it."""
        self._refuse_unless_open("it cannot be entered again")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> BlockingRunner:
        raise TypeError("BlockingRunner is synchronous (its scorers live on its own loop): use `with`, or "
                        "PRMRunner in async code")


# score_arrays' options: the row path reads attention_mask, on_error, per_turn, progress and metadata; ctx,
# logprobs, rewards, limit and is_eval are for scorers of interactions and go unread by model rows, as on the
# runner's loop (so tunix's learners, which pass ctx, take the row path too); an unknown one goes to the loop,
# whose score_arrays names it.
ROW_PATH_OPTIONS = frozenset(inspect.signature(score_arrays).parameters) - {"runner", "input_ids", "turn_ids"}


@atexit.register
def _close_at_exit() -> None:
    """Runners a script never closed: their scorers are closed before the interpreter goes (all of them within
    ``EXIT_CLOSE_S``; what is left then goes with the daemon thread)."""
    deadline = time.monotonic() + EXIT_CLOSE_S
    for runner in list(_OPEN):
        try:
            runner.close(timeout=max(deadline - time.monotonic(), 0.0))
        except Exception as err:  # the process is exiting: said, not raised
            logger.warning("closing an unclosed BlockingRunner at exit failed: %r", err)
