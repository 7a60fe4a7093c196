"""The built-in judges' transport: one ``httpx`` client per scorer, a ``RequestLimiter``, the retry rules
of ``prm_jax.runtime._limits`` and a bounded answer (``JSONService``), read by the judges' one
``AnswerReader`` (``prm_jax.scorers._answers``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import anyio

from prm_jax._validation import body_text, cut_at_word, finite_number, integer, short_repr
from prm_jax.errors import RequestFailed, RetryError, ServiceError
from prm_jax.runtime._authoring import call_with_retry
from prm_jax.runtime._limits import RETRYABLE_STATUS, RequestLimiter, retry_after_seconds
from prm_jax.runtime._runner import cause_text
from prm_jax.scorers._answers import AnswerReader

# An answer larger than this is decoded in a worker thread: a batch's prompt log-probs (a teacher's) run to
# megabytes, tens of milliseconds of json.loads.
THREADED_JSON_BYTES = 1 << 18

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
    if parts.query or parts.fragment:  # the scorer appends its route to the URL: a query would swallow it
        raise ValueError(f"{name} {shown_url(url)}?... must not hold a query or a fragment (the scorer appends "
                         "its route, e.g. /chat/completions; a key goes in api_key_env)")
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


def shown_url(url: str) -> str:
    """``url`` as errors and probes show it: without a user, a password, a query or a fragment (where keys
    hide: ``https://user:key@host/v1?api_key=...`` shows as ``https://host/v1``)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def failure_cause(err: BaseException, request_timeout: float) -> str:
    """One attempt's failure in words: the HTTP status the server answered, the connection error, or the
    timeout."""
    status = getattr(err, "status", None)
    if isinstance(err, ServiceError) and status is not None:
        return f"HTTP {status}" + (f" {err.reason}" if err.reason else "")
    if isinstance(err, TimeoutError):
        return f"no answer within request_timeout={request_timeout:g} s"
    if type(err).__module__.split(".")[0] in ("httpx", "httpcore") or isinstance(err, OSError):
        return f"connection error ({cause_text(err)})"
    return cause_text(err)


class Probe(NamedTuple):
    """One served scorer's probe (``prm-jax validate-config --probe``): its endpoint, the answer's HTTP status
    (or the connection error), the model that answered, the round trip, and whether it can score."""

    scorer: str
    url: str
    ok: bool
    status: str
    model: str | None
    latency_s: float

    def line(self) -> str:
        model = f"model {self.model}" if self.model else "model -"
        return (f"probe: scorer {self.scorer!r} at {self.url}: {self.status}, {model}, "
                f"{self.latency_s * 1e3:.1f} ms" + ("" if self.ok else "  <- FAILED"))


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
        self.reader = AnswerReader(who, secrets=[key] if key else [], origin=shown_url(base_url))  # every answer
        connections = max_concurrency or 100
        # The client is made here, not on the first call: building its TLS context takes ~50 ms, which
        # would block the event loop of the first scoring call.
        self._client = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(self.request_timeout),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))
        self.calls = self.sent = 0

    async def post(self, path: str, payload: Mapping[str, Any]) -> Any:
        """The decoded answer to ``POST base_url + path``, under the limiter and the retry rules. A failure
        names the scorer, the URL (``shown_url``), the HTTP status or connection error, and the attempts:
        ``RequestFailed`` after every attempt failed, the ``ServiceError`` of an answer not worth retrying
        (a 4xx, a malformed answer) at once."""
        url = shown_url(self.base_url + path)
        tried = 0

        async def attempt(path: str, payload: Mapping[str, Any]) -> Any:
            nonlocal tried
            if tried == 0:  # a call counts once it sends (one cancelled while waiting for the limiter sent
                self.calls += 1  # nothing: counted on entry, it made "retries" -1)
            tried += 1
            return await self._post_once(path, payload)

        try:
            return await call_with_retry(attempt, path, payload, timeout=self.request_timeout,
                                         attempts=self.attempts, backoff=self.backoff, max_backoff=self.max_backoff,
                                         limiter=self.limiter)
        except RetryError as err:
            last = err.errors[-1]
            raise RequestFailed(f"{self.who}: POST {url} failed {tried} times (attempts={self.attempts}): "
                                f"{failure_cause(last, self.request_timeout)}", err.errors, url=url,
                                status=getattr(last, "status", None)) from last
        except ServiceError as err:  # an answer not worth retrying: said with the attempt it came on
            raise ServiceError(f"{err} (attempt {tried} of {self.attempts}; not retried: this answer does not "
                               "change by asking again)", status=err.status, reason=err.reason) from err

    async def probe(self, scorer: str, path: str, payload: Mapping[str, Any], check: Callable[[Any], None]) -> Probe:
        """One request (one attempt, no limiter) and what it says: ``check`` reads the decoded answer as the
        scorer reads one (raising where it cannot be scored); the model is the answer's ``model`` field."""
        url = shown_url(self.base_url + path)
        started = time.perf_counter()
        try:
            answer = await self._post_once(path, payload)
            check(answer)
            model = str(answer["model"]) if isinstance(answer, Mapping) and answer.get("model") else None
        except Exception as err:  # the probe reports every failure, as a line
            status = failure_cause(err, self.request_timeout)
            if isinstance(err, ServiceError) and err.status not in (None, 200):
                status += f" ({cut_at_word(str(err).rsplit('answered ', 1)[-1], 240)})"
            elif isinstance(err, ServiceError):
                status = f"HTTP 200 OK, but {err}"
            return Probe(scorer, url, False, status, None, time.perf_counter() - started)
        return Probe(scorer, url, True, "HTTP 200 OK", model, time.perf_counter() - started)

    async def _post_once(self, path: str, payload: Mapping[str, Any]) -> Any:
        self.sent += 1
        where = f"{self.who}: POST {shown_url(self.base_url + path)}"
        async with self._client.stream("POST", self.base_url + path, json=payload) as response:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self.max_body_bytes:
                    raise ServiceError(f"{where}: the answer is larger than max_body_bytes={self.max_body_bytes}")
        status = response.status_code
        if status != 200:
            raise self.reader.error(where,
                                    f"answered {status} {response.reason_phrase}: {body_text(body)}",
                                    status=status, retryable=status in RETRYABLE_STATUS,
                                    retry_after=retry_after_seconds(response.headers),
                                    reason=response.reason_phrase)
        if len(body) > THREADED_JSON_BYTES:  # (decoded on the loop, it would stall every other scorer)
            return await anyio.to_thread.run_sync(self.reader.json, body, where)
        return self.reader.json(body, where)

    def stats(self) -> dict[str, float]:
        """Requests sent, retries (requests beyond one per call), rate-limit waits."""
        return {**self.limiter.stats(), "requests_sent": self.sent, "retries": self.sent - self.calls}

    async def aclose(self) -> None:
        await self._client.aclose()


class ServedScorer:
    """What every scorer served over HTTP shares: its ``JSONService`` (``self.service``) reports the client's
    figures (``client_stats``: requests, retries, rate-limit waits) and is closed with the scorer."""

    service: JSONService

    def client_stats(self) -> dict[str, float]:
        return self.service.stats()

    async def aclose(self) -> None:
        await self.service.aclose()
