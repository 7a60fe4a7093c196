"""Scoring sessions: read, score with the configured scorers, export group by group, pack, compute the
advantages, summarize. ``score(config, sessions) -> ScoreRun`` is the whole job of ``prm-jax score``
without its command line (arguments, signals, the output set and process tuning stay in ``cli``)."""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import jax
import numpy as np

from prm_jax._validation import cut_at_word
from prm_jax.app.sessions import SessionRecord, read_sessions
from prm_jax.config._experiment import ExperimentConfig
from prm_jax.errors import InputError, NoGroupAccepted, ScoreError
from prm_jax.kernels._advantages import compute_advantage_variants, compute_advantages
from prm_jax.kernels._diagnostics import STATISTICS
from prm_jax.kernels._estimator_registry import registered
from prm_jax.kernels._plan import STAGE_DIAGNOSTICS
from prm_jax.kernels._schema import MODEL_OUTPUT_KEYS
from prm_jax.kernels._shaping import SHAPING_MODES
from prm_jax.runtime._batching import bucket_width, pack_branches
from prm_jax.runtime._export import ExportedTrajectory, ExportResult, ExportService
from prm_jax.runtime._group_filters import (
    filter_function,
    filter_mixed_or_penalized_all_wrong,
    filter_mixed_or_penalized_all_wrong_mask_no_eos,
)
from prm_jax.runtime._metrics import InMemoryRecorder
from prm_jax.runtime._runner import BUILDING_NOTE
from prm_jax.runtime._scoring import BaseScorer
from prm_jax.runtime._specs import enabled_scorer_names
from prm_jax.runtime._trajectory import MODEL_OUTPUT_FIELDS

FILTERS: dict[str, Callable] = {
    "filter_function": filter_function,
    "mixed_or_penalized_all_wrong": filter_mixed_or_penalized_all_wrong,
    "mixed_or_penalized_all_wrong_mask_no_eos": filter_mixed_or_penalized_all_wrong_mask_no_eos,
}


GROUPS_IN_FLIGHT = 8  # groups exported at once: their branches share batched scorers' calls and judges' slots


async def _export_all(config: ExperimentConfig, records: list[SessionRecord], group_filter: Callable | None,
                      progress: Callable[[int], None] | None, path: str = "<sessions>") -> Exported:
    try:
        service = await ExportService.start(config)
    except Exception as err:  # a scorer's constructor: the config's fault, named (exit 2)
        where = [note for note in getattr(err, "__notes__", ()) if note.startswith(BUILDING_NOTE)]
        if not where:
            raise
        raise ScoreError(f"{where[0][len(BUILDING_NOTE):].strip()} could not be built: "
                       f"{type(err).__name__}: {err}") from None
    recorder = InMemoryRecorder()
    groups: OrderedDict[str, list[str]] = OrderedDict()
    for record in records:
        for interaction in record.cache:
            service.store.add(record.key, interaction)
        if record.metadata:
            service.store.set_metadata(record.key, record.metadata)
        for leaf in record.ready:
            service.store.mark_ready(record.key, leaf)
        groups.setdefault(record.group, []).append(record.key)
    out = Exported()
    results: dict[str, Any] = {}
    slots = anyio.Semaphore(GROUPS_IN_FLIGHT)

    async def export(group: str, keys: list[str]) -> None:
        async with slots:
            results[group] = await service.export(keys, group_filter=group_filter)
        if progress is not None:
            progress(len(keys))

    async with service:
        try:
            check_session_metadata(records, [] if service.runner is None else service.runner.scorers, path)
        except InputError as err:
            raise ScoreError(str(err)) from None
        try:
            async with anyio.create_task_group() as task_group:  # a failure cancels the rest
                for group, keys in groups.items():
                    task_group.start_soon(export, group, keys)
        except BaseExceptionGroup as failed:
            if len(failed.exceptions) == 1 and isinstance(failed.exceptions[0], Exception):
                raise failed.exceptions[0] from None  # one group's failure, as exporting one by one raised it
            raise
        if service.runner is not None:
            out.scorer_stats = plain_stats(service.runner.scorer_stats())
    for group, keys in groups.items():  # in the input's order, whatever finished first
        result = results[group]
        out.statuses[group] = result.status
        if result.status != "accepted":
            out.reasons[group] = Rejection(result.status, keys, _rejection_reason(result))
        if result.filter is not None:
            for name, value in result.filter._asdict().items():
                if name != "accepted":
                    out.filter_counters[name] = out.filter_counters.get(name, 0) + int(value)
        if result.prm_stats is not None:
            recorder.record(result.prm_stats.metrics)
        out.fallbacks.update({key: shorten(why) for key, why in (result.prm_fallbacks or {}).items()})
        if result.status == "accepted":
            out.accepted.append(result.trajectories)
    out.metrics = recorder.flush()
    return out


def check_session_metadata(records: list[SessionRecord], scorers: Sequence[Any], path: str) -> None:
    """Every enabled scorer's ``validate_metadata`` on every session's metadata, before anything is scored:
    ``InputError`` at the first session one refuses (a reference answer a verifier cannot read)."""
    checking = [s for s in scorers if s.enabled and type(s).validate_metadata is not BaseScorer.validate_metadata]
    for record in records:
        for scorer in checking:
            try:
                scorer.validate_metadata(record.metadata)
            except (ValueError, TypeError) as err:
                raise InputError(path, record.line, "metadata", f"{err} (session {record.key!r})") from None


@dataclasses.dataclass
class Exported:
    """What the export of every group gave: each group's status, the accepted groups' trajectories, the
    metrics, the filter's counters, why groups were not accepted, and the sessions exported unscored
    (``error_policy: keep_original``) with why."""

    statuses: dict[str, str] = dataclasses.field(default_factory=dict)
    accepted: list[list[ExportedTrajectory]] = dataclasses.field(default_factory=list)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    filter_counters: dict[str, int] = dataclasses.field(default_factory=dict)
    reasons: dict[str, Rejection] = dataclasses.field(default_factory=dict)
    fallbacks: dict[str, str] = dataclasses.field(default_factory=dict)
    scorer_stats: dict[str, dict[str, float | None]] = dataclasses.field(default_factory=dict)


def _counted(progress: Callable[[int, int], None], total: int) -> Callable[[int], None]:
    done = 0

    def step(sessions: int) -> None:
        nonlocal done
        done += sessions
        progress(done, total)
    return step


def _rejection_reason(result: ExportResult) -> dict[str, str] | str:
    if result.status == "rejected":
        return {key: shorten(reason) for key, reason in result.rejected_sessions.items()}
    decision = result.filter
    why = ("all correct" if decision is not None and decision.rejected_by_all_correct else
           "all wrong without a process penalty" if decision is not None and decision.rejected_by_all_wrong
           else "rejected")
    return f"filtered: {why}"


def plain_stats(stats: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float | None]]:
    """``scorer_stats()`` as JSON holds it: a latency without calls (NaN) as ``None``."""
    return {name: {key: None if isinstance(v, float) and not math.isfinite(v) else v for key, v in values.items()}
            for name, values in stats.items()}


def stats_text(stats: Mapping[str, float | None]) -> str:
    """One scorer's ``scorer_stats`` in words (the summary's line, the error line without a batch)."""
    def ms(key: str) -> str:
        value = stats.get(key)
        return "-" if value is None else f"{value * 1e3:.1f} ms"

    served = (f", requests {stats['requests_sent']}, retries {stats['retries']}, rate-limit waits "
              f"{stats.get('rate_limit_waits', 0)}" if "requests_sent" in stats else "")
    return (f"calls {stats.get('calls')}, failures {stats.get('failures')}, timeouts {stats.get('timeouts')}, "
            f"latency p50 {ms('latency_p50_s')} p95 {ms('latency_p95_s')}{served}")


def failure_causes(rejections: Mapping[str, Rejection]) -> list[tuple[str, list[str]]]:
    """Each distinct reason sessions were rejected, once, with the sessions it hit (first seen first): a
    judge that is down is one cause, not one line per session."""
    causes: dict[str, list[str]] = {}
    for rejection in rejections.values():
        if isinstance(rejection.reason, dict):
            for session, why in rejection.reason.items():
                causes.setdefault(why, []).append(session)
    return list(causes.items())


def listed(keys: list[str], limit: int = 5) -> str:
    """A few keys, and how many more."""
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def shorten(text: str, limit: int = 600) -> str:
    """``text`` cut to at most ``limit`` characters at a word's end (an error or a reason in the summary)."""
    return cut_at_word(text, limit)


TIMESTEP_FIELDS = ("advantages", "returns", "kl_rewards", "tot_rewards", "loss_mask", "logprobs")


def _advantages(padded: dict[str, np.ndarray], config: ExperimentConfig, rows: int) -> tuple[Any, dict[str, Any]]:
    """The configured run, and for the report the unshaped advantages and each shaping mode's, on a batch
    whose rows are bucketed (padding rows: no attention, ``group_ids`` -1; they change no real row's
    numbers); returns the first ``rows`` rows, as numpy views."""
    arrays = dict(padded)  # groups by group_ids [B], whose shape does not change with the number of groups
    # The masks as bool: pack_branches writes only 0 and 1, so the program needs no 0/1 check of them
    # (0.1 s less to compile). The other buffers are 64-byte aligned: on the CPU the device arrays alias
    # them (no copy of the batch; nothing writes into it from here on).
    for name in ("attention_mask", "loss_mask"):
        arrays[name] = arrays[name] > 0
    arrays = jax.device_put(arrays)
    outputs: dict[str, Any]
    if "token_rewards" in arrays and config.actor.plan.shaping is not None:
        # One GAE for every mode, each with its statistics (the kernel's).
        shapings, refused = config.actor.shaping_variants(SHAPING_MODES)
        configured, variants = compute_advantage_variants(arrays, config.actor, shapings)
        outputs = {**variants, **refused}
    else:
        plan = dataclasses.replace(config.actor.plan, diagnostics=True)  # (the advantages' statistics)
        configured = compute_advantages(arrays, plan)
        outputs = {"none": compute_advantages({k: v for k, v in arrays.items() if k != "token_rewards"}, plan)}
    jax.block_until_ready(configured)

    def real_rows(output: Any) -> Any:
        return output if isinstance(output, str) else output._replace(
            **{field: np.asarray(getattr(output, field))[:rows] for field in TIMESTEP_FIELDS})
    return real_rows(configured), {mode: real_rows(output) for mode, output in outputs.items()}


def _pack(sequences: list, group_sizes: list[int], bucket: int, row_bucket: int,
          process_rewards: bool, sessions: list[str] | None = None) -> dict[str, np.ndarray]:
    """The batch for the device: widths bucketed to ``bucket``, rows to ``row_bucket``, so runs of similar
    size share one compiled program (and hit the persistent compilation cache). Without ``process_rewards``
    (PRM disabled or no scorer) no token reward of the input reaches the batch, nor GiGPO's step rewards."""
    anchored = any(a is not None for seq in sequences for a in seq.anchor_ids)
    batch = pack_branches(sequences, bucket=bucket, rows=bucket_width(len(sequences), row_bucket),
                          group_sizes=group_sizes,
                          token_rewards=process_rewards and any(seq.token_rewards is not None for seq in sequences),
                          per_turn=anchored or any(r is not None for seq in sequences for r in seq.step_rewards),
                          sessions=sessions, model_outputs=any(seq.model_outputs for seq in sequences))
    if not anchored:
        batch.pop("anchor_ids", None)  # no anchors at all: one step group per group (not "every turn alone")
    carried = {key for seq in sequences for key in seq.model_outputs}
    for key in MODEL_OUTPUT_KEYS:  # a model output no session carries is not written (all NaN, it says nothing)
        if key not in carried:
            batch.pop(key, None)
    return batch


def score(config: ExperimentConfig, sessions: str | Path | list[SessionRecord], *, group_filter: str | None = None,
          bucket: int = 128, row_bucket: int = 64, progress: Callable[[int, int], None] | None = None,
          on_arrays: Callable[[dict[str, np.ndarray]], None] | None = None, after_read: Callable[[], None] | None = None,
          release_memory: Callable[[], None] | None = None, source: str | None = None,
          phase: Callable[[str], None] | None = None) -> ScoreRun:
    """Reads (``sessions``: a JSONL path, or records already read), scores, exports, packs and computes the
    advantages; returns the ``ScoreRun``.

    ``group_filter`` names one of ``FILTERS``; widths are padded to a multiple of ``bucket``, rows to one of
    ``row_bucket`` (one compiled program for runs of similar size). ``progress(done, total)`` (sessions) is
    called as groups finish; ``source`` names records' file in errors; ``on_arrays`` gets the output arrays
    as they are ready: the packed batch before the
    advantages are computed, then the timestep arrays before the summary is. ``after_read`` runs once the
    sessions are read and ``release_memory`` once the batch is packed (the command's process tuning);
    ``phase(name)`` as each phase starts (reading, scoring and exporting, packing, advantages).

    Raises:
      ScoreError: bad input (file, line and field named), a scorer that cannot be built, advantages that
        cannot be computed. NoGroupAccepted: every group was rejected or filtered.
    """
    clock = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(done: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[done], clock = now - clock, now
        if phase is not None and done in NEXT_PHASE:
            phase(NEXT_PHASE[done])

    if phase is not None:
        phase("reading sessions")

    try:
        if isinstance(sessions, (str, Path)):
            path = str(sessions)
            records = read_sessions(path, discounted=config.turn_discount is not None)
        else:
            path, records = source or "<sessions>", list(sessions)
        check_model_outputs(records, config, path)
    except InputError as err:
        raise ScoreError(str(err)) from None
    if after_read is not None:
        after_read()
    lap("read")
    groups = list(OrderedDict.fromkeys(r.group for r in records))
    exported = anyio.run(_export_all, config, records, FILTERS[group_filter] if group_filter else None,
                         None if progress is None else _counted(progress, len(records)), path)
    del records  # exported: the sessions' memory is free for the batch and the advantages
    lap("score+export")
    run = _score_batch(exported, groups, config, group_filter, (bucket, row_bucket), lap, on_arrays, release_memory)
    run.summary.timings_s = timings
    return run


# The phase that starts when each timed one ends (``score``'s ``phase`` callback names them as they start).
NEXT_PHASE = {"read": "scoring and exporting", "score+export": "packing the batch", "pack": "computing advantages"}


def _reward_sources(trajectories: list[ExportedTrajectory], rows: int, names: list[str]) -> np.ndarray:
    """GDPO's sources beside the outcome: each enabled scorer's total per trajectory, in the config's order
    (the order ``reward_norm.weights`` follows), NaN where it did not score (a session exported unscored
    under ``keep_original``): the columns are the config's, whatever scored."""
    sources = np.full((rows, len(names)), np.nan, np.float32)
    for b, t in enumerate(trajectories):
        for s, name in enumerate(names):
            sources[b, s] = (t.scorer_totals or {}).get(name, np.nan)
    return sources


def check_model_outputs(records: list[SessionRecord], config: ExperimentConfig, path: str) -> None:
    """A per-token model output that a configured stage reads (``AdvantagePlan.model_outputs_read``) is on
    every turn of every exported branch, or, for the KL reward's reference log-probs, on none of them (the
    reference is then 0, AReaL's rule): some turns without them would train on 0. ``InputError`` at the
    first turn without, before anything is scored."""
    plan = config.actor.plan
    for key in plan.model_outputs_read:
        field = MODEL_OUTPUT_FIELDS[key]
        required = key in plan.estimator_spec.reads
        lacking: tuple[SessionRecord, int] | None = None
        carried = False
        for record in records:
            exported = {turn.interaction_id for leaf in record.ready for turn in record.cache.chain(leaf)}
            for i, turn in enumerate(record.cache):
                if turn.interaction_id not in exported:
                    continue
                if getattr(turn, field) is None:
                    lacking = lacking or (record, i)
                else:
                    carried = True
            if lacking is not None and (required or carried):
                break
        if lacking is not None and (required or carried):
            record, i = lacking
            reader = (f"{plan.estimator_spec.label} reads them on every trained turn" if required else
                      "the KL reward (actor.kl_ctl != 0) reads them, and other turns carry them: give them on every "
                      "turn, or on none (the reference log-prob is then 0, AReaL's rule)")
            raise InputError(path, record.line, f"interactions[{i}].{field}", f"missing: {reader}")


def _score_batch(exported: Exported, groups: list[str], config: ExperimentConfig, group_filter: str | None,
                 buckets: tuple[int, int], lap: Callable[[str], None],
                 on_arrays: Callable[[dict[str, np.ndarray]], None] | None,
                 release_memory: Callable[[], None] | None = None) -> ScoreRun:
    """Packs the accepted groups (and drops their trajectories), computes the advantages, summarizes."""
    statuses, accepted, metrics, reasons = exported.statuses, exported.accepted, exported.metrics, exported.reasons
    trajectories = [t for group in accepted for t in group]
    if not trajectories:
        why = [f"{len(keys)} session(s) ({listed(keys)}): {cause}" for cause, keys in failure_causes(reasons)[:5]]
        why += [f"group {g}: {r.reason}" for g, r in list(reasons.items())[:5] if isinstance(r.reason, str)]
        why += [f"scorer {name!r}: {stats_text(st)}" for name, st in exported.scorer_stats.items()]
        raise NoGroupAccepted(f"no group was accepted ({len(groups)} rejected or filtered): nothing to train on; "
                              + shorten("; ".join(why), 1500))
    rows, group_sizes = len(trajectories), [len(group) for group in accepted]
    per_session = collections.Counter(t.session_key for t in trajectories)  # (a branching session: one row a leaf)
    plan = config.actor.plan
    # What the plan's stages read decides what is packed beyond the rollout (BATCH_SCHEMA's "packed").
    padded = _pack([t.sequence for t in trajectories], group_sizes, *buckets, process_rewards=config.prm.active,
                   sessions=[t.session_key for t in trajectories] if "node_ids" in plan.reads else None)
    sources: list[str] = []
    if "reward_sources" in plan.reads:
        sources = enabled_scorer_names(config) if config.prm.active else []
        padded["reward_sources"] = _reward_sources(trajectories, len(padded["rewards"]), sources)
    # Views: the real rows (node_parents is per node, not per row: kept whole).
    batch = {name: value if name == "node_parents" else value[:rows] for name, value in padded.items()}
    batch["original_rewards"] = np.array([t.reward if t.original_reward is None else t.original_reward
                                          for t in trajectories], np.float32)
    if "reward_sources" in plan.reads:  # the columns of reward_sources, after the outcome
        batch["reward_source_names"] = np.array(["outcome", *sources])
    batch["group_sizes"] = np.array(group_sizes, np.int32)
    del trajectories
    accepted.clear()  # packed: the branch sequences' memory is free for the advantages
    if release_memory is not None:
        release_memory()
    if on_arrays is not None:
        on_arrays(batch)
    lap("pack")
    try:
        configured, outputs = _advantages(padded, config, rows)
    except ValueError as err:  # a value check of the scored batch (e.g. process_weighted's [0, 1] range)
        raise ScoreError(f"the advantages could not be computed: {err}") from None
    if on_arrays is not None:
        on_arrays(timestep_arrays(configured, outputs))
    lap("advantages")
    try:
        stats = {mode: (advantage_stats(out) if not isinstance(out, str) else out) for mode, out in outputs.items()}
    except ValueError as err:  # non-finite advantages: what the scores or inputs hold, said in one line
        raise ScoreError(str(err)) from None
    summary = ScoreSummary(
        groups=GroupCounts(len(groups), *(sum(v == s for v in statuses.values()) for s in ("accepted", "rejected",
                                                                                          "filtered"))),
        trajectories=rows, sessions=len(per_session), branched_sessions=sum(n > 1 for n in per_session.values()),
        shaping_mode=config.actor.advantage_shaping.mode if plan.shaping is not None else "none",
        process_reward_per_scorer={k.rsplit("/", 1)[1]: v for k, v in metrics.items() if "/prm_turn_reward/" in k},
        advantages=stats, group_status=statuses, rejected_groups=reasons,
        prm_fallbacks=exported.fallbacks if config.prm.error_policy == "keep_original" and config.prm.active else None,
        filter=FilterCounts(group_filter, exported.filter_counters) if group_filter else None,
        reward_sources=batch["reward_source_names"].tolist() if "reward_source_names" in batch else None,
        credit=credit_stats(configured.diagnostics) or None)
    hook = plan.estimator_spec.summary
    if hook is not None:
        summary.estimator = {hook.key: hook.stats(configured.diagnostics)}
    lap("summary")
    return ScoreRun(batch, outputs, configured, metrics, summary, exported.scorer_stats)


def timestep_arrays(configured: Any, outputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """The ``timestep_*`` arrays of ``batch.npz``: the configured output's fields and the unshaped advantages."""
    arrays = {f"timestep_{field}": np.asarray(getattr(configured, field)) for field in TIMESTEP_FIELDS}
    arrays["timestep_advantages_unshaped"] = np.asarray(outputs["none"].advantages)
    return arrays


@dataclasses.dataclass(frozen=True)
class GroupCounts:
    total: int
    accepted: int
    rejected: int
    filtered: int


@dataclasses.dataclass(frozen=True)
class Rejection:
    """Why a group was not accepted: ``rejected`` (``reason`` maps each rejected session to why) or
    ``filtered`` (``reason`` says which rule)."""

    status: str
    sessions: list[str]
    reason: dict[str, str] | str


@dataclasses.dataclass(frozen=True)
class FilterCounts:
    """The group filter's name and AReaL's counters, summed over the groups."""

    name: str
    counters: dict[str, int]


@dataclasses.dataclass(frozen=True)
class AdvantageStats:
    """Advantages on trained timesteps: population statistics."""

    mean: float
    std: float
    min: float
    max: float


@dataclasses.dataclass
class ScoreSummary:
    """What a run did, typed; ``as_json()`` is ``metrics.json``'s ``summary``. ``advantages`` per shaping mode
    (and ``none``), a string where a mode does not apply; ``prm_fallbacks`` only under ``error_policy:
    keep_original``; ``filter`` only with a group filter; ``estimator`` the estimator's own summary
    (``EstimatorSpec.summary``: GiGPO's ``gigpo_step_groups``); ``credit`` the credit modes' diagnostics.
    ``trajectories`` is the batch's rows, one per leaf of each accepted session's tree of interactions:
    ``sessions`` accepted sessions, of which ``branched_sessions`` branch (more than one leaf)."""

    groups: GroupCounts
    trajectories: int
    shaping_mode: str
    process_reward_per_scorer: dict[str, float]
    advantages: dict[str, AdvantageStats | str]
    group_status: dict[str, str]
    rejected_groups: dict[str, Rejection]
    prm_fallbacks: dict[str, str] | None = None
    filter: FilterCounts | None = None
    reward_sources: list[str] | None = None
    credit: dict[str, float] | None = None
    estimator: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    timings_s: dict[str, float] = dataclasses.field(default_factory=dict)
    sessions: int | None = None
    branched_sessions: int | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "groups": dataclasses.asdict(self.groups), "trajectories": self.trajectories,
            "sessions": self.sessions, "branched_sessions": self.branched_sessions,
            "shaping_mode": self.shaping_mode, "process_reward_per_scorer": self.process_reward_per_scorer,
            "advantages": {mode: stats if isinstance(stats, str) else dataclasses.asdict(stats)
                           for mode, stats in self.advantages.items()},
            "group_status": self.group_status,
            "rejected_groups": {group: dataclasses.asdict(why) for group, why in self.rejected_groups.items()},
            "timings_s": self.timings_s, **self.estimator}
        if self.prm_fallbacks is not None:
            out["prm_fallbacks"] = self.prm_fallbacks
        if self.filter is not None:
            out["filter"] = {"name": self.filter.name, **self.filter.counters}
        if self.reward_sources is not None:
            out["reward_sources"] = self.reward_sources
        if self.credit is not None:
            out["credit"] = self.credit
        return out


@dataclasses.dataclass
class ScoreRun:
    """A scored run: the packed batch (real rows), each shaping mode's ``AdvantageOutput`` (or why it does
    not apply), the configured one, the scorers' metrics and the summary."""

    batch: dict[str, np.ndarray]
    outputs: dict[str, Any]
    configured: Any
    metrics: dict[str, float]
    summary: ScoreSummary
    scorer_stats: dict[str, dict[str, float | None]] = dataclasses.field(default_factory=dict)  # per scorer


def advantage_stats(output: Any) -> AdvantageStats:
    """The advantages' mean, population std, min and max on trained timesteps (0 each without any), as the
    kernel computed them (``output.diagnostics['advantages/...']``, ``prm_jax.kernels._diagnostics``)."""
    stats = AdvantageStats(*(float(output.diagnostics[f"advantages/{name}"]) for name in STATISTICS))
    if not all(math.isfinite(value) for value in dataclasses.astuple(stats)):
        raise ValueError(f"the advantages are not finite (min {stats.min}, max {stats.max}): the scores or the "
                         "inputs overflow float32")
    return stats


def credit_prefixes() -> tuple[str, ...]:
    """The prefixes of the diagnostics the summary lists under ``credit``: each registered estimator's (but
    those shown their own way, ``EstimatorSpec.summary``) and the stages' (``STAGE_DIAGNOSTICS``)."""
    return tuple(spec.diagnostics for spec in registered()
                 if spec.diagnostics is not None and spec.summary is None) + STAGE_DIAGNOSTICS


def credit_stats(diagnostics: Mapping[str, Any]) -> dict[str, float]:
    """The credit modes' diagnostics (``credit_prefixes``) as plain numbers: what the summary prints for the
    configured mode."""
    prefixes = credit_prefixes()
    return {key: float(value) for key, value in sorted(diagnostics.items()) if key.startswith(prefixes)}
