"""The harness: the program that runs a turn's tests inside the sandbox (``CodeExecutionScorer``: its assert
tests in the local sandbox, every test on SandboxFusion), one fresh process per test, and prints each test's
verdict after a nonce the code never sees. Standard library only: it
runs under the sandbox's interpreter (the local sandbox's ``/usr/bin/python3``, or SandboxFusion's), and the
host side imports its reading rules from here (``communicate``, ``classify``, ``io_verdict``), so each is
declared once.

The job comes on stdin, one JSON object: the nonce, the solution's path, the tests, ``time_per_test``,
``total_time``, ``output_bytes`` and ``wipe`` (empty the working folder between tests: the local sandbox's
``/work``). The harness makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``: no process of its uid can read
its memory or open its descriptors through ``/proc``), prints ``<nonce> started``, then runs each test:

- ``{"input", "output"}``: ``python3 solution.py`` with ``input`` on stdin, stdout and stderr read up to
  ``output_bytes`` each within ``time_per_test`` (``communicate``); it passes when it exits 0 and its stdout
  is ``output`` (``io_verdict``, ``same_output``); else the run's kind (``classify``: a failure, a timeout, a
  memory or an output limit);
- ``{"assert"}``: the solution in a process of its own (``harness.py --child``: an exec, so its memory never
  held the job), which answers calls over two pipes; the test's code runs here with each callable the
  solution defines bound to a stand-in that sends the call's arguments and reads back its value. Only values
  cross: Python literals (``repr`` read back by ``ast.literal_eval``; ``nan`` and ``inf`` too), so an object
  that claims to equal everything, a patched builtin or a hooked exit stays in the child. A call that earns no
  value (no literal, the child exits, answers nonsense or nothing within the test's time) raises ``Unearned``,
  a ``BaseException`` a test's ``except Exception`` does not catch, and fails the test even where a bare
  ``except`` swallows it. An exception the solution raised is raised again as the built-in of that name
  (``Exception`` otherwise), so ``except ValueError`` tests work. The solution's own output is discarded.

Each test has ``time_per_test`` of wall clock (and the sandbox's CPU limit, the turn's); after each, every
other process of the sandbox is killed (the harness is PID 1 of the local sandbox's namespace: ``kill(-1)``; elsewhere the
test's session) and reaped, so nothing of one test outlives it. A verdict line is ``<nonce> <index> <kind>``
on the harness' stdout, which nothing else writes: the tests' processes have pipes of their own, do not know
the nonce, and can reach the harness only to kill it (the tests left then have no verdict: failures).
"""

from __future__ import annotations

import builtins
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import time

TYPE_CHECKING = False  # (typing is not imported at run time: the harness starts once a turn, and every ms shows)
if TYPE_CHECKING:
    from typing import Any, Literal, NoReturn

    Outcome = Literal["ok", "error", "timeout", "memory", "output_limit"]  # how a run ended (``classify``)

PR_SET_DUMPABLE = 4
KINDS = ("passed", "failed", "timeout", "memory", "output_limit")  # a test's verdict


# -- the reading rules (the host side's too) -------------------------------------------------------------------

def same_output(got: bytes, expected: str) -> bool:
    """Whether a run's stdout is the expected output, each line's trailing whitespace and trailing blank lines
    ignored."""
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.splitlines()]
        while out and not out[-1]:
            out.pop()
        return out
    return lines(got.decode("utf-8", errors="replace")) == lines(expected)


def classify(ended: str, returncode: int, stderr: bytes) -> Outcome:
    """How a run ended (``ok``, ``error``, ``timeout``, ``memory``, ``output_limit``), from how its reading
    ended (``exit``, ``timeout``, ``output_limit``), its exit status and its stderr (a ``MemoryError``:
    ``memory``)."""
    if ended == "timeout" or returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "timeout"
    if ended == "output_limit":
        return "output_limit"
    if returncode == 0:
        return "ok"
    if b"MemoryError" in stderr[-4096:] or b"Cannot allocate memory" in stderr[-4096:]:
        return "memory"
    return "error"


def communicate(proc: subprocess.Popen[bytes], stdin: bytes, deadline: float, cap: int) -> tuple[bytes, bytes, str]:
    """stdin written, stdout and stderr read (at most ``cap`` bytes each) until both close or the process has
    exited and what it wrote is read (a daemon it left holding the pipes is not waited for: the sandbox's
    namespace ends with its first process, and the harness kills what a test leaves), the deadline passes
    (``"timeout"``) or a stream passes the cap (``"output_limit"``); ``"exit"`` otherwise."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out: dict[Any, bytearray] = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    selector = selectors.DefaultSelector()
    for stream in out:
        os.set_blocking(stream.fileno(), False)
        selector.register(stream, selectors.EVENT_READ)
    pending = memoryview(stdin)
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        selector.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    ended = "exit"
    try:
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                ended = "timeout"
                break
            exited = proc.poll() is not None  # (before the select: what it wrote is in the pipes by then)
            ready = selector.select(min(left, 0.1))
            if exited and not ready:
                break
            for key, _ in ready:
                stream = key.fileobj
                if stream is proc.stdin:
                    try:
                        written = os.write(proc.stdin.fileno(), pending[:1 << 16])
                    except BlockingIOError:
                        written = 0
                    except BrokenPipeError:  # (the code stopped reading: the rest is dropped)
                        written = len(pending)
                    pending = pending[written:]
                    if not pending:
                        selector.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(stream.fileno(), 1 << 16)  # type: ignore[union-attr]
                if not chunk:
                    selector.unregister(stream)
                    continue
                buffer = out[stream]
                buffer += chunk
                if len(buffer) > cap:
                    del buffer[cap:]
                    return bytes(out[proc.stdout]), bytes(out[proc.stderr]), "output_limit"
    finally:
        selector.close()
    if ended == "exit":
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            ended = "timeout"
    return bytes(out[proc.stdout]), bytes(out[proc.stderr]), ended


def io_verdict(outcome: str, stdout: bytes, expected: str) -> str:
    """A stdin/stdout test's verdict, from its run's outcome (``classify``) and its stdout."""
    if outcome == "ok":
        return "passed" if same_output(stdout, expected) else "failed"
    return "failed" if outcome == "error" else outcome


def verdicts(stdout: bytes, nonce: str, count: int) -> tuple[bool, list[str | None]]:
    """From the harness' stdout: whether it started, and each test's verdict (``None``: none printed).

    Args:
        stdout: What the harness printed.
        nonce: The run's nonce.
        count: The number of tests.
    """
    started = False
    out: list[str | None] = [None] * count
    for line in stdout.decode("utf-8", errors="replace").splitlines():
        parts = line.split(" ")
        if parts[0] != nonce:
            continue
        if parts[1:] == ["started"]:
            started = True
        elif len(parts) == 3 and parts[1].isdigit() and int(parts[1]) < count and parts[2] in KINDS:
            out[int(parts[1])] = parts[2]
    return started, out


# -- values across the pipes ----------------------------------------------------------------------------------

def encode(value: Any) -> str:
    """A value as the literal that crosses (its ``repr``)."""
    return repr(value)


def decode(text: str) -> Any:
    """A literal read back (``ValueError`` where it is none); ``nan`` and ``inf``, as ``repr`` writes them, are
    the floats they are."""
    import ast  # (assert tests only)

    class Constants(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id in ("nan", "inf"):
                return ast.copy_location(ast.Constant(math.nan if node.id == "nan" else math.inf), node)
            return node

    try:
        tree = Constants().visit(ast.parse(text, mode="eval"))
        return ast.literal_eval(tree)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as err:
        raise ValueError(f"not a Python literal ({type(err).__name__})") from None


def _send(stream: Any, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def child(solution: str, calls_fd: int, answers_fd: int) -> NoReturn:
    """The solution's process of an assert test: runs its file, says which callables it defines, then answers
    calls."""
    calls = os.fdopen(calls_fd, "r", encoding="utf-8")
    answers = os.fdopen(answers_fd, "w", encoding="utf-8")
    namespace: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
    try:
        with open(solution, encoding="utf-8") as handle:
            source = handle.read()
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as err:  # the solution failed to load: the test fails with its error
        _send(answers, {"error": type(err).__name__, "message": str(err)[:500]})
        os._exit(0)
    names = sorted(k for k, v in namespace.items() if callable(v) and not k.startswith("__"))
    _send(answers, {"names": names})
    for line in calls:
        call = json.loads(line)
        try:
            args, kwargs = decode(call["args"]), decode(call["kwargs"])
            reply = {"value": encode(namespace[call["name"]](*args, **kwargs))}
        except BaseException as err:  # (SystemExit included: the call fails, the child answers on)
            reply = {"error": type(err).__name__, "message": str(err)[:500]}
        _send(answers, reply)
    os._exit(0)


class Unearned(BaseException):
    """A call that earned no value: the solution's process ended, answered nothing readable or nothing in time,
    or returned no literal. A ``BaseException``, so a test's ``except Exception`` does not take it for the
    solution's own error; and any one of them fails the test, even caught by a bare ``except``."""


class _Solution:
    """The harness' side of an assert test's pipes."""

    def __init__(self, calls_fd: int, answers_fd: int, limit: int, deadline: float):
        self.calls = os.fdopen(calls_fd, "w", encoding="utf-8")
        self.answers_fd, self.limit, self.deadline = answers_fd, limit, deadline
        self.pending = b""
        self.unearned: str | None = None  # why a call earned nothing (the test then fails, whatever it caught)
        self.timed_out = False

    def void(self, why: str) -> Unearned:
        self.unearned = self.unearned or why
        return Unearned(why)

    def receive(self) -> dict[str, Any]:
        """The next line the child writes, within the test's time."""
        while b"\n" not in self.pending:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                raise self.void("the solution did not answer within time_per_test")
            with selectors.DefaultSelector() as selector:
                selector.register(self.answers_fd, selectors.EVENT_READ)
                if not selector.select(left):
                    continue
            chunk = os.read(self.answers_fd, 1 << 16)
            if not chunk:
                raise self.void("the solution's process ended")
            self.pending += chunk
            if len(self.pending) > self.limit:
                raise self.void("the solution answered more than output_bytes")
        line, _, self.pending = self.pending.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise self.void("the solution's process answered something else")
        return reply

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            _send(self.calls, {"name": name, "args": encode(args), "kwargs": encode(kwargs)})
        except (BrokenPipeError, OSError):
            raise self.void("the solution's process ended") from None
        reply = self.receive()
        if "error" in reply:
            kind = getattr(builtins, str(reply["error"]), None)
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                kind = Exception
            raise kind(str(reply.get("message", "")))
        value = reply.get("value")
        if not isinstance(value, str):
            raise self.void("the solution's process answered something else")
        try:
            return decode(value)
        except ValueError:
            raise self.void(f"{name}(...) returned a value that is not a Python literal") from None


class _Stand:
    """A callable of the solution, as the test sees it."""

    def __init__(self, solution: _Solution, name: str):
        self._solution, self._name = solution, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._solution.call(self._name, args, kwargs)

    def __repr__(self) -> str:
        return f"<solution's {self._name}>"


# -- the harness ----------------------------------------------------------------------------------------------

def _undumpable() -> None:
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (ImportError, OSError, AttributeError):  # (a sandbox without ctypes: its own isolation stands)
        pass


def _end(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> int:
    """Every process of the test killed and reaped (the harness as PID 1: all but itself), then the test's exit
    status."""
    try:
        if os.getpid() == 1:
            os.kill(-1, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    returncode = proc.wait()
    if os.getpid() == 1:
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
    return returncode


def _wipe(folder: str) -> None:
    """The working folder emptied for the next test."""
    import shutil
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def run_io(solution: str, test: dict[str, Any], seconds: float, cap: int) -> str:
    """One stdin/stdout test: the solution's run and its verdict."""
    proc = subprocess.Popen([sys.executable, solution], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr, ended = communicate(proc, str(test.get("input", "")).encode(), time.monotonic() + seconds, cap)
    finally:
        returncode = _end(proc)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return io_verdict(classify(ended, returncode, stderr), stdout, str(test["output"]))


def run_assert(solution: str, test: dict[str, Any], seconds: float, cap: int) -> str:
    """One assert test: the solution's process answering the test's calls, and the verdict."""
    deadline = time.monotonic() + seconds
    calls_read, calls_write = os.pipe()
    answers_read, answers_write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "--child", solution, str(calls_read),
                             str(answers_write)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, pass_fds=(calls_read, answers_write), start_new_session=True)
    os.close(calls_read)
    os.close(answers_write)
    side = _Solution(calls_write, answers_read, cap, deadline)
    verdict = "failed"
    try:
        first = side.receive()
        if "error" in first:
            verdict = "memory" if first["error"] == "MemoryError" else "failed"
        else:
            scope: dict[str, Any] = {"__name__": "__test__", "__builtins__": builtins}
            scope.update((str(name), _Stand(side, str(name))) for name in first.get("names") or ())
            exec(compile(str(test["assert"]), "test", "exec"), scope)
            verdict = "failed" if side.unearned else "passed"
    except MemoryError:
        verdict = "memory"
    except BaseException:  # (an assertion, an error the test raised, the child gone: a failure)
        verdict = "failed"
    finally:
        _end(proc)
        try:
            side.calls.close()
        except OSError:
            pass
        os.close(answers_read)
    return "timeout" if side.timed_out else verdict


def harness() -> None:
    """Runs the job on stdin and prints the verdicts."""
    job = json.loads(sys.stdin.read())
    sys.stdin.close()
    nonce, solution, tests = str(job["nonce"]), str(job["solution"]), list(job["tests"])
    per_test, total, cap = float(job["time_per_test"]), float(job["total_time"]), int(job["output_bytes"])
    wipe = bool(job.get("wipe")) and os.getpid() == 1
    del job
    _undumpable()
    folder = os.getcwd()
    spent_by = time.monotonic() + total

    def say(text: str) -> None:
        sys.stdout.write(f"{nonce} {text}\n")
        sys.stdout.flush()

    say("started")
    for index, test in enumerate(tests):
        left = spent_by - time.monotonic()
        if left <= 0:
            say(f"{index} timeout")
            continue
        run = run_assert if "assert" in test else run_io
        say(f"{index} {run(solution, test, min(per_test, left), cap)}")
        if wipe:
            _wipe(folder)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    harness()
