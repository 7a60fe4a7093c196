"""The ``prm-jax`` command line.

  prm-jax score --config CONFIG.yaml --input SESSIONS.jsonl --output OUT [--overwrite] [--plot FILE.png]
                [--filter NAME]
  prm-jax demo [--output OUT] [--overwrite]
  prm-jax validate-config CONFIG.yaml

``score`` reads sessions (format: ``prm_jax.app.sessions``), scores them with the configured scorers, exports
them group by group, computes advantages with the configured actor settings, and writes ``OUT/batch.npz``
(the padded batch, its advantages and returns) and ``OUT/metrics.json`` (metrics and the summary). Input and
config are validated completely before anything is scored or written; the output set is staged beside
``OUT`` and published at once (``prm_jax.app.outputs``), so a failed or interrupted run leaves nothing behind
and an earlier set in ``OUT`` (replaced only with ``--overwrite``) whole. Exit statuses: 0, 1 (no group
accepted), 2 (bad arguments, config or input), 74 (the output could not be written), 128 + N (signal N).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import dataclasses
import gc
import json
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import anyio
import jax
import numpy as np

from prm_jax._compat import BaseExceptionGroup, add_note, first_in_group
from prm_jax.app.outputs import (
    OUTPUT_SET,
    WRITE_ERRNOS,
    BatchWriter,
    OutputFolderError,
    StagedOutputs,
    check_output_folder,
    current_umask,
    in_folder,
)
from prm_jax.app.report import (
    ScoreRun,
    advantage_stats,
    credit_stats,
    plot,
    print_summary,
    print_turn_table,
)
from prm_jax.app.sessions import InputError, SessionRecord, read_sessions
from prm_jax.config.experiment import ExperimentConfig, ScorerSpec
from prm_jax.config.loader import ConfigFileError, load_config
from prm_jax.kernels.advantages import compute_advantage_variants, compute_advantages
from prm_jax.kernels.shaping import SHAPING_MODES
from prm_jax.native.build import cache_dir
from prm_jax.runtime.batching import bucket_width, pack_branches
from prm_jax.runtime.export import ExportedTrajectory, ExportResult, ExportService
from prm_jax.runtime.filters import (
    filter_function,
    filter_mixed_or_penalized_all_wrong,
    filter_mixed_or_penalized_all_wrong_mask_no_eos,
)
from prm_jax.runtime.metrics import InMemoryRecorder
from prm_jax.runtime.runner import BUILDING_NOTE
from prm_jax.runtime.specs import check_scorer_specs, enabled_scorer_names

FILTERS: dict[str, Callable] = {
    "filter_function": filter_function,
    "mixed_or_penalized_all_wrong": filter_mixed_or_penalized_all_wrong,
    "mixed_or_penalized_all_wrong_mask_no_eos": filter_mixed_or_penalized_all_wrong_mask_no_eos,
}


PUBLISHED_NOTE = "the new output set was published before the interruption"
EXIT_WRITE_FAILED = 74  # sysexits' EX_IOERR: the disk is full or a file-size limit was hit


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class NoGroupAccepted(Exception):
    """Every group was rejected or filtered: nothing to train on (exit status 1)."""


def _load_config(path: str) -> ExperimentConfig:
    """The config, with everything runner start-up would reject checked and no scorer built."""
    try:
        config = load_config(path)
        check_scorer_specs(config)
    except OSError as err:
        raise CLIError(f"{path}: {err.strerror or err}") from None
    except ConfigFileError as err:  # names the file itself
        raise CLIError(str(err)) from None
    except (ValueError, TypeError) as err:
        raise CLIError(f"{path}: {err}") from None
    return config


class Progress:
    """Sessions scored of the total, their rate and the time left, on one line of stderr (only when
    enabled: a terminal, unless ``--no-progress`` or ``--quiet``)."""

    def __init__(self, total: int, enabled: bool, stream=None):
        self.total, self.enabled, self.done = total, enabled, 0
        self.stream = stream or sys.stderr
        self.started = time.perf_counter()

    def step(self, sessions: int = 1) -> None:
        self.done += sessions
        if self.enabled:
            elapsed = max(time.perf_counter() - self.started, 1e-9)
            rate = self.done / elapsed
            left = (self.total - self.done) / rate if rate > 0 else float("inf")
            filled = int(30 * self.done / max(self.total, 1))
            self.stream.write(f"\rscoring [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} sessions, "
                              f"{rate:.1f}/s, ETA {left:.0f} s ")
            if self.done >= self.total:
                self.stream.write("\n")
            self.stream.flush()


GROUPS_IN_FLIGHT = 8  # groups exported at once: their branches share batched scorers' calls and judges' slots


async def _export_all(config: ExperimentConfig, records, group_filter, progress: Progress):
    try:
        service = await ExportService.start(config)
    except Exception as err:  # a scorer's constructor: the config's fault, named (exit 2)
        where = [note for note in getattr(err, "__notes__", ()) if note.startswith(BUILDING_NOTE)]
        if not where:
            raise
        raise CLIError(f"{where[0][len(BUILDING_NOTE):].strip()} could not be built: "
                       f"{type(err).__name__}: {err}") from None
    recorder = InMemoryRecorder()
    groups: OrderedDict[str, list[str]] = OrderedDict()
    for record in records:
        for interaction in record.cache:
            service.store.add(record.key, interaction)
        for leaf in record.ready:
            service.store.mark_ready(record.key, leaf)
        groups.setdefault(record.group, []).append(record.key)
    out = Exported()
    results: dict[str, Any] = {}
    slots = anyio.Semaphore(GROUPS_IN_FLIGHT)

    async def export(group: str, keys: list[str]) -> None:
        async with slots:
            results[group] = await service.export(keys, group_filter=group_filter)
        progress.step(len(keys))

    async with service:
        try:
            async with anyio.create_task_group() as task_group:  # a failure cancels the rest
                for group, keys in groups.items():
                    task_group.start_soon(export, group, keys)
        except BaseExceptionGroup as failed:
            if len(failed.exceptions) == 1 and isinstance(failed.exceptions[0], Exception):
                raise failed.exceptions[0] from None  # one group's failure, as exporting one by one raised it
            raise
    for group, keys in groups.items():  # in the input's order, whatever finished first
        result = results[group]
        out.statuses[group] = result.status
        if result.status != "accepted":
            out.reasons[group] = {"status": result.status, "sessions": keys, "reason": _rejection_reason(result)}
        for name, value in (result.filter or {}).items():
            if name != "accepted":
                out.filter_counters[name] = out.filter_counters.get(name, 0) + int(value)
        if result.prm_stats is not None:
            recorder.record(result.prm_stats["metrics"])
        out.fallbacks.update({key: _shorten(why) for key, why in (result.prm_fallbacks or {}).items()})
        if result.status == "accepted":
            out.accepted.append(result.trajectories)
    out.metrics = recorder.flush()
    return out


@dataclasses.dataclass
class Exported:
    """What the export of every group gave: each group's status, the accepted groups' trajectories, the
    metrics, the filter's counters, why groups were not accepted, and the sessions exported unscored
    (``error_policy: keep_original``) with why."""

    statuses: dict[str, str] = dataclasses.field(default_factory=dict)
    accepted: list[list[ExportedTrajectory]] = dataclasses.field(default_factory=list)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    filter_counters: dict[str, int] = dataclasses.field(default_factory=dict)
    reasons: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    fallbacks: dict[str, str] = dataclasses.field(default_factory=dict)


def _rejection_reason(result: ExportResult) -> Any:
    if result.status == "rejected":
        return {key: _shorten(reason) for key, reason in result.rejected_sessions.items()}
    decision = result.filter or {}
    why = ("all correct" if decision.get("rejected_by_all_correct") else "all wrong without a process penalty"
           if decision.get("rejected_by_all_wrong") else "rejected")
    return f"filtered: {why}"


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


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
    outputs: dict[str, Any] = {}
    if "token_rewards" in arrays and config.actor.plan.shaping is not None:
        # One GAE for every mode.
        shapings, refused = config.actor.shaping_variants(SHAPING_MODES)
        configured, variants = compute_advantage_variants(arrays, config.actor, shapings)
        for mode, advantages in {**variants, **refused}.items():
            outputs[mode] = advantages if isinstance(advantages, str) else configured._replace(advantages=advantages)
    else:
        configured = compute_advantages(arrays, config.actor)
        outputs["none"] = compute_advantages({k: v for k, v in arrays.items() if k != "token_rewards"},
                                             config.actor)
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
                          sessions=sessions, model_logprobs=any(seq.prm_logprobs is not None
                                                                or seq.ref_logprobs is not None for seq in sequences))
    if not anchored:
        batch.pop("anchor_ids", None)  # no anchors at all: one step group per group (not "every turn alone")
    return batch


def run_score(config: ExperimentConfig, input_path: str, *, group_filter: str | None = None, bucket: int = 128,
              row_bucket: int = 64, progress: bool = False, tune_process: bool = False,
              on_arrays: Callable[[dict[str, np.ndarray]], None] | None = None) -> ScoreRun:
    """Reads, scores, exports, packs and computes advantages. ``tune_process`` (the ``prm-jax`` process's
    choice, made in ``entry``: it owns its process; in-process callers keep theirs untouched) moves
    everything read into CPython's permanent generation, so the cyclic collector stops re-walking the
    sessions on every full collection while they are scored, and hands the freed sessions' pages back to
    the system once the batch is packed (``malloc_trim``). ``on_arrays`` gets the
    output arrays as they are ready: the packed batch before the advantages are computed, then the
    timestep arrays before the summary is (the command writes them into ``batch.npz`` meanwhile)."""
    clock = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[phase], clock = now - clock, now

    try:
        records = read_sessions(input_path, discounted=config.turn_discount is not None)
        check_model_outputs(records, config, input_path)
    except InputError as err:
        raise CLIError(str(err)) from None
    if tune_process:
        gc.freeze()
    lap("read")
    groups = list(OrderedDict.fromkeys(r.group for r in records))
    exported = anyio.run(_export_all, config, records, FILTERS[group_filter] if group_filter else None,
                         Progress(len(records), progress))
    del records  # exported: the sessions' memory is free for the batch and the advantages
    lap("score+export")
    run = _score_batch(exported, groups, config, group_filter, (bucket, row_bucket), lap, on_arrays,
                       _release_freed_memory if tune_process else None)
    run.summary["timings_s"] = timings
    return run


def _release_freed_memory() -> None:
    """Hands the pages of freed sessions and branch sequences back to the system (glibc keeps them in its
    heap, where XLA's large allocations never reuse them): a lower peak for the advantages. A no-op
    without glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reward_sources(trajectories: list[ExportedTrajectory], rows: int, names: list[str]) -> np.ndarray:
    """GDPO's sources beside the outcome: each enabled scorer's total per trajectory, in the config's order
    (the order ``reward_norm.weights`` follows), NaN where it did not score (a session exported unscored
    under ``keep_original``): the columns are the config's, whatever scored."""
    sources = np.full((rows, len(names)), np.nan, np.float32)
    for b, t in enumerate(trajectories):
        for s, name in enumerate(names):
            sources[b, s] = (t.scorer_totals or {}).get(name, np.nan)
    return sources


MODEL_OUTPUTS = {"ref_logprobs": "output_ref_logprobs", "prm_logprobs": "output_prm_logprobs"}


def check_model_outputs(records: list[SessionRecord], config: ExperimentConfig, path: str) -> None:
    """A per-token model output that a configured stage reads (``AdvantagePlan.model_outputs_read``) is on
    every turn of every exported branch, or, for the KL reward's reference log-probs, on none of them (the
    reference is then 0, AReaL's rule): some turns without them would train on 0. ``InputError`` at the
    first turn without, before anything is scored."""
    plan = config.actor.plan
    for key in plan.model_outputs_read:
        field = MODEL_OUTPUTS[key]
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
            reader = ("credit_assignment 'prime' reads them on every trained turn" if required else
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
        listed = "; ".join(f"{g}: {r['status']} {r['reason']}" for g, r in list(reasons.items())[:5])
        raise NoGroupAccepted(f"no group was accepted ({len(groups)} rejected or filtered): nothing to train on; "
                              + _shorten(listed, 1000))
    rows, group_sizes = len(trajectories), [len(group) for group in accepted]
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
        raise CLIError(f"the advantages could not be computed: {err}") from None
    if on_arrays is not None:
        on_arrays(timestep_arrays(configured, outputs))
    lap("advantages")
    try:
        stats = {mode: (advantage_stats(out) if not isinstance(out, str) else out) for mode, out in outputs.items()}
    except ValueError as err:  # non-finite advantages: what the scores or inputs hold, said in one line
        raise CLIError(str(err)) from None
    summary = {
        "groups": {"total": len(groups), **{s: sum(v == s for v in statuses.values())
                                            for s in ("accepted", "rejected", "filtered")}},
        "trajectories": rows,
        "shaping_mode": config.actor.advantage_shaping.mode if config.actor.plan.shaping is not None else "none",
        "process_reward_per_scorer": {k.rsplit("/", 1)[1]: v for k, v in metrics.items()
                                      if "/prm_turn_reward/" in k},
        "advantages": stats,
        "group_status": statuses,
        "rejected_groups": reasons,
    }
    if config.prm.error_policy == "keep_original" and config.prm.active:
        summary["prm_fallbacks"] = exported.fallbacks
    if group_filter:
        summary["filter"] = {"name": group_filter, **exported.filter_counters}
    hook = plan.estimator_spec.summary
    if hook is not None:
        summary[hook.key] = hook.stats(configured.diagnostics)
    if "reward_source_names" in batch:
        summary["reward_sources"] = batch["reward_source_names"].tolist()
    credit = credit_stats(configured.diagnostics)
    if credit:
        summary["credit"] = credit
    lap("summary")
    return ScoreRun(batch, outputs, configured, metrics, summary)


def timestep_arrays(configured: Any, outputs: dict[str, Any]) -> dict[str, np.ndarray]:
    arrays = {f"timestep_{field}": np.asarray(getattr(configured, field)) for field in TIMESTEP_FIELDS}
    arrays["timestep_advantages_unshaped"] = np.asarray(outputs["none"].advantages)
    return arrays


def write_outputs(run: ScoreRun, staged: StagedOutputs, plot_path: Path | None = None, compress: bool = False,
                  early: BatchWriter | None = None) -> None:
    """Writes the output set into the staging folder and publishes it (see ``prm_jax.app.outputs``); a plot
    outside the output folder is written beside itself under a temporary name and renamed after."""
    payload = json.dumps({"metrics": run.metrics, "summary": run.summary}, indent=2, sort_keys=True,
                         allow_nan=False).encode()
    if early is not None:  # every array was handed to its writer thread: wait for it
        early.finish()
    else:
        save: Any = np.savez_compressed if compress else np.savez
        with open(staged.path("batch.npz"), "wb") as handle:
            save(handle, **run.batch, **timestep_arrays(run.configured, run.outputs))
    staged.path("metrics.json").write_bytes(payload)
    outside: str | None = None
    try:
        if plot_path is not None and staged.holds(plot_path):
            with open(staged.path(plot_path.name), "wb") as handle:
                plot(run, handle)
        elif plot_path is not None:
            fd, outside = tempfile.mkstemp(prefix=f".{plot_path.name}.", dir=plot_path.parent)
            with os.fdopen(fd, "wb") as handle:
                plot(run, handle)
            os.chmod(outside, 0o666 & ~current_umask())
        staged.publish()
        if outside is not None and plot_path is not None:
            os.replace(outside, plot_path)
            outside = None
    finally:
        if outside is not None:
            Path(outside).unlink(missing_ok=True)


def _check_arguments(args) -> None:
    """Every argument is checked before any input is read."""
    for flag, value in (("--bucket", args.bucket), ("--row-bucket", args.row_bucket)):
        if value < 1:
            raise CLIError(f"{flag} must be >= 1, got {value}")
    _check_output(args)
    if args.plot:
        _require_matplotlib()
        plot_path, plot_dir = Path(args.plot), Path(args.plot).parent
        staged_with_the_set = in_folder(plot_path, Path(args.output))
        if not plot_dir.is_dir() and not staged_with_the_set:
            raise CLIError(f"--plot {args.plot}: the folder {plot_dir} does not exist")
        if plot_dir.is_dir() and not os.access(plot_dir, os.W_OK | os.X_OK):
            raise CLIError(f"--plot {args.plot}: the folder {plot_dir} is not writable")
        if plot_path.is_dir():
            raise CLIError(f"--plot {args.plot}: is a directory")
        if plot_path.name in OUTPUT_SET and staged_with_the_set:
            raise CLIError(f"--plot {args.plot}: would replace the output set's own {plot_path.name}")


def _check_output(args) -> None:
    try:
        check_output_folder("--output", Path(args.output), args.overwrite)
    except OutputFolderError as err:
        raise CLIError(str(err)) from None


class Interrupted(BaseException):
    """SIGTERM (or SIGHUP) received: unwinds like ``KeyboardInterrupt`` so every cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _signals_unwind():
    """SIGTERM and SIGHUP raise ``Interrupted`` in the main thread (SIGINT raises ``KeyboardInterrupt``);
    a second signal during the cleanup is ignored, so the cleanup finishes. Outside the main thread (a
    caller's worker) the handlers are left as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum: int, frame: Any) -> None:
        for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(number, signal.SIG_IGN)
        raise KeyboardInterrupt if signum == signal.SIGINT else Interrupted(signum)

    previous = {number: signal.signal(number, unwind) for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def _staged(output: Path):
    """The run's staging folder; everything in it (and any folder the run made) removed on failure."""
    staged = StagedOutputs(output)
    try:
        yield staged
    except BaseException as err:
        if staged.published:  # interrupted after the new set was in place: it stays, and the message says so
            add_note(err, PUBLISHED_NOTE)
        staged.abort()
        raise


def _progress_wanted(args) -> bool:
    """``--progress`` / ``--no-progress`` / ``--quiet``, else whether stderr is a terminal."""
    if getattr(args, "quiet", False):
        return False
    return args.progress if args.progress is not None else sys.stderr.isatty()


def cmd_score(args) -> int:
    _check_arguments(args)
    config = _load_config(args.config)
    writers: list[BatchWriter] = []
    with _signals_unwind(), _staged(Path(args.output)) as staged:

        def write_early(arrays: dict[str, np.ndarray]) -> None:
            if not writers:
                writers.append(BatchWriter(staged.path("batch.npz")))
            writers[0].add(arrays)

        try:
            run = run_score(config, args.input, group_filter=args.filter, bucket=args.bucket,
                            row_bucket=args.row_bucket, tune_process=args.tune_process,
                            on_arrays=None if args.compress else write_early,
                            progress=_progress_wanted(args))
            start = time.perf_counter()
            write_outputs(run, staged, Path(args.plot) if args.plot else None, compress=args.compress,
                          early=writers[0] if writers else None)
        except BaseException:
            for writer in writers:
                writer.abort()
            raise
    run.summary["timings_s"]["write"] = time.perf_counter() - start
    print_summary(run)
    if args.timings:
        for phase, seconds in run.summary["timings_s"].items():
            print(f"timing: {phase:<14} {seconds:8.3f} s")
    print(f"wrote {Path(args.output) / 'batch.npz'} and {Path(args.output) / 'metrics.json'}"
          + (f" and {args.plot}" if args.plot else ""))
    return 0


def cmd_demo(args) -> int:
    if args.output:
        _check_output(args)
    output = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="prm-jax-demo-")) / "out"
    data = resources.files("prm_jax").joinpath("data")
    with _signals_unwind(), resources.as_file(data.joinpath("demo_config.yaml")) as config_path, \
            resources.as_file(data.joinpath("demo_sessions.jsonl")) as sessions_path, _staged(output) as staged:
        config = _load_config(str(config_path))
        print(f"prm-jax demo: {sessions_path.name} scored with the seed's example config "
              f"(LengthBudgetScorer, max_output_tokens=128, shaping {config.actor.advantage_shaping.mode})\n")
        run = run_score(config, str(sessions_path), progress=args.progress if args.progress is not None else False)
        write_outputs(run, staged)
    print_summary(run)
    print()
    print_turn_table(run)
    print(f"\nwrote {output / 'batch.npz'} and {output / 'metrics.json'}")
    return 0


def cmd_validate(args) -> int:
    config = _load_config(args.config)
    scorers = [s.path for s in config.prm.scorers if isinstance(s, ScorerSpec)]
    print(f"{args.config}: ok (rollout {config.rollout.version}, PRM {'active' if config.prm.active else 'inactive'}, "
          f"scorers: {', '.join(scorers) or 'none'}, shaping {config.actor.advantage_shaping.mode})")
    return 0


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CLIError("--plot needs matplotlib: pip install matplotlib (from a checkout: "
                       ".venv/bin/pip install -e '.[plot]')") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prm-jax", description="Process rewards to shaped PPO/GRPO advantages.")
    sub = parser.add_subparsers(dest="command", required=True)
    score = sub.add_parser("score", help="score sessions, export groups, compute advantages")
    score.add_argument("--config", required=True, help="YAML config (rollout.agent.prm, actor)")
    score.add_argument("--input", required=True, help="sessions, one JSON object per line")
    score.add_argument("--output", required=True, help="output directory for batch.npz and metrics.json")
    score.add_argument("--overwrite", action="store_true",
                       help="replace an output set already in --output (atomically, once the new one is complete)")
    score.add_argument("--plot", help="also draw a few rows' process rewards and advantages to this PNG")
    score.add_argument("--filter", choices=sorted(FILTERS), help="group filter applied to accepted groups")
    score.add_argument("--bucket", type=int, default=128, help="pad widths to a multiple of this (default 128)")
    score.add_argument("--row-bucket", type=int, default=64,
                       help="compute on rows padded to a multiple of this (default 64); outputs hold the real rows")
    score.add_argument("--compress", action="store_true", help="write batch.npz compressed (default: uncompressed)")
    score.add_argument("--timings", action="store_true", help="print the time of each phase")
    score.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="sessions scored, rate and ETA on stderr (default: when stderr is a terminal)")
    score.add_argument("--quiet", action="store_true", help="no progress line (as --no-progress)")
    score.set_defaults(func=cmd_score)
    demo = sub.add_parser("demo", help="score the bundled example sessions with the seed's example config")
    demo.add_argument("--output", help="output directory (default: a new temporary directory)")
    demo.add_argument("--overwrite", action="store_true", help="replace an output set already in --output")
    demo.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    demo.set_defaults(func=cmd_demo)
    validate = sub.add_parser("validate-config", help="check a config and import its scorers")
    validate.add_argument("config")
    validate.set_defaults(func=cmd_validate)
    return parser


def main(argv: list[str] | None = None, *, tune_process: bool = False) -> int:
    """The command line, for in-process callers too: nothing process-wide is changed unless
    ``tune_process`` (``entry`` passes it: the ``prm-jax`` process owns its garbage collector and heap)."""
    args = build_parser().parse_args(argv)
    args.tune_process = tune_process
    try:
        return args.func(args)
    except CLIError as err:
        print(f"prm-jax: error: {_shorten(str(err), 2000)}", file=sys.stderr)
        return 2
    except NoGroupAccepted as err:
        print(f"prm-jax: {_shorten(str(err), 2000)}", file=sys.stderr)
        return 1
    except OSError as err:
        if err.errno not in WRITE_ERRNOS:
            raise
        print(f"prm-jax: error: could not write the output: {err.strerror or err} (nothing was written)",
              file=sys.stderr)
        return EXIT_WRITE_FAILED
    except (KeyboardInterrupt, Interrupted) as err:
        return _interrupted(err, err)
    except BaseExceptionGroup as group:  # a signal inside a task group (a scorer running synchronous code)
        interruption = first_in_group(group, (KeyboardInterrupt, Interrupted))
        if interruption is None:
            raise
        return _interrupted(interruption, group)
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _interrupted(err: BaseException, raised: BaseException) -> int:
    """The one line and the exit status of an interruption (128 + the signal's number). A signal can land
    between making a scorer's coroutine and awaiting it: that coroutine is abandoned with the run, so the
    interpreter's "never awaited" warning about it is noise after the one line, and is not shown."""
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
    signum = err.signum if isinstance(err, Interrupted) else signal.SIGINT
    notes = (*getattr(raised, "__notes__", ()), *getattr(err, "__notes__", ()))
    written = "after the new output set was published" if PUBLISHED_NOTE in notes else "nothing was written"
    print(f"prm-jax: interrupted by {signal.Signals(signum).name} ({written})", file=sys.stderr)
    return 128 + signum


def enable_compile_cache() -> None:
    """JAX's persistent compilation cache for the command line, in ``$PRM_JAX_CACHE/xla`` (default
    ``~/.cache/prm_jax/xla``; about 50 kB per batch shape): a later run with the same shapes loads the advantage
    programs instead of compiling them (0.6 s of a 2,000-session run). ``PRM_JAX_COMPILE_CACHE=0`` turns it
    off; a cache directory configured for JAX already (``JAX_COMPILATION_CACHE_DIR``) is used as it is."""
    if os.environ.get("PRM_JAX_COMPILE_CACHE", "1") == "0":
        return
    try:
        if not getattr(jax.config, "jax_compilation_cache_dir", None):
            cache = cache_dir()
            if cache is None:
                return
            jax.config.update("jax_compilation_cache_dir", str(cache / "xla"))
        if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # JAX's default, 1 s, skips ours
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    except (AttributeError, ValueError):  # an older jax without these options: compile every time
        pass


def entry() -> None:
    """The ``prm-jax`` process: the one place that tunes the process (the persistent compilation cache, the
    frozen garbage collector, the trimmed heap, the current folder on the import path); ``main`` is the same
    command without them."""
    enable_compile_cache()
    # Scorer paths resolve against the current folder, as ``python -m`` makes it importable: a scorer in
    # the user's own module next to the config works without PYTHONPATH.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    sys.exit(main(tune_process=True))


if __name__ == "__main__":
    entry()
