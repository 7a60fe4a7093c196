"""The read-only context a scorer gets with each call, and the per-session data it may carry
(``metadata``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from prm_jax._validation import short_repr
from prm_jax.errors import PrefixRuleError
from prm_jax.runtime._trajectory import Interaction, freeze, thaw

METADATA_KEY = "metadata"          # ctx["metadata"]: the session's (or the array row's) metadata
MAX_METADATA_BYTES = 64 * 1024  # encoded as compact JSON (UTF-8)
MAX_METADATA_DEPTH = 32         # the object itself is level 1; each nested object or list one more


def check_metadata(value: Any, name: str = "metadata") -> dict[str, Any]:
    """A session's (or a row's) ``metadata``: a JSON object (string keys; strings, finite numbers, booleans,
    null, lists and objects), at most ``MAX_METADATA_DEPTH`` levels deep and ``MAX_METADATA_BYTES``
    encoded; ``ValueError`` naming ``name`` and where inside it the problem is. Scorers get it as
    ``ctx["metadata"]``, read-only. Both JSONL readers and ``score_arrays`` run this one rule.

    Args:
        value: The metadata to check.
        name: How errors name it (``metadata``, ``metadata[3]``).

    Example:
        >>> prm_jax.runtime.check_metadata({"answer": "42", "task_id": 7})
        {'answer': '42', 'task_id': 7}
        >>> try:
        ...     prm_jax.runtime.check_metadata({"answer": float("nan")})
        ... except ValueError as err:
        ...     print(err)
        ...
        metadata.answer is nan: numbers must be finite
    """
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object (e.g. {{\"answer\": \"42\"}}), got {short_repr(value)}")
    stack: list[tuple[Any, str, int]] = [(value, name, 1)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_METADATA_DEPTH:
                raise ValueError(f"{name} is nested more than {MAX_METADATA_DEPTH} levels deep (at {where})")
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise ValueError(f"{where} has a key that is not a string: {short_repr(key)}")
                    stack.append((child, f"{where}.{key}", depth + 1))
            else:
                stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{where} is {item}: numbers must be finite")
        elif item is not None and not isinstance(item, (str, int, float, bool)):
            raise ValueError(f"{where} holds a {type(item).__name__}, which JSON has no form for")
    size = len(msgspec.json.encode(value))
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"{name} is {size:,} bytes encoded as JSON, more than {MAX_METADATA_BYTES:,} (64 KiB: "
                         "keep large data out of the session, and a key to it in)")
    return value


class ScorerContext(Mapping):
    """The read-only ``ctx`` scorers get: the caller's entries frozen, ``is_eval``, and ``messages`` (the
    leaf's conversation) frozen on first read, once per run, since most scorers never read it.

    A ``prefix_determined`` scorer gets ``prefix_only()``: the same entries without ``messages``, whose read
    raises ``PrefixRuleError`` naming the rule (``ctx.get("messages")`` too: ``Mapping.get`` turns only a
    ``KeyError`` into its default), so the mistake cannot pass silently."""

    def __init__(self, ctx: Mapping[str, Any] | None, leaf: Interaction, is_eval: bool,
                 prefix_only: bool = False):
        self._items = {key: freeze(value) for key, value in (ctx or {}).items()}
        self._items["is_eval"] = bool(is_eval)
        self._items.pop("messages", None)
        self._leaf = leaf
        self._prefix_only = prefix_only
        self._prefix_view: ScorerContext | None = None

    def prefix_only(self) -> ScorerContext:
        """This context without the branch's ``messages`` (see the class docstring), made once per run."""
        if self._prefix_view is None:
            view = ScorerContext.__new__(ScorerContext)
            view._items = {key: value for key, value in self._items.items() if key != "messages"}
            view._leaf, view._prefix_only, view._prefix_view = self._leaf, True, None
            self._prefix_view = view
        return self._prefix_view

    def __getitem__(self, key: str) -> Any:
        if key == "messages":
            if self._prefix_only:
                raise PrefixRuleError(
                    "ctx['messages'] (the branch's whole conversation) is not given to a prefix_determined scorer: "
                    "its score of a turn is shared by every clone of the session, so it may read only the turn "
                    "and what came before it (interaction.messages); set prefix_determined = False to read it")
            if "messages" not in self._items:
                # The leaf's own frozen messages (built once per interaction, shared with scorers' views).
                self._items["messages"] = self._leaf._frozen("messages") + self._leaf._frozen("output_messages")
            return self._items["messages"]
        return self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items or (key == "messages" and not self._prefix_only)

    def __iter__(self):
        yield from self._items
        if "messages" not in self._items and not self._prefix_only:
            yield "messages"

    def __len__(self) -> int:
        return len(self._items) + ("messages" not in self._items and not self._prefix_only)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (for a scorer's worker process) as the caller's entries thawed, the leaf, ``is_eval`` and
        whether it is a prefix-determined scorer's."""
        items = {k: thaw(v) for k, v in self._items.items() if k not in ("is_eval", "messages")}
        return ScorerContext, (items, self._leaf, self._items["is_eval"], self._prefix_only)

    def __repr__(self) -> str:
        return f"ctx({dict(self)!r})"
