"""Helpers for scorer authors: bounded deadlines and retries for external calls.

Scorers that call a judge service should never wait forever nor give up on the first transient error:
``call_with_retry`` runs each attempt under ``anyio.fail_after`` and retries what is worth retrying
(``prm_jax.runtime._limits.should_retry``: 429, 408, 5xx, connection errors, timeouts; never another 4xx
nor a malformed answer), after the server's ``Retry-After`` or a fully jittered, capped exponential
backoff. Cancellation always propagates (it is never retried).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from prm_jax.errors import RetryError
from prm_jax.runtime._limits import MAX_RETRY_AFTER_S, RequestLimiter, retry_delay, should_retry

T = TypeVar("T")


async def call_with_retry(fn: Callable[..., Awaitable[T]], *args: Any, timeout: float, attempts: int = 3,
                          backoff: float = 0.05, max_backoff: float = 2.0,
                          retry_on: tuple[type[BaseException], ...] | None = None,
                          limiter: RequestLimiter | None = None) -> T:
    """Awaits ``fn(*args)`` with a per-attempt deadline, retrying the failures worth retrying.

    Args:
      fn: the coroutine function to call.
      args: ``fn``'s positional arguments, the same for every attempt.
      timeout: seconds allowed per attempt (``anyio.fail_after``; not counting the wait for ``limiter``); a
        timeout counts as a failure.
      attempts: total attempts, >= 1 (the retry budget of one call).
      backoff: the scale of the wait before the second attempt; doubled after each failure, capped at
        ``max_backoff``; each wait is drawn uniformly below it (full jitter). A server's ``Retry-After``
        (an error's ``retry_after`` seconds) is waited instead, and holds every request of ``limiter``.
      retry_on: exception types worth retrying (each also passes ``should_retry``: an error marked
        ``retryable=False``, such as a 4xx answer, never is); None: ``should_retry``'s rules alone.
      limiter: a ``RequestLimiter`` each attempt runs under (its slot and pacing).

    Raises:
      RetryError: all attempts failed, chained to the last failure. A failure not worth retrying
        propagates at once, as it is.

    Example:
        >>> import anyio
        >>> tries = []
        >>> async def flaky():
        ...     tries.append(1)
        ...     if len(tries) < 3:
        ...         raise ConnectionError("reset")
        ...     return "ok"
        ...
        >>> anyio.run(lambda: prm_jax.runtime.call_with_retry(flaky, timeout=1.0, attempts=3, backoff=0.0)), len(tries)
        ('ok', 3)
    """
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts must be an integer >= 1, got {attempts!r}")
    if backoff < 0 or max_backoff < 0:
        raise ValueError("backoff and max_backoff must be >= 0")
    errors: list[BaseException] = []
    retryable = (Exception,) if retry_on is None else retry_on
    for attempt in range(1, attempts + 1):
        try:
            if limiter is None:
                with anyio.fail_after(timeout):
                    return await fn(*args)
            async with limiter.request():  # the wait for a slot is not the attempt's time
                with anyio.fail_after(timeout):
                    return await fn(*args)
        except retryable as err:
            if not should_retry(err):
                raise
            err.add_note(f"attempt {attempt} of {attempts}")
            errors.append(err)
            if attempt < attempts:
                wait = retry_delay(err, attempt, backoff, max_backoff)
                if wait > MAX_RETRY_AFTER_S:
                    break  # the server asked for longer than a call should wait
                if limiter is not None and getattr(err, "retry_after", None) is not None:
                    limiter.hold(wait)
                    wait = 0.0  # the hold paces this attempt with the others
                await anyio.sleep(wait)
    raise RetryError(f"{getattr(fn, '__name__', fn)!s} failed {len(errors)} times; last error: {errors[-1]!r}",
                     errors) from errors[-1]
