"""``BlockingRunner``: a ``PRMRunner`` for synchronous training loops.

A JAX training loop is usually plain synchronous Python. ``BlockingRunner`` keeps an event loop in a
worker thread (an anyio blocking portal) and runs the runner there, so the loop calls
``runner.score_arrays(...)`` like any function and never becomes ``async def main``. Scorers run, and are
closed, on that loop; ``close()`` (or leaving the ``with`` block) closes them and stops the thread.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from anyio.from_thread import start_blocking_portal

from prm_jax.runtime.arrays import ScoredArrays, score_arrays
from prm_jax.runtime.runner import PRMRunner
from prm_jax.runtime.scoring import BaseScorer
from prm_jax.runtime.trajectory import Interaction, InteractionCache


class BlockingRunner:
    """``PRMRunner(config, scorers=...)`` behind synchronous methods; a context manager.

    ``backend`` is anyio's (``"asyncio"`` or ``"trio"``). Build it outside any running event loop.
    """

    def __init__(self, config: Any = None, *, scorers: Sequence[BaseScorer] = (), backend: str = "asyncio"):
        self._portal_cm = start_blocking_portal(backend)
        self._portal = self._portal_cm.__enter__()
        try:
            self.runner: PRMRunner = self._portal.call(functools.partial(PRMRunner.create, config, scorers=scorers))
        except BaseException as err:
            self._portal_cm.__exit__(type(err), err, err.__traceback__)
            raise
        self._closed = False

    def run(self, branch: InteractionCache | Sequence[Interaction], ctx: Mapping[str, Any] | None = None, *,
            is_eval: bool = False) -> list:
        """``PRMRunner.run``, blocking."""
        return self._call(self.runner.run, branch, ctx, is_eval=is_eval)

    def run_many(self, branches: Sequence[InteractionCache | Sequence[Interaction]], ctx: Any = None, *,
                 limit: int | None = 64, is_eval: bool = False, return_exceptions: bool = False) -> list:
        """``PRMRunner.run_many``, blocking."""
        return self._call(self.runner.run_many, branches, ctx, limit=limit, is_eval=is_eval,
                          return_exceptions=return_exceptions)

    def score_arrays(self, input_ids: Any, turn_ids: Any, **kwargs: Any) -> np.ndarray | ScoredArrays:
        """``prm_jax.runtime.arrays.score_arrays`` with this runner, blocking: ``token_rewards [B, T]``, or
        with ``on_error="mask"`` a ``ScoredArrays`` (the failed rows flagged instead of raising)."""
        return self._call(score_arrays, self.runner, input_ids, turn_ids, **kwargs)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise RuntimeError("BlockingRunner is closed")
        return self._portal.call(functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Closes the runner (its owned scorers) on its loop, then stops the loop's thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(self.runner.aclose)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def __enter__(self) -> BlockingRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
