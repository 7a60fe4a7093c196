"""``CodeExecutionScorer``: runs the code a turn wrote against the session's tests, inside the local sandbox
(``prm_jax.scorers._sandbox``: bubblewrap), and scores the turn by the tests it passes.

The code is taken from the turn's output text: by default the last fenced block of the configured language
(```` ```python ```` ... ```` ``` ````, or ``~~~`` fences; a block without a language counts too), or the first block, or every
block joined, or the whole reply (``extract``). The tests are the session's ``metadata[tests_key]``, a list
of two kinds, mixed as a session likes:

- ``{"input": str, "output": str}``: the code runs as its own program with ``input`` on stdin; the test
  passes when it exits 0 and its stdout equals ``output`` (trailing whitespace of each line and trailing
  blank lines ignored);
- ``{"assert": str}``: Python test code (``assert add(2, 3) == 5``, or a ``def check(candidate): ...`` and
  its call) run against the functions the code defines, by the harness (``prm_jax.scorers._harness``): the
  code runs in a process of its own (its module-level code with ``__name__`` ``"solution"`` and an empty
  stdin: a ``__main__`` block does not run) and only literal values cross to the test's process, so a test
  passes when its code runs to its end on values the solution returned.

Locally each stdin/stdout test is one sandbox run, its verdict taken outside the sandbox; a turn's assert tests
are one sandbox run of the harness (``prm_jax.scorers._harness``: a fresh process a test, everything else in
the namespace killed and the folder emptied between tests); on SandboxFusion the harness runs all of a turn's
tests, one request a turn. Nothing the code prints, no exit status alone, no object that claims to equal
everything, and no file it writes can pass a test (its task files are read-only; the harness' verdicts carry a
nonce the code never sees).

A turn scores the fraction of tests passed (``score: fraction``) or 1 only when all pass (``score: all``);
a turn without code scores 0 (``no_code: zero``) or is left unscored (``no_code: skip``: 0, as every turn a
scorer leaves out, but counted apart). A failure of the code (a wrong answer, a crash, a time, memory or
output limit) is a score; the turn's observations count each kind (``tests_passed``, ``tests_failed``,
``tests_timeout``, ``tests_memory``, ``tests_output_limit``, ``no_code``; ``skipped`` under ``no_code:
skip``). A failure of the sandbox itself (it cannot start, the harness does not start: ``SandboxError``; the
served sandbox fails: ``ServiceError``) fails the branch, never a 0.

Two sandboxes run the code (``sandbox``): ``local``, bubblewrap on this machine
(``prm_jax.scorers._sandbox``), and ``sandbox_fusion``, a SandboxFusion server's ``POST /run_code``
(``prm_jax.scorers._sandbox_fusion``) through the served scorers' one transport (retries, rate limit,
deadlines) and answer reader. The limits (``time_per_test``, ``total_time``, ``memory_mb``, ``output_bytes``,
``processes``, ``file_size_mb``, ``open_files``) are one declared record (``Limits``), checked at
configuration, where the local sandbox is also started once: a machine without bubblewrap or user namespaces
is refused then, with the reason. There is no unsandboxed mode.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, cast, get_args

from prm_jax._validation import one_of, short_repr
from prm_jax.errors import SandboxError
from prm_jax.runtime._context import METADATA_KEY
from prm_jax.runtime._scoring import PRMMetricObservation, PRMScorerResult, SyncScorer
from prm_jax.runtime._settings import Settings, setting
from prm_jax.runtime._trajectory import Interaction
from prm_jax.scorers._harness import KINDS as VERDICT_KINDS
from prm_jax.scorers._harness import io_verdict, verdicts
from prm_jax.scorers._http import Probe, Transport, check_url, httpx_module, transport_setting
from prm_jax.scorers._openai_judge import output_text
from prm_jax.scorers._sandbox import DEFAULT_INTERPRETER, Limits, LocalSandbox, unavailable
from prm_jax.scorers._sandbox_fusion import SandboxFusion

Extract = Literal["last_block", "first_block", "all_blocks", "whole_reply"]
ScoreBy = Literal["fraction", "all"]
NoCode = Literal["zero", "skip"]
SandboxKind = Literal["local", "sandbox_fusion"]
KINDS = (*VERDICT_KINDS, "no_code")
# Each kind's metric: how many of a turn's tests ended so (``tests_passed``, ...; ``no_code``: the turn had none).
METRICS = {kind: kind if kind == "no_code" else f"tests_{kind}" for kind in KINDS}
_FENCE = re.compile(r"(```|~~~)[ \t]*([\w+.-]*)[^\n]*\n(.*?)\1", re.S)  # (Markdown's two fences)
SOLUTION, HARNESS = "solution.py", "harness.py"
HARNESS_SOURCE = (Path(__file__).parent / "_harness.py").read_bytes()
TEST_SHAPE = '{"input": str, "output": str} or {"assert": str}'
HARNESS_SLACK_S = 3.0  # seconds the sandbox run may take beyond its tests' (the harness' start, the kills)
FUSION_TRANSPORT: dict[str, Any] = {"request_timeout": 60.0, "max_concurrency": 32}  # (the served sandbox's)


def check_executor(sandbox: str, executor: str) -> None:
    """The served sandbox's requests go out on the runner's event loop from the scorer's threads: with
    ``sandbox: sandbox_fusion`` only executor ``thread`` is taken (a refusal naming both keys)."""
    if sandbox == "sandbox_fusion" and executor != "thread":
        raise ValueError(f"sandbox: sandbox_fusion sends requests from the runner's event loop, with executor "
                         f"'thread' only (executor is {executor!r})")


def code_blocks(text: str, language: str) -> list[str]:
    """The fenced blocks of ``text`` in ``language`` (or without a language), in order."""
    return [body for _, tag, body in _FENCE.findall(text) if tag.lower() in ("", language, f"{language}3")]


class IOTest(NamedTuple):
    """A stdin/stdout test: ``input`` on stdin, ``output`` expected on stdout."""

    input: str
    output: str


class AssertTest(NamedTuple):
    """An assert-style test: Python code run against the solution's functions (the harness)."""

    code: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodeExecutionSettings(Settings):
    language: Literal["python"] = setting("python", doc="The language the turn's code is in, and run as "
                                          "(``python``: the sandbox's ``interpreter``).")
    extract: Extract = setting("last_block", doc="Where the code is taken from the turn's text: the "
                               "``last_block`` or ``first_block`` fenced in ``language`` (or untagged), "
                               "``all_blocks`` joined, or the ``whole_reply``.")
    tests_key: str = setting("tests", doc="The key of the session's ``metadata`` that holds the tests: a list of "
                             f"``{TEST_SHAPE}``.")
    score: ScoreBy = setting("fraction", doc="A turn's score: the ``fraction`` of tests passed, or 1 only when "
                             "``all`` pass (else 0).")
    no_code: NoCode = setting("zero", doc="A turn without code: scored 0 (``zero``) or left unscored "
                              "(``skip``: 0, counted apart).")
    sandbox: SandboxKind = setting("local", doc="Where the code runs: ``local`` (bubblewrap on this machine) or "
                                   "``sandbox_fusion`` (a SandboxFusion server at ``url``).")
    url: str | None = setting(None, doc="The SandboxFusion server (``http://host:8080``; ``/run_code`` is "
                              "appended), with ``sandbox: sandbox_fusion`` only.")
    interpreter: str = setting(DEFAULT_INTERPRETER, doc="The interpreter inside the local sandbox: a system one "
                               "every user can read (bound read-only with ``/usr``).")
    limits: Limits = setting(Limits(), doc="What one run may use (flat: the limits' keys are the scorer's).")
    transport: Transport = transport_setting(**FUSION_TRANSPORT)

    def check(self) -> None:
        one_of("language", self.language, ("python",))
        one_of("extract", self.extract, get_args(Extract))
        one_of("score", self.score, get_args(ScoreBy))
        one_of("no_code", self.no_code, get_args(NoCode))
        one_of("sandbox", self.sandbox, get_args(SandboxKind))
        if not isinstance(self.tests_key, str) or not self.tests_key:
            raise ValueError(f"tests_key must be the metadata key of the tests, got {short_repr(self.tests_key)}")
        if self.sandbox == "sandbox_fusion":
            if self.url is None:
                raise ValueError("sandbox: sandbox_fusion needs url (the SandboxFusion server)")
            httpx_module("scorer 'code_execution' (sandbox: sandbox_fusion)")
            check_url("url", self.url)
            if self.interpreter != DEFAULT_INTERPRETER:
                raise ValueError("interpreter applies to sandbox: local only (SandboxFusion runs its own python)")
            return
        if self.url is not None:
            raise ValueError("url applies to sandbox: sandbox_fusion only, and sandbox is 'local'")
        if self.transport != Transport(**FUSION_TRANSPORT):
            raise ValueError("the transport settings (request_timeout, attempts, ...) apply to sandbox: "
                             "sandbox_fusion only, and sandbox is 'local'")
        reason = unavailable(self.interpreter) if isinstance(self.interpreter, str) else "interpreter is no path"
        if reason is not None:
            raise ValueError(f"the local sandbox cannot run here: {reason}")


class CodeExecutionScorer(SyncScorer):
    """Scores each turn by running its code against the session's tests in a sandbox (see the module
    docstring).

    Example:
        >>> scorer = prm_jax.scorers.CodeExecutionScorer(time_per_test=2.0)
        >>> code = "def double(n):\\n    return 2 * n\\n\\nif __name__ == '__main__':\\n    print(double(int(input())))"
        >>> reply = f"Here:\\n```python\\n{code}\\n```"
        >>> turn = prm_jax.Interaction("t0", [1], [2], output_messages=[{"role": "assistant", "content": reply}])
        >>> tests = [{"input": "2\\n", "output": "4"}, {"input": "1", "output": "3"}, {"assert": "assert double(5) == 10"}]
        >>> result = scorer.evaluate(turn, {"metadata": {"tests": tests}})
        >>> round(result.reward, 4), [(o.metric_id, o.value) for o in result.observations][:2]
        (0.6667, [('tests_passed', 2.0), ('tests_failed', 1.0)])
    """

    name = "code_execution"
    executor = "thread"  # (the code runs in the sandbox's processes, or on the server; a thread waits for each)
    settings_class = CodeExecutionSettings

    def prepare(self) -> None:
        super().prepare()
        record = self.settings
        try:
            check_executor(record.sandbox, self.executor)
        except ValueError as err:
            raise ValueError(f"scorer {self.name!r}: {err}") from None
        if record.sandbox == "sandbox_fusion":
            self.runner: LocalSandbox | SandboxFusion = SandboxFusion(record.url, record.limits, record.transport,
                                                                      who=f"scorer {self.name!r}")
        else:
            self.runner = LocalSandbox(record.limits, record.interpreter)

    @classmethod
    def validate_kwargs(cls, **kwargs: Any) -> None:
        super().validate_kwargs(**kwargs)
        check_executor(kwargs.get("sandbox", "local"), kwargs.get("executor", cls.executor))

    def code(self, text: str) -> str | None:
        """The code the turn wrote (``extract``), or ``None`` where it wrote none.

        Args:
            text: The turn's output text.
        """
        how = self.settings.extract
        if how == "whole_reply":
            return text if text.strip() else None
        blocks = code_blocks(text, self.settings.language)
        if not blocks:
            return None
        return {"first_block": blocks[0], "last_block": blocks[-1]}.get(how) or "\n".join(blocks)

    def validate_metadata(self, metadata: Mapping[str, Any]) -> None:
        """The session's tests are there and well formed (an assert test's code compiles), before anything is
        scored.

        Args:
            metadata: One session's ``metadata``.
        """
        self.tests(metadata)

    def tests(self, metadata: Mapping[str, Any]) -> list[IOTest | AssertTest]:
        """The session's tests; ``ValueError`` naming the ``metadata`` key otherwise.

        Args:
            metadata: The session's ``metadata``.
        """
        key = self.settings.tests_key
        tests = metadata.get(key)
        where = f"scorer {self.name!r}: metadata[{key!r}]"
        if not isinstance(tests, Sequence) or isinstance(tests, str) or not tests:
            raise ValueError(f"{where} must be a non-empty list of {TEST_SHAPE}, got {short_repr(tests)}")
        out: list[IOTest | AssertTest] = []
        for i, test in enumerate(tests):
            if isinstance(test, Mapping) and set(test) == {"assert"} and isinstance(test["assert"], str):
                try:
                    compile(test["assert"], f"{where}[{i}]['assert']", "exec")
                except (SyntaxError, ValueError) as err:
                    raise ValueError(f"{where}[{i}]['assert'] is not Python code: {err}") from None
                out.append(AssertTest(test["assert"]))
            elif isinstance(test, Mapping) and set(test) <= {"input", "output"} \
                    and isinstance(test.get("input", ""), str) and isinstance(test.get("output"), str):
                out.append(IOTest(test.get("input", ""), test["output"]))
            else:
                raise ValueError(f"{where}[{i}] must be {TEST_SHAPE}, got {short_repr(test)}")
        return out

    def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> PRMScorerResult:  # type: ignore[override]
        tests = self.tests(ctx.get(METADATA_KEY) or {})
        text = output_text(self.name, interaction, "run", "evaluate")
        code = self.code(text)
        counts = dict.fromkeys(KINDS, 0.0)
        if code is None:
            counts["no_code"] = 1.0
            return self._result(interaction, 0.0, counts)
        for kind in self.run_tests(code, tests):
            counts[kind] += 1
        passed = counts["passed"] / len(tests)
        score = passed if self.settings.score == "fraction" else float(passed == 1.0)
        return self._result(interaction, score, counts)

    def run_tests(self, code: str, tests: Sequence[IOTest | AssertTest]) -> list[str]:
        """How each of the turn's tests ended (``passed``, ``failed``, ``timeout``, ``memory``,
        ``output_limit``). In the local sandbox each stdin/stdout test is a sandbox run of its own (a fresh
        namespace a test: about 6 ms of CPU), run first, and the assert tests one run of the harness
        (``prm_jax.scorers._harness``: a fresh process a test; its interpreter starts once a turn); on
        SandboxFusion every test goes to the harness, one request a turn. ``SandboxError`` where the harness
        did not start.

        Args:
            code: The turn's code.
            tests: The session's tests.
        """
        limits = self.settings.limits
        spent_by = time.monotonic() + limits.total_time
        kinds: list[str | None] = [None] * len(tests)
        local = isinstance(self.runner, LocalSandbox)
        for index, test in enumerate(tests):
            if not (local and isinstance(test, IOTest)):
                continue
            left = spent_by - time.monotonic()
            if left <= 0:
                kinds[index] = "timeout"
                continue
            run = self.runner.run_file({SOLUTION: code.encode()}, SOLUTION, test.input.encode(),
                                       min(limits.time_per_test, left))
            kinds[index] = io_verdict(run.outcome, run.stdout, test.output)
        harnessed = [index for index, kind in enumerate(kinds) if kind is None]
        left = spent_by - time.monotonic()
        if harnessed:
            ended = self.harness([tests[i] for i in harnessed], code, left) if left > 0 else ["timeout"] * len(harnessed)
            for index, kind in zip(harnessed, ended, strict=True):
                kinds[index] = kind
        return cast("list[str]", kinds)  # (every test has its verdict by now)

    def harness(self, tests: Sequence[IOTest | AssertTest], code: str, total_time: float) -> list[str]:
        """``tests`` run by the harness in one sandbox run within ``total_time`` seconds, and how each ended.

        Args:
            tests: The tests.
            code: The turn's code.
            total_time: Seconds the tests may take together.
        """
        limits = self.settings.limits
        nonce = secrets.token_hex(16)
        job = {"nonce": nonce, "solution": self.runner.path(SOLUTION), "time_per_test": limits.time_per_test,
               "total_time": total_time, "output_bytes": limits.output_bytes,
               "wipe": isinstance(self.runner, LocalSandbox),
               "tests": [{"assert": t.code} if isinstance(t, AssertTest) else {"input": t.input, "output": t.output}
                         for t in tests]}
        budget = min(total_time, len(tests) * limits.time_per_test) + HARNESS_SLACK_S
        run = self.runner.run_file({SOLUTION: code.encode(), HARNESS: HARNESS_SOURCE}, HARNESS,
                                   json.dumps(job).encode(), budget, harness=True)
        started, kinds = verdicts(run.stdout, nonce, len(tests))
        if not started:
            detail = run.stderr.decode("utf-8", errors="replace").strip()[-300:]
            raise SandboxError(f"scorer {self.name!r}: the tests' harness did not start in the sandbox ({run.outcome}"
                               f"{': ' + detail if detail else ''})")
        missing = "timeout" if run.outcome == "timeout" else "failed"  # (the run ended, or the harness was killed)
        return [kind or missing for kind in kinds]

    def _result(self, interaction: Interaction, score: float, counts: Mapping[str, float]) -> PRMScorerResult:
        observations = tuple(PRMMetricObservation(METRICS[kind], "turn", interaction.interaction_id, value,
                                                  "float", ("sum", "mean")) for kind, value in counts.items())
        if self.settings.no_code == "skip" and counts["no_code"]:
            observations = (PRMMetricObservation("skipped", "turn", interaction.interaction_id, True,
                                                 "boolean", ("count", "rate")),)
        return PRMScorerResult(score, observations)

    async def probe(self) -> Probe:
        """One tiny run in the sandbox (``prm-jax validate-config --probe``): whether it starts (locally) or
        answers (SandboxFusion), and how long it takes."""
        if isinstance(self.runner, SandboxFusion):
            return await self.runner.probe(self.name)
        started = time.perf_counter()
        failure = self.runner.start_failure(self.settings.limits.time_per_test)
        return Probe(self.name, f"local sandbox ({self.settings.interpreter})", failure is None,
                     failure or "sandbox started", None, time.perf_counter() - started)

    def client_stats(self) -> dict[str, float]:
        """The served sandbox's requests, retries and rate-limit waits (none locally)."""
        return self.runner.stats() if isinstance(self.runner, SandboxFusion) else {}

    async def aclose(self) -> None:
        if isinstance(self.runner, SandboxFusion):
            await self.runner.aclose()


