"""Issue 31.10: ``prm_jax.runtime._authoring.call_with_retry`` on its own: attempts, deadlines, the rules of
what is retried (``runtime.limits``), and the limiter it may run under."""

import time

import anyio
import pytest

from prm_jax.errors import ServiceError
from prm_jax.runtime import RetryError, call_with_retry
from prm_jax.runtime._limits import RequestLimiter

pytestmark = pytest.mark.anyio


def flaky(errors):
    calls = []

    async def fn():
        calls.append(time.monotonic())
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"

    return fn, calls


async def test_retryable_failures_are_retried_up_to_the_attempts_and_kept():
    fn, calls = flaky([ConnectionError("a"), TimeoutError()])
    assert await call_with_retry(fn, timeout=1, attempts=3, backoff=0.001) == "ok" and len(calls) == 3
    fn, calls = flaky([ConnectionError("a"), ConnectionError("b"), ConnectionError("c")])
    with pytest.raises(RetryError, match="failed 2 times") as info:
        await call_with_retry(fn, timeout=1, attempts=2, backoff=0.001)
    assert [str(e) for e in info.value.errors] == ["a", "b"] and info.value.__cause__ is info.value.errors[-1]
    assert info.value.errors[0].__notes__ == ["attempt 1 of 2"]


async def test_each_attempt_has_its_deadline_and_a_timeout_is_retried():
    attempts = []

    async def hangs():
        attempts.append(1)
        await anyio.sleep(10)

    started = time.monotonic()
    with pytest.raises(RetryError):
        await call_with_retry(hangs, timeout=0.05, attempts=3, backoff=0.001)
    assert len(attempts) == 3 and time.monotonic() - started < 1.0


async def test_the_servers_retry_after_is_waited_and_holds_the_limiter():
    told = ServiceError("busy", status=429, retryable=True, retry_after=0.2)
    fn, calls = flaky([told])
    limiter = RequestLimiter(max_concurrency=2)
    assert await call_with_retry(fn, timeout=1, attempts=2, backoff=0.001, limiter=limiter) == "ok"
    assert calls[1] - calls[0] >= 0.19 and limiter.requests == 2 and limiter.waits == 1


async def test_a_retry_after_beyond_a_minute_is_not_waited():
    fn, calls = flaky([ServiceError("come back tomorrow", status=429, retryable=True, retry_after=86400.0)])
    with pytest.raises(RetryError, match="failed 1 times"):
        await call_with_retry(fn, timeout=1, attempts=3)
    assert len(calls) == 1


async def test_only_retry_on_types_are_retried_and_never_what_should_retry_refuses():
    fn, calls = flaky([OSError("disk"), OSError("disk")])
    with pytest.raises(RetryError):
        await call_with_retry(fn, timeout=1, attempts=2, backoff=0.001, retry_on=(OSError,))
    fn, calls = flaky([ConnectionError("x")])
    with pytest.raises(ConnectionError):  # not among retry_on: at once
        await call_with_retry(fn, timeout=1, attempts=3, retry_on=(KeyError,))
    assert len(calls) == 1
