"""The built-in judges' one answer reader: every number a judge takes from a server's answer is read here,
under one rule set, so a malformed answer fails its turn (a ``ServiceError``, status 200: the server
answered, with something unusable) and is never clipped, rounded or coerced into a score.

The rules:

- a number is an ``int`` or a ``float`` (JSON ``true`` is not a score), finite;
- a probability is a number in ``[0, 1]``; probabilities that share one distribution (a token's top
  log-probs) sum to at most ``1 + PROBABILITY_SLACK``;
- a log-prob is a number at most ``LOGPROB_SLACK`` (log 1 = 0; a server rounds, never by more);
- indexed results (a batch's ``index`` fields) hold each index of the request exactly once;
- JSON is nested at most ``MAX_NESTING`` levels (a deeper answer raised a bare ``RecursionError``);
- a message built from an answer never holds the key the scorer sent, nor any ``Bearer ...`` token (a
  server's 401 body can quote the ``Authorization`` header).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from prm_jax._validation import short_repr
from prm_jax.errors import ServiceError
from prm_jax.kernels._schema import LOGPROB_SLACK, PROBABILITY_SLACK

MAX_NESTING = 64
REDACTED = "[redacted]"
_BEARER = re.compile(r"(?i)(bearer)\s+[^\s'\",;}]+")


class AnswerReader:
    """Reads one judge's answers (``who`` names it); ``secrets`` are redacted from every message."""

    def __init__(self, who: str, secrets: Iterable[str] = (), origin: str = ""):
        self.who, self.origin = who, origin  # origin: the server, as errors show it (no secrets)
        self.secrets = tuple(s for s in secrets if s)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return _BEARER.sub(rf"\1 {REDACTED}", text)

    def error(self, where: str, what: str, **kwargs: Any) -> ServiceError:
        """A malformed answer (status 200 unless told): ``where`` names the judge and the turn; an answer
        read after the request also names the server it came from (``origin``) and its status."""
        kwargs.setdefault("status", 200)
        source = f" [HTTP {kwargs['status']} from {self.origin}]" if self.origin and self.origin not in where else ""
        return ServiceError(self.redact(f"{where}: {what}{source}"), **kwargs)

    def json(self, body: bytes | bytearray | str, where: str, what: str = "the answer") -> Any:
        """``body`` decoded as JSON, nested at most ``MAX_NESTING`` levels."""
        try:
            value = json.loads(body)
        except RecursionError:
            raise self.error(where, f"{what} is JSON nested too deeply (more than {MAX_NESTING} levels)") from None
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as err:
            raise self.error(where, f"{what} is not valid JSON: {err}") from None
        if _depth(value) > MAX_NESTING:
            raise self.error(where, f"{what} is JSON nested too deeply (more than {MAX_NESTING} levels)")
        return value

    def number(self, value: Any, where: str, field: str) -> float:
        """A finite ``int`` or ``float`` (never a bool, a string or null)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(where, f"{field} must be a number, got {self.redact(short_repr(value))}")
        out = float(value)
        if not math.isfinite(out):
            raise self.error(where, f"{field} must be finite, got {value!r}")
        return out

    def probability(self, value: Any, where: str, field: str) -> float:
        out = self.number(value, where, field)
        if not 0.0 <= out <= 1.0:
            raise self.error(where, f"{field} must be a probability in [0, 1], got {out}")
        return out

    def logprob(self, value: Any, where: str, field: str) -> float:
        out = self.number(value, where, field)
        if out > LOGPROB_SLACK:
            raise self.error(where, f"{field} must be a log-probability (at most 0), got {out}")
        return min(out, 0.0)

    def distribution(self, probabilities: Sequence[float], where: str, field: str) -> None:
        """Probabilities of one distribution: their sum is at most ``1 + PROBABILITY_SLACK``."""
        total = math.fsum(probabilities)
        if total > 1.0 + PROBABILITY_SLACK:
            raise self.error(where, f"{field} sum to {total!r}, more than 1: not one distribution")

    def indexed(self, items: Any, count: int, where: str, field: str = "index") -> list[Any]:
        """``items`` (mappings with an ``index``) in index order: each of ``0 .. count - 1`` exactly once."""
        if not isinstance(items, list):
            raise self.error(where, f"expected a list of {count} results, got {self.redact(short_repr(items))}")
        ordered: list[Any] = [None] * count
        seen: set[int] = set()
        for position, item in enumerate(items):
            index = item.get(field) if isinstance(item, dict) else None
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
                raise self.error(where, f"result {position}'s {field} must be an integer in [0, {count}), got "
                                        f"{self.redact(short_repr(index))}")
            if index in seen:
                raise self.error(where, f"{field} {index} appears more than once (each index of the request "
                                        "must be answered exactly once)")
            seen.add(index)
            ordered[index] = item
        if len(seen) != count:
            missing = sorted(set(range(count)) - seen)
            raise self.error(where, f"the server answered {len(seen)} of {count} inputs ({field} {missing[:8]} "
                                    "missing)")
        return ordered

    def field(self, value: Any, path: Sequence[Any], where: str) -> Any:
        """``value[path[0]][path[1]]...``, or a located error naming the path."""
        for step in path:
            try:
                value = value[step]
            except (KeyError, IndexError, TypeError):
                shown = "".join(f"[{p!r}]" for p in path)
                raise self.error(where, f"the answer has no {shown}") from None
        return value


def _depth(value: Any) -> int:
    """JSON nesting depth, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in node)
    return deepest
