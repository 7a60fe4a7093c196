"""The harness of an assert-style test (``CodeExecutionScorer``): a standalone program (the standard library
only) that runs inside the sandbox, in two processes, so that the verdict is one the agent's code cannot forge.

The harness (this file, run as ``python3 -I harness.py``) reads its job from stdin, one JSON object: the
test's code, the path of the solution, a nonce the scorer drew for this run, and the largest answer it reads.
It makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``: no process of its uid can read its memory or
open its descriptors through ``/proc``), then starts the solution in a fresh interpreter of its own
(``harness.py --child``: an exec, so the child's memory never held the job), whose stdout and stderr go to the
sandbox's stderr. The child runs the solution's file and answers calls over two pipes; the harness runs the
test's code with each callable the solution defines bound to a stand-in that sends the call's arguments and
reads back its value.

Only values cross: Python literals (``repr`` read back by ``ast.literal_eval``; ``nan`` and ``inf`` too), so
an object that claims to equal everything, a patched builtin or a hooked exit stays in the child. A call that
earns no value (its value is no literal, or the child exits or answers nonsense) raises ``Unearned``, a
``BaseException`` a test's ``except Exception`` does not catch, and fails the test even where a bare
``except`` swallows it. An exception the solution raised is raised again in
the test as the built-in exception of that name (``Exception`` otherwise), so ``try``/``except ValueError``
tests work. The test passes when its code runs to its end; the harness then prints ``<nonce> passed`` (else
``<nonce> failed``, or ``<nonce> memory`` after a ``MemoryError``) on its own stdout, which nothing else
writes: the child does not know the nonce, cannot reach the harness' stdout, and exits early (``sys.exit``,
``os._exit``) only to fail the call it was in.
"""

from __future__ import annotations

import ast
import builtins
import json
import math
import os
import subprocess
import sys
from typing import Any, NoReturn

PR_SET_DUMPABLE = 4


def encode(value: Any) -> str:
    """A value as the literal that crosses (its ``repr``)."""
    return repr(value)


class _Constants(ast.NodeTransformer):
    """``nan`` and ``inf`` (what ``repr`` writes for them) as the floats they are."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("nan", "inf"):
            return ast.copy_location(ast.Constant(math.nan if node.id == "nan" else math.inf), node)
        return node


def decode(text: str) -> Any:
    """A literal read back (``ValueError`` where it is none)."""
    try:
        tree = _Constants().visit(ast.parse(text, mode="eval"))
        return ast.literal_eval(tree)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as err:
        raise ValueError(f"not a Python literal ({type(err).__name__})") from None


def _send(stream: Any, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def child(solution: str, calls_fd: int, answers_fd: int) -> NoReturn:
    """The solution's process: runs its file, says which callables it defines, then answers calls."""
    calls = os.fdopen(calls_fd, "r", encoding="utf-8")
    answers = os.fdopen(answers_fd, "w", encoding="utf-8")
    namespace: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
    try:
        with open(solution, encoding="utf-8") as handle:
            source = handle.read()
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as err:  # the solution failed to load: every call fails with its error
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
    """A call that earned no value: the solution's process ended, answered nothing readable, or returned no
    literal. A ``BaseException``, so a test's ``except Exception`` does not take it for the solution's own
    error; and any one of them fails the test, even caught by a bare ``except``."""


class _Solution:
    """The harness' side of the pipes."""

    def __init__(self, calls: Any, answers: Any, limit: int):
        self.calls, self.answers, self.limit = calls, answers, limit
        self.unearned: str | None = None  # why a call earned nothing (the test then fails, whatever it caught)

    def void(self, why: str) -> Unearned:
        self.unearned = self.unearned or why
        return Unearned(why)

    def receive(self) -> dict[str, Any]:
        line = self.answers.readline(self.limit + 1)
        if not line.endswith("\n"):
            raise self.void("the solution's process ended or answered more than the output limit")
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


def _undumpable() -> None:
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (ImportError, OSError, AttributeError):  # (a sandbox without ctypes: its own isolation stands)
        pass


def harness() -> None:
    """Runs one test (the job on stdin) against the solution and prints the verdict."""
    job = json.loads(sys.stdin.read())
    sys.stdin.close()
    nonce, test, solution, limit = str(job["nonce"]), str(job["test"]), str(job["solution"]), int(job["limit"])
    del job
    _undumpable()
    calls_read, calls_write = os.pipe()
    answers_read, answers_write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "--child", solution,
                             str(calls_read), str(answers_write)],
                            stdin=subprocess.DEVNULL, stdout=2, stderr=2, pass_fds=(calls_read, answers_write),
                            start_new_session=True)
    os.close(calls_read)
    os.close(answers_write)
    verdict = "failed"
    try:
        solution_side = _Solution(os.fdopen(calls_write, "w", encoding="utf-8"),
                                  os.fdopen(answers_read, "r", encoding="utf-8"), limit)
        first = solution_side.receive()
        if "error" in first:
            verdict = "memory" if first["error"] == "MemoryError" else "failed"
        else:
            names = first.get("names")
            scope: dict[str, Any] = {"__name__": "__test__", "__builtins__": builtins}
            scope.update((str(name), _Stand(solution_side, str(name))) for name in names or ())
            exec(compile(test, "test", "exec"), scope)
            verdict = "failed" if solution_side.unearned else "passed"
    except MemoryError:
        verdict = "memory"
    except BaseException:  # (an assertion, an error the test raised, the child gone: a failure)
        verdict = "failed"
    finally:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            pass
        proc.wait()
    sys.stdout.write(f"{nonce} {verdict}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    harness()
