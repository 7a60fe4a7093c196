"""The read-only context a scorer gets with each call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prm_jax.runtime.trajectory import Interaction, freeze, thaw


class PrefixRuleError(RuntimeError):
    """A ``prefix_determined`` scorer read ``ctx["messages"]``, the branch's conversation: its score of a shared
    turn would be given to every clone of the session although it depends on one branch."""


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
