"""Start-up that can fail half-way: what was acquired is released, and the error that stopped it is the one
raised (SPEC 3: the original error, cleanup failures attached as notes; cancellation during the cleanup
propagates). The runner's ``create`` and the export service's ``start`` both go through ``rolled_back``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable


@contextlib.asynccontextmanager
async def rolled_back(stack: contextlib.AsyncExitStack, cleanup_failures: Callable[[], Iterable[str]]
                      ) -> AsyncIterator[None]:
    """On an ordinary failure inside: unwinds ``stack`` (what was acquired so far), adds each of
    ``cleanup_failures()`` (read after the unwinding) to the error as a note, and re-raises the error
    unchanged. Nothing is done on success."""
    try:
        yield
    except Exception as err:
        await stack.aclose()
        for note in cleanup_failures():
            err.add_note(note)
        raise


def first_in_group(group: BaseExceptionGroup, kinds: type[BaseException] | tuple[type[BaseException], ...]
                   ) -> BaseException | None:
    """The first exception of ``kinds`` in a (nested) exception group, depth first; ``None`` when none is."""
    for error in group.exceptions:
        if isinstance(error, kinds):
            return error
        if isinstance(error, BaseExceptionGroup):
            found = first_in_group(error, kinds)
            if found is not None:
                return found
    return None
