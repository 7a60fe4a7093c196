"""The served sandbox: a SandboxFusion server (ByteDance's code sandbox, the one verl's and many RL recipes'
code rewards call) runs the agent's code, one ``POST /run_code`` a run, through the served scorers' one
transport (``JSONService``: retries of 429/5xx and connection errors, the rate limit, deadlines, the body bound)
and read through the one ``AnswerReader``.

The request is SandboxFusion's documented ``RunCodeRequest``: ``code`` (the program), ``language: python``,
``stdin``, ``run_timeout`` (the run's seconds), ``memory_limit_MB`` (``memory_mb``) and ``files`` (the task's
other files, base64, at paths relative to the program's working folder). The answer is its
``RunCodeResponse``: ``status`` (``Success``, ``Failed``, ``SandboxError``) and ``run_result`` (``status``:
``Finished``, ``TimeLimitExceeded``, ``Error``; ``return_code``, ``stdout``, ``stderr``, ``execution_time``).
A ``SandboxError``, a run ``Error`` (the server's sandbox failed, not the code) and a malformed answer fail
the branch as a ``ServiceError``; a time limit is a ``timeout``, a run whose stdout or stderr passes
``output_bytes`` an ``output_limit``, and a ``MemoryError`` in stderr a ``memory`` failure, as locally. The
limits on processes, file size and open files are the server's own (its configuration), not sent.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any

import anyio.from_thread

from prm_jax._validation import short_repr
from prm_jax.scorers._harness import classify
from prm_jax.scorers._http import JSONService, Probe, Transport
from prm_jax.scorers._sandbox import Limits, Run

ROUTE = "/run_code"
PROBE_PROGRAM = b"print(6 * 7)"


class SandboxFusion:
    """Runs programs on the SandboxFusion server at ``url`` (see the module docstring)."""

    def __init__(self, url: str, limits: Limits, transport: Transport, who: str):
        self.limits, self.who = limits, who
        self.service = JSONService(url, who=who, transport=transport)

    def path(self, name: str) -> str:
        """Where a task file named ``name`` is, as the code sees it (its working folder).

        Args:
            name: The file's name.
        """
        return name

    def request(self, files: Mapping[str, bytes], entry: str, stdin: bytes, timeout: float) -> dict[str, Any]:
        """The ``RunCodeRequest`` that runs ``entry`` (one of ``files``) with the others beside it.

        Args:
            files: The task's files, by name.
            entry: The file that is the program.
            stdin: Its standard input.
            timeout: Seconds it may take.
        """
        return {"code": files[entry].decode("utf-8", errors="replace"), "language": "python",
                "stdin": stdin.decode("utf-8", errors="replace"), "run_timeout": timeout, "compile_timeout": timeout,
                "memory_limit_MB": self.limits.memory_mb,
                "files": {name: base64.b64encode(content).decode("ascii") for name, content in files.items()
                          if name != entry}, "fetch_files": []}

    def read(self, answer: Any, where: str, cap: int | None = None) -> Run:
        """A ``RunCodeResponse`` as the run it reports; ``ServiceError`` where the server's sandbox failed or
        the answer is malformed.

        Args:
            answer: The decoded answer.
            where: How errors name the call.
            cap: The bytes of stdout and stderr taken (past them: ``output_limit``); default
                ``Limits.read_cap()``.
        """
        reader = self.service.reader
        status = reader.field(answer, ["status"], where)
        if status == "SandboxError":
            message = answer.get("message") if isinstance(answer, dict) else None
            raise reader.error(where, f"the server's sandbox failed (status SandboxError: "
                                      f"{reader.redact(short_repr(message))})")
        if status not in ("Success", "Failed"):
            raise reader.error(where, f"['status'] must be 'Success', 'Failed' or 'SandboxError', got "
                                      f"{reader.redact(short_repr(status))}")
        result = reader.field(answer, ["run_result"], where)
        if result is None:  # (nothing ran: a failed compile step, for a compiled language)
            raise reader.error(where, f"status {status} with no run_result: the program did not run")
        kind = reader.field(answer, ["run_result", "status"], where)
        if kind == "Error":
            raise reader.error(where, "the server's sandbox could not run the program (run_result status Error)")
        if kind not in ("Finished", "TimeLimitExceeded"):
            raise reader.error(where, f"['run_result']['status'] must be 'Finished', 'TimeLimitExceeded' or "
                                      f"'Error', got {reader.redact(short_repr(kind))}")
        streams = []
        for name in ("stdout", "stderr"):
            text = result.get(name)
            if text is not None and not isinstance(text, str):
                raise reader.error(where, f"['run_result'][{name!r}] must be a string or null, got "
                                          f"{reader.redact(short_repr(text))}")
            streams.append((text or "").encode("utf-8", errors="replace"))
        stdout, stderr = streams
        seconds = result.get("execution_time")
        seconds = reader.number(seconds, where, "['run_result']['execution_time']") if seconds is not None else math.nan
        if kind == "TimeLimitExceeded":
            return Run("timeout", -9, stdout, stderr, seconds)
        code = reader.field(answer, ["run_result", "return_code"], where)
        if isinstance(code, bool) or not isinstance(code, int):
            raise reader.error(where, f"['run_result']['return_code'] must be an integer, got "
                                      f"{reader.redact(short_repr(code))}")
        cap = cap or self.limits.read_cap()
        ended = "output_limit" if max(len(stdout), len(stderr)) > cap else "exit"
        return Run(classify(ended, code, stderr), code, stdout[:cap], stderr[:cap], seconds)

    def run_file(self, files: Mapping[str, bytes], entry: str, stdin: bytes, timeout: float,
                 harness: bool = False) -> Run:
        """One run on the server, from a worker thread of the runner's event loop (the request goes out on
        the loop, through the transport). ``harness``: the program is the tests' harness (its output read up
        to ``Limits.read_cap``).

        Args:
            files: The task's files, by name.
            entry: The file that is the program.
            stdin: Its standard input.
            timeout: Seconds it may take.
            harness: Whether the program is the harness.
        """
        request = self.request(files, entry, stdin, timeout)
        try:
            answer = anyio.from_thread.run(self.service.post, ROUTE, request)
        except RuntimeError as err:
            if "worker thread" not in str(err) and "event loop" not in str(err):
                raise
            raise RuntimeError(f"{self.who}: sandbox: sandbox_fusion sends its requests from the runner's event "
                               "loop: score through PRMRunner or prm-jax score, not by calling evaluate "
                               "directly") from None
        return self.read(answer, f"{self.who}: POST {ROUTE}", self.limits.read_cap(harness))

    async def probe(self, scorer: str) -> Probe:
        """One tiny program (``print(6 * 7)``) run on the server, read as every run is.

        Args:
            scorer: The scorer's name.
        """
        request = self.request({"probe.py": PROBE_PROGRAM}, "probe.py", b"", self.limits.time_per_test)

        def check(answer: Any) -> None:
            run = self.read(answer, f"scorer {scorer!r} (probe)")
            if run.outcome != "ok" or run.stdout.strip() != b"42":
                raise self.service.reader.error(f"scorer {scorer!r} (probe)", f"print(6 * 7) ran as {run.outcome} "
                                                f"with stdout {run.stdout[:80]!r}")
        return await self.service.probe(scorer, ROUTE, request, check)

    def stats(self) -> dict[str, float]:
        """Requests sent, retries, rate-limit waits (the client's figures)."""
        return self.service.stats()

    async def aclose(self) -> None:
        await self.service.aclose()
