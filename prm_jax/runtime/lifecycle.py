"""Start-up that can fail half-way: what was acquired is released, and the error that stopped it is the one
raised (SPEC 3: the original error, cleanup failures attached as notes; cancellation during the cleanup
propagates). The runner's ``create`` and the export service's ``start`` both go through ``rolled_back``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable

from prm_jax._compat import add_note


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
            add_note(err, note)
        raise
