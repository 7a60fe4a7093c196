"""The JSONL session format read by ``prm-jax score``.

One session per line::

  {"session_key": "q17-s0",            # unique per file
   "group": "q17",                     # sessions of one group are exported together (a GRPO group)
   "interactions": [                   # parent before child is not required; parent_id links them
     {"id": "q17-s0-t0", "parent_id": null,
      "input_tokens": [..], "output_tokens": [..],      # token ids (required: scoring is token-backed)
      "output_logprobs": [..],                          # optional, one per output token
      "messages": [{"role": "user", "content": ".."}],  # optional: the chat so far
      "output_messages": [{"role": "assistant", ..}],   # optional
      "stop_reason": "stop" | "length",                 # optional, default "stop"
      "reward": 1.0,                                    # the outcome reward, on each leaf
      "token_rewards": [..]}],                          # optional, pre-existing process rewards
   "ready": ["q17-s0-t3"]}             # optional: leaves to export; default every leaf

``group`` defaults to the session key (a group of one, with a warning: its group-normalized outcome
reward is 0). Numbers must be finite (``NaN``/``Infinity`` are refused), token ids in ``[0, 2**31 - 1]``,
log-probs ``<= 0``; every error names the file, the line and the field. Lines end at ``\n`` only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path
from typing import Any

from prm_jax.runtime.trajectory import Interaction, InteractionCache
from prm_jax.validation import short_repr

MAX_TOKEN_ID = 2**31 - 1
LOGPROB_SLACK = 1e-6  # inference engines round a log-prob of ~0 to tiny positive values
SESSION_KEYS = {"session_key", "group", "interactions", "ready"}
INTERACTION_KEYS = {"id", "parent_id", "input_tokens", "output_tokens", "output_logprobs", "messages",
                    "output_messages", "stop_reason", "reward", "token_rewards"}


class InputError(ValueError):
    """Bad input, located: which file, which line, which field."""

    def __init__(self, path: Path | str, line: int, field: str, message: str):
        super().__init__(f"{path}:{line}: {field}: {message}")
        self.path, self.line, self.field = str(path), line, field


@dataclasses.dataclass
class SessionRecord:
    key: str
    group: str
    cache: InteractionCache
    ready: list[str]
    line: int


def _check_finite(value: Any, upper: float | None, path: Path, line: int, field: str) -> None:
    """Numbers (or lists of numbers) must be finite, and at most ``upper`` when given; bools are not numbers."""
    if value is None:
        return
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InputError(path, line, field, f"must hold numbers, got {short_repr(v)}")
        if not math.isfinite(v):
            raise InputError(path, line, field, f"must be finite, got {v}")
        if upper is not None and v > upper + LOGPROB_SLACK:
            raise InputError(path, line, field, f"log-probabilities must be <= 0, got {v}")


def _interaction(item: Any, path: Path, line: int, where: str) -> Interaction:
    if not isinstance(item, dict):
        raise InputError(path, line, where, "must be a JSON object")
    unknown = sorted(set(item) - INTERACTION_KEYS)
    if unknown:
        raise InputError(path, line, f"{where}.{unknown[0]}", "unknown key")
    for field in ("input_tokens", "output_tokens"):
        if not isinstance(item.get(field), list):
            raise InputError(path, line, f"{where}.{field}", "token ids are required (a list of integers); "
                                                             "message-only interactions cannot be scored")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in item[field]):
            raise InputError(path, line, f"{where}.{field}", "must hold integer token ids only")
        bad = [t for t in item[field] if not 0 <= t <= MAX_TOKEN_ID]
        if bad:
            raise InputError(path, line, f"{where}.{field}", f"token ids must be in [0, {MAX_TOKEN_ID}] (int32), "
                                                             f"got {bad[0]}")
    for field, upper in (("token_rewards", None), ("output_logprobs", 0.0), ("reward", None)):
        _check_finite(item.get(field), upper, path, line, f"{where}.{field}")
    interaction_id = item.get("id")
    if not isinstance(interaction_id, str) or not interaction_id:
        raise InputError(path, line, f"{where}.id", "must be a non-empty string")
    try:
        return Interaction(
            interaction_id, item["input_tokens"], item["output_tokens"], parent_id=item.get("parent_id"),
            output_logprobs=item.get("output_logprobs"), messages=item.get("messages") or (),
            output_messages=item.get("output_messages") or (), stop_reason=item.get("stop_reason", "stop"),
            reward=item.get("reward"), token_rewards=item.get("token_rewards"))
    except (ValueError, TypeError) as err:
        raise InputError(path, line, where, str(err)) from None


def _session(data: Any, path: Path, line: int) -> SessionRecord:
    if not isinstance(data, dict):
        raise InputError(path, line, "session", f"must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - SESSION_KEYS)
    if unknown:
        raise InputError(path, line, unknown[0], f"unknown key (allowed: {sorted(SESSION_KEYS)})")
    key = data.get("session_key")
    if not isinstance(key, str) or not key:
        raise InputError(path, line, "session_key", "must be a non-empty string")
    group = data.get("group", key)
    if not isinstance(group, str) or not group:
        raise InputError(path, line, "group", "must be a non-empty string")
    items = data.get("interactions")
    if not isinstance(items, list) or not items:
        raise InputError(path, line, "interactions", "must be a non-empty list")
    cache = InteractionCache()
    for i, item in enumerate(items):
        interaction = _interaction(item, path, line, f"interactions[{i}]")
        try:
            cache.add(interaction)
        except (ValueError, TypeError) as err:
            raise InputError(path, line, f"interactions[{i}]", str(err)) from None
    try:
        leaves = cache.leaves()
        ready = data.get("ready", leaves)
        if not isinstance(ready, list) or not ready or not all(isinstance(r, str) for r in ready):
            raise InputError(path, line, "ready", "must be a non-empty list of interaction ids")
        for leaf in ready:
            if leaf not in cache:
                raise InputError(path, line, "ready", f"names {leaf!r}, which is not an interaction of the session")
            sequence = cache.to_sequence(leaf)
            if sequence.reward is None:
                raise InputError(path, line, "reward", f"the leaf {leaf!r} of a ready trajectory needs an outcome reward")
    except InputError:
        raise
    except ValueError as err:
        raise InputError(path, line, "interactions", str(err)) from None
    return SessionRecord(key, group, cache, list(ready), line)


def read_sessions(path: str | Path) -> list[SessionRecord]:
    """Reads and validates every line before anything is scored; raises ``InputError`` at the first problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(path, 0, "file", err.strerror or str(err)) from None
    records, keys = [], set()
    ungrouped = 0
    # Lines end at "\n" only: U+2028 and friends are valid inside JSON strings.
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)  # NaN/Infinity parse here and are refused by field below
        except json.JSONDecodeError as err:
            raise InputError(path, line_no, "json", f"malformed JSON: {err.msg} at column {err.colno}") from None
        record = _session(data, path, line_no)
        ungrouped += isinstance(data, dict) and "group" not in data
        if record.key in keys:
            raise InputError(path, line_no, "session_key", f"{record.key!r} appears twice")
        keys.add(record.key)
        records.append(record)
    if not records:
        raise InputError(path, 0, "file", "no sessions")
    if ungrouped:
        warnings.warn(f"{path}: {ungrouped} session(s) have no 'group': each is a group of one, whose "
                      "group-normalized outcome reward, and so its advantages without a critic, are 0",
                      stacklevel=2)
    return records

