"""The JSONL session format read by ``prm-jax score``.

One session per line::

  {"session_key": "q17-s0",            # unique per file
   "group": "q17",                     # sessions of one group are exported together (a GRPO group)
   "interactions": [                   # parent before child is not required; parent_id links them
     {"id": "q17-s0-t0", "parent_id": null,
      "input_tokens": [..], "output_tokens": [..],      # token ids (required: scoring is token-backed;
                                                        #   output_tokens holds at least one token)
      "output_logprobs": [..],                          # optional, one per output token
      "messages": [{"role": "user", "content": ".."}],  # optional: the chat so far
      "output_messages": [{"role": "assistant", ..}],   # optional
      "stop_reason": "stop" | "length",                 # optional, default "stop"
      "reward": 1.0,                                    # the outcome reward, on each ready interaction
                                                        #   (turn_discount: optional where it has children)
      "token_rewards": [..],                            # optional, pre-existing process rewards
      "anchor_id": 17, "step_reward": 0.5,              # optional, per turn, for GiGPO
      "output_prm_logprobs": [..],                      # optional, per output token: an implicit PRM's
      "output_ref_logprobs": [..],                      #   and the reference model's log-probs (PRIME, KL),
      "output_sum_pi_squared": [..],                    #   sum_v pi_v^2 of its distribution (OTB; in [0, 1]),
      "output_teacher_logprobs": [..]}],                #   a teacher's log-probs (on-policy distillation)
   "ready": ["q17-s0-t3"],             # optional: leaves to export; default every leaf
   "metadata": {"answer": "42"}}       # optional: any JSON object, given to every scorer of the session
                                       #   as ctx["metadata"] (read-only); at most 64 KiB, 32 levels deep

``group`` defaults to the session key (a group of one, with a warning: its group-normalized outcome
reward is 0). Numbers must be finite, and finite in float32, the dtype batches store them in
(``NaN``/``Infinity`` and 3.5e38 are refused; one rule for every numeric field), token ids in ``[0, 2**31 -
1]``, log-probs ``<= 0``, anchor ids 64-bit integers, signed or unsigned (-1: none); ``ready`` names each
interaction once; every child's inputs start with its parent's inputs and outputs, and no turn is on a
parent cycle.
Every error names the file, the line and the field. Lines are UTF-8 and end at ``\n`` only; the file may
be gzip-compressed, or ``-`` (standard input). Both readers (the typed fast path and the field-by-field
one) accept exactly the same lines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, NamedTuple, get_args

import msgspec
import numpy as np

from prm_jax._validation import short_repr
from prm_jax.errors import InputError
from prm_jax.kernels._schema import BATCH_SCHEMA, LOGPROB
from prm_jax.runtime._context import check_metadata
from prm_jax.runtime._trajectory import (
    STOP_REASONS,
    TOKEN_ID_RANGE,
    TURN_FIELDS,
    VECTOR_FIELDS,
    Interaction,
    InteractionCache,
    JsonKind,
    StopReason,
    TurnField,
    bounded_vector,
    check_vector_lengths,
    concat_spans,
    root_first,
    stray_token_id,
)

__all__ = ["SessionRecord", "iter_sessions", "read_sessions"]

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


@dataclasses.dataclass
class SessionRecord:
    """One session line as read: its key and group, its turns (an ``InteractionCache``), the interactions
    ready for export, the line it came from, and its ``metadata``.

    Args:
        key: The session's ``session_key``.
        group: Its ``group`` (the session's own key where the line names none).
        cache: Its turns.
        ready: The ids of the interactions it exports (its ``ready``, by default every leaf).
        line: The line of the file it came from, from 1.
        metadata: Its ``metadata`` (a JSON object; empty where the line has none).

    Example:
        >>> import json, pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "sessions.jsonl"
        >>> line = {"session_key": "a", "group": "q1", "metadata": {"answer": "4"},
        ...         "interactions": [{"id": "a0", "input_tokens": [1, 2], "output_tokens": [3, 4], "reward": 1.0}]}
        ...
        >>> _ = path.write_text(json.dumps(line) + "\\n")
        >>> from prm_jax.app.sessions import iter_sessions, read_sessions
        >>> record = read_sessions(path)[0]
        >>> record.key, record.group, record.ready, record.line, record.metadata
        ('a', 'q1', ['a0'], 1, {'answer': '4'})
    """

    key: str
    group: str
    cache: InteractionCache
    ready: list[str]
    line: int
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


# The schema, declared once. Each field: its JSON type as the fast path decodes it (msgspec checks it in C),
# the same type checked in Python by the field-by-field path, and one value rule that both paths run on the
# decoded value. The fast path may read bytes differently (token lists are compared as bytes); it accepts
# exactly what this table accepts (tests/app/test_sessions.py fuzzes both readers against each other).

REQUIRED = msgspec.NODEFAULT


class FieldRule(NamedTuple):
    name: str
    json_type: Any                        # msgspec type of the fast path
    default: Any                          # REQUIRED, or the value when absent
    is_type: Callable[[Any], bool]        # the field-by-field path's check of the same type
    type_problem: str
    value: Callable[[Any], Any] | None = None  # the value rule (raises ValueError), on the decoded value
    absent: Any = None                    # the turn's value when the field is absent or null


class JSONType(NamedTuple):
    """A turn field's JSON type in this format: the fast path's msgspec type, the field-by-field check of
    the same type and what to say when it fails; ``value``: the format's own value rule where it is stricter
    than the turn's (log-probs <= 0).
    """

    json_type: Any
    is_type: Callable[[Any], bool]
    type_problem: str
    value: Callable[[Any], Any] | None = None
    default: Any = None  # the fast path's value when absent (None: the turn's own absent value follows)
    label: str = ""  # the JSON type, as the format's page names it
    range: str = ""  # the values accepted, as the format's page says them (a batch key's declared bounds first)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _numbers(v: Any) -> bool:
    return isinstance(v, list) and all(map(_number, v))


def _token_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def _objects(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(m, dict) for m in v)


# The turn's vector rule (one number rule for every per-token field: finite, and finite in float32), then the
# format's rule on log-probs: the schema's declared range (<= 0, with slack for rounding).
_logprobs = bounded_vector(LOGPROB)


_FINITE = "finite, and finite in float32"
_NUMBERS = JSONType(list[float] | None, _optional(_numbers), "must hold numbers",
                    label="list of numbers, one per output token", range=_FINITE)
_LOGPROBS = _NUMBERS._replace(value=_logprobs, range=f"{LOGPROB.text}, {_FINITE}")
_NUMBER = JSONType(float | None, _optional(_number), "must hold numbers", label="number", range=_FINITE)
_MESSAGES = JSONType(list[dict[str, Any]] | None, _optional(_objects), "must be a list of JSON objects",
                     label="list of objects (`role`, `content`, ...)", range="any JSON objects")
# The JSON type of each kind of turn field (the fields, their kinds, value rules and absent values are the
# turn's own: prm_jax.runtime._trajectory.TURN_FIELDS; a kind without a type here fails at import).
JSON_KINDS: dict[str, JSONType] = {
    "id": JSONType(NonEmpty | None, _optional(_nonempty_str), "must be a non-empty string or null",
                   label="string or null", range="another interaction's `id`, never a cycle"),
    "logprobs": _LOGPROBS, "numbers": _NUMBERS, "messages": _MESSAGES, "number": _NUMBER,
    "stop_reason": JSONType(StopReason, lambda v: v in STOP_REASONS, f"must be one of {STOP_REASONS}",
                            default="stop", label="string", range=" or ".join(f"`{r}`" for r in STOP_REASONS)),
    # (msgspec bounds no int beyond int64: the value rule checks the range)
    "integer": JSONType(int | None, _optional(lambda v: isinstance(v, int) and not isinstance(v, bool)),
                        "must be an integer or null", label="integer or null",
                        range="a 64-bit integer, signed or unsigned (-1: none)"),
}
if set(JSON_KINDS) != set(get_args(JsonKind)):
    raise RuntimeError(f"JSON_KINDS and JsonKind disagree: {sorted(set(JSON_KINDS) ^ set(get_args(JsonKind)))}")


def _field_rule(field: TurnField) -> FieldRule:
    """A turn field's rule in this format: its JSON type here, its value rule (the format's stricter one,
    else the turn's) and its absent value from ``TURN_FIELDS``."""
    kind = JSON_KINDS[field.json]
    return FieldRule(field.name, kind.json_type, kind.default, kind.is_type, kind.type_problem,
                     kind.value or field.rule, field.absent)


_TOKENS_REQUIRED = "token ids are required (a list of integers); message-only interactions cannot be scored"
INTERACTION_SCHEMA: tuple[FieldRule, ...] = (
    FieldRule("id", NonEmpty, REQUIRED, _nonempty_str, "must be a non-empty string", None),
    FieldRule("input_tokens", msgspec.Raw, REQUIRED, _token_list, _TOKENS_REQUIRED),
    FieldRule("output_tokens", msgspec.Raw, REQUIRED, _token_list, _TOKENS_REQUIRED),
    *map(_field_rule, TURN_FIELDS),
)
INTERACTION_KEYS = {rule.name for rule in INTERACTION_SCHEMA}


_VALUE_RULES = tuple((rule.name, rule.value, rule.absent) for rule in INTERACTION_SCHEMA
                     if rule.name not in ("id", "input_tokens", "output_tokens"))


def _struct_fields(schema: Sequence[FieldRule]) -> list[tuple[Any, ...]]:
    return [(r.name, r.json_type) if r.default is REQUIRED else (r.name, r.json_type, r.default) for r in schema]


def _field_values(get: Callable[[str], Any], where: str) -> dict[str, Any]:
    """The value rules of every field but the token lists, on decoded values; ``FieldError`` names the field."""
    values, name = {}, ""
    try:
        for name, check, absent in _VALUE_RULES:
            value = get(name)
            values[name] = absent if value is None else value if check is None else check(value)
    except ValueError as err:
        raise FieldError(f"{where}.{name}", str(err)) from None
    return values


class FieldError(ValueError):
    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


def _interaction_from(interaction_id: str, input_tokens: np.ndarray, output_tokens: np.ndarray,
                      values: dict[str, Any], where: str) -> Interaction:
    """The cross-field rules, then the turn (every rule of ``Interaction`` holds by now)."""
    if values["parent_id"] == interaction_id:
        raise FieldError(where, f"interaction {interaction_id!r} is its own parent")
    if output_tokens.shape[0] == 0:  # never a scorer's failure (nor error_policy's fallback): the input's
        raise FieldError(f"{where}.output_tokens", "must hold at least one token: a turn that generated nothing "
                                                    "can be neither scored nor trained on")
    try:
        check_vector_lengths(interaction_id, output_tokens.shape[0], *(values[name] for name in VECTOR_FIELDS))
    except ValueError as err:
        raise FieldError(where, str(err)) from None
    return Interaction.prevalidated(interaction_id, input_tokens, output_tokens, **values)


def _interaction(item: Any, path: Path, line: int, where: str) -> Interaction:
    """One interaction, field by field: the schema's types in Python, then the value rules."""
    if not isinstance(item, dict):
        raise InputError(path, line, where, "must be a JSON object")
    unknown = sorted(set(item) - INTERACTION_KEYS)
    if unknown:
        raise InputError(path, line, f"{where}.{unknown[0]}", "unknown key")
    for rule in INTERACTION_SCHEMA:
        if rule.name not in item and rule.default is not REQUIRED:
            continue
        value = item.get(rule.name)
        if not rule.is_type(value):
            shown = "" if rule.name.endswith("_tokens") else f", got {short_repr(value)}"
            raise InputError(path, line, f"{where}.{rule.name}", rule.type_problem + shown)
    tokens = []
    for name in ("input_tokens", "output_tokens"):
        stray = stray_token_id(item[name])
        if stray is not None:
            raise InputError(path, line, f"{where}.{name}", f"token ids must be in {TOKEN_ID_RANGE} (int32), "
                                                            f"got {stray}")
        tokens.append(np.asarray(item[name], np.int64) if item[name] else np.zeros(0, np.int64))
    try:
        return _interaction_from(item["id"], tokens[0], tokens[1], _field_values(item.get, where), where)
    except FieldError as err:
        raise InputError(path, line, err.field, err.problem) from None


def _ready_rule(ready: list[str], known: Any, reward_of: Callable[[str], float | None], parents: set[str],
                discounted: bool) -> None:
    """``ready`` names interactions of the session, each once (both readers); each needs an outcome reward,
    except, with ``discounted`` (``turn_discount``), one with children: an unset reward counts 0 there, and
    the discount gives it the discounted mean of its children's (AReaL's rule)."""
    if not ready:
        raise FieldError("ready", "must be a non-empty list of interaction ids")
    if len(set(ready)) != len(ready):
        raise FieldError("ready", f"names {next(r for r in ready if ready.count(r) > 1)!r} twice")
    for end in ready:
        if end not in known:
            raise FieldError("ready", f"names {end!r}, which is not an interaction of the session")
        if reward_of(end) is None and not (discounted and end in parents):
            inner = end in parents
            raise FieldError("reward", f"the ready trajectory ending at {end!r} needs an outcome reward on it"
                             + (" (it has children: with turn_discount an unset reward counts 0 and it gets the "
                                "discounted mean of its children's)" if inner else " (it is a leaf)"))


def _session(data: Any, path: Path, line: int, discounted: bool = False) -> SessionRecord:
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
        leaves = [branch[-1].interaction_id for branch in cache.branches()]  # every turn on a branch (no cycle)
        ready = data.get("ready", leaves)
        if not isinstance(ready, list) or not all(isinstance(r, str) for r in ready):
            raise InputError(path, line, "ready", "must be a non-empty list of interaction ids")
        parents = {turn.parent_id for turn in cache if turn.parent_id is not None}
        _ready_rule(ready, cache, lambda leaf: cache.get(leaf).reward, parents, discounted)
        for leaf in ready:
            cache.to_sequence(leaf)  # the concat rule along the branch
    except FieldError as err:
        raise InputError(path, line, err.field, err.problem) from None
    except ValueError as err:
        raise InputError(path, line, "interactions", str(err)) from None
    try:
        metadata = check_metadata(data.get("metadata", {}))
    except ValueError as err:
        raise InputError(path, line, "metadata", str(err)) from None
    return SessionRecord(key, group, cache, list(ready), line, metadata)


# The fast path's types, built from the schema above. Token lists stay raw JSON (valid JSON: msgspec checks
# their syntax): a child repeats its parent's tokens, which are compared as bytes and never decoded (see
# ``_branch_tokens``); the leaf's are parsed straight into one array (``_parse_ids``).
_InteractionIn = msgspec.defstruct("_InteractionIn", _struct_fields(INTERACTION_SCHEMA), forbid_unknown_fields=True)


class _SessionIn(msgspec.Struct, forbid_unknown_fields=True):
    """A session's keys, declared once: the fast path decodes with it, the field-by-field path allows its
    fields (``SESSION_KEYS``)."""

    session_key: NonEmpty
    interactions: list[_InteractionIn]  # type: ignore[valid-type]
    group: NonEmpty | msgspec.UnsetType = msgspec.UNSET  # absent: the session key; null is refused (as field by field)
    ready: list[str] | msgspec.UnsetType = msgspec.UNSET
    metadata: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET  # check_metadata's rule, both paths


SESSION_KEYS = set(_SessionIn.__struct_fields__)


class KeyDoc(NamedTuple):
    """What a key of the format is, for its page (``format_table``): its JSON type, the values accepted, what
    it is and what it becomes in the batch; the turn fields' are on ``TURN_FIELDS``."""

    label: str
    range: str
    doc: str
    becomes: str


# The session's own keys (``_SessionIn``) and a turn's identity (``id`` and the token lists), declared beside
# the schema; a key without its entry, or an entry without its key, fails at import.
SESSION_KEY_DOCS: dict[str, KeyDoc] = {
    "session_key": KeyDoc("string", "non-empty, unique in the file", "the session's name",
                          "the session trees `node_ids`, `node_parents` (under `credit_assignment: tree`)"),
    "group": KeyDoc("string", "non-empty; absent: the session key (a group of one, with a warning)",
                    "the sessions exported together (a GRPO group: the outcome is normalized within it)",
                    "`group_sizes` (a group's rows are adjacent)"),
    "interactions": KeyDoc("list of objects", "at least one; each one below", "the session's turns",
                           "one row per leaf"),
    "ready": KeyDoc("list of strings", "interaction ids, each once", "the leaves to export (default: every leaf)",
                    "which rows there are"),
    "metadata": KeyDoc("object", "any JSON object, at most 64 KiB and 32 levels deep",
                       "given to every scorer of the session, read-only", "`ctx[\"metadata\"]` (read by scorers)"),
}
IDENTITY_DOCS: dict[str, KeyDoc] = {
    "id": KeyDoc("string", "non-empty, unique in the session", "the interaction's name", "(names the rows' turns)"),
    "input_tokens": KeyDoc("list of integers", f"token ids in {TOKEN_ID_RANGE}",
                           "the prompt of the turn (a child's starts with its parent's inputs and outputs)",
                           "`input_ids`, `attention_mask`"),
    "output_tokens": KeyDoc("list of integers", f"token ids in {TOKEN_ID_RANGE}, at least one",
                            "the tokens the policy generated", "`input_ids`, `loss_mask` (the trained tokens)"),
}
_undocumented = sorted(set(SESSION_KEY_DOCS) ^ SESSION_KEYS) + sorted(
    set(IDENTITY_DOCS) ^ (INTERACTION_KEYS - {field.name for field in TURN_FIELDS}))
if _undocumented:
    raise RuntimeError(f"session format keys and their documentation disagree: {_undocumented}")


def format_table() -> list[tuple[str, str, str, str, str, str]]:
    """The session format, one row a key, from its declarations (``_SessionIn``, ``INTERACTION_SCHEMA``,
    ``TURN_FIELDS``, ``JSON_KINDS``, the batch schema's bounds): ``(key, required or optional (with its
    default), JSON type, values accepted, what it is, what it becomes in the batch)``; a turn's keys are
    ``interactions[].<key>``. The site's Session format page renders it."""
    rows = []
    for name in _SessionIn.__struct_fields__:
        doc = SESSION_KEY_DOCS[name]
        required = name in ("session_key", "interactions")
        rows.append((name, "required" if required else "optional", doc.label, doc.range, doc.doc, doc.becomes))
    fields = {field.name: field for field in TURN_FIELDS}
    for rule in INTERACTION_SCHEMA:
        key = f"interactions[].{rule.name}"
        if rule.name in IDENTITY_DOCS:
            doc = IDENTITY_DOCS[rule.name]
            rows.append((key, "required", doc.label, doc.range, doc.doc, doc.becomes))
            continue
        field, kind = fields[rule.name], JSON_KINDS[fields[rule.name].json]
        bounds = BATCH_SCHEMA[field.batch_key].bounds if field.batch_key is not None else None
        accepted = f"{bounds.text}, {_FINITE}" if bounds is not None else kind.range
        default = f"optional (default `{field.absent}`)" if field.absent not in (None, ()) else "optional"
        becomes = field.becomes or (f"`{field.batch_key}` (on timesteps)" if field.batch_key else "")
        rows.append((key, default, kind.label, accepted, field.doc, becomes))
    return rows


_DECODER = msgspec.json.Decoder(_SessionIn)


def _fast_session(line: bytes, path: Path, line_no: int, discounted: bool = False) -> tuple[SessionRecord, bool]:
    """One line through the typed decoder, number lists to arrays with vectorized checks.

    Any problem raises ``ValueError`` (or ``msgspec.DecodeError``): the caller sends the line to the
    field-by-field path, which names the field that is wrong.
    """
    data = _DECODER.decode(line)
    turns: list[Any] = data.interactions  # (a struct type built at run time: mypy cannot see its fields)
    items = {item.id: item for item in turns}
    if len(items) != len(turns):
        raise ValueError("duplicate ids")
    children = {item.parent_id for item in turns if item.parent_id is not None}
    leaves = [iid for iid in items if iid not in children]
    ready = leaves if data.ready is msgspec.UNSET else data.ready
    _ready_rule(ready, items, lambda leaf: items[leaf].reward, children, discounted)
    tokens = _branch_tokens(items, leaves)
    if len(tokens) != len(items):
        raise ValueError("turns on no branch (a parent cycle)")
    cache = InteractionCache()
    for item in turns:
        cache.add(_fast_interaction(item, *tokens[item.id]))
    ungrouped = isinstance(data.group, msgspec.UnsetType)
    group = data.session_key if isinstance(data.group, msgspec.UnsetType) else data.group
    metadata = {} if isinstance(data.metadata, msgspec.UnsetType) else check_metadata(data.metadata)
    return SessionRecord(data.session_key, group, cache, list(ready), line_no, metadata), ungrouped


_SPACE = b" \t\r\n"
_ID_CHARS = b"0123456789," + _SPACE
_SPACES = re.compile(b"[ \t\r\n]*")
_ELEMENT_END = (b",", b"]", b" ", b"\t", b"\r", b"\n")


def _list_body(raw: bytes) -> bytes:
    """The text between a JSON list's brackets (``ValueError`` if the value is not a list)."""
    if raw[:1] != b"[" or raw[-1:] != b"]":
        raise ValueError("not a list")
    return raw[1:-1].strip(_SPACE)


def _count(body: bytes) -> int:
    """How many elements a list body holds (its elements are numbers: no commas inside them)."""
    return body.count(b",") + 1 if body else 0


def _parse_ids(raw: bytes) -> np.ndarray:
    """A JSON list of token ids, parsed at C speed and range-checked. ``raw`` is valid JSON (msgspec
    checked it), so a body of digits, commas and spaces only is a list of non-negative JSON integers, which
    ``np.fromstring`` parses exactly (saturating at the int64 maximum, which the range check refuses);
    anything else (signs, floats, strings, ``true``, nested lists) raises ``ValueError``."""
    body = _list_body(raw)
    if body.translate(None, _ID_CHARS):
        raise ValueError("not a list of token ids")
    if not body:
        return np.zeros(0, np.int64)
    ids = np.fromstring(body, dtype=np.int64, sep=",")
    if ids.size != _count(body) or stray_token_id(ids) is not None:
        raise ValueError("token ids")
    return ids


def _branch_tokens(items: dict[str, Any], leaves: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every turn's ``(input_tokens, output_tokens)`` as views of one buffer per branch.

    Only the leaf's tokens are parsed; an ancestor's inputs are checked to be a prefix of the leaf's
    inputs byte for byte, and its outputs to follow that prefix there (the concat rule), so their token ids
    are the leaf's, already parsed and range-checked. Lists written in another style than the leaf's
    (other spacing) raise ``ValueError``: the field-by-field path reads them.
    """
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for leaf in leaves:
        chain = _chain(items, leaf)
        leaf_raw = bytes(items[leaf].input_tokens).strip(_SPACE)
        inputs = _parse_ids(leaf_raw)
        full = np.concatenate([inputs, _parse_ids(bytes(items[leaf].output_tokens).strip(_SPACE))])
        full.setflags(write=False)
        parent_stop = 0
        for turn in chain:
            start, stop = (inputs.shape[0], full.shape[0]) if turn is chain[-1] else _ancestor_span(turn, leaf_raw)
            if start < parent_stop:  # its inputs end before its parent's outputs do: not the concat rule
                raise ValueError("concat prefix")
            parent_stop = stop
            out.setdefault(turn.id, (full[:start], full[start:stop]))
    return out


def _chain(items: dict[str, Any], leaf: str) -> list[Any]:
    """Root-first turns of the branch ending at ``leaf`` (``ValueError`` on a cycle or a missing parent:
    the checked path words the error)."""
    return [items[i] for i in root_first(leaf, lambda iid: items[iid].parent_id)]


def _ancestor_span(turn: Any, leaf_raw: bytes) -> tuple[int, int]:
    """Where an ancestor's output tokens are in its leaf's sequence, ``(start, stop)``, after checking, as
    bytes, that the leaf's input list begins with the ancestor's input elements and then its output elements."""
    raw = bytes(turn.input_tokens).strip(_SPACE)
    inputs = _count(_list_body(raw))
    prefix = raw[:-1].rstrip(_SPACE)  # "[1, 2" of "[1, 2]"
    if not leaf_raw.startswith(prefix):
        raise ValueError("concat prefix")
    at = len(prefix)
    outputs = _list_body(bytes(turn.output_tokens).strip(_SPACE))
    if outputs:
        if inputs:  # the comma between the last input and the first output
            at = _SPACES.match(leaf_raw, at).end()  # type: ignore[union-attr]
            if leaf_raw[at:at + 1] != b",":
                raise ValueError("concat prefix")
            at += 1
        at = _SPACES.match(leaf_raw, at).end()  # type: ignore[union-attr]
        if not leaf_raw.startswith(outputs, at):
            raise ValueError("concat prefix")
        at += len(outputs)
    if (inputs or outputs) and leaf_raw[at:at + 1] not in _ELEMENT_END:  # the last element is whole
        raise ValueError("concat prefix")
    return inputs, inputs + _count(outputs)


def _fast_interaction(item: Any, input_tokens: np.ndarray, output_tokens: np.ndarray) -> Interaction:
    """The schema's value rules on a decoded interaction (types were checked while decoding)."""
    return _interaction_from(item.id, input_tokens, output_tokens,
                             _field_values(item.__getattribute__, "interaction"), "interaction")


def share_prefixes(cache: InteractionCache, leaves: Sequence[str]) -> None:
    """Makes every turn's token arrays views of one buffer per branch (the leaf's whole sequence).

    A child's ``input_tokens`` repeats its parent's tokens; after the concat-prefix check they are equal,
    so holding one copy per branch saves the repeats (most of an AReaL rollout dump).
    """
    for leaf in leaves:
        chain = cache.chain(leaf)
        spans = concat_spans(chain)  # the rule holds: every turn's tokens are where its span says
        last = chain[-1]
        full = np.concatenate([last.input_tokens, last.output_tokens])
        full.setflags(write=False)
        for turn, (start, stop) in zip(chain, spans):
            turn.input_tokens = full[:start]
            turn.output_tokens = full[start:stop]


def _slow_session(line: bytes, path: Path, line_no: int, discounted: bool = False) -> tuple[SessionRecord, bool]:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(path, line_no, "json", f"invalid UTF-8 at byte {err.start}") from None
    try:
        data = json.loads(text)  # NaN/Infinity parse here and are refused by field below
    except json.JSONDecodeError as err:
        raise InputError(path, line_no, "json", f"malformed JSON: {err.msg} at column {err.colno}") from None
    except RecursionError:
        raise InputError(path, line_no, "json", "nested too deeply") from None
    record = _session(data, path, line_no, discounted)
    share_prefixes(record.cache, record.ready)
    return record, isinstance(data, dict) and "group" not in data


GZIP_MAGIC = b"\x1f\x8b"


@contextlib.contextmanager
def _open(path: Path) -> Iterator[Any]:
    """The input as binary lines: ``-`` is standard input; a gzip file (by its magic bytes) is read
    decompressed."""
    if str(path) == "-":
        yield sys.stdin.buffer
        return
    try:
        # 1 MB reads: for long lines a small buffer makes readline copy many times
        handle = io.BufferedReader(io.FileIO(path, "rb"), buffer_size=1 << 20)
    except OSError as err:
        raise InputError(path, 0, "file", err.strerror or str(err)) from None
    with handle:
        if handle.peek(2)[:2] == GZIP_MAGIC:
            with gzip.GzipFile(fileobj=handle, mode="rb") as unzipped:
                yield unzipped
        else:
            yield handle


def iter_sessions(path: str | Path, *, discounted: bool = False) -> Iterator[tuple[SessionRecord, bool]]:
    """Streams ``(record, had_no_group)`` line by line; ``InputError`` at the first problem. ``path`` may
    be ``-`` (standard input) or a gzip file; ``discounted``: the config sets ``turn_discount`` (a ready
    interaction with children may then have no reward of its own).

    Args:
        path: The JSONL file (gzip-compressed ones are recognized by their magic bytes), or ``-`` for standard input.
        discounted: Whether the config sets ``turn_discount`` (a ready interaction with children may then have no
            reward of its own).

    Example:
        >>> import json, pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "sessions.jsonl"
        >>> line = {"session_key": "a", "group": "q1", "metadata": {"answer": "4"},
        ...         "interactions": [{"id": "a0", "input_tokens": [1, 2], "output_tokens": [3, 4], "reward": 1.0}]}
        ...
        >>> _ = path.write_text(json.dumps(line) + "\\n")
        >>> from prm_jax.app.sessions import iter_sessions, read_sessions
        >>> [(record.key, had_no_group) for record, had_no_group in iter_sessions(path)]
        [('a', False)]
    """
    path = Path(path)
    shown = Path("<stdin>") if str(path) == "-" else path
    with _open(path) as handle:
        # Lines end at "\n" only (a binary file splits nowhere else): U+2028 is valid inside JSON strings.
        try:
            for line_no, line in enumerate(handle, start=1):
                if line.isspace():  # (no copy of the line, unlike strip())
                    continue
                try:
                    yield _fast_session(line, shown, line_no, discounted)
                except (msgspec.DecodeError, ValueError, TypeError, RecursionError, OverflowError):
                    # Rare (bad input, or token lists formatted unlike each other): the field-by-field checks
                    # decide, and name the field when the line is bad.
                    yield _slow_session(line, shown, line_no, discounted)
        except (OSError, EOFError) as err:  # a corrupt gzip stream, a read error
            raise InputError(shown, 0, "file", f"could not be read: {err}") from None


def read_sessions(path: str | Path, *, discounted: bool = False) -> list[SessionRecord]:
    """Reads and validates every line before anything is scored; raises ``InputError`` at the first problem.
    ``discounted``: the config sets ``turn_discount`` (see ``iter_sessions``).

    Args:
        path: The JSONL file (gzip-compressed ones are recognized by their magic bytes), or ``-`` for standard input.
        discounted: Whether the config sets ``turn_discount`` (see ``iter_sessions``).

    Example:
        >>> import json, pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "sessions.jsonl"
        >>> line = {"session_key": "a", "group": "q1", "metadata": {"answer": "4"},
        ...         "interactions": [{"id": "a0", "input_tokens": [1, 2], "output_tokens": [3, 4], "reward": 1.0}]}
        ...
        >>> _ = path.write_text(json.dumps(line) + "\\n")
        >>> from prm_jax.app.sessions import iter_sessions, read_sessions
        >>> [record.cache.to_sequence("a0").input_ids.tolist() for record in read_sessions(path)]
        [[1, 2, 3, 4]]
    """
    records, keys = [], set()
    ungrouped = 0
    shown = "<stdin>" if str(path) == "-" else path
    for record, had_no_group in iter_sessions(path, discounted=discounted):
        ungrouped += had_no_group
        if record.key in keys:
            raise InputError(shown, record.line, "session_key", f"{record.key!r} appears twice")
        keys.add(record.key)
        records.append(record)
    if not records:
        raise InputError(shown, 0, "file", "no sessions")
    if ungrouped:
        warnings.warn(f"{shown}: {ungrouped} session(s) have no 'group': each is a group of one, whose "
                      "group-normalized outcome reward, and so its advantages without a critic, are 0",
                      stacklevel=2)
    return records
