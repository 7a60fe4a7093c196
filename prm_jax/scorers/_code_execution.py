"""``CodeExecutionScorer``: runs the code a turn wrote against the session's tests, inside the local sandbox
(``prm_jax.scorers._sandbox``: bubblewrap), and scores the turn by the tests it passes.

The code is taken from the turn's output text: by default the last fenced block of the configured language
(```` ```python ```` ... ```` ``` ````, or ``~~~`` fences; a block without a language counts too), or the first block, or every
block joined, or the whole reply (``extract``). The tests are the session's ``metadata[tests_key]``: a list of
``{"input": str, "output": str}`` pairs, each run as its own process with ``input`` on stdin; a test passes
when the run exits 0 and its stdout equals ``output`` (trailing whitespace of each line and trailing blank
lines ignored). The verdicts are the scorer's, from outside the sandbox: nothing the code prints, no exit
status alone, and no file it writes can pass a test (its task files are read-only).

A turn scores the fraction of tests passed (``score: fraction``) or 1 only when all pass (``score: all``);
a turn without code scores 0 (``no_code: zero``) or is left unscored (``no_code: skip``: 0, as every turn a
scorer leaves out, but counted apart). A failure of the code (a wrong answer, a crash, a time, memory or
output limit) is a score; the turn's observations count each kind (``tests_passed``, ``tests_failed``,
``tests_timeout``, ``tests_memory``, ``tests_output_limit``, ``no_code``; ``skipped`` under ``no_code:
skip``). A failure of the sandbox itself (it cannot start) fails the branch, never a 0.

The limits (``time_per_test``, ``total_time``, ``memory_mb``, ``output_bytes``, ``processes``,
``file_size_mb``, ``open_files``) are one declared record (``Limits``), checked at configuration, where the
sandbox is also started once: a machine without bubblewrap or user namespaces is refused then, with the
reason. There is no unsandboxed mode. SandboxFusion's served sandbox (``sandbox: sandbox_fusion``) is not
offered yet.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from prm_jax._validation import one_of, short_repr
from prm_jax.runtime._context import METADATA_KEY
from prm_jax.runtime._scoring import PRMMetricObservation, PRMScorerResult, SyncScorer
from prm_jax.runtime._settings import Settings, setting
from prm_jax.runtime._trajectory import Interaction
from prm_jax.scorers._http import Probe
from prm_jax.scorers._openai_judge import output_text
from prm_jax.scorers._sandbox import Limits, LocalSandbox, Run, unavailable

Extract = Literal["last_block", "first_block", "all_blocks", "whole_reply"]
ScoreBy = Literal["fraction", "all"]
NoCode = Literal["zero", "skip"]
KINDS = ("passed", "failed", "timeout", "memory", "output_limit", "no_code")
# Each kind's metric: how many of a turn's tests ended so (``tests_passed``, ...; ``no_code``: the turn had none).
METRICS = {kind: kind if kind == "no_code" else f"tests_{kind}" for kind in KINDS}
_FENCE = re.compile(r"(```|~~~)[ \t]*([\w+.-]*)[^\n]*\n(.*?)\1", re.S)  # (Markdown's two fences)
SOLUTION = "solution.py"


def code_blocks(text: str, language: str) -> list[str]:
    """The fenced blocks of ``text`` in ``language`` (or without a language), in order."""
    return [body for _, tag, body in _FENCE.findall(text) if tag.lower() in ("", language, f"{language}3")]


def same_output(got: bytes, expected: str) -> bool:
    """Whether a run's stdout is the expected output, each line's trailing whitespace and trailing blank lines
    ignored."""
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.splitlines()]
        while out and not out[-1]:
            out.pop()
        return out
    return lines(got.decode("utf-8", errors="replace")) == lines(expected)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodeExecutionSettings(Settings):
    language: Literal["python"] = setting("python", doc="The language the turn's code is in, and run as "
                                          "(``python``: the sandbox's ``interpreter``).")
    extract: Extract = setting("last_block", doc="Where the code is taken from the turn's text: the "
                               "``last_block`` or ``first_block`` fenced in ``language`` (or untagged), "
                               "``all_blocks`` joined, or the ``whole_reply``.")
    tests_key: str = setting("tests", doc="The key of the session's ``metadata`` that holds the tests: a list of "
                             "``{\"input\": str, \"output\": str}``.")
    score: ScoreBy = setting("fraction", doc="A turn's score: the ``fraction`` of tests passed, or 1 only when "
                             "``all`` pass (else 0).")
    no_code: NoCode = setting("zero", doc="A turn without code: scored 0 (``zero``) or left unscored "
                              "(``skip``: 0, counted apart).")
    interpreter: str = setting("/usr/bin/python3", doc="The interpreter inside the sandbox: a system one every "
                               "user can read (bound read-only with ``/usr``).")
    limits: Limits = setting(Limits(), doc="What one run may use (flat: the limits' keys are the scorer's).")

    def check(self) -> None:
        one_of("language", self.language, ("python",))
        one_of("extract", self.extract, get_args(Extract))
        one_of("score", self.score, get_args(ScoreBy))
        one_of("no_code", self.no_code, get_args(NoCode))
        if not isinstance(self.tests_key, str) or not self.tests_key:
            raise ValueError(f"tests_key must be the metadata key of the tests, got {short_repr(self.tests_key)}")
        reason = unavailable(self.interpreter) if isinstance(self.interpreter, str) else "interpreter is no path"
        if reason is not None:
            raise ValueError(f"the local sandbox cannot run here: {reason}")


class CodeExecutionScorer(SyncScorer):
    """Scores each turn by running its code against the session's tests in the local sandbox (see the module
    docstring).

    Example:
        >>> scorer = prm_jax.scorers.CodeExecutionScorer(time_per_test=2.0)
        >>> reply = "Here:\\n```python\\nprint(int(input()) * 2)\\n```"
        >>> turn = prm_jax.Interaction("t0", [1], [2], output_messages=[{"role": "assistant", "content": reply}])
        >>> tests = [{"input": "2\\n", "output": "4"}, {"input": "5\\n", "output": "10"}, {"input": "1", "output": "3"}]
        >>> result = scorer.evaluate(turn, {"metadata": {"tests": tests}})
        >>> round(result.reward, 4), [(o.metric_id, o.value) for o in result.observations][:2]
        (0.6667, [('tests_passed', 2.0), ('tests_failed', 1.0)])
    """

    name = "code_execution"
    executor = "thread"  # (the code runs in the sandbox's processes; a thread waits for each)
    settings_class = CodeExecutionSettings

    def prepare(self) -> None:
        super().prepare()
        self.sandbox = LocalSandbox(self.settings.limits, self.settings.interpreter)

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
        """The session's tests are there and well formed, before anything is scored.

        Args:
            metadata: One session's ``metadata``.
        """
        self.tests(metadata)

    def tests(self, metadata: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The session's ``(input, output)`` tests; ``ValueError`` naming the ``metadata`` key otherwise.

        Args:
            metadata: The session's ``metadata``.
        """
        key = self.settings.tests_key
        tests = metadata.get(key)
        where = f"scorer {self.name!r}: metadata[{key!r}]"
        if not isinstance(tests, Sequence) or isinstance(tests, str) or not tests:
            raise ValueError(f"{where} must be a non-empty list of {{\"input\": str, \"output\": str}}, got "
                             f"{short_repr(tests)}")
        out = []
        for i, test in enumerate(tests):
            if not isinstance(test, Mapping) or not isinstance(test.get("input", ""), str) \
                    or not isinstance(test.get("output"), str):
                raise ValueError(f"{where}[{i}] must be {{\"input\": str, \"output\": str}}, got {short_repr(test)}")
            out.append((test.get("input", ""), test["output"]))
        return out

    def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> PRMScorerResult:  # type: ignore[override]
        tests = self.tests(ctx.get(METADATA_KEY) or {})
        text = output_text(self.name, interaction, "run", "evaluate")
        code = self.code(text)
        counts = dict.fromkeys(KINDS, 0.0)
        if code is None:
            counts["no_code"] = 1.0
            return self._result(interaction, 0.0, counts)
        limits, files = self.settings.limits, {SOLUTION: code.encode()}
        spent_by = time.monotonic() + limits.total_time
        for given, expected in tests:
            left = spent_by - time.monotonic()
            if left <= 0:
                counts["timeout"] += 1
                continue
            run = self.sandbox.run(files, [f"/task/{SOLUTION}"], given.encode(), min(limits.time_per_test, left))
            counts[self._kind(run, expected)] += 1
        passed = counts["passed"] / len(tests)
        score = passed if self.settings.score == "fraction" else float(passed == 1.0)
        return self._result(interaction, score, counts)

    @staticmethod
    def _kind(run: Run, expected: str) -> str:
        if run.outcome == "ok":
            return "passed" if same_output(run.stdout, expected) else "failed"
        return "failed" if run.outcome == "error" else run.outcome

    def _result(self, interaction: Interaction, score: float, counts: Mapping[str, float]) -> PRMScorerResult:
        observations = tuple(PRMMetricObservation(METRICS[kind], "turn", interaction.interaction_id, value,
                                                  "float", ("sum", "mean")) for kind, value in counts.items())
        if self.settings.no_code == "skip" and counts["no_code"]:
            observations = (PRMMetricObservation("skipped", "turn", interaction.interaction_id, True,
                                                 "boolean", ("count", "rate")),)
        return PRMScorerResult(score, observations)

    async def probe(self) -> Probe:
        """One tiny run in the sandbox (``prm-jax validate-config --probe``): whether it starts, and how long it
        takes."""
        started = time.perf_counter()
        failure = self.sandbox.start_failure(self.settings.limits.time_per_test)
        return Probe(self.name, f"local sandbox ({self.settings.interpreter})", failure is None,
                     failure or "sandbox started", None, time.perf_counter() - started)
