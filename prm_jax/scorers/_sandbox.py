"""The local sandbox that runs code an agent wrote: bubblewrap (Debian's ``bubblewrap``, ``apt-get install
bubblewrap``), chosen because it is the unprivileged-namespace tool Flatpak ships and distributions maintain,
small enough to audit, and starts in tens of milliseconds (a container runtime would be a daemon and a second
of start-up per call).

Each run gets new user, PID, network, IPC, UTS and mount namespaces (``--unshare-all``: no network at all,
not even loopback to the host's), the interpreter and the system libraries bound read-only (``/usr``), the
task's files bound read-only at ``/task`` (the harness' files cannot be changed), the root read-only, a fresh
tmpfs as its working folder ``/work`` and ``/tmp``, an empty environment (no API key reaches it), and the
code's process as PID 1 of its namespace (``--as-pid-1``: it reaps its children; bubblewrap's own init, left a
zombie, counted against the process limit and failed every call after about a dozen). Inside the sandbox,
util-linux's ``prlimit`` sets rlimits on CPU time, address space, file size, open files and processes before it
execs the interpreter: taken inside the new user namespace, the process limit counts the sandbox's own processes
(taken before bubblewrap, it counted every process of the host user, and a user with 18 processes could not start
one). Where the host runs as root, bubblewrap itself starts under a uid of its own from a pool (``setpriv``; the
kernel does not enforce ``RLIMIT_NPROC`` for root: a fork bomb under root reached 200 processes); a root whose
user namespace maps none of the pool (``unshare --map-root-user``) is refused. A wall-clock deadline kills
bubblewrap's process group; ``--die-with-parent`` then takes PID 1 of the namespace, and with it every process
inside (a daemonized or SIGTERM-ignoring child included). stdout and stderr are read up to ``output_bytes`` each;
past it the run is killed.

Where bubblewrap cannot start (not installed, no user namespaces), ``unavailable()`` says why and the scorer
refuses at configuration; nothing falls back to running unsandboxed.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from prm_jax._validation import finite_number, integer
from prm_jax.runtime._settings import Settings, setting
from prm_jax.scorers._harness import classify, communicate

if TYPE_CHECKING:
    from prm_jax.scorers._harness import Outcome

DEFAULT_INTERPRETER = "/usr/bin/python3"  # a system interpreter every uid can read (bound with /usr)
UID_BASE = 200_000  # the pool of sandbox uids when the host runs as root (none of them is a real user)
UID_POOL = 4096
HARNESS_CAP = 1 << 20  # bytes of the harness' stdout and stderr read (its verdict lines)
PRLIMIT = "/usr/bin/prlimit"  # (run inside the sandbox, which binds /usr)


@functools.lru_cache(maxsize=1)
def _uid_map() -> tuple[tuple[int, int, int], ...]:
    """This process's user namespace's uid map: ``(inside, outside, count)`` ranges (the initial namespace
    maps every uid to itself)."""
    try:
        with open("/proc/self/uid_map") as handle:
            return tuple((int(a), int(b), int(c)) for a, b, c in (line.split() for line in handle if line.strip()))
    except OSError:
        return ((0, 0, 1 << 32),)


def uid_pool_needed() -> bool:
    """Whether runs switch to a uid of the pool: the host runs the scorer as the real root (uid 0 mapped to
    uid 0), whom the kernel does not hold to ``RLIMIT_NPROC``."""
    return os.geteuid() == 0 and any(inside == 0 and outside == 0 for inside, outside, _ in _uid_map())


def uid_pool_mapped() -> bool:
    """Whether this user namespace maps the pool's uids (the initial one does; ``unshare --map-root-user``
    maps root alone)."""
    return any(inside <= UID_BASE and UID_BASE + UID_POOL <= inside + count for inside, _, count in _uid_map())


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits(Settings):
    """What one run of the agent's code may use (each checked at configuration)."""

    time_per_test: float = setting(2.0, doc="Seconds of wall clock one test may take, > 0; past it the test is "
                                   "killed and scores as a timeout (a stdin/stdout test's CPU time is capped one "
                                   "second above it; the assert tests', at their turn's).")
    total_time: float = setting(30.0, doc="Seconds all of a turn's runs may take together, > 0; the tests left "
                                "when it is spent are failed as timeouts, not run.")
    memory_mb: int = setting(512, doc="The address space a run may map, in MiB, >= 32 (the interpreter itself "
                             "maps about 20).")
    output_bytes: int = setting(1 << 20, doc="Bytes of stdout (and of stderr) a run may write, >= 1; past it the "
                                "run is killed and scores as an output-limit failure.")
    processes: int = setting(16, doc="Processes (and threads) a test may hold at once, >= 1 (the assert tests' "
                             "harness is one more).")
    file_size_mb: int = setting(16, doc="The largest file a run may write, in MiB, >= 1 (its folder is a tmpfs).")
    open_files: int = setting(64, doc="File descriptors a run may hold open, >= 8.")

    def read_cap(self, harness: bool = False) -> int:
        """The bytes of a run's stdout (and of its stderr) read: ``output_bytes``, or for the tests' harness at
        least ``HARNESS_CAP`` (its verdict lines, a test's output being capped inside it).

        Args:
            harness: Whether the run is the harness'.
        """
        return max(self.output_bytes, HARNESS_CAP) if harness else self.output_bytes

    def check(self) -> None:
        finite_number("time_per_test", self.time_per_test, positive=True)
        finite_number("total_time", self.total_time, positive=True)
        integer("memory_mb", self.memory_mb, minimum=32)
        integer("output_bytes", self.output_bytes, minimum=1)
        integer("processes", self.processes, minimum=1)
        integer("file_size_mb", self.file_size_mb, minimum=1)
        integer("open_files", self.open_files, minimum=8)


class Run(NamedTuple):
    """One run's result: how it ended (``ok``: exit status 0; ``error``: another status or a signal;
    ``timeout``; ``memory``; ``output_limit``), its exit status (negative: the signal), what it wrote (at most
    ``output_bytes`` of each) and its wall-clock seconds."""

    outcome: Outcome
    returncode: int
    stdout: bytes
    stderr: bytes
    seconds: float


def unavailable(interpreter: str) -> str | None:
    """Why the local sandbox cannot run here (bubblewrap missing, user namespaces off, the interpreter not
    usable inside), or ``None`` where it can: one tiny run, at configuration."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    if not os.path.isfile(PRLIMIT):
        return f"util-linux's prlimit is not at {PRLIMIT} (the sandbox binds /usr only)"
    if uid_pool_needed() and shutil.which("setpriv") is None:
        return "util-linux's setpriv is not installed (as root, each run starts under a uid of its own)"
    if uid_pool_needed() and not uid_pool_mapped():
        return (f"this process runs as root in a user namespace that maps none of the sandbox's uids "
                f"({UID_BASE}-{UID_BASE + UID_POOL - 1}): without them root's processes are not limited (run "
                "as another user, or map the range)")
    if not os.path.isfile(interpreter) or not os.access(interpreter, os.X_OK):
        return f"the interpreter {interpreter!r} is not an executable file"
    return LocalSandbox(Limits(), interpreter).start_failure(10.0)


class LocalSandbox:
    """Runs ``interpreter`` (a system interpreter every uid can read: ``/usr/bin/python3`` by default) on the
    task's files inside bubblewrap, under ``limits`` (see the module docstring)."""

    _uids = itertools.count()
    _lock = threading.Lock()

    def __init__(self, limits: Limits, interpreter: str = DEFAULT_INTERPRETER):
        self.limits, self.interpreter = limits, interpreter

    def _uid(self) -> int | None:
        if not uid_pool_needed():
            return None
        with self._lock:
            return UID_BASE + next(self._uids) % UID_POOL

    def start_failure(self, timeout: float) -> str | None:
        """Why a tiny program (``print(6 * 7)``) does not run in this sandbox within ``timeout`` seconds, or
        ``None`` where it does: ``unavailable``'s last check and the scorer's probe."""
        try:
            probe = self.run({}, ["-c", "print(6 * 7)"], b"", timeout)
        except OSError as err:
            return f"bubblewrap could not start: {err}"
        if probe.outcome != "ok" or probe.stdout.strip() != b"42":
            detail = probe.stderr.decode(errors="replace").strip()[-300:]
            return f"bubblewrap could not start a sandbox ({detail or probe.outcome}; are user namespaces enabled?)"
        return None

    def identity(self) -> list[str]:
        """Where the host runs as root, ``setpriv`` ahead of bubblewrap: a uid of the pool and no groups; nothing
        otherwise. An exec, not ``Popen(user=...)``: that makes ``subprocess`` fork the scorer's process instead
        of spawning (8.6-11.6 ms a call from a process with JAX loaded, against 5.5-6.3 ms through ``setpriv``),
        and not a ``preexec_fn`` (a fork of a multithreaded process, JAX's, can deadlock)."""
        uid = self._uid()
        if uid is None:
            return []
        return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]

    def confinement(self, timeout: float, helpers: int = 0) -> list[str]:
        """util-linux's ``prlimit`` inside the sandbox, ahead of the interpreter: the rlimits, taken after
        bubblewrap made the user namespace, so that the process limit counts the sandbox's own processes (the
        kernel counts processes per user namespace and uid), not every process of the host user that runs the
        scorer (a limit of 18 taken before bubblewrap failed every call of a user with 18 processes)."""
        limits = self.limits
        cpu = math.ceil(timeout) + 1
        return [PRLIMIT, f"--cpu={cpu}", f"--as={limits.memory_mb << 20}", f"--fsize={limits.file_size_mb << 20}",
                f"--nofile={limits.open_files}", "--core=0", f"--nproc={limits.processes + helpers}", "--"]

    def command(self) -> list[str]:
        """bubblewrap's arguments, up to the interpreter's own."""
        out = ["bwrap", "--unshare-all", "--die-with-parent", "--as-pid-1", "--new-session",
               "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev",
               "--tmpfs", "/tmp", "--tmpfs", "/work", "--chdir", "/work", "--clearenv",
               "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/work",
               "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "LANG", "C.UTF-8"]
        for link in ("lib", "lib64", "bin", "sbin"):
            if os.path.islink(f"/{link}") or os.path.isdir(f"/usr/{link}"):
                out += ["--symlink", f"usr/{link}", f"/{link}"]
        return out

    def path(self, name: str) -> str:
        """Where a task file named ``name`` is, as the code sees it.

        Args:
            name: The file's name.
        """
        return f"/task/{name}"

    def run_file(self, files: Mapping[str, bytes], entry: str, stdin: bytes, timeout: float,
                 harness: bool = False) -> Run:
        """Runs the task file ``entry`` (one of ``files``) as the program; ``harness``: the program is the
        tests' harness (the interpreter in isolated mode without ``site``, ``-I -S``; one process more than
        ``processes``, the harness' own; its output read up to ``Limits.read_cap``).

        Args:
            files: The task's files, by name.
            entry: The file that is the program.
            stdin: Its standard input.
            timeout: Seconds it may take.
            harness: Whether the program is the harness.
        """
        return self.run(files, [*(["-I", "-S"] if harness else []), self.path(entry)], stdin, timeout,
                        helpers=int(harness), cap=self.limits.read_cap(harness))

    def run(self, files: Mapping[str, bytes], argv: Sequence[str], stdin: bytes, timeout: float,
            helpers: int = 0, cap: int | None = None) -> Run:
        """Runs ``interpreter *argv`` in ``/work`` with ``files`` read-only at ``/task/<name>``, ``stdin`` on
        its standard input, for at most ``timeout`` seconds (and the limits; ``helpers``: processes of ours
        allowed beyond ``processes``, the harness'; ``cap``: the bytes of stdout and stderr read, default
        ``Limits.read_cap()``)."""
        limits = self.limits
        task = tempfile.mkdtemp(prefix=f"prm-jax-task-{os.getpid()}-")  # (whose run left it, should one stay)
        try:
            os.chmod(task, 0o755)
            for name, content in files.items():
                if "/" in name or name in ("", ".", ".."):
                    raise ValueError(f"a task file's name must be a plain file name, got {name!r}")
                path = os.path.join(task, name)
                with open(path, "wb") as handle:
                    handle.write(content)
                os.chmod(path, 0o444)
            cmd = [*self.identity(), *self.command(), "--ro-bind", task, "/task", "--remount-ro", "/",
                   *self.confinement(timeout, helpers), self.interpreter, *argv]
            started = time.monotonic()
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, close_fds=True)
            try:
                stdout, stderr, ended = communicate(proc, stdin, started + timeout, cap or limits.read_cap())
            finally:
                _kill(proc)
            seconds = time.monotonic() - started
            returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
            return Run(classify(ended, returncode, stderr), returncode, stdout, stderr, seconds)
        finally:
            shutil.rmtree(task, ignore_errors=True)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """bubblewrap's whole process group, then the wait (its namespace dies with it: ``--die-with-parent``)."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


