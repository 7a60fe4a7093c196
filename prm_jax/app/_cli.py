"""The ``prm-jax`` command line.

  prm-jax score --config CONFIG.yaml --input SESSIONS.jsonl --output OUT [--overwrite] [--plot FILE.png]
                [--filter NAME]
  prm-jax demo [--example lengths|coding] [--output OUT] [--overwrite]
  prm-jax validate-config CONFIG.yaml
  prm-jax doctor

``score`` reads sessions (format: ``prm_jax.app.sessions``), scores them with the configured scorers, exports
them group by group, computes advantages with the configured actor settings, and writes ``OUT/batch.npz``
(the padded batch, its advantages and returns) and ``OUT/metrics.json`` (metrics and the summary). Input and
config are validated completely before anything is scored or written; the output set is staged beside
``OUT`` and published at once (``prm_jax.app._outputs``), so a failed or interrupted run leaves nothing behind
and an earlier set in ``OUT`` (replaced only with ``--overwrite``) whole. Exit statuses: 0, 1 (no group
accepted), 2 (bad arguments, config or input), 74 (the output could not be written), 128 + N (signal N).
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import json
import os
import signal
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import jax
import numpy as np

from prm_jax.app._outputs import (
    OUTPUT_SET,
    WRITE_ERRNOS,
    BatchWriter,
    StagedOutputs,
    check_output_folder,
    current_umask,
    in_folder,
)
from prm_jax.app._report import plot, print_summary, print_turn_table
from prm_jax.app._score import (
    FILTERS,
    ScoreRun,
    score,
    shorten,
    timestep_arrays,
)
from prm_jax.config._experiment import ExperimentConfig, ScorerSpec
from prm_jax.config._loader import load_config
from prm_jax.errors import ConfigFileError, NoGroupAccepted, OutputFolderError, PRMJaxError, ScoreError
from prm_jax.kernels._verl_losses import VERL_AGG_MODES
from prm_jax.native._build import cache_dir
from prm_jax.runtime._lifecycle import first_in_group
from prm_jax.runtime._specs import check_scorer_specs

PUBLISHED_NOTE = "the new output set was published before the interruption"
EXIT_WRITE_FAILED = 74  # sysexits' EX_IOERR: the disk is full or a file-size limit was hit
EXIT_AUDIT_FAILED = 3  # prm-jax audit: a problem marked required failed


class CLIError(PRMJaxError):
    """A user-facing error of the command: printed as one line, exit status 2 (the library's errors that end a
    run arrive as one, their own text)."""

    exit_status = 2


def _load_config(path: str, scorers: bool = True) -> ExperimentConfig:
    """The config, with everything runner start-up would reject checked and no scorer built (``scorers``
    False: the scorers' imports not checked, for a command that runs none)."""
    try:
        config = load_config(path)
        if scorers:
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
    enabled: a terminal, unless ``--no-progress`` or ``--quiet``); ``score``'s ``progress`` callback, and its
    ``phase`` callback: each phase named as it starts.

    The rate is measured from the first sessions scored on (the time before them is warm-up: workers
    starting, programs compiling, a judge's first answers), smoothed over ``RATE_HALF_LIFE_S``, and the ETA
    is shown only once it means something: ``ETA_AFTER_S`` of measurement and ``ETA_AFTER_UPDATES`` updates
    (before that, ``ETA --``). The first ETA of a run once read 24,106 s for a phase of 8.9 s."""

    RATE_HALF_LIFE_S = 3.0
    ETA_AFTER_S = 2.0
    ETA_AFTER_UPDATES = 3

    def __init__(self, enabled: bool, stream=None, clock: Callable[[], float] = time.perf_counter):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.clock = clock
        self.first: tuple[float, int] | None = None  # (time, done) of the first update: the rate's start
        self.last: tuple[float, int] | None = None
        self.rate: float | None = None
        self.updates = 0

    def phase(self, name: str) -> None:
        """A phase begins (reading, scoring, packing, advantages, writing): said on its own line, so the
        terminal is never blank while a long phase runs."""
        if self.enabled:
            self.stream.write(f"{name} ...\n")
            self.stream.flush()

    def measure(self, done: int) -> None:
        """Folds the sessions scored since the last update into the smoothed rate (sessions per second)."""
        now = self.clock()
        if self.first is None:
            self.first = self.last = (now, done)
            return
        assert self.last is not None
        elapsed, scored = now - self.last[0], done - self.last[1]
        if elapsed <= 0:
            return
        weight = 1.0 - 0.5 ** (elapsed / self.RATE_HALF_LIFE_S)
        instant = scored / elapsed
        self.rate = instant if self.rate is None else self.rate + weight * (instant - self.rate)
        self.last = (now, done)
        self.updates += 1

    def eta(self, done: int, total: int) -> str:
        """The time left, or ``--`` until the rate means something."""
        if (self.rate is None or self.rate <= 0 or self.first is None or self.last is None
                or self.updates < self.ETA_AFTER_UPDATES or self.last[0] - self.first[0] < self.ETA_AFTER_S):
            return "--"
        return f"{(total - done) / self.rate:.0f} s"

    def __call__(self, done: int, total: int) -> None:
        if self.enabled:
            self.measure(done)
            rate = "--" if self.rate is None else f"{self.rate:.1f}"
            filled = int(30 * done / max(total, 1))
            self.stream.write(f"\rscoring [{'#' * filled}{'.' * (30 - filled)}] {done}/{total} sessions, "
                              f"{rate}/s, ETA {self.eta(done, total)} ")
            if done >= total:
                self.stream.write("\n")
            self.stream.flush()


def run_score(config: ExperimentConfig, input_path: str, *, group_filter: str | None = None, bucket: int = 128,
              row_bucket: int = 64, progress: bool = False, tune_process: bool = False,
              on_arrays: Callable[[dict[str, np.ndarray]], None] | None = None) -> ScoreRun:
    """``prm_jax.app._score.score`` with the command's progress line and, with ``tune_process`` (the
    ``prm-jax`` process's choice, made in ``entry``: it owns its process; in-process callers keep theirs
    untouched), its process tuning: everything read moves into CPython's permanent generation, so the cyclic
    collector stops re-walking the sessions on every full collection while they are scored, and the freed
    sessions' pages go back to the system once the batch is packed (``malloc_trim``)."""
    line = Progress(progress)
    try:
        return score(config, input_path, group_filter=group_filter, bucket=bucket, row_bucket=row_bucket,
                     progress=line, on_arrays=on_arrays, after_read=gc.freeze if tune_process else None,
                     release_memory=_release_freed_memory if tune_process else None, phase=line.phase)
    except ScoreError as err:
        raise CLIError(str(err)) from None


def _release_freed_memory() -> None:
    """Hands the pages of freed sessions and branch sequences back to the system (glibc keeps them in its
    heap, where XLA's large allocations never reuse them): a lower peak for the advantages. A no-op
    without glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def write_outputs(run: ScoreRun, staged: StagedOutputs, plot_path: Path | None = None, compress: bool = False,
                  early: BatchWriter | None = None) -> None:
    """Writes the output set into the staging folder and publishes it (see ``prm_jax.app._outputs``); a plot
    outside the output folder is written beside itself under a temporary name and renamed after."""
    payload = json.dumps({"metrics": run.metrics, "summary": run.summary.as_json(), "scorer_stats": run.scorer_stats},
                         indent=2, sort_keys=True, allow_nan=False).encode()
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
            outside = str(_write_beside(plot_path, lambda handle: plot(run, handle)))
        staged.publish()
        if outside is not None and plot_path is not None:
            os.replace(outside, plot_path)
            outside = None
    finally:
        if outside is not None:
            Path(outside).unlink(missing_ok=True)


def _write_beside(path: Path, write: Callable[[Any], None]) -> Path:
    """Writes a file beside ``path`` under a temporary name (``write(handle)``, binary), with the mode ``open``
    would give, and returns its name: the caller renames it onto ``path`` or removes it."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.chmod(name, 0o666 & ~current_umask())
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def _publish_file(path: Path, write: Callable[[Any], None]) -> None:
    """``path`` written whole or not at all (``_write_beside``, then renamed)."""
    temporary = _write_beside(path, write)
    try:
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _check_file_argument(flag: str, value: str, folder_made_by_the_run: bool = False) -> None:
    """A file the command writes (``--plot``, ``--json``): its folder exists (unless the run makes it) and is
    writable, and it is not itself a folder."""
    path, folder = Path(value), Path(value).parent
    if not folder.is_dir() and not folder_made_by_the_run:
        raise CLIError(f"{flag} {value}: the folder {folder} does not exist")
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise CLIError(f"{flag} {value}: the folder {folder} is not writable")
    if path.is_dir():
        raise CLIError(f"{flag} {value}: is a directory")


def _check_arguments(args) -> None:
    """Every argument is checked before any input is read."""
    for flag, value in (("--bucket", args.bucket), ("--row-bucket", args.row_bucket)):
        if value < 1:
            raise CLIError(f"{flag} must be >= 1, got {value}")
    _check_output(args)
    if args.plot:
        _require_matplotlib()
        plot_path = Path(args.plot)
        staged_with_the_set = in_folder(plot_path, Path(args.output))
        _check_file_argument("--plot", args.plot, folder_made_by_the_run=staged_with_the_set)
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

    def lost(unraisable: Any) -> None:
        # A handler that runs inside a gc callback (JAX registers one) or a destructor raises where Python
        # prints "Exception ignored" and drops the exception: the run went on with the signals ignored, and
        # hung (CI). The signal is delivered again a moment later, from another thread, so that the main
        # thread takes it outside that callback (were it lost again, this runs again).
        error = unraisable.exc_value
        if isinstance(error, (KeyboardInterrupt, Interrupted)):
            signum = signal.Signals(error.signum if isinstance(error, Interrupted) else signal.SIGINT)
            signal.signal(signum, unwind)
            kill = getattr(signal, "pthread_kill", None)  # (POSIX: it wakes a main thread that sleeps)
            again = (threading.Timer(0.01, kill, args=(threading.main_thread().ident, signum)) if kill is not None
                     else threading.Timer(0.01, _thread.interrupt_main, args=(signum,)))
            again.daemon = True
            again.start()
            return
        hook(unraisable)

    previous = {number: signal.signal(number, unwind) for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    hook, sys.unraisablehook = sys.unraisablehook, lost
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def _staged(output: Path, overwrite: bool):
    """The run's staging folder; everything in it (and any folder the run made) removed on failure."""
    staged = StagedOutputs(output, overwrite)
    try:
        yield staged
    except BaseException as err:
        if staged.published:  # interrupted after the new set was in place: it stays, and the message says so
            err.add_note(PUBLISHED_NOTE)
        staged.abort()
        raise


def _progress_wanted(args) -> bool:
    """``--progress`` / ``--no-progress`` / ``--quiet``, else whether stderr is a terminal."""
    if getattr(args, "quiet", False):
        return False
    return args.progress if args.progress is not None else sys.stderr.isatty()


def _probe(config: ExperimentConfig, path: str) -> None:
    """``--probe``: each served scorer's line on stdout; a failed one is exit 2 naming it (nothing read)."""
    from prm_jax.app._probe import probe_lines

    try:
        lines, failed = probe_lines(config)
    except (ValueError, TypeError, ImportError) as err:  # a scorer could not be built (the config's fault)
        raise CLIError(f"{path}: {err}") from None
    for line in lines:
        print(line, flush=True)
    if failed:
        raise CLIError(f"{path}: the probe failed for scorer(s) "
                       + "; ".join(f"{p.scorer!r} at {p.url}: {p.status}" for p in failed))


PLOT_HINT = ("see every timestep: add --plot turns.png (each turn's process reward beside the advantages, "
             "a few rows; the plot extra)")


def cmd_score(args) -> int:
    _check_arguments(args)
    config = _load_config(args.config)
    if args.probe:
        _probe(config, args.config)
    writers: list[BatchWriter] = []
    with _signals_unwind(), _staged(Path(args.output), args.overwrite) as staged:

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
            Progress(_progress_wanted(args)).phase("writing outputs")
            write_outputs(run, staged, Path(args.plot) if args.plot else None, compress=args.compress,
                          early=writers[0] if writers else None)
        except BaseException:
            for writer in writers:
                writer.abort()
            raise
    run.summary.timings_s["write"] = time.perf_counter() - start
    print_summary(run)
    print()
    print_turn_table(run)
    print(PLOT_HINT if not args.plot else f"plot: {args.plot} (each turn's process reward and advantages, a few rows)")
    if args.timings:
        for phase, seconds in run.summary.timings_s.items():
            print(f"timing: {phase:<14} {seconds:8.3f} s")
    print(f"wrote {Path(args.output) / 'batch.npz'} and {Path(args.output) / 'metrics.json'}"
          + (f" and {args.plot}" if args.plot else ""))
    return 0


# The bundled examples (prm_jax/data): config, sessions, and what the config's scorer is, in words.
DEMOS = {"lengths": ("demo_config.yaml", "demo_sessions.jsonl", "LengthBudgetScorer, max_output_tokens=128"),
         "coding": ("coding_config.yaml", "coding_sessions.jsonl",
                    "CodeExecutionScorer in the local sandbox; stdin/stdout and assert-style tests")}


def cmd_demo(args) -> int:
    if args.output:
        _check_output(args)
    output = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="prm-jax-demo-")) / "out"
    data = resources.files("prm_jax").joinpath("data")
    config_name, sessions_name, scorer = DEMOS[args.example]
    with _signals_unwind(), resources.as_file(data.joinpath(config_name)) as config_path, \
            resources.as_file(data.joinpath(sessions_name)) as sessions_path, \
            _staged(output, bool(args.overwrite)) as staged:
        config = _load_config(str(config_path))
        print(f"prm-jax demo: {sessions_path.name} scored with the bundled example config {config_name} "
              f"({scorer}, shaping {config.actor.advantage_shaping.mode})\n")
        run = run_score(config, str(sessions_path), progress=args.progress if args.progress is not None else False)
        write_outputs(run, staged)
    print_summary(run)
    print()
    print_turn_table(run)
    print("see every timestep: prm-jax score --config CONFIG.yaml --input SESSIONS.jsonl --output OUT --plot "
          "turns.png (each turn's process reward beside the advantages, a few rows)")
    print(f"\nwrote {output / 'batch.npz'} and {output / 'metrics.json'}")
    return 0


def cmd_validate(args) -> int:
    config = _load_config(args.config)
    scorers = [s.path for s in config.prm.scorers if isinstance(s, ScorerSpec)]
    print(f"{args.config}: ok (rollout {config.rollout.version}, PRM {'active' if config.prm.active else 'inactive'}, "
          f"scorers: {', '.join(scorers) or 'none'}, shaping {config.actor.advantage_shaping.mode})")
    if args.probe:
        _probe(config, args.config)
    return 0


def cmd_audit(args) -> int:
    from prm_jax import audit

    config = _load_config(args.config, scorers=False)
    names = [p.name for p in audit.SUITE]
    unknown = [name for name in (*args.require, *(args.problems or ())) if name not in (*names, "all")]
    if unknown:
        raise CLIError(f"--require/--problems: unknown problem {unknown[0]!r}; the problems are {', '.join(names)} "
                       "(or all)")
    problems = [p for p in audit.SUITE if not args.problems or p.name in args.problems]
    if args.plot:
        _require_matplotlib()
    for flag, target in (("--json", args.json), ("--plot", args.plot)):
        if target:
            _check_file_argument(flag, target)
    report = audit.audit(config.actor, args.loss_agg_mode, problems=problems, seed=args.seed)
    print(report.table())
    if args.json:
        _publish_file(Path(args.json), lambda handle: handle.write(report.as_json().encode()))
    if args.plot:
        _publish_file(Path(args.plot), lambda handle: audit.plot(report, handle))
    failed = report.failed(args.require)
    if failed:
        print(f"prm-jax audit: required problems failed: {', '.join(failed)}", file=sys.stderr)
        return EXIT_AUDIT_FAILED
    return 0


def cmd_doctor(args) -> int:
    from prm_jax.app._doctor import main as doctor
    return doctor()


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CLIError("--plot needs matplotlib: pip install matplotlib (from a checkout: "
                       ".venv/bin/pip install -e '.[plot]')") from None


# What each exit status means (``main`` returns them), as every subcommand's --help lists them.
EXIT_STATUSES = (f"exit status: 0 done; {NoGroupAccepted.exit_status} no group accepted (nothing written) or stdout "
                 f"closed; {CLIError.exit_status} bad input, "
                 f"config or output folder (one line: file, line and field; nothing written); "
                 f"{EXIT_WRITE_FAILED} the output could not be written (disk full); {EXIT_AUDIT_FAILED} (audit) a required "
                 "problem failed; 128 + N stopped by signal N")
# Each subcommand: what it does, in a sentence, and an example (its --help shows them with EXIT_STATUSES).
COMMANDS = {
    "score": ("Score sessions (JSONL, one per line: '-' for stdin, .gz read as gzip; every key: the docs' "
              "Session format page, docs/guides/session-format.md), export each group, and compute the "
              "advantages: OUT/batch.npz and "
              "OUT/metrics.json, and a summary on stdout.",
              "prm-jax score --config config.yaml --input sessions.jsonl --output out --plot rows.png"),
    "demo": ("Score a bundled example with its bundled config and print the summary: --example lengths (16 "
             "sessions, 4 groups; a length-budget scorer, process_weighted shaping) or coding (8 coding sessions, "
             "2 groups; the agent's code run against each session's tests in the local sandbox).",
             "prm-jax demo --example coding"),
    "validate-config": ("Check a config file and import its scorers, without scoring anything; --probe also "
                        "asks every served scorer once.", "prm-jax validate-config config.yaml --probe"),
    "audit": ("Audit the actor's advantage configuration before training: on small problems whose exact policy "
              "gradient is known by enumeration, compare it with the expected gradient the configuration gives "
              "(bias, cosine, variance, a verdict with its reason a problem); --require makes a failure exit 3.",
              "prm-jax audit --config config.yaml --loss-agg-mode seq-mean-token-sum --require all --json audit.json"),
    "doctor": ("Print what a bug report needs: versions, the backend and its devices, the native kernels, the "
               "caches and the extras installed.", "prm-jax doctor"),
}


def _subcommand(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    description, example = COMMANDS[name]
    return sub.add_parser(name, help=help, description=textwrap.fill(description, 100),
                          epilog=f"example:\n  {example}\n\n{textwrap.fill(EXIT_STATUSES, 100)}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    import prm_jax  # (for its one version string)

    parser = argparse.ArgumentParser(prog="prm-jax", description="Process rewards to shaped PPO/GRPO advantages.",
                                     epilog=EXIT_STATUSES)
    parser.add_argument("--version", action="version", version=f"prm-jax {prm_jax.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    score = _subcommand(sub, "score", "score sessions, export groups, compute advantages")
    score.add_argument("--config", required=True, help="YAML config (rollout.agent.prm, actor)")
    score.add_argument("--input", required=True,
                       help="sessions, one JSON object per line ('-': stdin; a .gz file is read as gzip)")
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
    score.add_argument("--probe", action="store_true",
                       help="first send one small request to every served scorer and stop (exit 2) if one fails")
    score.set_defaults(func=cmd_score)
    demo = _subcommand(sub, "demo", "score the bundled example sessions with the bundled example config")
    demo.add_argument("--example", choices=tuple(DEMOS), default="lengths",
                      help="which bundled example (default: lengths)")
    demo.add_argument("--output", help="output directory (default: a new temporary directory)")
    demo.add_argument("--overwrite", action="store_true", help="replace an output set already in --output")
    demo.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    demo.set_defaults(func=cmd_demo)
    validate = _subcommand(sub, "validate-config", "check a config and import its scorers")
    validate.add_argument("config")
    validate.add_argument("--probe", action="store_true",
                          help="also send one small request to every served scorer: its URL, status, model and "
                               "latency (exit 2 if one fails)")
    validate.set_defaults(func=cmd_validate)
    audit = _subcommand(sub, "audit", "audit the advantage configuration on exact synthetic problems")
    audit.add_argument("--config", required=True, help="YAML config (its actor section is audited)")
    audit.add_argument("--loss-agg-mode", default="token-mean", choices=VERL_AGG_MODES,
                       help="the policy loss's aggregation, verl's loss_agg_mode (default token-mean)")
    audit.add_argument("--require", action="append", default=[], metavar="PROBLEM",
                       help="a problem that must pass (repeat it; 'all': every one); a failure exits 3")
    audit.add_argument("--problems", type=lambda text: [p for p in text.split(",") if p], metavar="A,B",
                       help="audit only these problems (default: all of them)")
    audit.add_argument("--json", help="also write the report as JSON to this file")
    audit.add_argument("--plot", help="also draw the true against the estimated gradient per parameter to this PNG")
    audit.add_argument("--seed", type=int, default=0, help="the seed where groups are sampled (default 0)")
    audit.set_defaults(func=cmd_audit)
    doctor = _subcommand(sub, "doctor", "versions, backend, native kernels, caches and extras (for a bug report)")
    doctor.set_defaults(func=cmd_doctor)
    return parser


def main(argv: list[str] | None = None, *, tune_process: bool = False) -> int:
    """The command line, for in-process callers too: nothing process-wide is changed unless
    ``tune_process`` (``entry`` passes it: the ``prm-jax`` process owns its garbage collector and heap)."""
    args = build_parser().parse_args(argv)
    args.tune_process = tune_process
    try:
        return args.func(args)
    except (CLIError, OutputFolderError) as err:  # OutputFolderError: another run published there first
        print(f"prm-jax: error: {shorten(str(err), 2000)}", file=sys.stderr)
        return err.exit_status or 2
    except NoGroupAccepted as err:
        print(f"prm-jax: {shorten(str(err), 2000)}", file=sys.stderr)
        return err.exit_status or 1
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly (before OSError, which it is)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
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
