"""The scorer contract: what a process-reward scorer implements and what it may return.

A scorer scores every turn of one branch. ``evaluate`` returns an *unweighted* score per turn: a float,
broadcast over the turn's output tokens, or an array of shape ``[output_len]`` that keeps token positions.
``None`` or an exception rejects the trajectory; a real zero is ``0.0``. The runner multiplies by the
scorer's ``weight`` and adds the contributions of all scorers into the turn's ``token_rewards``.

Scorers receive read-only inputs (``Interaction.readonly()``, an immutable ``ctx``) and one instance serves
concurrent sessions: keep request state inside the coroutine.

Each scorer class declares its *kind*: its ``unit`` (a call scores one ``turn`` or a whole ``trajectory``)
and its ``executor`` (how a call runs; ``prm_jax.runtime._dispatch.EXECUTORS`` holds one executor per kind):

==========================  ==============  ===========  =====================================================
base class                  unit            executor     for
==========================  ==============  ===========  =====================================================
``BaseScorer``              turn            async        I/O on the event loop (``async def evaluate``)
``BaseTrajectoryScorer``    trajectory      async        the same, one call per branch
``SyncScorer``              turn            thread,      plain ``def evaluate``: blocking I/O (``thread``),
                                            process or   CPU-bound Python that holds the GIL (``process``),
                                            ray          the same on a Ray cluster's actors (``ray``)
``SyncTrajectoryScorer``    trajectory      thread,      the same, one call per branch
                                            process or
                                            ray
``BatchScorer``             turn            batch        ``async def evaluate_batch(items)``: the turns of
                                                         concurrent branches in one call (a GPU model, a
                                                         server that takes batches)
``BatchTrajectoryScorer``   trajectory      batch        the same, whole branches (a causal PRM scores every
                                                         turn of a branch from its leaf)
==========================  ==============  ===========  =====================================================

A plain ``def evaluate`` on an async base (or ``async def`` on a synchronous one) is refused when the
scorer is built, naming the base to use.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, get_args

import numpy as np

from prm_jax._validation import boolean, deadline, finite_number, integer, one_of, scorer_weight
from prm_jax.runtime._settings import Settings, args_section, settings_constructor
from prm_jax.runtime._trajectory import Interaction

Unit = Literal["turn", "trajectory"]
ExecutorKind = Literal["async", "thread", "process", "ray", "batch"]
SyncExecutor = Literal["thread", "process", "ray"]
SYNC_EXECUTORS: tuple[SyncExecutor, ...] = get_args(SyncExecutor)

Scope = Literal["turn", "trajectory"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
ValueType = Literal["float", "boolean"]
VALUE_TYPES: tuple[ValueType, ...] = get_args(ValueType)
AGGREGATIONS = {"boolean": ("count", "rate"), "float": ("sum", "mean")}


@dataclasses.dataclass(frozen=True)
class PRMMetricObservation:
    """One structured monitoring value, unweighted. A turn-scope observation targets its own turn.

    Args:
        metric_id: The metric's name (``checked/passed``); its statistics are reported under it.
        scope: ``turn`` (one turn's value) or ``trajectory`` (one branch's).
        target_id: The turn's id (``turn`` scope) or the branch's leaf id (``trajectory``).
        value: The value: a finite float, or a bool for ``value_type: boolean``.
        value_type: ``float`` or ``boolean``.
        aggregations: How values are reduced: ``sum`` and ``mean`` for floats, ``count`` and ``rate`` for booleans.

    Example:
        >>> seen = prm_jax.PRMMetricObservation("checked/passed", "turn", "t0", True, "boolean", ("count", "rate"))
        >>> seen.metric_id, seen.value
        ('checked/passed', True)
    """

    metric_id: str
    scope: str
    target_id: str
    value: float | bool
    value_type: str
    aggregations: tuple[str, ...]

    def __post_init__(self):
        for key in ("metric_id", "target_id"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ValueError(f"PRMMetricObservation.{key} must be a non-empty string, got {getattr(self, key)!r}")
        one_of("PRMMetricObservation.scope", self.scope, SCOPES)
        one_of("PRMMetricObservation.value_type", self.value_type, VALUE_TYPES)
        aggregations = (self.aggregations,) if isinstance(self.aggregations, str) else tuple(self.aggregations)
        object.__setattr__(self, "aggregations", aggregations)
        if not aggregations:
            raise ValueError(f"metric {self.metric_id!r}: aggregations must not be empty")
        if len(set(aggregations)) != len(aggregations):
            raise ValueError(f"metric {self.metric_id!r}: aggregations must be unique, got {aggregations}")
        allowed = AGGREGATIONS[self.value_type]
        bad = [a for a in aggregations if a not in allowed]
        if bad:
            raise ValueError(f"metric {self.metric_id!r}: a {self.value_type} observation allows only {allowed}, "
                             f"got {bad}")
        if self.value_type == "boolean":
            if not isinstance(self.value, (bool, np.bool_)):
                raise ValueError(f"metric {self.metric_id!r}: a boolean value must be a bool, got {self.value!r}")
            object.__setattr__(self, "value", bool(self.value))
        else:
            if isinstance(self.value, (bool, np.bool_)) or not isinstance(self.value, (int, float, np.number)) \
                    or not math.isfinite(float(self.value)):
                raise ValueError(f"metric {self.metric_id!r}: a float value must be a finite, non-bool number, got "
                                 f"{self.value!r}")
            object.__setattr__(self, "value", float(self.value))

    @property
    def schema(self) -> tuple[str, tuple[str, ...]]:
        return self.value_type, self.aggregations


@dataclasses.dataclass(frozen=True)
class PRMScorerResult:
    """A scorer's raw (unweighted) reward for one turn plus its observations.

    Args:
        reward: The raw (unweighted) score: a float for the turn, an ``[output_len]`` array, or ``None`` (rejects the
            branch).
        observations: Its monitoring values (``PRMMetricObservation``).

    Example:
        >>> class Checked(prm_jax.BaseScorer):
        ...     name = "checked"
        ...     async def evaluate(self, interaction, ctx):
        ...         return 1.0
        ...     def prepare_result(self, interaction, raw, ctx):
        ...         seen = prm_jax.PRMMetricObservation("checked/passed", "turn", interaction.interaction_id, raw == 1.0,
        ...                                             "boolean", ("rate",))
        ...         return prm_jax.PRMScorerResult(raw, (seen,))
        ...
        >>> with prm_jax.BlockingRunner(scorers=[Checked()]) as runner:
        ...     rewards = runner.score_arrays(np.array([[1, 2]]), np.array([[-1, 0]]))
        ...
        >>> rewards.tolist()
        [[0.0, 1.0]]
    """

    reward: Any
    observations: tuple[PRMMetricObservation, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "observations", tuple(self.observations))


@dataclasses.dataclass(frozen=True, slots=True)
class PRMTurnResult:
    """What one scorer committed to one turn: the weighted token rewards and the turn metric.

    Attributes:
        scorer: The scorer's ``name``.
        interaction_id: The turn's id.
        reward: The turn metric: the mean of the weighted token rewards over its tokens.
        observations: The scorer's monitoring values for the turn.

    Example:
        >>> scorer = prm_jax.scorers.LengthBudgetScorer(max_output_tokens=2, weight=0.5)
        >>> with prm_jax.BlockingRunner(scorers=[scorer]) as runner:
        ...     results = runner.run([prm_jax.Interaction("t0", [1], [2, 3])])
        ...
        >>> [(r.scorer, r.interaction_id, r.weight, r.token_rewards.tolist(), r.reward) for r in results]
        [('length_budget', 't0', 0.5, [0.5, 0.5], 0.5)]
    """

    scorer: str
    interaction_id: str
    weight: float
    token_rewards: np.ndarray  # weight * raw, float32 [output_len]
    reward: float              # mean over the turn's tokens of weight * raw
    observations: tuple[PRMMetricObservation, ...] = ()


class BaseScorer:
    """Subclass, set a unique class-level ``name`` and implement ``async evaluate(interaction, ctx)``.

    ``ctx`` holds ``messages`` (the branch's full conversation), ``is_eval`` and the caller's context.
    Override ``prepare_result`` or ``evaluate_result`` to return ``PRMScorerResult(reward, observations)``
    for structured monitoring, and ``aclose`` to release what the scorer owns.

    Args:
        kwargs: Refused, naming them: a subclass consumes its own keyword arguments before calling this constructor.

    Example:
        >>> class Short(prm_jax.BaseScorer):
        ...     name = "short"
        ...     async def evaluate(self, interaction, ctx):
        ...         return 1.0 if interaction.output_len <= 2 else 0.0
        ...
        >>> with prm_jax.BlockingRunner(scorers=[Short(weight=2.0)]) as runner:
        ...     rewards = runner.score_arrays(np.array([[1, 2, 3, 4], [1, 2, 3, 4]]), np.array([[-1, 0, 0, -1], [-1, 0, 0, 0]]))
        ...
        >>> rewards.tolist()
        [[0.0, 2.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    """

    name: ClassVar[str] = ""
    unit: ClassVar[Unit] = "turn"
    # True when a turn's score depends only on the turn and what came before it (its input and output, the
    # read-only ctx the caller gives every branch alike), never on the branch's later turns: the runner then
    # scores a turn shared by several clones of one session once per run_many and gives each the same score.
    prefix_determined: ClassVar[bool] = False
    executor: ExecutorKind = "async"  # a class attribute (SyncScorer's instances may set their own)
    # The scorer's own settings, declared once (``prm_jax.runtime._settings``): a class that sets it gets a
    # constructor taking the record's fields (then the base class's arguments, ``base_defaults`` over their
    # defaults), ``self.settings`` holding them, ``validate_kwargs`` building the record, and its docstring's
    # ``Args`` generated from the fields' sentences.
    settings_class: ClassVar[type[Settings] | None] = None
    base_defaults: ClassVar[Mapping[str, Any]] = {}
    settings: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        record = cls.__dict__.get("settings_class")
        if record is None:
            return
        if "__init__" in cls.__dict__:
            raise TypeError(f"{cls.__name__} declares settings_class: its constructor is generated from the record "
                            "(build what else it needs in prepare())")
        cls.__init__ = settings_constructor(cls, record, cls.base_defaults, BaseScorer)  # type: ignore[method-assign]
        if cls.__doc__ and "Args:" not in cls.__doc__:
            cls.__doc__ = _with_section(cls.__doc__, args_section(record))

    def __init__(self, weight: float = 1.0, enabled: bool = True, timeout: float | None = None,
                 max_concurrency: int | None = None, **kwargs: Any):
        if not isinstance(type(self).name, str) or not type(self).name:
            raise ValueError(f"{type(self).__name__} must set a non-empty class-level name")
        type(self).check_kind()
        boolean(f"scorer {self.name!r}: enabled", enabled, config=False)
        if kwargs:
            raise TypeError(f"scorer {self.name!r} got unexpected keyword arguments {sorted(kwargs)}")
        self.weight = scorer_weight(f"scorer {self.name!r}: weight", weight)
        self.enabled = enabled
        # Seconds per evaluate / evaluate_trajectory call under a runner (None: no deadline); a config
        # entry's ``timeout`` wins for the scorers a runner builds.
        self.timeout = deadline(f"scorer {self.name!r}: timeout", timeout)
        # Calls of this scorer in flight at once, across every run of a runner (None: unbounded for async
        # scorers; a synchronous scorer is bounded by its workers).
        self.max_concurrency = None if max_concurrency is None else integer(
            f"scorer {self.name!r}: max_concurrency", max_concurrency, minimum=1)

    def prepare(self) -> None:
        """What a scorer that declares ``settings_class`` builds from ``self.settings`` once it is constructed
        (a client, a model); its generated constructor calls it last. Call ``super().prepare()`` first."""

    @classmethod
    def check_kind(cls) -> None:
        """The class's methods match its kind: ``TypeError`` naming the base class to use otherwise (called
        when a scorer is built and by ``check_scorer_specs``)."""
        _require_async(cls, "evaluate_trajectory" if cls.unit == "trajectory" else "evaluate",
                       "SyncTrajectoryScorer" if cls.unit == "trajectory" else "SyncScorer")

    @classmethod
    def validate_kwargs(cls, **kwargs: Any) -> None:
        """Checks a config entry's ``kwargs`` for this class without acquiring anything (no client, no
        connection, no file): ``validate-config`` and ``prm-jax score``'s preflight call it, so a bad value
        is reported before anything is scored. Raise ``ValueError`` or ``TypeError`` naming the argument; a
        constructor should call it too, so each rule has one home. The default builds the class's declared
        settings (``settings_class``) from their keys and accepts everything else.

        Args:
            kwargs: A config entry's ``kwargs``, as written.
        """
        record = cls.settings_class
        if record is not None:
            keys = set(record.keys())
            record.build({k: v for k, v in kwargs.items() if k in keys})

    def validate_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Checks one session's ``metadata`` (what the scorer will read as ``ctx["metadata"]``) before anything
        is scored: ``prm-jax score`` calls it for every session it reads and stops (exit 2, file, line and
        key named) at the first that fails, so a reference a verifier cannot read fails the run up front, not
        its rows one by one. Raise ``ValueError`` naming the key. The default accepts everything.

        Args:
            metadata: One session's ``metadata`` (a JSON object).
        """

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> Any:
        raise NotImplementedError(f"scorer {self.name!r} must implement evaluate(interaction, ctx)")

    def prepare_result(self, interaction: Interaction, raw: Any, ctx: Mapping[str, Any]) -> PRMScorerResult | None:
        """Wraps a raw score; override to attach observations. ``None`` stays ``None`` (a rejection).

        Args:
            raw: What ``evaluate`` returned (a float, an ``[output_len]`` array, ``None`` or a ``PRMScorerResult``).
        """
        if raw is None or isinstance(raw, PRMScorerResult):
            return raw
        return PRMScorerResult(raw)

    async def evaluate_result(self, interaction: Interaction, ctx: Mapping[str, Any]) -> PRMScorerResult | None:
        return self.prepare_result(interaction, await self.evaluate(interaction, ctx), ctx)

    async def aclose(self) -> None:
        """Cleanup hook (default no-op): flush buffers, join writers, close owned clients, with bounded I/O."""


def _with_section(doc: str, section: str) -> str:
    """``doc`` with ``section`` (a generated ``Args:``) after its summary paragraph, indented as ``doc`` is."""
    lines = doc.expandtabs().splitlines()
    indent = min((len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()), default=0)
    body = "\n".join(" " * indent + line for line in section.splitlines())
    head, sep, tail = doc.partition("\n\n")
    return f"{head}\n\n{body}\n\n{tail}" if sep else f"{head}\n\n{body}\n"


class BaseTrajectoryScorer(BaseScorer):
    """Scores a whole branch at once: ``evaluate_trajectory`` maps interaction ids to unweighted rewards.

    Ids it leaves out get 0.0; an unknown id is a ``ValueError``; a non-mapping is a ``TypeError``.

    Args:
        kwargs: The base class's keyword arguments (``weight``, ``enabled``, ``timeout``, ``max_concurrency``); any
            other is refused, naming it.

    Example:
        >>> class LastTurn(prm_jax.BaseTrajectoryScorer):
        ...     name = "last_turn"
        ...     async def evaluate_trajectory(self, interactions, ctx):
        ...         return {interactions[-1].interaction_id: 1.0}
        ...
        >>> with prm_jax.BlockingRunner(scorers=[LastTurn()]) as runner:
        ...     rewards = runner.score_arrays(np.array([[1, 2, 3, 4, 5]]), np.array([[-1, 0, 0, 1, 1]]))
        ...
        >>> rewards.tolist()
        [[0.0, 0.0, 0.0, 1.0, 1.0]]
    """

    unit: ClassVar[Unit] = "trajectory"

    async def evaluate_trajectory(self, interactions: Sequence[Interaction],
                                  ctx: Mapping[str, Any]) -> Mapping[str, Any] | None:
        raise NotImplementedError(f"scorer {self.name!r} must implement evaluate_trajectory(interactions, ctx)")

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> Any:
        raise RuntimeError(f"trajectory scorer {self.name!r} scores whole branches: the runner calls "
                           "evaluate_trajectory, not evaluate")


def _require_async(cls: type, method: str, sync_base: str) -> None:
    function = getattr(cls, method, None)
    if function is not None and not inspect.iscoroutinefunction(function):
        raise TypeError(f"scorer class {cls.__name__}: {method} is a plain function, but {cls.__name__} derives "
                        f"from an async base class, whose {method} the runner awaits; derive from "
                        f"prm_jax.runtime.{sync_base} (executor 'thread' or 'process') for synchronous code, or "
                        f"make it 'async def'")


def _require_sync(cls: type, method: str, async_base: str) -> None:
    function = getattr(cls, method, None)
    if function is not None and inspect.iscoroutinefunction(function):
        raise TypeError(f"scorer class {cls.__name__}: {method} is 'async def', but {cls.__name__} derives from a "
                        f"synchronous base class, whose {method} runs in a worker thread or process; derive from "
                        f"prm_jax.runtime.{async_base} for async code, or make it a plain 'def'")


def usable_cores() -> int:
    """The cores this process may use (its CPU affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers(executor: str) -> int | None:
    """Workers of a synchronous scorer by default: the cores this process may use for ``process``
    (CPU-bound work), as many threads as Python's ``ThreadPoolExecutor`` would start for ``thread``, and for
    ``ray`` None (the executor starts as many actors as the cluster's CPUs hold at ``num_cpus`` each)."""
    if executor == "ray":
        return None
    cores = usable_cores()
    return cores if executor == "process" else min(32, cores + 4)


DEFAULT_PLACEMENT_TIMEOUT_S = 60.0  # how long a ray executor's actor may wait for the cluster to place it
DEFAULT_CONNECT_TIMEOUT_S = 30.0  # how long joining a Ray cluster at ray_address may take before it fails
RAY_SETTINGS = ("ray_address", "num_cpus", "actor_options", "placement_timeout", "connect_timeout")  # executor 'ray' only
EXECUTOR_SETTINGS = ("executor", "max_workers", *RAY_SETTINGS)  # a SyncScorer's (validate_executor's arguments)


class SyncScorer(BaseScorer):
    """A scorer whose ``evaluate(interaction, ctx)`` is a plain function, run off the event loop.

    ``executor`` (a class attribute, or the constructor's / a config entry's ``kwargs.executor``):
    ``"thread"`` (default; blocking I/O, or code that releases the GIL) runs calls in worker threads;
    ``"process"`` (CPU-bound Python that holds the GIL) in worker processes, each holding a pickled copy of
    the scorer (its class must be importable and its state picklable). ``max_workers`` defaults to the
    cores for ``process`` and ``min(32, cores + 4)`` threads.

    Deadlines (``timeout``) start when a worker starts the call, never while it waits for a worker. Past its
    deadline a ``process`` call's worker is ended (and replaced); a ``thread`` call is reported as timed out
    and its result, when the thread finishes, is discarded (a thread cannot be stopped).

    Args:
        kwargs: The base class's keyword arguments (``weight``, ``enabled``, ``timeout``, ``max_concurrency``); any
            other is refused, naming it.

    Example:
        >>> class SmallTokens(prm_jax.SyncScorer):
        ...     name = "small_tokens"
        ...     def evaluate(self, interaction, ctx):
        ...         return float(sum(int(t) < 10 for t in interaction.output_tokens))
        ...
        >>> with prm_jax.BlockingRunner(scorers=[SmallTokens(executor="thread", max_workers=2)]) as runner:
        ...     rewards = runner.score_arrays(np.array([[1, 2, 30]]), np.array([[-1, 0, 0]]))
        ...
        >>> rewards.tolist()
        [[0.0, 1.0, 1.0]]
    """

    executor: ExecutorKind = "thread"

    def __init__(self, executor: ExecutorKind | None = None, max_workers: int | None = None,
                 ray_address: str | None = None, num_cpus: float | None = None,
                 actor_options: Mapping[str, Any] | None = None, placement_timeout: float | None = None,
                 connect_timeout: float | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        type(self).validate_executor(executor=executor, max_workers=max_workers, ray_address=ray_address,
                                     num_cpus=num_cpus, actor_options=actor_options,
                                     placement_timeout=placement_timeout, connect_timeout=connect_timeout)
        self.executor = executor or type(self).executor
        self.max_workers = default_workers(self.executor) if max_workers is None else max_workers
        self.ray_address = ray_address
        self.num_cpus = 1.0 if num_cpus is None else float(num_cpus)
        self.actor_options = dict(actor_options or {})
        self.placement_timeout = DEFAULT_PLACEMENT_TIMEOUT_S if placement_timeout is None else float(placement_timeout)
        self.connect_timeout = DEFAULT_CONNECT_TIMEOUT_S if connect_timeout is None else float(connect_timeout)

    @classmethod
    def validate_executor(cls, executor: Any = None, max_workers: Any = None, ray_address: Any = None,
                          num_cpus: Any = None, actor_options: Any = None, placement_timeout: Any = None,
                          connect_timeout: Any = None) -> None:
        """The executor settings, checked without starting anything. ``ray_address``, ``num_cpus``,
        ``actor_options``, ``placement_timeout`` and ``connect_timeout`` (seconds joining the cluster at
        ``ray_address`` may take, default 30) are the ``ray`` executor's: given with another executor they
        are refused, naming both keys."""
        if executor is not None:
            one_of("executor", executor, SYNC_EXECUTORS)
        if max_workers is not None:
            integer("max_workers", max_workers, minimum=1)
        given = dict(zip(RAY_SETTINGS, (ray_address, num_cpus, actor_options, placement_timeout, connect_timeout),
                         strict=True))
        kind = executor or cls.executor
        stray = [key for key, value in given.items() if value is not None]
        if stray and kind != "ray":
            raise ValueError(f"{stray[0]} applies to executor 'ray' only, and executor is {kind!r} (set "
                             "executor: ray, or leave it out)")
        if ray_address is not None and (not isinstance(ray_address, str) or not ray_address.strip()):
            raise ValueError(f"ray_address must be a non-empty string ('auto', 'ray://host:10001', "
                             f"'host:6379'), got {ray_address!r}")
        if num_cpus is not None:
            finite_number("num_cpus (the CPUs each actor reserves)", num_cpus, positive=True)
        if placement_timeout is not None:
            deadline("placement_timeout", placement_timeout)
        if connect_timeout is not None:
            deadline("connect_timeout", connect_timeout)
        if actor_options is not None:
            if not isinstance(actor_options, Mapping) or not all(isinstance(k, str) for k in actor_options):
                raise TypeError(f"actor_options must be a mapping of Ray actor options (resources, num_gpus, "
                                f"runtime_env, ...), got {type(actor_options).__name__}")
            owned = sorted(set(actor_options) & {"num_cpus", "max_restarts", "max_task_retries", "max_concurrency"})
            if owned:
                raise ValueError(f"actor_options: {owned} are set by the ray executor itself (num_cpus is its own "
                                 "setting; restarts and retries are its rules, one call at a time per actor)")

    @classmethod
    def check_kind(cls) -> None:
        if cls.executor not in SYNC_EXECUTORS:
            raise TypeError(f"scorer class {cls.__name__}: executor must be one of {SYNC_EXECUTORS}, got "
                            f"{cls.executor!r}")
        if cls.unit == "turn":
            _require_sync(cls, "evaluate", "BaseScorer")

    def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> Any:
        raise NotImplementedError(f"scorer {self.name!r} must implement evaluate(interaction, ctx)")


class SyncTrajectoryScorer(SyncScorer):
    """``SyncScorer`` for whole branches: a plain ``evaluate_trajectory(interactions, ctx)`` returns a
    mapping of interaction id to unweighted reward (as ``BaseTrajectoryScorer``'s).

    Args:
        kwargs: The base class's keyword arguments (``weight``, ``enabled``, ``timeout``, ``max_concurrency``); any
            other is refused, naming it.

    Example:
        >>> class TurnIndex(prm_jax.SyncTrajectoryScorer):
        ...     name = "turn_index"
        ...     def evaluate_trajectory(self, interactions, ctx):
        ...         return {turn.interaction_id: float(k) for k, turn in enumerate(interactions)}
        ...
        >>> with prm_jax.BlockingRunner(scorers=[TurnIndex(executor="thread")]) as runner:
        ...     rewards = runner.score_arrays(np.array([[1, 2, 3, 4, 5]]), np.array([[-1, 0, 0, 1, 1]]))
        ...
        >>> rewards.tolist()
        [[0.0, 0.0, 0.0, 1.0, 1.0]]
    """

    unit: ClassVar[Unit] = "trajectory"

    @classmethod
    def check_kind(cls) -> None:
        super().check_kind()
        _require_sync(cls, "evaluate_trajectory", "BaseTrajectoryScorer")

    def evaluate_trajectory(self, interactions: Sequence[Interaction],
                            ctx: Mapping[str, Any]) -> Mapping[str, Any] | None:
        raise NotImplementedError(f"scorer {self.name!r} must implement evaluate_trajectory(interactions, ctx)")


DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_MAX_WAIT_S = 0.005


class BatchScorer(BaseScorer):
    """Scores the turns of concurrent branches together: ``async evaluate_batch(items)`` gets a list of
    ``(interaction, ctx)`` pairs and returns one score per item, in order (each as ``evaluate`` would).

    The runner gathers turns from every branch in flight (``run_many``, ``score_arrays``, a group's export,
    ``prm-jax score``) into batches of at most ``max_batch_size`` items, waiting at most ``max_wait``
    seconds for a batch to fill, and calls once per batch; ``timeout`` bounds one batch call. A failed
    call fails exactly the branches with an item in it. ``pads = True`` (a class attribute) says the scorer
    pads its items to the longest: the runner then sorts a batch's items by length (results come back in
    the original order). ``max_concurrency`` bounds the batch calls in flight.

    Args:
        kwargs: The base class's keyword arguments (``weight``, ``enabled``, ``timeout``, ``max_concurrency``); any
            other is refused, naming it.

    Example:
        >>> class Lengths(prm_jax.BatchScorer):
        ...     name = "lengths"
        ...     async def evaluate_batch(self, items):
        ...         return [float(turn.output_len) for turn, ctx in items]
        ...
        >>> with prm_jax.BlockingRunner(scorers=[Lengths(max_batch_size=64)]) as runner:
        ...     rewards = runner.score_arrays(np.array([[1, 2, 3], [1, 2, 2]]), np.array([[-1, 0, 0], [-1, -1, 0]]))
        ...     calls = runner.scorer_stats()["lengths"]["calls"]
        ...
        >>> rewards.tolist(), calls
        ([[0.0, 2.0, 2.0], [0.0, 0.0, 1.0]], 1)
    """

    executor: ExecutorKind = "batch"
    pads: ClassVar[bool] = False

    def __init__(self, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, max_wait: float = DEFAULT_MAX_WAIT_S,
                 **kwargs: Any):
        super().__init__(**kwargs)
        type(self).validate_batching(max_batch_size=max_batch_size, max_wait=max_wait)
        self.max_batch_size, self.max_wait = max_batch_size, float(max_wait)

    @classmethod
    def validate_kwargs(cls, **kwargs: Any) -> None:
        """``BaseScorer.validate_kwargs``, and the batching settings.

        Args:
            kwargs: A config entry's ``kwargs``, as written (``max_batch_size`` and ``max_wait`` checked here).
        """
        super().validate_kwargs(**kwargs)
        cls.validate_batching(**{k: kwargs[k] for k in ("max_batch_size", "max_wait") if k in kwargs})

    @classmethod
    def validate_batching(cls, max_batch_size: Any = DEFAULT_MAX_BATCH_SIZE, max_wait: Any = DEFAULT_MAX_WAIT_S) -> None:
        integer("max_batch_size", max_batch_size, minimum=1)
        finite_number("max_wait", max_wait, minimum=0.0, maximum=60.0)

    @classmethod
    def check_kind(cls) -> None:
        if not inspect.iscoroutinefunction(getattr(cls, "evaluate_batch", None)):
            raise TypeError(f"scorer class {cls.__name__}: evaluate_batch must be 'async def' (a batched "
                            "scorer's calls run on the event loop; put blocking work in a thread)")

    async def evaluate_batch(self, items: Sequence[tuple[Interaction, Mapping[str, Any]]]) -> Sequence[Any]:
        raise NotImplementedError(f"scorer {self.name!r} must implement evaluate_batch(items)")

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> Any:
        """One turn alone: a batch of one."""
        return (await self.evaluate_batch([(interaction, ctx)]))[0]


class BatchTrajectoryScorer(BatchScorer):
    """``BatchScorer`` for whole branches: ``evaluate_batch(items)`` gets ``(interactions, ctx)`` pairs, one
    per branch (root first), and returns one mapping of interaction id to unweighted reward per item.

    Args:
        kwargs: The base class's keyword arguments (``weight``, ``enabled``, ``timeout``, ``max_concurrency``); any
            other is refused, naming it.

    Example:
        >>> class Turns(prm_jax.BatchTrajectoryScorer):
        ...     name = "turns"
        ...     async def evaluate_batch(self, items):
        ...         return [{turn.interaction_id: float(len(turns)) for turn in turns} for turns, ctx in items]
        ...
        >>> with prm_jax.BlockingRunner(scorers=[Turns()]) as runner:
        ...     rewards = runner.score_arrays(np.array([[1, 2, 3, 4], [1, 2, 3, 4]]), np.array([[-1, 0, 1, 1], [-1, 0, 0, 0]]))
        ...
        >>> rewards.tolist()
        [[0.0, 2.0, 2.0, 2.0], [0.0, 1.0, 1.0, 1.0]]
    """

    unit: ClassVar[Unit] = "trajectory"

    async def evaluate_batch(self, items: Sequence[tuple[Sequence[Interaction], Mapping[str, Any]]]  # type: ignore[override]
                             ) -> Sequence[Mapping[str, Any] | None]:
        raise NotImplementedError(f"scorer {self.name!r} must implement evaluate_batch(items)")

    async def evaluate_trajectory(self, interactions: Sequence[Interaction],
                                  ctx: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return (await self.evaluate_batch([(tuple(interactions), ctx)]))[0]
