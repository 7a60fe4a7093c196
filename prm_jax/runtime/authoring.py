"""Helpers for scorer authors: bounded deadlines and retries for external calls.

Scorers that call a judge service should never wait forever nor give up on the first transient error:
``call_with_retry`` runs each attempt under ``anyio.fail_after`` and retries failures with capped
exponential backoff. Cancellation always propagates (it is never retried).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from prm_jax._compat import add_note

T = TypeVar("T")


class RetryError(RuntimeError):
    """Every attempt failed; ``__cause__`` is the last failure and ``errors`` holds them all."""

    def __init__(self, message: str, errors: list[BaseException]):
        super().__init__(message)
        self.errors = errors


async def call_with_retry(fn: Callable[..., Awaitable[T]], *args: Any, timeout: float, attempts: int = 3,
                          backoff: float = 0.05, max_backoff: float = 2.0,
                          retry_on: tuple[type[BaseException], ...] = (Exception,)) -> T:
    """Awaits ``fn(*args)`` with a per-attempt deadline, retrying failures.

    Args:
      fn: the coroutine function to call.
      timeout: seconds allowed per attempt (``anyio.fail_after``); a timeout counts as a failure.
      attempts: total attempts, >= 1.
      backoff: sleep before the second attempt; doubled after each failure, capped at ``max_backoff``.
      retry_on: exception types worth retrying; anything else propagates at once.

    Raises:
      RetryError: all attempts failed, chained to the last failure.
    """
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts must be an integer >= 1, got {attempts!r}")
    if backoff < 0 or max_backoff < 0:
        raise ValueError("backoff and max_backoff must be >= 0")
    errors: list[BaseException] = []
    delay = backoff
    for attempt in range(1, attempts + 1):
        try:
            with anyio.fail_after(timeout):
                return await fn(*args)
        except retry_on as err:
            add_note(err, f"attempt {attempt} of {attempts}")
            errors.append(err)
        if attempt < attempts:
            await anyio.sleep(delay)
            delay = min(delay * 2, max_backoff)
    raise RetryError(f"{getattr(fn, '__name__', fn)!s} failed {attempts} times; last error: {errors[-1]!r}",
                     errors) from errors[-1]
