"""The shared-turn cache: within one ``run_many`` (or one group's export), a prefix-determined scorer scores a
turn shared by clones of one session once, and every branch holding it reuses that outcome."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import anyio

# The outcomes of prefix-determined scorers on turns shared by clones of one session, keyed by (session key,
# interaction id, scorer), so each such turn is scored once.
_SHARED: contextvars.ContextVar[dict[tuple[str, str, int], _SharedCall] | None] = contextvars.ContextVar(
    "prm_jax_shared_turns", default=None)


@contextlib.contextmanager
def shared_turns() -> Generator[None, None, None]:
    """Within the block (and the tasks started in it), prefix-determined scorers score a turn shared by
    clones of one session once: ``run_many`` and a group's export open one."""
    token = _SHARED.set({}) if _SHARED.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _SHARED.reset(token)


def current() -> dict[tuple[str, str, int], _SharedCall] | None:
    """The open cache, or ``None`` outside ``shared_turns()``."""
    return _SHARED.get()


class _SharedCall:
    __slots__ = ("done", "ok", "value")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.ok = False
        self.value: Any = None


async def once(shared: dict[tuple[str, str, int], _SharedCall], key: tuple[str, str, int],
               call: Callable[[], Awaitable[Any]]) -> Any:
    """``await call()`` once per key: the first branch to reach a shared turn scores it, the others wait for
    its outcome; if that call failed or was cancelled, each waiting branch scores the turn itself (a failure
    stays its own branch's)."""
    entry = shared.get(key)
    if entry is None:
        entry = shared[key] = _SharedCall()
        try:
            entry.value = await call()
            entry.ok = True
            return entry.value
        finally:
            if not entry.ok:
                del shared[key]
            entry.done.set()
    await entry.done.wait()
    if entry.ok:
        return entry.value
    return await call()
