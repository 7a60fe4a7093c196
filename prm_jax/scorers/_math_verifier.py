"""``MathVerifyScorer``: checks a turn's final answer against the session's reference answer with
HuggingFace's ``math-verify`` (the checker TRL and open-r1 use; the ``verify`` extra: ``pip install
'prm-jax[verify]'``).

The reference answer is ``ctx["metadata"][answer_key]`` (a session line's ``metadata``, or
``score_arrays(..., metadata=[...])``). A gold answer without math delimiters (no ``$``, ``\\(``, ``\\[`` or
``\\boxed``) is wrapped in ``$...$`` before it is parsed, as open-r1 does, so ``\\frac{1}{2}`` and ``0.5``
read as the numbers they are. A numeric reference (a JSON number, or a string that is a number in Python's
exponent notation such as ``"1e-05"``) is first written as the exact decimal it is (``0.00001``,
``100000000000000000000``): LaTeX has no exponent notation, and math-verify reads ``1e-05`` as ``-5 + e``.

A reference is *read* when math-verify turns it into a mathematical object; for text it cannot read
(``\\frac{``, ``x=``, ``???``) its parser hands the input back as a string, and that counts as unreadable:
the branch fails with an error naming the session's ``metadata`` key (a verifier that cannot read its
reference must not hand out zeros). ``validate_metadata`` applies the same rule to a session's metadata
before anything is scored (``prm-jax score`` calls it for every session while it reads them: exit 2, the
file, line and key named).

The turn's answer is read from its text (its output messages; a turn without text fails its branch,
``NoTextError``) as open-r1 reads a completion: a ``\\boxed{...}`` first, then LaTeX after an anchor ("the
final answer is"), then a plain number or expression. ``boxed``: ``last`` (the default) judges a reply by
its last boxed answer alone (a reply that boxes 3, then corrects itself and boxes 5, answered 5);
``all`` reads every boxed answer of the reply together as math-verify does (``\\boxed{3}`` ... ``\\boxed{5}``
is the set {3, 5}). A turn with no answer in it, or a wrong one, scores ``wrong`` (0), a right one
``correct`` (1). ``scope``: ``last_turn`` (the default: the branch's final answer, on its last turn; the
other turns 0) or ``every_turn`` (every turn's own answer).

Numbers are compared as math-verify compares them where one side is a decimal: both rounded, to 6 decimal
places by default (so ``1/3`` equals ``0.333333``). For a numeric reference below 1 in magnitude the
rounding keeps 6 significant digits instead (a reference of ``1e-12`` is not equal to ``2e-12``, which
six decimal places would both make 0).

math-verify's parser can take seconds on adversarial LaTeX, and its own timeouts use ``SIGALRM`` (the main
thread only): they are off here, and the scorer runs on the process executor with a deadline per call
(``timeout``, default 10 s), past which its worker is ended and replaced and the branch fails with the
timeout; every other branch goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Literal, NamedTuple, get_args

from prm_jax._validation import finite_number, one_of, short_repr
from prm_jax.runtime._context import METADATA_KEY
from prm_jax.runtime._scoring import SyncTrajectoryScorer
from prm_jax.runtime._settings import Settings, setting
from prm_jax.runtime._trajectory import Interaction
from prm_jax.scorers._openai_judge import output_text

Scope = Literal["last_turn", "every_turn"]
Boxed = Literal["last", "all"]
DEFAULT_TIMEOUT_S = 10.0
FLOAT_ROUNDING = 6  # math-verify's default: decimal places both sides of a numeric comparison are rounded to
_DELIMITED = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed")  # an escaped dollar (\$5) is no delimiter
_EXPONENT_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)[eE][+-]?\d+")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


class _OurDeadline(logging.Filter):
    """Drops math-verify's notice that its own timeouts are off: the executor's deadline is the timeout."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


def math_verify_module() -> Any:
    """``math_verify``, or ``ImportError`` naming the extra that installs it."""
    try:
        import math_verify
    except ImportError as err:
        raise ImportError("MathVerifyScorer needs math-verify: pip install 'prm-jax[verify]' (or "
                          "'math-verify')") from err
    for name in ("math_verify.parser", "math_verify.grader"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _OurDeadline) for f in log.filters):
            log.addFilter(_OurDeadline())
    return math_verify


def reference_text(answer: str | int | float) -> str:
    """A reference answer as text: an integer as its digits, a float (or a string in exponent notation) as
    the exact decimal it is (``1e-05`` -> ``0.00001``), any other string as it is."""
    if isinstance(answer, int):
        return str(answer)
    if isinstance(answer, float):
        return format(Decimal(repr(answer)), "f")
    if _EXPONENT_NUMBER.fullmatch(answer.strip()):
        return format(Decimal(answer.strip()), "f")
    return answer


# How a reference names the empty set on purpose; bare braces ("{}", "{ }") parse to it too, but are an empty
# answer (a hypothesis case of tests/scorers/test_math_verifier.py).
_EMPTY_SET = re.compile(r"\\emptyset|\u2205|\\\{\s*\\\}")


def _is_empty_set(parsed: Any) -> bool:
    return type(parsed).__name__ == "EmptySet"


def gold_text(answer: str) -> str:
    """The reference answer as math-verify parses it: wrapped in ``$...$`` unless it has math delimiters."""
    return answer if _DELIMITED.search(answer) else f"${answer}$"


def last_boxed(reply: str) -> str | None:
    """The reply's last ``\\boxed{...}`` (or ``\\fbox{...}``) whole, its braces balanced; ``None`` without one."""
    starts = [m for m in _BOXED.finditer(reply)]
    for match in reversed(starts):
        depth, i = 1, match.end()
        while i < len(reply) and depth:
            depth += {"{": 1, "}": -1}.get(reply[i], 0) if reply[i - 1] != "\\" else 0
            i += 1
        if depth == 0:
            return reply[match.start():i]
    return None


class Reference(NamedTuple):
    """A parsed reference answer: math-verify's parse (a mathematical object first) and the decimal places
    numeric comparisons round to."""

    parsed: list[Any]
    float_rounding: int


def float_rounding(parsed: Sequence[Any]) -> int:
    """``FLOAT_ROUNDING`` decimal places, or more for a numeric reference below 1 in magnitude: 6 significant
    digits of it (``1e-12`` is compared at 17 decimal places)."""
    import sympy

    value = parsed[0] if parsed else None
    if isinstance(value, sympy.Number) and value != 0 and abs(value) < 1:
        return max(FLOAT_ROUNDING, FLOAT_ROUNDING - 1 - math.floor(math.log10(abs(float(value)))))
    return FLOAT_ROUNDING


@dataclasses.dataclass(frozen=True, kw_only=True)
class MathVerifySettings(Settings):
    answer_key: str = setting("answer", doc="The key of the session's ``metadata`` that holds the reference "
                              "answer (a string or a number).")
    scope: Scope = setting("last_turn", doc="Which turns are judged: ``last_turn`` (the branch's final answer, on "
                           "its last turn; the other turns score 0) or ``every_turn`` (each turn's own answer).")
    correct: float = setting(1.0, doc="The score of a right answer (finite).")
    wrong: float = setting(0.0, doc="The score of a wrong answer, or of a turn with no answer in it (finite).")
    boxed: Boxed = setting("last", doc="Which boxed answers a reply is judged by: ``last`` (its last "
                           "``\\boxed{}`` alone) or ``all`` (every one together, as math-verify reads them).")

    def check(self) -> None:
        math_verify_module()
        if not isinstance(self.answer_key, str) or not self.answer_key:
            raise ValueError(f"answer_key must be the metadata key of the reference answer, got "
                             f"{short_repr(self.answer_key)}")
        one_of("scope", self.scope, get_args(Scope))
        one_of("boxed", self.boxed, get_args(Boxed))
        finite_number("correct", self.correct)
        finite_number("wrong", self.wrong)


class MathVerifyScorer(SyncTrajectoryScorer):
    """Checks each branch's final answer (or every turn's) against ``ctx["metadata"][answer_key]`` with
    math-verify (see the module docstring).

    Example:
        >>> scorer = prm_jax.scorers.MathVerifyScorer(scope="last_turn")
        >>> turn = prm_jax.Interaction("t0", [1], [2], output_messages=[
        ...     {"role": "assistant", "content": "So the answer is \\\\boxed{\\\\frac{1}{2}}."}])
        >>> scorer.evaluate_trajectory([turn], {"metadata": {"answer": "0.5"}})
        {'t0': 1.0}
    """

    name = "math_verify"
    executor = "process"
    settings_class = MathVerifySettings
    base_defaults = {"timeout": DEFAULT_TIMEOUT_S}

    def prepare(self) -> None:
        super().prepare()
        self._configs: Any = None  # math-verify's extraction settings, built in the worker on first use

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_configs": None}  # (rebuilt in each worker)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """In a worker: math-verify (and sympy) imported as the worker loads the scorer, which is not a
        call's time (seconds on a busy machine: inside the first call it ate that call's deadline)."""
        self.__dict__.update(state)
        self._extraction()

    def evaluate_trajectory(self, interactions: Sequence[Interaction],
                            ctx: Mapping[str, Any]) -> dict[str, float]:
        gold = self.gold(interactions[-1], ctx)
        turns = interactions if self.settings.scope == "every_turn" else interactions[-1:]
        return {turn.interaction_id: self.verdict(gold, self.reply(turn)) for turn in turns}

    def gold(self, leaf: Interaction, ctx: Mapping[str, Any]) -> Reference:
        """The parsed reference answer; ``ValueError`` naming the scorer, the branch and the key.

        Args:
            leaf: The branch's last turn.
        """
        where = f"scorer {self.name!r} on the branch ending at {leaf.interaction_id!r}"
        return self.reference(ctx.get(METADATA_KEY) or {}, where)

    def validate_metadata(self, metadata: Mapping[str, Any]) -> None:
        """A session's reference answer is there and readable (``reference``'s rule), before anything is
        scored: ``ValueError`` naming the ``metadata`` key otherwise (``prm-jax score`` calls it for every
        session it reads).

        Args:
            metadata: One session's ``metadata``.

        Example:
            >>> prm_jax.scorers.MathVerifyScorer().validate_metadata({"answer": 1e-05})   # read: 0.00001
            >>> prm_jax.scorers.MathVerifyScorer().validate_metadata({"answer": "x="})  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            ValueError: scorer 'math_verify': math-verify could not parse the reference answer metadata['answer'] ...
        """
        self.reference(metadata, f"scorer {self.name!r}")

    def reference(self, metadata: Mapping[str, Any], where: str) -> Reference:
        """``metadata[answer_key]`` parsed into a mathematical object; ``ValueError`` naming ``where`` and the
        key when it is missing, not a string or a number, or unreadable (math-verify hands text it cannot
        read back as a string).

        Args:
            metadata: The session's ``metadata``, holding the reference under ``answer_key``.
        """
        if self.settings.answer_key not in metadata:
            raise ValueError(f"{where}: the session's metadata has no {self.settings.answer_key!r} (the reference answer: "
                             f"a session line's \"metadata\": {{\"{self.settings.answer_key}\": \"...\"}}); it has "
                             f"{sorted(metadata)}")
        answer = metadata[self.settings.answer_key]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise ValueError(f"{where}: metadata[{self.settings.answer_key!r}] must be a string or a number, got "
                             f"{short_repr(answer)}")
        parsed = math_verify_module().parse(gold_text(reference_text(answer)), extraction_mode="first_match",
                                            parsing_timeout=None)
        if not parsed or isinstance(parsed[0], str) or (_is_empty_set(parsed[0]) and not _EMPTY_SET.search(
                str(answer))):  # ("{}" parses to the empty set: an empty answer, not one written as a set)
            raise ValueError(f"{where}: math-verify could not parse the reference answer "
                             f"metadata[{self.settings.answer_key!r}] = {short_repr(answer)} into a mathematical object: "
                             "write it as LaTeX or a plain number (e.g. \"\\\\frac{1}{2}\" or 0.5)")
        return Reference(parsed, float_rounding(parsed))

    def reply(self, turn: Interaction) -> str:
        """The turn's text (its output messages); ``NoTextError`` for a turn without any.

        Args:
            turn: The turn whose answer is read.
        """
        return output_text(self.name, turn, "check", "reply")

    def _extraction(self) -> Any:
        """How a reply's answer is read (open-r1's completion settings: a boxed answer first, LaTeX only
        after an anchor), then a plain expression; built once per process."""
        if self._configs is None:
            math_verify = math_verify_module()
            from latex2sympy2_extended import NormalizationConfig

            latex = math_verify.LatexExtractionConfig(
                normalization_config=NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True,
                                                         boxed="all", units=True),
                boxed_match_priority=0, try_extract_without_anchor=False)
            self._configs = [latex, math_verify.ExprExtractionConfig()]
        return self._configs

    def verdict(self, gold: Reference, reply: str) -> float:
        """``correct`` where the reply's answer equals ``gold``, else ``wrong`` (no answer found: wrong).
        ``boxed: last`` reads a reply with boxed answers by its last one alone.

        Args:
            gold: The parsed reference (``Reference``).
            reply: The turn's text.
        """
        math_verify = math_verify_module()
        if self.settings.boxed == "last":
            reply = last_boxed(reply) or reply
        parsed = math_verify.parse(reply, extraction_config=self._extraction(), extraction_mode="first_match",
                                   parsing_timeout=None)
        if not parsed:
            return float(self.settings.wrong)
        same = math_verify.verify(gold.parsed, parsed, float_rounding=gold.float_rounding, timeout_seconds=None)
        return float(self.settings.correct if same else self.settings.wrong)
