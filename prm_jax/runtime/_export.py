"""Exporting scored groups of trajectories, with the semantics of AReaL's v1/v2 proxies, in process.

Agents (or an inference proxy) feed a ``TrajectoryStore`` with token-backed interactions and mark
trajectories ready (a ready trajectory is the branch ending at a leaf). A trainer exports a *group* of
sessions at a time (``export_group``):

- each exported branch is cloned before scoring, so a shared ancestor gets a branch-local score and
  nothing stored changes;
- sessions are scored concurrently, the branches of one session in order; a session is published only when
  every branch scored, and a missing or failed session rejects the whole group (other sessions still
  report their stats; failed ones report none);
- scoring runs before group outcome normalization (population z-score, raw values kept as
  ``original_rewards``); process rewards are never group-normalized;
- an explicit discard skips scoring; with ``remove_session`` sessions are removed on success, on failure and
  on cancellation, except persistent sessions (AReaL's ``__hitl__``, where a caller names it in
  ``persistent``), from which an export consumes only the selected ready trajectory (default: the oldest);
  no key is persistent unless the caller says so;
- a ready trajectory is consumed once: retrying the export of a consumed trajectory finds it missing and
  does not score it again (a lost response is not replayed);
- the export that consumed a session's trajectories owns that session until it finishes: a concurrent or
  retried export of the same group is rejected as missing and its cleanup does not remove sessions that
  another export holds, so exactly one export of the group is accepted, whole.

The result is an ``ExportResult``. With PRM active it carries ``prm_stats``; without PRM that field is
``None`` and the rest is what it would be without this feature.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import anyio
import numpy as np

from prm_jax.config._experiment import ErrorPolicy, ExperimentConfig
from prm_jax.kernels._normalization import proxy_normalize
from prm_jax.kernels._tree import tree_discount
from prm_jax.runtime._batching import pack_branches
from prm_jax.runtime._context import check_metadata
from prm_jax.runtime._group_filters import GroupFilterResult
from prm_jax.runtime._lifecycle import Lifecycle, rolled_back
from prm_jax.runtime._metrics import MetricStats, branch_stats, namespace, trajectory_rewards
from prm_jax.runtime._runner import (
    NOT_SCORER_FAILURES,
    PRMRunner,
    cause_text,
    error_text,
)
from prm_jax.runtime._scoring import PRMTurnResult
from prm_jax.runtime._shared_turns import shared_turns
from prm_jax.runtime._trajectory import BranchSequence, Interaction, InteractionCache, freeze

logger = logging.getLogger(__name__)
HITL_SESSION = "__hitl__"


@dataclasses.dataclass
class _Session:
    cache: InteractionCache = dataclasses.field(default_factory=InteractionCache)
    ready: list[str] = dataclasses.field(default_factory=list)
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


class TrajectoryStore:
    """Sessions of interactions and their ready trajectories.

    Example:
        >>> store = prm_jax.runtime.TrajectoryStore()
        >>> store.add("s", prm_jax.Interaction("t0", [1], [2], reward=1.0))
        >>> store.mark_ready("s", "t0")
        >>> store.keys(), store.ready("s")
        (['s'], ['t0'])
    """

    def __init__(self):
        self._sessions: dict[str, _Session] = {}
        self._held: dict[str, int] = {}  # session key -> exports that consumed from it and have not finished

    def add(self, session_key: str, interaction: Interaction) -> None:
        if not isinstance(session_key, str) or not session_key:
            raise ValueError(f"session_key must be a non-empty string, got {session_key!r}")
        self._sessions.setdefault(session_key, _Session()).cache.add(interaction)

    def mark_ready(self, session_key: str, leaf_id: str) -> None:
        """Marks the branch ending at ``leaf_id`` ready for export (validated as a chain now)."""
        session = self._session(session_key)
        session.cache.chain(leaf_id)
        if leaf_id in session.ready:
            raise ValueError(f"trajectory {leaf_id!r} of session {session_key!r} is already ready")
        session.ready.append(leaf_id)

    def set_metadata(self, session_key: str, metadata: Mapping[str, Any]) -> None:
        """The session's ``metadata`` (``check_metadata``'s rule): every scorer of the session gets it as
        ``ctx["metadata"]``, and its exported trajectories carry it.

        Args:
            metadata: The session's ``metadata`` (a JSON object; ``check_metadata``'s rule).
        """
        if not isinstance(session_key, str) or not session_key:
            raise ValueError(f"session_key must be a non-empty string, got {session_key!r}")
        checked = check_metadata(dict(metadata) if isinstance(metadata, Mapping) else metadata)
        self._sessions.setdefault(session_key, _Session()).metadata = checked

    def metadata(self, session_key: str) -> dict[str, Any]:
        session = self._sessions.get(session_key)
        return session.metadata if session is not None else {}

    def ready(self, session_key: str) -> list[str]:
        return list(self._sessions[session_key].ready) if session_key in self._sessions else []

    def session(self, session_key: str) -> InteractionCache:
        return self._session(session_key).cache

    def has_session(self, session_key: str) -> bool:
        return session_key in self._sessions

    def remove_session(self, session_key: str) -> None:
        self._sessions.pop(session_key, None)

    def hold(self, session_key: str) -> None:
        """Marks a session as being exported: another export's cleanup leaves it alone."""
        self._held[session_key] = self._held.get(session_key, 0) + 1

    def release(self, session_key: str) -> None:
        count = self._held.get(session_key, 0) - 1
        if count > 0:
            self._held[session_key] = count
        else:
            self._held.pop(session_key, None)

    def held(self, session_key: str) -> bool:
        return session_key in self._held

    def keys(self) -> list[str]:
        return list(self._sessions)

    def _session(self, session_key: str) -> _Session:
        try:
            return self._sessions[session_key]
        except KeyError:
            raise KeyError(f"no session {session_key!r} in the store") from None

    def consume(self, session_key: str, select: str | None = None, *, persistent: bool = False) -> list[str]:
        """Consumes the ready trajectories to export: all of them, or only ``select`` (a persistent session:
        only ``select``, by default its oldest).

        Args:
            select: The one leaf id to consume; ``None``: every ready one (a persistent session's oldest).
            persistent: Whether the session stays open for more turns (only one trajectory is consumed).
        """
        session = self._sessions.get(session_key)
        if session is None or not session.ready:
            return []
        if persistent and select is None:
            select = session.ready[0]
        if select is None:
            taken, session.ready = session.ready, []
            return taken
        if select not in session.ready:
            return []
        session.ready.remove(select)
        return [select]


ExportStatus = Literal["accepted", "rejected", "filtered", "discarded"]


@dataclasses.dataclass
class ExportedTrajectory:
    """One exported ready trajectory. With group normalization ``reward`` and ``sequence.reward`` are both
    the normalized reward (``pack_branches([t.sequence ...])`` trains on it) and ``original_reward`` the raw
    one; without it ``original_reward`` is ``None``.

    Attributes:
        session_key: The session's key.
        leaf_id: The branch's leaf id.
        sequence: The branch's concat export (``BranchSequence``).
        reward: Its outcome reward (group-normalized where configured).
        original_reward: The raw outcome reward with group normalization; else ``None``.
        scorer_totals: Each scorer's total weighted reward over the branch; ``None`` without PRM.
        metadata: The session's ``metadata`` (read-only).

    Example:
        >>> import anyio
        >>> store = prm_jax.runtime.TrajectoryStore()
        >>> for key, reward in (("a", 1.0), ("b", 0.0)):
        ...     store.add(key, prm_jax.Interaction(f"{key}0", [1], [2, 3], reward=reward))
        ...     store.mark_ready(key, f"{key}0")
        ...
        >>> result = anyio.run(lambda: prm_jax.runtime.export_group(store, ["a", "b"]))
        >>> [(t.session_key, t.leaf_id, round(t.reward, 4), t.original_reward) for t in result.trajectories]
        [('a', 'a0', 1.0, 1.0), ('b', 'b0', -1.0, 0.0)]
    """

    session_key: str
    leaf_id: str
    sequence: BranchSequence
    reward: float | None
    original_reward: float | None = None
    scorer_totals: dict[str, float] | None = None  # per scorer, its turn rewards summed (PRM active)
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the session's (read-only)


class PRMStats(NamedTuple):
    """A group's process-reward results: each scored session's per-turn results (every branch's, in order),
    each branch's totals per scorer (``{session: {leaf: {scorer: total}}}``) and the metrics.

    Attributes:
        turn_results: Each scored session's per-turn results (every branch's, in order), by session key.
        branch_totals: Each branch's totals per scorer, ``{session: {leaf: {scorer: total}}}``.
        metrics: The group's metrics (``MetricStats``).

    Example:
        >>> import anyio
        >>> store = prm_jax.runtime.TrajectoryStore()
        >>> for key, reward in (("a", 1.0), ("b", 0.0)):
        ...     store.add(key, prm_jax.Interaction(f"{key}0", [1], [2, 3], reward=reward))
        ...     store.mark_ready(key, f"{key}0")
        ...
        >>> async def main():
        ...     async with prm_jax.PRMRunner(scorers=[prm_jax.scorers.LengthBudgetScorer(max_output_tokens=1)]) as runner:
        ...         return await prm_jax.runtime.export_group(store, ["a", "b"], runner=runner)
        ...
        >>> anyio.run(main).prm_stats.branch_totals
        {'a': {'a0': {'length_budget': 0.0}}, 'b': {'b0': {'length_budget': 0.0}}}
    """

    turn_results: dict[str, list[PRMTurnResult]]
    branch_totals: dict[str, dict[str, dict[str, float]]]
    metrics: MetricStats


@dataclasses.dataclass
class ExportResult:
    """What ``export_group`` did with a group.

    ``rejected_sessions`` maps a session key to why it was rejected; ``prm_stats`` (PRM active only) holds
    the ``MetricStats``, the per-turn results and the branch totals (``PRMStats``); ``prm_fallbacks``
    (``error_policy: keep_original`` only) maps a session key to why it was exported unscored; ``filter`` is
    the group filter's decision with AReaL's counters (a ``GroupFilterResult``, with a ``group_filter`` only).

    Attributes:
        status: ``accepted`` or ``rejected`` (the whole group).
        trajectories: The exported trajectories (``ExportedTrajectory``), one per ready leaf.
        rejected_sessions: Each rejected session's key and why.
        prm_stats: The process-reward results and metrics (``PRMStats``), with PRM active; else ``None``.
        prm_fallbacks: Sessions exported unscored under ``error_policy: keep_original``, with why; else ``None``.
        filter: The group filter's decision (``GroupFilterResult``), with a ``group_filter``; else ``None``.

    Example:
        >>> import anyio
        >>> store = prm_jax.runtime.TrajectoryStore()
        >>> for key, reward in (("a", 1.0), ("b", 0.0)):
        ...     store.add(key, prm_jax.Interaction(f"{key}0", [1], [2, 3], reward=reward))
        ...     store.mark_ready(key, f"{key}0")
        ...
        >>> result = anyio.run(lambda: prm_jax.runtime.export_group(store, ["a", "b"]))
        >>> result.status, [round(t.reward, 4) for t in result.trajectories], result.rejected_sessions
        ('accepted', [1.0, -1.0], {})
    """

    status: ExportStatus = "accepted"
    trajectories: list[ExportedTrajectory] = dataclasses.field(default_factory=list)
    rejected_sessions: dict[str, str] = dataclasses.field(default_factory=dict)
    prm_stats: PRMStats | None = None
    prm_fallbacks: dict[str, str] | None = None
    filter: GroupFilterResult | None = None


@dataclasses.dataclass
class _Scored:
    key: str
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    sequences: list[BranchSequence] = dataclasses.field(default_factory=list)
    turn_results: list[list[PRMTurnResult]] = dataclasses.field(default_factory=list)
    error: BaseException | None = None
    fallback: str | None = None  # error_policy keep_original: why the session is exported unscored
    raw_rewards: list[float | None] | None = None  # before the turn discount, when one is applied


async def _score_session(store: TrajectoryStore, key: str, leaves: list[str], runner: PRMRunner | None,
                         is_eval: bool, error_policy: ErrorPolicy = "reject", discounted: bool = False) -> _Scored:
    metadata = store.metadata(key)
    scored = _Scored(key, freeze(metadata))
    try:
        for leaf in leaves:
            clone = store.session(key).clone_chain(leaf)
            if runner is not None:
                try:
                    scored.turn_results.append(await runner.run(clone, {"session_key": key, "metadata": metadata},
                                                                is_eval=is_eval))
                except NOT_SCORER_FAILURES:
                    raise
                except Exception as err:  # a scorer failed (cancellation is no Exception: never caught here)
                    if error_policy != "keep_original":
                        raise
                    return _unscored(store, key, leaves, err, discounted)
            scored.sequences.append(_exported(clone, key, leaf, discounted))
    except Exception as err:
        err.add_note(f"while scoring session {key!r}")
        scored.error = err
    return scored


def _exported(clone: InteractionCache, key: str, leaf: str, discounted: bool = False) -> BranchSequence:
    """The branch's concat export; it needs an outcome reward unless the turn discount gives it one (an
    unset reward counts 0 there, AReaL's rule)."""
    sequence = clone.to_sequence(leaf)
    if sequence.reward is None and not discounted:
        raise ValueError(f"trajectory {leaf!r} of session {key!r} has no outcome reward")
    return sequence


def _unscored(store: TrajectoryStore, key: str, leaves: list[str], error: Exception, discounted: bool) -> _Scored:
    """AReaL's ``keep_original`` fallback: the session's whole pre-scoring export (fresh clones of every
    branch: the original outcome and token rewards, nothing of a partly scored branch)."""
    scored = _Scored(key, freeze(store.metadata(key)), fallback=error_text(error))
    try:
        scored.sequences = [_exported(store.session(key).clone_chain(leaf), key, leaf, discounted) for leaf in leaves]
    except Exception as err:
        err.add_note(f"while exporting session {key!r} unscored after a scorer failed: {error!r}")
        scored.error, scored.fallback = err, None
    return scored


def _prm_stats(scored: list[_Scored], is_eval: bool) -> PRMStats:
    stats = MetricStats()
    turns: dict[str, list[PRMTurnResult]] = {}
    totals: dict[str, dict[str, dict[str, float]]] = {}
    for session in scored:
        if session.fallback is not None:
            stats.add(f"{namespace(is_eval)}/prm_fallback", 1.0, averaged=False)
        if session.error is not None or session.fallback is not None:
            continue
        turns[session.key] = [r for branch in session.turn_results for r in branch]
        totals[session.key] = {}
        for seq, branch in zip(session.sequences, session.turn_results):
            totals[session.key][seq.leaf_id] = trajectory_rewards(branch)
            stats.merge(branch_stats(branch, is_eval=is_eval))
    return PRMStats(turns, totals, stats)


def _filter_view(trajectories: list[ExportedTrajectory]) -> dict[str, Any]:
    """The group as the filters read it: padded rows, normalized and raw outcome rewards."""
    group = pack_branches([t.sequence for t in trajectories], bucket=1)
    group["rewards"] = np.array([t.reward for t in trajectories])
    group["original_rewards"] = np.array([t.reward if t.original_reward is None else t.original_reward
                                          for t in trajectories])
    return group


async def export_group(store: TrajectoryStore, session_keys: Sequence[str], *, runner: PRMRunner | None = None,
                       is_eval: bool = False, remove_session: bool = True, discard: bool = False,
                       normalize_rewards: bool = True, select: Mapping[str, str] | None = None,
                       group_filter: Callable[[Mapping[str, Any]], GroupFilterResult] | None = None,
                       persistent: Collection[str] = (), error_policy: ErrorPolicy = "reject",
                       turn_discount: float | None = None) -> ExportResult:
    """Exports one group of sessions (see the module docstring).

    Args:
      store: where the sessions live.
      session_keys: the group's sessions.
      runner: the PRM runner; ``None`` or an inactive runner exports without scoring (and without
        ``prm_stats``).
      is_eval: evaluation rollouts (metric namespace ``eval-rollout``).
      remove_session: remove the group's sessions afterwards (never a persistent one).
      discard: drop the group without scoring.
      normalize_rewards: group outcome normalization after scoring, ``(r - mean) / (population std + 1e-8)``
        (the proxy's rule; ``AdvantageConfig.reward_norm`` is AReaL's other one: use one, not both).
      select: session key -> the one ready trajectory to export (a persistent session defaults to its oldest).
      group_filter: e.g. ``filter_mixed_or_penalized_all_wrong``, applied to the complete accepted group;
        its decision and AReaL's counters are returned in ``filter``.
      error_policy: ``reject`` (a failing scorer rejects the group) or ``keep_original`` (AReaL PR #1747:
        that session is exported as it was before scoring, counted in ``prm_fallback`` and listed in
        ``prm_fallbacks`` with its reason; its sessions report no other stats).
      turn_discount: AReaL's ``turn_discount``: each exported trajectory's reward becomes its last
        interaction's reward discounted per tree, ``r(n) = raw(n) + turn_discount * mean over n's children
        of r`` (``prm_jax.credit.tree_discount``; a leaf keeps its own reward, so it changes the reward of a
        ready trajectory that ends at a turn with children); ``original_reward`` keeps the raw reward.
      persistent: keys of persistent sessions (AReaL's human-in-the-loop session: ``(HITL_SESSION,)``),
        never removed and exported one ready trajectory at a time. Default none: every key, ``__hitl__``
        included, is an ordinary session.

    Returns:
      an ``ExportResult``: ``status``, the accepted ``trajectories`` (``ExportedTrajectory``),
      ``rejected_sessions``, and ``prm_stats`` with PRM active.

    Example:
        >>> import anyio
        >>> store = prm_jax.runtime.TrajectoryStore()
        >>> for key, reward in (("a", 1.0), ("b", 0.0)):
        ...     store.add(key, prm_jax.Interaction(f"{key}0", [1], [2, 3], reward=reward))
        ...     store.mark_ready(key, f"{key}0")
        ...
        >>> result = anyio.run(lambda: prm_jax.runtime.export_group(store, ["a", "b"]))
        >>> result.status, [round(t.reward, 4) for t in result.trajectories]
        ('accepted', [1.0, -1.0])
    """
    keys = list(session_keys)
    if len(set(keys)) != len(keys):
        raise ValueError(f"session_keys must be distinct, got {keys}")
    with_prm = runner is not None and runner.active
    result = ExportResult()
    # The sessions this export consumed from are its own until it finishes: a concurrent or retried
    # export of the same group finds them missing and, when cleaning up, leaves them to this one.
    owned: list[str] = []
    try:
        taken = {key: store.consume(key, (select or {}).get(key), persistent=key in persistent) for key in keys}
        for key, leaves in taken.items():
            if leaves:
                store.hold(key)
                owned.append(key)
        missing = {key: "missing: no such session or no ready trajectory" for key, leaves in taken.items()
                   if not leaves}
        if discard or missing:
            # A missing session rejects the group whatever the others score: spare the judges.
            result.status = "discarded" if discard else "rejected"
            result.rejected_sessions = {} if discard else missing
            if with_prm:
                result.prm_stats = _prm_stats([], is_eval)
            return result
        scored = await _score_sessions(store, taken, runner if with_prm else None, is_eval, error_policy,
                                       turn_discount is not None)
        result.rejected_sessions = {key: f"failed: {cause_text(s.error)}" for key, s in scored.items() if s.error}
        if with_prm:
            result.prm_stats = _prm_stats(list(scored.values()), is_eval)
            if error_policy == "keep_original":
                result.prm_fallbacks = {key: s.fallback for key, s in scored.items() if s.fallback is not None}
        if result.rejected_sessions:
            result.status = "rejected"
            return result
        if turn_discount is not None:
            _discount(store, scored, turn_discount)
        return _publish(result, scored, normalize_rewards, group_filter)
    finally:
        _release(store, [key for key in keys if key not in persistent], owned, remove_session)


async def _score_sessions(store: TrajectoryStore, taken: dict[str, list[str]], runner: PRMRunner | None,
                          is_eval: bool, error_policy: ErrorPolicy, discounted: bool) -> dict[str, _Scored]:
    """Scores every session concurrently (the branches of one session in order), in the keys' order."""
    scored: dict[str, _Scored] = {}

    async def score(key: str) -> None:
        scored[key] = await _score_session(store, key, taken[key], runner, is_eval, error_policy, discounted)

    with shared_turns():  # a prefix-determined scorer scores a turn its session's branches share once
        async with anyio.create_task_group() as tg:
            for key in taken:
                tg.start_soon(score, key)
    return {key: scored[key] for key in taken}


def _discount(store: TrajectoryStore, scored: dict[str, _Scored], gamma: float) -> None:
    """Each exported sequence's reward becomes its leaf's tree-discounted reward; the raw one is kept aside."""
    for key, session in scored.items():
        turns = list(store.session(key))
        index = {turn.interaction_id: i for i, turn in enumerate(turns)}
        size = max(8, 1 << (len(turns) - 1).bit_length())  # a few padded sizes: a few compiled programs
        parent = np.full(size, -1, np.int32)
        raw = np.zeros(size, np.float32)
        for i, turn in enumerate(turns):
            parent[i] = index[turn.parent_id] if turn.parent_id in index else -1
            raw[i] = 0.0 if turn.reward is None else turn.reward  # an unset reward counts 0 (AReaL's None)
        discounted = np.asarray(tree_discount(parent, raw, gamma, mask=np.arange(size) < len(turns)))
        session.raw_rewards = [0.0 if seq.reward is None else seq.reward for seq in session.sequences]
        session.sequences = [dataclasses.replace(seq, reward=float(discounted[index[seq.leaf_id]]))
                             for seq in session.sequences]


def _publish(result: ExportResult, scored: dict[str, _Scored], normalize_rewards: bool,
             group_filter: Callable[[Mapping[str, Any]], GroupFilterResult] | None) -> ExportResult:
    """Group outcome normalization, then the group filter, on a group whose sessions all scored."""
    trajectories = [ExportedTrajectory(key, seq.leaf_id, seq, seq.reward,
                                       None if session.raw_rewards is None else session.raw_rewards[i],
                                       scorer_totals=trajectory_rewards(session.turn_results[i])
                                       if i < len(session.turn_results) else None, metadata=session.metadata)
                    for key, session in scored.items() for i, seq in enumerate(session.sequences)]
    if normalize_rewards:
        # One place holds the reward a batch is built from: the sequence carries the normalized one too.
        for t, value in zip(trajectories, proxy_normalize([t.reward for t in trajectories])):
            t.original_reward = t.reward if t.original_reward is None else t.original_reward
            t.reward = float(value)
            t.sequence = dataclasses.replace(t.sequence, reward=float(value))
    if group_filter is not None:
        decision = group_filter(_filter_view(trajectories))
        result.filter = decision
        if not decision.accepted:
            result.status = "filtered"
            return result
    result.trajectories = trajectories
    return result


def _release(store: TrajectoryStore, keys: list[str], owned: list[str], remove_session: bool) -> None:
    """Releases this export's sessions; removes ``keys`` (never one another export holds)."""
    for key in owned:
        store.release(key)
    if remove_session:
        for key in keys:
            if key in owned or not store.held(key):
                store.remove_session(key)


class ExportService(Lifecycle):
    """The store plus its PRM runner and clients, with the v1/v2 start-up and shutdown order.

    v1 builds the runner synchronously (``PRMRunner(config)``, no start-up rollback); v2 builds it with
    ``await PRMRunner.create(config)``. Its one exit stack (``Lifecycle``) holds the clients' ``aclose``
    (registered first) and the runner's (last), so shutdown closes the runner first, then the clients,
    which are closed even when scorer cleanup fails. A start-up error unwinds the same stack (the clients)
    and is re-raised unchanged, with cleanup failures attached as notes. An async context manager; entering
    it after close is refused, as ``PRMRunner`` refuses it.

    Args:
        config: The experiment configuration (its PRM section builds the runner).
        runner: The PRM runner (``None``: no process rewards); the service closes it.
        clients: Other clients the service closes at shutdown, after the runner.

    Example:
        >>> import anyio
        >>> async def main():
        ...     config = prm_jax.config.ExperimentConfig()
        ...     async with await prm_jax.runtime.ExportService.start(config) as service:
        ...         service.store.add("a", prm_jax.Interaction("a0", [1], [2], reward=1.0))
        ...         service.store.mark_ready("a", "a0")
        ...         return (await service.export(["a"], normalize_rewards=False)).status
        ...
        >>> anyio.run(main)
        'accepted'
    """

    CLOSE_FAILED = "export service shutdown failed"

    def __init__(self, config: ExperimentConfig, runner: PRMRunner | None, clients: Sequence[Any]):
        self._open()
        self.config = config
        self.runner = runner
        self.clients = list(clients)
        self.store = TrajectoryStore()
        for client in self.clients:
            self._owns(f"client {client!r}", client.aclose)
        if runner is not None:
            self._owns("the PRM runner", runner.aclose)

    @classmethod
    async def start(cls, config: ExperimentConfig, *, clients: Sequence[Any] = ()) -> ExportService:
        """The service started in the config's order (v1: the runner built synchronously; v2: ``await
        PRMRunner.create``); a start-up failure closes what was opened, the clients included, and is raised.

        Args:
            config: The experiment configuration (its PRM section builds the runner).
            clients: Other clients the service closes at shutdown, after the runner.
        """
        service = cls(config, None, clients)
        async with rolled_back(service._stack, lambda: service._cleanup_notes("after the failed start-up")):
            if config.prm.active:
                service.runner = (await PRMRunner.create(config) if config.rollout.version == "v2"
                                  else PRMRunner(config))
                service._owns("the PRM runner", service.runner.aclose)
        return service

    async def export(self, session_keys: Sequence[str], **kwargs: Any) -> ExportResult:
        """``export_group`` with this service's runner and the config's ``error_policy``; refused once the
        service's close has started (``RunnerClosedError``).

        Args:
            session_keys: The group's sessions, by key.
            kwargs: ``export_group``'s other keyword arguments (``group_filter``, ``normalize_rewards``, ...);
                ``error_policy`` and ``turn_discount`` default to the config's.
        """
        self._refuse_unless_open("export() is rejected once aclose() has started")
        kwargs.setdefault("error_policy", self.config.prm.error_policy)
        kwargs.setdefault("turn_discount", self.config.turn_discount)
        return await export_group(self.store, session_keys, runner=self.runner, **kwargs)
