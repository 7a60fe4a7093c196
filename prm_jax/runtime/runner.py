"""The scorer runner: builds scorers from config, scores branches, commits token rewards, closes scorers.

Scoring a branch (``run``): scorers run in config order (disabled ones skipped); within a scorer every turn
is evaluated concurrently, and a failure cancels its siblings. A scorer's results are all validated
(type, shape ``(output_len,)``, finite ``raw`` and ``raw * weight``, observation rules, stable metric
schemas) before any is committed; committing adds ``weight * raw`` to each turn's float32 ``token_rewards``.

Lifecycle: scorers built from config are *owned* (disabled ones too) and closed by ``aclose`` in reverse
creation order, each at most once; instances passed in are *borrowed* and never closed here.
``await PRMRunner.create(config)`` rolls back (closes the owned scorers built so far) when start-up fails;
the synchronous ``PRMRunner(config)`` is kept for compatibility without that rollback (SPEC 3, AReaL's v1
start-up; with borrowed scorers only there is nothing to roll back), and warns (``ResourceWarning``, naming
them) when a failed start-up leaves owned scorers unclosed. The lifecycle is ``RunnerState``:
``OPEN``, ``CLOSING``, ``INTERRUPTED`` (a cancelled close; the next one resumes), ``CLOSED``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import logging
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import anyio
import numpy as np

from prm_jax.config.experiment import PRMSection
from prm_jax.runtime.concurrency import concurrently
from prm_jax.runtime.context import ScorerContext
from prm_jax.runtime.dispatch import make_executor
from prm_jax.runtime.executors import WORKER_TRACEBACK_NOTE, AsyncExecutor, Executor
from prm_jax.runtime.lifecycle import first_in_group, rolled_back
from prm_jax.runtime.rewards import weighted_rewards
from prm_jax.runtime.scoring import (
    BaseScorer,
    PRMMetricObservation,
    PRMScorerResult,
    PRMTurnResult,
)
from prm_jax.runtime.specs import as_section, check_scorer_specs
from prm_jax.runtime.trajectory import Interaction, InteractionCache, require_scorable
from prm_jax.runtime.watchdog import watch_loop
from prm_jax.validation import integer, short_repr

logger = logging.getLogger(__name__)


BUILDING_NOTE = "while building the scorer of"


# Within one run_many: the outcomes of prefix-determined scorers on turns shared by clones of one session,
# keyed by (session key, interaction id, scorer), so each such turn is scored once.
_SHARED: contextvars.ContextVar[dict[tuple[str, str, int], _SharedCall] | None] = contextvars.ContextVar(
    "prm_jax_shared_turns", default=None)


@contextlib.contextmanager
def shared_turns() -> Generator[None, None, None]:
    """Within the block (and the tasks started in it), prefix-determined scorers score a turn shared by
    clones of one session once: ``run_many`` and a group's export open one."""
    token = _SHARED.set({}) if _SHARED.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _SHARED.reset(token)


class _SharedCall:
    __slots__ = ("done", "ok", "value")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.ok = False
        self.value: Any = None


async def _once(shared: dict[tuple[str, str, int], _SharedCall], key: tuple[str, str, int],
                call: Any) -> Any:
    """``await call()`` once per key: the first branch to reach a shared turn scores it, the others wait for
    its outcome; if that call failed or was cancelled, each waiting branch scores the turn itself (a failure
    stays its own branch's)."""
    entry = shared.get(key)
    if entry is None:
        entry = shared[key] = _SharedCall()
        try:
            entry.value = await call()
            entry.ok = True
            return entry.value
        finally:
            if not entry.ok:
                del shared[key]
            entry.done.set()
    await entry.done.wait()
    if entry.ok:
        return entry.value
    return await call()


class RunnerState(enum.Enum):
    """A runner's lifecycle (``PRMRunner`` and ``BlockingRunner`` alike): ``OPEN`` (runs accepted),
    ``CLOSING`` (a close started: runs rejected, runs in flight cancelled, owned scorers being closed),
    ``INTERRUPTED`` (a cancelled close left owned scorers never tried: runs stay rejected, and the next close
    resumes with them), ``CLOSED`` (every owned scorer was tried). Entering a runner that is not ``OPEN`` is
    refused."""

    OPEN = "open"
    CLOSING = "closing"
    INTERRUPTED = "interrupted"
    CLOSED = "closed"


class RunnerClosedError(RuntimeError):
    """``run()`` on a runner that is closing or closed: a lifecycle error, not a scorer's failure."""


class NotScorableError(ValueError):
    """A branch the runner cannot score (a message-only turn): the input's fault, not a scorer's."""


# Errors of a run that no scorer caused: AReaL's ``error_policy: keep_original`` never falls back on them.
NOT_SCORER_FAILURES: tuple[type[BaseException], ...] = (RunnerClosedError, NotScorableError)


def _raised_on(err: BaseException, scorer: BaseScorer, where: str) -> None:
    """The note naming the scorer and what its call covered; a batch's error has one naming its items (the
    same object is raised by every branch in the batch), so it gets none per branch."""
    if not getattr(err, "prm_batch", False):
        err.add_note(f"raised by scorer {scorer.name!r} on {where}")


def guarded_progress(progress: Callable[[int, int], None] | None) -> Callable[[int, int], None] | None:
    """``progress`` as scoring calls it: a callback that raises is reported once (a ``RuntimeWarning`` naming
    it and its error) and scoring goes on; its later errors are ignored."""
    if progress is None:
        return None
    warned = [False]

    def report(done: int, total: int) -> None:
        try:
            progress(done, total)
        except Exception as err:
            if not warned[0]:
                warned[0] = True
                warnings.warn(f"the progress callback {getattr(progress, '__qualname__', progress)!r} raised "
                              f"{err!r}; scoring goes on without its reports failing it", RuntimeWarning,
                              stacklevel=2)
    return report


def cause_text(err: BaseException) -> str:
    """What failed, without where: ``Type: message`` (the same for every row a down server failed, so
    reports can say it once with the rows it hit)."""
    message = str(err)
    return f"{type(err).__name__}: {message}" if message else type(err).__name__


def error_text(err: BaseException) -> str:
    """A failed row's one-line error: ``cause_text``, then the first line of each note, which name the
    scorer, the turn and what failed (a worker process's traceback is left to the exception itself)."""
    notes = [str(note).splitlines()[0] for note in getattr(err, "__notes__", ())
             if str(note).strip() and not str(note).startswith(WORKER_TRACEBACK_NOTE)]
    text = cause_text(err)
    return f"{text} [{'; '.join(notes)}]" if notes else text


def _refuse_shared_turns(branches: Sequence[InteractionCache | Sequence[Interaction]]) -> None:
    """Each branch of ``run_many`` has turns of its own: a turn object in two branches (the same branch twice)
    would have its rewards committed twice."""
    owner: dict[int, int] = {}
    for i, branch in enumerate(branches):
        turns = list(branch) if isinstance(branch, (InteractionCache, Sequence)) else ()  # (run() names a bad one)
        for turn in turns:
            first = owner.setdefault(id(turn), i)
            if first != i:
                raise ValueError(f"run_many got interaction {getattr(turn, 'interaction_id', turn)!r} in branches "
                                 f"{first} and {i}: its rewards would be committed twice; give each branch its own "
                                 "turns (InteractionCache.clone_chain)")


def _plain(scorer: BaseScorer) -> bool:
    """The scorer keeps BaseScorer's ``evaluate_result``/``prepare_result``: its raw results need no wrapper."""
    return (type(scorer).evaluate_result is BaseScorer.evaluate_result
            and type(scorer).prepare_result is BaseScorer.prepare_result)


def _prepares(scorer: BaseScorer) -> bool:
    """The scorer overrides ``prepare_result``: the runner applies it to what a synchronous or batched
    ``evaluate`` returned (an async scorer's ``evaluate_result`` applies it itself)."""
    return type(scorer).prepare_result is not BaseScorer.prepare_result


@dataclasses.dataclass
class _Staged:
    """One scorer's validated results for a branch, waiting to be committed with the others."""

    scorer: BaseScorer
    weighted: list[np.ndarray] = dataclasses.field(default_factory=list)
    results: list[PRMTurnResult] = dataclasses.field(default_factory=list)
    schemas: dict = dataclasses.field(default_factory=dict)


class PRMRunner:
    """Runs configured scorers over branches and commits their weighted token rewards.

    ``config`` names the scorers to build (owned: closed by ``aclose``); ``scorers`` are instances the caller
    owns (borrowed: run after the configured ones, never closed here). An async context manager:
    ``async with await PRMRunner.create(config) as runner: ...`` closes it on exit.
    """

    def __init__(self, config: Any = None, *, scorers: Sequence[BaseScorer] = ()):
        self._init_state()
        try:
            self._build(as_section(config, scorers), scorers)
        except Exception:
            # SPEC 3: no rollback here (it would have to await); but never a silent leak.
            built = [s.name for s in self._scorers if not any(s is b for b in scorers)]
            if built:
                warnings.warn(f"PRMRunner(config) failed at start-up and leaves the {len(built)} scorer(s) it "
                              f"built unclosed: {built}; `await PRMRunner.create(config)` closes them",
                              ResourceWarning, stacklevel=2)
            raise

    @classmethod
    async def create(cls, config: Any = None, *, scorers: Sequence[BaseScorer] = ()) -> PRMRunner:
        """Builds and validates; on failure closes the owned scorers built so far, then re-raises."""
        runner = cls.__new__(cls)
        runner._init_state()
        async with rolled_back(runner._owned_stack, lambda: [
                f"cleanup of scorer {scorer.name!r} after the failed start-up also failed: {error!r}"
                for scorer, error in runner._close_errors]):
            runner._build(as_section(config, scorers), scorers)
        return runner

    async def __aenter__(self) -> PRMRunner:
        """Entering a runner that is closing or closed is refused (as httpx refuses a closed client)."""
        if self._state is not RunnerState.OPEN:
            raise RunnerClosedError(f"PRMRunner is {self._state.value}: it cannot be entered again")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _init_state(self) -> None:
        self._scorers: list[BaseScorer] = []
        # Each owned scorer's aclose is pushed as it is built: start-up rollback and aclose() both unwind it.
        self._owned_stack = contextlib.AsyncExitStack()
        self._close_errors: list[tuple[BaseScorer, Exception]] = []
        self._untried: list[BaseScorer] = []  # INTERRUPTED: the owned scorers the cancelled close never tried
        self._schemas: dict[tuple[str, str, str], tuple[str, tuple[str, ...]]] = {}
        self._state = RunnerState.OPEN
        self._close_event: anyio.Event | None = None
        self._executors: dict[int, Executor] = {}
        self._in_flight: set[anyio.CancelScope] = set()
        self._idle: anyio.Event | None = None
        self._warned_lag = False
        self.branches_scored = self.branches_failed = 0  # runs that committed, runs a scorer failed
        self.config: PRMSection | None = None

    def _build(self, section: PRMSection, borrowed: Sequence[BaseScorer]) -> None:
        self.config = section
        classes = check_scorer_specs(section, borrowed)
        for i, (entry, cls) in enumerate(zip(section.scorers, classes)):
            try:
                scorer = cls(weight=entry.weight, enabled=entry.enabled, **dict(entry.kwargs))
            except Exception as err:  # re-raised as it is (SPEC 3), with the entry named
                err.add_note(f"{BUILDING_NOTE} rollout.agent.prm.scorers[{i}] ({entry.path})")
                raise
            self._owned_stack.push_async_callback(self._close_one, scorer)
            self._scorers.append(scorer)
            self._executors[id(scorer)] = self._executor(scorer, entry.timeout if entry.timeout is not None
                                                         else scorer.timeout)
        for scorer in borrowed:
            type(scorer).check_kind()
            self._scorers.append(scorer)
            self._executors[id(scorer)] = self._executor(scorer, getattr(scorer, "timeout", None))

    def _executor(self, scorer: BaseScorer, timeout: float | None) -> Executor:
        """The scorer's executor, owned by the runner (closed by ``aclose``, borrowed scorers' too)."""
        executor = make_executor(scorer, timeout)
        self._owned_stack.push_async_callback(executor.aclose)
        return executor

    def scorer_stats(self) -> dict[str, dict[str, float]]:
        """Per scorer: calls (batch calls for a batched scorer), failures, timeouts, latency p50 / p95 in
        seconds, and what the scorer reports itself (``client_stats()``: a judge's requests, retries and
        rate-limit waits)."""
        out = {}
        for scorer in self._scorers:
            stats = self._executors[id(scorer)].stats()
            client_stats = getattr(scorer, "client_stats", None)
            if callable(client_stats):
                stats.update(client_stats())
            out[scorer.name] = stats
        return out

    def count_failure(self, scorer: BaseScorer) -> None:
        """One row (branch) ``scorer`` failed, in its ``scorer_stats()`` (paths that score rows without
        running branches call this; ``run`` counts its own)."""
        self._executors[id(scorer)].count_failure()

    async def _close_one(self, scorer: BaseScorer) -> None:
        """One owned scorer's cleanup; after a cancellation (``INTERRUPTED``) the rest are kept for a later
        ``aclose``."""
        if self._state is RunnerState.INTERRUPTED:
            self._untried.append(scorer)
            return
        try:
            await scorer.aclose()
        except anyio.get_cancelled_exc_class():
            self._state = RunnerState.INTERRUPTED
            raise
        except Exception as err:
            logger.exception("aclose() of scorer %r failed", scorer.name)
            self._close_errors.append((scorer, err))

    @property
    def scorers(self) -> tuple[BaseScorer, ...]:
        return tuple(self._scorers)

    @property
    def shaping_mode(self) -> str:
        """The configured ``advantage_shaping.mode`` (what the scores will shape; ``score_arrays`` warns for
        ``gvpo`` when no process reward is negative)."""
        assert self.config is not None  # set by _build
        return self.config.advantage_shaping.mode

    @property
    def active(self) -> bool:
        return bool(self.config and self.config.enabled and any(s.enabled for s in self._scorers))

    @property
    def state(self) -> RunnerState:
        return self._state

    @property
    def closed(self) -> bool:
        """True once ``aclose`` has started: from then on ``run`` is rejected."""
        return self._state is not RunnerState.OPEN

    async def run(self, branch: InteractionCache | Sequence[Interaction], ctx: Mapping[str, Any] | None = None, *,
                  is_eval: bool = False) -> list[PRMTurnResult]:
        """Scores one branch and commits into it; returns what each scorer committed to each turn.

        Args:
          branch: an ``InteractionCache`` holding one root-to-leaf chain (clone a session's branches with
            ``clone_chain`` first), or the chain itself, parent before child.
          ctx: extra read-only context for scorers; the runner adds ``messages`` and ``is_eval``.
          is_eval: evaluation rollouts (metrics go to the ``eval-rollout`` namespace).

        Raises:
          RuntimeError: the runner is closing or closed; a scorer returned None for some turns.
          ValueError, TypeError: a scorer's results failed validation; nothing of that scorer is committed.
          Any exception a scorer raised, with a note naming the scorer and the turn.
        """
        if self._state is not RunnerState.OPEN:
            raise RunnerClosedError("PRMRunner is closed: run() is rejected once aclose() has started")
        chain = self._chain(branch)
        require_scorable(chain, NotScorableError)
        assert self.config is not None  # set by _build
        if not self.config.enabled:
            return []
        frozen_ctx = ScorerContext(ctx, chain[-1], is_eval)
        views = [turn.readonly(k) for k, turn in enumerate(chain)]
        staged: list[_Staged] = []
        with anyio.CancelScope() as scope:
            self._in_flight.add(scope)
            try:
                for scorer in self._scorers:
                    if scorer.enabled:
                        try:
                            staged.append(await self._score(scorer, chain, views,
                                                            frozen_ctx.prefix_only() if scorer.prefix_determined
                                                            else frozen_ctx))
                        except Exception:  # this row failed in this scorer, whatever refused it
                            self.count_failure(scorer)
                            raise
            except Exception:
                self.branches_failed += 1
                raise
            finally:
                self._in_flight.discard(scope)
                if not self._in_flight and self._idle is not None:
                    self._idle.set()
        if scope.cancelled_caught or self._state is not RunnerState.OPEN:
            raise RunnerClosedError("PRMRunner was closed while this run was in flight; nothing was committed")
        results = self._commit(chain, staged)
        self.branches_scored += 1
        return results

    async def run_many(self, branches: Sequence[InteractionCache | Sequence[Interaction]],
                       ctx: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None, *,
                       limit: int | None = 64, is_eval: bool = False,
                       return_exceptions: bool = False,
                       progress: Callable[[int, int], None] | None = None) -> list[Any]:
        """Scores many branches concurrently, at most ``limit`` at a time; results in the branches' order.

        Each branch follows ``run``'s rules: it commits all of its scores or none. ``ctx`` is one mapping for
        every branch or one per branch. By default the first failure cancels the branches still running
        (they commit nothing; branches already finished keep their scores) and is raised in an
        ``ExceptionGroup``; with ``return_exceptions`` every branch runs and a failed one's slot holds its
        exception. ``limit`` counts branches; each scorer's calls in flight are bounded by its own
        ``max_concurrency`` (its workers, a judge's limiter). A batched scorer is never starved by it: the
        limit is raised to twice the largest ``max_batch_size`` of the enabled batched scorers, so the next
        batch fills while one is in flight. ``progress(done, total)`` is called as each
        branch finishes (scored or failed). The runner's counters ``branches_scored`` and
        ``branches_failed`` count every run.
        """
        if limit is not None:
            integer("limit", limit, minimum=1)
        branches = list(branches)
        limit = self._branch_limit(limit)
        contexts = list(ctx) if isinstance(ctx, Sequence) else [ctx] * len(branches)
        if len(contexts) != len(branches):
            raise ValueError(f"ctx has {len(contexts)} entries for {len(branches)} branches")
        _refuse_shared_turns(branches)
        results: list[Any] = [None] * len(branches)
        limiter = anyio.Semaphore(limit) if limit is not None and limit < len(branches) else None
        report = guarded_progress(progress)
        finished = [0]

        async def one(i: int) -> None:
            try:
                if limiter is None:  # no slot to wait for: no semaphore round trip per branch
                    results[i] = await self.run(branches[i], contexts[i], is_eval=is_eval)
                else:
                    async with limiter:
                        results[i] = await self.run(branches[i], contexts[i], is_eval=is_eval)
            except Exception as err:
                if not return_exceptions:
                    err.prm_branch = i  # type: ignore[attr-defined]  # (score_arrays names the row from it)
                    raise
                results[i] = err
            finally:
                finished[0] += 1
                if report is not None:
                    report(finished[0], len(branches))

        stop = anyio.Event()

        async def branches_then_stop() -> None:
            try:
                await concurrently([one(i) for i in range(len(branches))], group_one=True)
            finally:
                stop.set()

        try:
            with shared_turns():  # the branches' tasks inherit it
                if self._warned_lag:
                    await branches_then_stop()
                else:
                    async with anyio.create_task_group() as group:
                        group.start_soon(watch_loop, self._warn_lag, stop)
                        await branches_then_stop()
        except ExceptionGroup as outer:
            failed: ExceptionGroup = outer
            while len(failed.exceptions) == 1 and isinstance(failed.exceptions[0], ExceptionGroup):
                failed = failed.exceptions[0]  # the watchdog's task group around the branches' own
            closed = first_in_group(failed, RunnerClosedError)
            if closed is not None:  # a lifecycle error is one type, whatever the path
                raise closed from failed
            if failed is outer:
                raise
            raise failed from None
        return results

    def _branch_limit(self, limit: int | None) -> int | None:
        """``limit``, raised to two batches of the largest enabled batched scorer (see ``run_many``)."""
        sizes = [int(getattr(s, "max_batch_size", 0)) for s in self._scorers if s.enabled and s.executor == "batch"]
        if limit is None or not sizes:
            return limit
        return max(limit, 2 * max(sizes))

    def _warn_lag(self, message: str) -> None:
        if not self._warned_lag:
            self._warned_lag = True
            warnings.warn(message, RuntimeWarning, stacklevel=2)

    def _commit(self, chain: list[Interaction], staged: list[_Staged]) -> list[PRMTurnResult]:
        """Adds every scorer's weighted rewards to the turns, all at once or (non-finite sums) not at all."""
        totals = []
        for i, turn in enumerate(chain):
            if len(staged) == 1 and turn.token_rewards is None:  # the usual case: 0 + the one scorer's rewards
                only = staged[0].weighted[i]  # the stage's own float32 array, checked finite when staged
                totals.append(np.add(only, np.float32(0), out=only))  # as the sum below gives it (-0.0 -> 0.0)
                continue
            total = turn.token_rewards if turn.token_rewards is not None else np.zeros(turn.output_len, np.float32)
            with np.errstate(over="ignore", invalid="ignore"):
                for stage in staged:
                    total = (total + stage.weighted[i]).astype(np.float32)
            if not np.isfinite(total).all():
                names = [stage.scorer.name for stage in staged]
                raise ValueError(f"the committed token rewards of interaction {turn.interaction_id!r} would be "
                                 f"non-finite (the float32 sum over scorers {names} and its earlier rewards "
                                 "overflows); nothing was committed")
            totals.append(total)
        for turn, total in zip(chain, totals):
            turn.token_rewards = total
        results = []
        for stage in staged:
            self._schemas.update(stage.schemas)
            results.extend(stage.results)
        return results

    @staticmethod
    def _chain(branch: InteractionCache | Sequence[Interaction]) -> list[Interaction]:
        if isinstance(branch, InteractionCache):
            branches = branch.branches()
            if len(branches) != 1:
                raise ValueError(f"run() scores one branch, got a session with {len(branches)} branches; clone "
                                 "each with clone_chain(leaf_id) first")
            return branches[0]
        chain = list(branch)
        if not chain or not all(isinstance(t, Interaction) for t in chain):
            raise TypeError("branch must be an InteractionCache or a non-empty sequence of Interactions")
        for parent, child in zip(chain, chain[1:]):
            if child.parent_id != parent.interaction_id:
                raise ValueError(f"branch is not a parent-before-child chain at {child.interaction_id!r}")
        return chain

    async def _evaluate_all(self, scorer: BaseScorer, views: list[Interaction],
                            ctx: Mapping[str, Any]) -> list[Any]:
        if scorer.unit == "trajectory":
            return await self._evaluate_trajectory(scorer, views, ctx)
        return await self._evaluate_turns(scorer, views, ctx)

    async def _evaluate_trajectory(self, scorer: BaseScorer, views: list[Interaction],
                                   ctx: Mapping[str, Any]) -> list[Any]:
        """The whole branch in one call: a mapping of interaction id to reward (missing ids get 0.0)."""
        where = f"the branch ending at {views[-1].interaction_id!r}"
        try:
            mapping = await self._executors[id(scorer)].run((tuple(views), ctx), where)
        except Exception as err:
            _raised_on(err, scorer, where)
            raise
        if mapping is None:
            return [None] * len(views)
        if not isinstance(mapping, Mapping):
            raise TypeError(f"scorer {scorer.name!r}: evaluate_trajectory must return a mapping of interaction "
                            f"id to reward, got {type(mapping).__name__}")
        ids = {view.interaction_id for view in views}
        unknown = sorted(map(str, set(mapping) - ids))
        if unknown:
            raise ValueError(f"scorer {scorer.name!r}: evaluate_trajectory returned unknown interaction ids "
                             f"{short_repr(unknown)}")
        return [scorer.prepare_result(view, mapping.get(view.interaction_id, 0.0), ctx) for view in views]

    async def _evaluate_turns(self, scorer: BaseScorer, views: list[Interaction], ctx: Mapping[str, Any]) -> list[Any]:
        """Every turn concurrently; the first failure cancels the others and is raised."""
        outcomes: list[Any] = [None] * len(views)
        done = [False] * len(views)
        failure: list[BaseException] = []
        executor = self._executors[id(scorer)]
        # An async scorer that keeps BaseScorer's evaluate_result/prepare_result is awaited directly: its raw
        # result is wrapped later only if needed (two allocations fewer per turn on the hot path).
        if scorer.executor == "async" and not _plain(scorer):
            run = self._async_results(scorer, executor)
        else:
            run = executor.run
        prepare = scorer.prepare_result if scorer.executor != "async" and _prepares(scorer) else None

        shared = _SHARED.get() if scorer.prefix_determined else None

        async def score(i: int) -> None:
            view = views[i]
            try:
                origin = view.__dict__.get("_origin") if shared is not None else None
                if origin is None or shared is None:
                    outcome = await run((view, ctx), view)
                else:
                    outcome = await _once(shared, (origin, view.interaction_id, id(scorer)),
                                          lambda: run((view, ctx), view))
                outcomes[i] = outcome if prepare is None else prepare(view, outcome, ctx)
                done[i] = True
            except Exception as err:  # (a cancellation that was asked for passes through)
                _raised_on(err, scorer, f"interaction {view.interaction_id!r}")
                if not failure:
                    failure.append(err)
                raise  # the group cancels the other turns

        try:
            await concurrently([score(i) for i in range(len(views))])
        except Exception:
            if not failure:
                raise
        if failure:
            raise failure[0]
        if not all(done):
            raise RuntimeError(f"scorer {scorer.name!r} was cancelled on {done.count(False)} of {len(views)} turns "
                               "before returning")
        return outcomes

    @staticmethod
    def _async_results(scorer: BaseScorer, executor: Executor) -> Any:
        """An async scorer's ``evaluate_result`` under its executor (its deadline, its slots)."""
        assert isinstance(executor, AsyncExecutor)

        async def run(args: tuple[Any, ...], on: Any) -> Any:
            return await executor.run_call(scorer.evaluate_result(*args), on)
        return run

    async def _score(self, scorer: BaseScorer, chain: list[Interaction], views: list[Interaction],
                     ctx: Mapping[str, Any]) -> _Staged:
        """Evaluates and validates one scorer's results; nothing is committed here."""
        outcomes = await self._evaluate_all(scorer, views, ctx)
        missing = [turn.interaction_id for turn, outcome in zip(chain, outcomes)
                   if outcome is None or (isinstance(outcome, PRMScorerResult) and outcome.reward is None)]
        if missing:
            raise RuntimeError(f"scorer {scorer.name!r} returned None for {len(missing)} of {len(outcomes)} turns "
                               f"(interaction {short_repr(missing[0]) if len(missing) == 1 else short_repr(missing)}), "
                               "which rejects the trajectory (return 0.0 for a real zero)")
        stage = _Staged(scorer)
        seen: set = set()
        raw_allowed = _plain(scorer) and scorer.unit == "turn"
        for turn, outcome in zip(chain, outcomes):
            if isinstance(outcome, PRMScorerResult):
                reward, observations = outcome.reward, outcome.observations
            elif raw_allowed:  # what BaseScorer.prepare_result would have wrapped
                reward, observations = outcome, ()
            else:
                raise TypeError(f"scorer {scorer.name!r} on interaction {turn.interaction_id!r}: evaluate_result "
                                f"must return a PRMScorerResult, got {type(outcome).__name__}")
            weighted, mean = weighted_rewards(scorer, turn, reward)
            for obs in observations:
                self._check_observation(scorer, turn, obs, seen, stage.schemas)
            stage.weighted.append(weighted)
            stage.results.append(PRMTurnResult(scorer.name, turn.interaction_id, scorer.weight, weighted, mean,
                                               observations))
        return stage

    def _check_observation(self, scorer: BaseScorer, turn: Interaction, obs: Any, seen: set,
                           new_schemas: dict) -> None:
        where = f"scorer {scorer.name!r} on interaction {turn.interaction_id!r}"
        if not isinstance(obs, PRMMetricObservation):
            raise TypeError(f"{where}: observations must be PRMMetricObservation, got {type(obs).__name__}")
        if obs.scope == "turn" and obs.target_id != turn.interaction_id:
            raise ValueError(f"{where}: a turn-scope observation must target its own turn, got target "
                             f"{obs.target_id!r}")
        key = (obs.scope, obs.target_id, obs.metric_id)
        if key in seen:
            raise ValueError(f"{where}: observation {key} reported more than once in one scorer run")
        seen.add(key)
        schema_key = (scorer.name, obs.scope, obs.metric_id)
        known = self._schemas.get(schema_key, new_schemas.get(schema_key))
        if known is not None and known != obs.schema:
            raise ValueError(f"{where}: metric {obs.metric_id!r} ({obs.scope}) changed schema from {known} to "
                             f"{obs.schema}; a scorer's metric keeps one value type and aggregation set")
        new_schemas[schema_key] = obs.schema

    async def aclose(self) -> None:
        """Cancels runs in flight (they commit nothing), then closes owned scorers in reverse creation order.

        The first caller runs the cleanup and raises an ``ExceptionGroup`` of the ordinary failures after
        every owned scorer was tried; concurrent callers wait for that cleanup and return. Cancellation
        propagates; the interrupted hook is not retried, and a later call closes the scorers never tried.
        """
        if self._state in (RunnerState.OPEN, RunnerState.INTERRUPTED):
            self._state = RunnerState.CLOSING
        # Runs in flight are cancelled, and waited for, before any scorer is closed; they commit nothing.
        while self._in_flight:
            self._idle = anyio.Event()
            for scope in list(self._in_flight):
                scope.cancel()
            for executor in self._executors.values():  # (calls a run's cancellation does not end: batches)
                executor.abandon()
            await self._idle.wait()
        while self._state is not RunnerState.CLOSED:
            if self._close_event is not None:
                await self._close_event.wait()
                continue
            if self._state is RunnerState.INTERRUPTED:  # a concurrent close was cancelled: resume it
                self._state = RunnerState.CLOSING
            event = self._close_event = anyio.Event()
            errors = self._close_errors = []
            try:
                await self._owned_stack.aclose()
            finally:
                self._after_close()
                self._close_event = None
                event.set()
            if errors:
                raise ExceptionGroup(f"{len(errors)} scorer cleanup hook(s) failed", [e for _, e in errors])

    def _after_close(self) -> None:
        """``CLOSED``, unless a cancellation left scorers never tried (``INTERRUPTED``): a new stack holds them,
        in order, for the next ``aclose``."""
        if self._state is not RunnerState.INTERRUPTED:
            self._state = RunnerState.CLOSED
            return
        untried, self._untried = self._untried, []
        self._owned_stack = contextlib.AsyncExitStack()
        for scorer in reversed(untried):
            self._owned_stack.push_async_callback(self._close_one, scorer)
