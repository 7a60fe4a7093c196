"""The built-in judges' transport: one ``httpx`` client per scorer, a ``RequestLimiter``, the retry rules
of ``prm_jax.runtime.limits`` and a bounded answer (``JSONService``), read by the judges' one
``AnswerReader`` (``prm_jax.scorers._answers``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from prm_jax.runtime.authoring import call_with_retry
from prm_jax.runtime.limits import RETRYABLE_STATUS, RequestLimiter, ServiceError, retry_after_seconds
from prm_jax.scorers._answers import AnswerReader
from prm_jax.validation import finite_number, integer, short_repr

DEFAULT_MAX_BODY_BYTES = 1 << 20  # a score answer is a few hundred bytes; 1 MiB leaves room for logprobs
BURST_S = 0.01  # the limiter's burst, in seconds of the request rate
MAX_BURST = 2  # and never more than two requests back to back: inside any gateway's slack (a 500/s server
# with a bucket of 4 refused the 5 that 10 ms of its rate would allow, when a late wake-up made them up)


def httpx_module(who: str) -> Any:
    try:
        import httpx
    except ImportError:
        raise ImportError(f"{who} needs httpx: pip install -e '.[judge]' (from a checkout) or pip install httpx"
                          ) from None
    return httpx


def check_url(name: str, url: Any) -> str:
    """An http(s) URL, without unexpanded variables."""
    if not isinstance(url, str):
        raise ValueError(f"{name} must be an http:// or https:// URL, got {short_repr(url)}")
    if "${" in url or url.startswith("$"):
        raise ValueError(f"{name} {url!r} holds an unexpanded variable: set it in the config (prm-jax does not "
                         "expand environment variables; api_key_env names the one variable it reads)")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{name} must be an http:// or https:// URL, got {url!r}")
    try:
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as err:
        raise ValueError(f"{name} {url!r}: {err}") from None
    return url.rstrip("/")


def check_transport(request_timeout: Any, attempts: Any, backoff: Any, max_backoff: Any, max_body_bytes: Any,
                    max_concurrency: Any, max_requests_per_second: Any, api_key_env: Any = None) -> None:
    """The transport settings every built-in judge takes, checked without opening anything."""
    timeout = finite_number("request_timeout", request_timeout)
    if not timeout > 0:
        raise ValueError(f"request_timeout must be > 0 seconds, got {short_repr(request_timeout)}")
    integer("attempts", attempts, minimum=1)
    finite_number("backoff", backoff, minimum=0.0)
    finite_number("max_backoff", max_backoff, minimum=0.0)
    integer("max_body_bytes", max_body_bytes, minimum=1)
    if max_concurrency is not None:
        integer("max_concurrency", max_concurrency, minimum=1)
    if max_requests_per_second is not None:
        finite_number("max_requests_per_second", max_requests_per_second, minimum=1e-3)
    if api_key_env is not None and (not isinstance(api_key_env, str) or not api_key_env.isidentifier()):
        raise ValueError(f"api_key_env must name an environment variable (e.g. OPENAI_API_KEY), got "
                         f"{short_repr(api_key_env)}: a key never belongs in a config file")


TRANSPORT_KEYS = ("request_timeout", "attempts", "backoff", "max_backoff", "max_body_bytes", "max_concurrency",
                  "max_requests_per_second", "api_key_env")


def transport(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The transport settings among a judge's constructor arguments (``JSONService``'s keywords)."""
    return {key: settings[key] for key in TRANSPORT_KEYS if key in settings}


class JSONService:
    """POSTs JSON to one server and returns its decoded JSON answer, under the limiter and the retry rules.

    A 200 answer of at most ``max_body_bytes`` that is valid JSON is the result; 429, 408 and 5xx answers,
    connection errors and timeouts are retried (after the server's ``Retry-After``, which holds every
    request of the limiter, else full jitter), up to ``attempts`` per call; any other answer is a
    ``ServiceError`` at once (a 400 does not get better by asking again).
    """

    def __init__(self, base_url: str, *, who: str, request_timeout: float, attempts: int, backoff: float,
                 max_backoff: float, max_body_bytes: int, max_concurrency: int | None,
                 max_requests_per_second: float | None, api_key_env: str | None = None):
        httpx = httpx_module(who)
        self.base_url, self.who = base_url, who
        self.request_timeout, self.attempts = float(request_timeout), attempts
        self.backoff, self.max_backoff, self.max_body_bytes = float(backoff), float(max_backoff), max_body_bytes
        # A burst of 10 ms worth of requests (2 at 250/s), far inside any gateway's bucket: a start that woke
        # late can be made up, where a burst of 1 lost ~10% of the rate to the event loop's wake-up lag.
        burst = 1 if max_requests_per_second is None else max(1, min(int(max_requests_per_second * BURST_S),
                                                                     MAX_BURST))
        self.limiter = RequestLimiter(max_concurrency, max_requests_per_second, burst)
        headers = {}
        key = None
        if api_key_env is not None:
            key = os.environ.get(api_key_env)
            if not key:
                raise ValueError(f"{who}: the environment variable {api_key_env} (api_key_env) is not set")
            headers["Authorization"] = f"Bearer {key}"
        self.reader = AnswerReader(who, secrets=[key] if key else [])  # every answer is read through it
        connections = max_concurrency or 100
        # The client is made here, not on the first call: building its TLS context takes ~50 ms, which
        # would block the event loop of the first scoring call.
        self._client = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(self.request_timeout),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))
        self.calls = self.sent = 0

    async def post(self, path: str, payload: Mapping[str, Any]) -> Any:
        self.calls += 1
        return await call_with_retry(self._post_once, path, payload, timeout=self.request_timeout,
                                     attempts=self.attempts, backoff=self.backoff, max_backoff=self.max_backoff,
                                     limiter=self.limiter)

    async def _post_once(self, path: str, payload: Mapping[str, Any]) -> Any:
        self.sent += 1
        async with self._client.stream("POST", self.base_url + path, json=payload) as response:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self.max_body_bytes:
                    raise ServiceError(f"{self.who}: the answer is larger than max_body_bytes={self.max_body_bytes}")
        status = response.status_code
        if status != 200:
            raise self.reader.error(f"{self.who}: {self.base_url + path}",
                                    f"answered {status} {response.reason_phrase}: {bytes(body[:300])!r}",
                                    status=status, retryable=status in RETRYABLE_STATUS,
                                    retry_after=retry_after_seconds(response.headers))
        return self.reader.json(body, self.who)

    def stats(self) -> dict[str, float]:
        """Requests sent, retries (requests beyond one per call), rate-limit waits."""
        return {**self.limiter.stats(), "requests_sent": self.sent, "retries": self.sent - self.calls}

    async def aclose(self) -> None:
        await self._client.aclose()
