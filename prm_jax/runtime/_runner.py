"""The scorer runner: builds scorers from config, scores branches, commits token rewards, closes scorers.

Scoring a branch (``run``): scorers run in config order (disabled ones skipped); within a scorer every turn
is evaluated concurrently, and a failure cancels its siblings. A scorer's results are all validated
(type, shape ``(output_len,)``, finite ``raw`` and ``raw * weight``, observation rules, stable metric
schemas) before any is committed; committing adds ``weight * raw`` to each turn's float32 ``token_rewards``
(``runtime.evaluation``: one scorer on one branch, and the commit; ``runtime.shared_turns``: a turn shared
by clones of one session scored once by a prefix-determined scorer).

Lifecycle: scorers built from config are *owned* (disabled ones too) and closed by ``aclose`` in reverse
creation order, each at most once; instances passed in are *borrowed* and never closed here.
``await PRMRunner.create(config)`` rolls back (closes the owned scorers built so far) when start-up fails;
the synchronous ``PRMRunner(config)`` is kept for compatibility without that rollback (AReaL's v1
start-up; with borrowed scorers only there is nothing to roll back), and warns (``ResourceWarning``, naming
them) when a failed start-up leaves owned scorers unclosed. The lifecycle is ``prm_jax.runtime._lifecycle.Lifecycle``'s
(one exit stack of the owned scorers and every executor; ``RunnerState``: ``OPEN``, ``CLOSING``,
``INTERRUPTED``, a cancelled close the next one resumes, ``CLOSED``); closing first cancels runs in flight.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from prm_jax._validation import integer
from prm_jax.config._experiment import PRMSection
from prm_jax.errors import NotScorableError, RunnerClosedError
from prm_jax.runtime import _evaluation as evaluation
from prm_jax.runtime._concurrency import concurrently
from prm_jax.runtime._context import ScorerContext
from prm_jax.runtime._dispatch import make_executor
from prm_jax.runtime._executors import Executor
from prm_jax.runtime._lifecycle import Lifecycle, RunnerState, first_in_group, rolled_back
from prm_jax.runtime._scoring import (
    BaseScorer,
    PRMTurnResult,
)
from prm_jax.runtime._shared_turns import shared_turns
from prm_jax.runtime._specs import as_section, check_scorer_specs
from prm_jax.runtime._trajectory import Interaction, InteractionCache, require_scorable
from prm_jax.runtime._watchdog import watch_loop
from prm_jax.runtime._worker import WORKER_TRACEBACK_NOTE

logger = logging.getLogger(__name__)


BUILDING_NOTE = "while building the scorer of"


# Errors of a run that no scorer caused: AReaL's ``error_policy: keep_original`` never falls back on them.
NOT_SCORER_FAILURES: tuple[type[BaseException], ...] = (RunnerClosedError, NotScorableError)


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


class PRMRunner(Lifecycle):
    """Runs configured scorers over branches and commits their weighted token rewards.

    ``config`` names the scorers to build (owned: closed by ``aclose``); ``scorers`` are instances the caller
    owns (borrowed: run after the configured ones, never closed here). An async context manager:
    ``async with await PRMRunner.create(config) as runner: ...`` closes it on exit.

    Args:
        config: What names the scorers to build (owned: closed by ``aclose``): an ``ExperimentConfig``, a
            ``PRMConfig``, a mapping of either, or ``None``.
        scorers: Scorer instances the caller owns (borrowed: run after the configured ones, never closed here).

    Example:
        >>> import anyio
        >>> class Half(prm_jax.BaseScorer):
        ...     name = "half"
        ...     async def evaluate(self, interaction, ctx):
        ...         return 0.5
        ...
        >>> async def main():
        ...     async with prm_jax.PRMRunner(scorers=[Half()]) as runner:
        ...         return await prm_jax.score_arrays(runner, np.array([[1, 2, 3]]), np.array([[-1, 0, 0]]))
        ...
        >>> anyio.run(main).tolist()
        [[0.0, 0.5, 0.5]]
    """

    def __init__(self, config: Any = None, *, scorers: Sequence[BaseScorer] = ()):
        self._init_state()
        try:
            self._build(as_section(config, scorers), scorers)
        except Exception:
            # (AReaL's v1 semantics) no rollback here (it would have to await); but never a silent leak.
            built = [s.name for s in self._scorers if not any(s is b for b in scorers)]
            if built:
                warnings.warn(f"PRMRunner(config) failed at start-up and leaves the {len(built)} scorer(s) it "
                              f"built unclosed: {built}; `await PRMRunner.create(config)` closes them",
                              ResourceWarning, stacklevel=2)
            raise

    @classmethod
    async def create(cls, config: Any = None, *, scorers: Sequence[BaseScorer] = ()) -> PRMRunner:
        """Builds and validates; on failure closes the owned scorers built so far, then re-raises.

        Args:
            config: What names the scorers to build (owned): an ``ExperimentConfig``, a ``PRMConfig``, a mapping of
                either, or ``None``.
            scorers: Scorer instances the caller owns (borrowed).
        """
        runner = cls.__new__(cls)
        runner._init_state()
        async with rolled_back(runner._stack, lambda: runner._cleanup_notes("after the failed start-up")):
            runner._build(as_section(config, scorers), scorers)
        return runner

    def _init_state(self) -> None:
        # Each owned scorer's aclose (and each executor's) is registered as it is built (Lifecycle._owns):
        # start-up rollback and aclose() both unwind the one stack.
        self._open()
        self._scorers: list[BaseScorer] = []
        self._schemas: dict[tuple[str, str, str], tuple[str, tuple[str, ...]]] = {}
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
            except Exception as err:  # re-raised as it is (AReaL's v1 semantics), with the entry named
                err.add_note(f"{BUILDING_NOTE} rollout.agent.prm.scorers[{i}] ({entry.path})")
                raise
            self._owns(f"scorer {scorer.name!r}", scorer.aclose)
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
        self._owns(f"the executor of scorer {scorer.name!r}", executor.aclose)
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
        running branches call this; ``run`` counts its own).

        Args:
            scorer: The scorer that failed a row.
        """
        self._executors[id(scorer)].count_failure()

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
        self._refuse_unless_open("run() is rejected once aclose() has started")
        chain = self._chain(branch)
        require_scorable(chain, NotScorableError)
        assert self.config is not None  # set by _build
        if not self.config.enabled:
            return []
        frozen_ctx = ScorerContext(ctx, chain[-1], is_eval)
        views = [turn.readonly(k) for k, turn in enumerate(chain)]
        staged: list[evaluation.Staged] = []
        with anyio.CancelScope() as scope:
            self._in_flight.add(scope)
            try:
                for scorer in self._scorers:
                    if scorer.enabled:
                        try:
                            staged.append(await evaluation.staged(
                                scorer, self._executors[id(scorer)], chain, views,
                                frozen_ctx.prefix_only() if scorer.prefix_determined else frozen_ctx, self._schemas))
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
        results = evaluation.commit(chain, staged, self._schemas)
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

        Args:
            branches: The branches to score: each an ``InteractionCache`` holding one root-to-leaf chain, or the chain
                itself.
            limit: The most branches scored at once, >= 1; ``None``: all at once.
            return_exceptions: Whether every branch runs and a failed one's slot holds its exception (else the first
                failure cancels the rest and is raised).
            progress: Called as ``progress(done, total)`` as branches finish; ``None``: not called.
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

    CLOSE_FAILED = "{count} scorer cleanup hook(s) failed"

    async def _before_close(self) -> None:
        """Runs in flight are cancelled, and waited for, before any scorer is closed; they commit nothing."""
        while self._in_flight:
            self._idle = anyio.Event()
            for scope in list(self._in_flight):
                scope.cancel()
            for executor in self._executors.values():  # (calls a run's cancellation does not end: batches)
                executor.abandon()
            await self._idle.wait()
