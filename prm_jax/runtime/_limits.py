"""Client-side limits for scorers that call a service: requests in flight, requests per second, and which
failures are worth retrying, when. One implementation, used by the built-in judges and by
``call_with_retry``.

- ``RequestLimiter(max_concurrency, max_requests_per_second, burst)``: ``async with limiter.request():``
  holds one of ``max_concurrency`` slots (shared by every run of the runner that holds the scorer) and
  paces the starts of requests to ``max_requests_per_second`` (a token bucket of ``burst`` tokens, in its
  virtual-scheduling form: no timer task). A server's ``Retry-After`` holds every request of the limiter
  until then (``hold``), not only the one that was told.
- ``should_retry(err)``: retry 429, 408, 5xx answers and connection errors and timeouts; never another 4xx,
  never a malformed answer (a ``ServiceError(retryable=False)``), never a cancellation.
- ``retry_delay(err, attempt, backoff, max_backoff)``: the server's ``retry-after-ms`` / ``Retry-After``
  when it sent one, else full jitter (uniform in ``[0, min(max_backoff, backoff * 2**(attempt - 1))]``), so
  clients that failed together do not retry together.
"""

from __future__ import annotations

import contextlib
import email.utils
import math
import random
import sys
import time
from collections.abc import AsyncIterator, Mapping

import anyio

from prm_jax._validation import finite_number, integer
from prm_jax.runtime._concurrency import LoopLocal

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 60.0  # a Retry-After beyond this is not waited for: the call fails


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds a server asked the client to wait: ``retry-after-ms`` (OpenAI's), else ``Retry-After`` in
    seconds or as an HTTP date; None when it did not say (or said nonsense)."""
    lower = {k.lower(): v for k, v in headers.items()}
    value = lower.get("retry-after-ms")
    if value is not None:
        try:
            seconds = float(value) / 1000.0
            return seconds if math.isfinite(seconds) and seconds >= 0 else None
        except ValueError:
            pass
    value = lower.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def should_retry(err: BaseException) -> bool:
    """Whether a failed attempt is worth another: see the module docstring.

    Args:
        err: The failed attempt's exception.

    Example:
        >>> prm_jax.runtime.should_retry(ConnectionError()), prm_jax.runtime.should_retry(ValueError())
        (True, False)
    """
    retryable = getattr(err, "retryable", None)
    if isinstance(retryable, bool):
        return retryable
    if not isinstance(err, Exception):  # a cancellation, a KeyboardInterrupt: never
        return False
    if isinstance(err, (TimeoutError, ConnectionError)):
        return True
    httpx = sys.modules.get("httpx")  # httpx's transport errors (never imported here for the check)
    if httpx is not None:
        if isinstance(err, httpx.HTTPStatusError):
            return err.response.status_code in RETRYABLE_STATUS
        if isinstance(err, httpx.TransportError):
            return True
    return isinstance(err, OSError)


def retry_delay(err: BaseException, attempt: int, backoff: float, max_backoff: float) -> float:
    """Seconds before attempt ``attempt + 1``: the server's word, else full jitter."""
    told = getattr(err, "retry_after", None)
    if isinstance(told, (int, float)) and math.isfinite(told) and told >= 0:
        return float(told)
    return random.uniform(0.0, min(max_backoff, backoff * 2.0 ** (attempt - 1)))


class RequestLimiter:
    """Requests in flight and requests per second for one client (see the module docstring). ``waits``
    counts the requests that waited for the rate or a server's hold, ``waited_s`` the seconds they waited;
    ``requests`` counts the requests started.

    Args:
        max_concurrency: Requests in flight at once, >= 1; ``None``: no bound.
        burst: Requests the rate may start back to back, >= 1 (the token bucket's size).

    Example:
        >>> import anyio
        >>> limiter = prm_jax.runtime.RequestLimiter(max_concurrency=2)
        >>> async def main():
        ...     async with limiter.request():
        ...         pass
        ...     return limiter.stats()
        ...
        >>> anyio.run(main)
        {'requests': 1, 'rate_limit_waits': 0, 'rate_limit_wait_s': 0.0}
    """

    def __init__(self, max_concurrency: int | None = None, max_requests_per_second: float | None = None,
                 burst: int = 1):
        self.max_concurrency = None if max_concurrency is None else integer("max_concurrency", max_concurrency,
                                                                            minimum=1)
        self.rate = None if max_requests_per_second is None else finite_number(
            "max_requests_per_second", max_requests_per_second, minimum=1e-3)
        self.burst = integer("burst", burst, minimum=1)
        limit = self.max_concurrency
        self._slots = LoopLocal(lambda: anyio.Semaphore(limit)) if limit is not None else None
        self._next = -math.inf  # the theoretical arrival time of the next request (GCRA)
        self._held_until = -math.inf
        self.requests = self.waits = 0
        self.waited_s = 0.0

    def hold(self, seconds: float) -> None:
        """No request of this limiter starts for ``seconds`` (a server's ``Retry-After``).

        Args:
            seconds: How long no request starts, >= 0.
        """
        self._held_until = max(self._held_until, time.monotonic() + seconds)

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[None]:
        if self._slots is None:
            await self._pace()
            yield
            return
        async with self._slots.get():
            await self._pace()
            yield

    async def _pace(self) -> None:
        """Waits until this request conforms (GCRA: a start at ``t`` conforms when ``t >= next - (burst - 1)
        / rate``; each start moves ``next`` to ``max(next, t) + 1 / rate``), counting from actual starts, so
        no window of ``w`` seconds holds more than ``burst + w * rate`` starts however late a waiter wakes.
        Waiters that wake together re-check: the first one starts, the others wait again."""
        waited = 0.0
        while True:
            now = time.monotonic()
            start = max(now, self._held_until)
            if self.rate is not None:
                start = max(start, self._next - (self.burst - 1) / self.rate)
            if start <= now:
                break
            waited += start - now
            await anyio.sleep(start - now)
        if self.rate is not None:
            self._next = max(self._next, now) + 1.0 / self.rate
        self.requests += 1
        if waited > 0:
            self.waits += 1
            self.waited_s += waited

    def stats(self) -> dict[str, float]:
        return {"requests": self.requests, "rate_limit_waits": self.waits, "rate_limit_wait_s": self.waited_s}
