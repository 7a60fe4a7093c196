"""The read-only context a scorer gets with each call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prm_jax.runtime.trajectory import Interaction, freeze, thaw


class ScorerContext(Mapping):
    """The read-only ``ctx`` scorers get: the caller's entries frozen, ``is_eval``, and ``messages`` (the
    leaf's conversation) frozen on first read, once per run, since most scorers never read it."""

    def __init__(self, ctx: Mapping[str, Any] | None, leaf: Interaction, is_eval: bool):
        self._items = {key: freeze(value) for key, value in (ctx or {}).items()}
        self._items["is_eval"] = bool(is_eval)
        self._items.pop("messages", None)
        self._leaf = leaf

    def __getitem__(self, key: str) -> Any:
        if key == "messages":
            if "messages" not in self._items:
                # The leaf's own frozen messages (built once per interaction, shared with scorers' views).
                self._items["messages"] = self._leaf._frozen("messages") + self._leaf._frozen("output_messages")
            return self._items["messages"]
        return self._items[key]

    def __iter__(self):
        yield from self._items
        if "messages" not in self._items:
            yield "messages"

    def __len__(self) -> int:
        return len(self._items) + ("messages" not in self._items)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (for a scorer's worker process) as the caller's entries thawed, the leaf and ``is_eval``."""
        items = {k: thaw(v) for k, v in self._items.items() if k not in ("is_eval", "messages")}
        return ScorerContext, (items, self._leaf, self._items["is_eval"])

    def __repr__(self) -> str:
        return f"ctx({dict(self)!r})"
