"""The built-in judges' transport: one ``httpx`` client per scorer, a ``RequestLimiter``, the retry rules
of ``prm_jax.runtime._limits`` and a bounded answer (``JSONService``), read by the judges' one
``AnswerReader`` (``prm_jax.scorers._answers``)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import anyio

from prm_jax._validation import body_text, cut_at_word, finite_number, integer, short_repr
from prm_jax.errors import RequestFailed, RetryError, ServiceError
from prm_jax.runtime._authoring import call_with_retry
from prm_jax.runtime._limits import RETRYABLE_STATUS, RequestLimiter, retry_after_seconds
from prm_jax.runtime._runner import cause_text
from prm_jax.runtime._settings import Settings, setting
from prm_jax.runtime._trajectory import Interaction
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Transport(Settings):
    """How a served scorer talks to its server: every built-in served scorer holds one (its ``transport``
    setting, flat to the user: ``request_timeout: 60`` beside ``model``), with its own defaults.

    Example:
        >>> transport = prm_jax.scorers.Transport(request_timeout=5.0, max_requests_per_second=20.0)
        >>> transport.attempts, transport.max_concurrency
        (4, 16)
        >>> try:
        ...     prm_jax.scorers.Transport(attempts=0)
        ... except ValueError as err:
        ...     print(err)
        ...
        attempts must be an integer >= 1, got 0
    """

    request_timeout: float = setting(30.0, doc="Seconds one attempt may take (connecting, sending, reading the "
                                     "whole answer); > 0. The config entry's own ``timeout`` bounds the whole "
                                     "call, retries and waits included.")
    attempts: int = setting(4, doc="Attempts per call, >= 1: retried are 429, 408 and 5xx answers, connection "
                            "errors and timeouts; any other answer fails the call at once.")
    backoff: float = setting(0.25, doc="Seconds, >= 0: the first retry waits a random time up to this (full "
                             "jitter, doubling each retry) unless the server sent ``Retry-After``.")
    max_backoff: float = setting(8.0, doc="Seconds, >= 0: the longest wait between two attempts.")
    max_body_bytes: int = setting(DEFAULT_MAX_BODY_BYTES, doc="Bytes, >= 1: the largest answer read; a larger "
                                  "one fails the call (not retried).")
    max_concurrency: int | None = setting(16, doc="Requests in flight at once, >= 1, across every run of the "
                                          "runner; ``None``: no bound.")
    max_requests_per_second: float | None = setting(None, doc="Requests started per second, at most (>= 0.001; "
                                                    "set it from the server's published limit); ``None``: no "
                                                    "bound.")
    api_key_env: str | None = setting(None, doc="The environment variable that holds the API key, sent as "
                                      "``Authorization: Bearer``; a key never belongs in a config. ``None``: no "
                                      "key.")

    def check(self) -> None:
        finite_number("request_timeout", self.request_timeout, positive=True)
        integer("attempts", self.attempts, minimum=1)
        finite_number("backoff", self.backoff, minimum=0.0)
        finite_number("max_backoff", self.max_backoff, minimum=0.0)
        integer("max_body_bytes", self.max_body_bytes, minimum=1)
        if self.max_concurrency is not None:
            integer("max_concurrency", self.max_concurrency, minimum=1)
        if self.max_requests_per_second is not None:
            finite_number("max_requests_per_second", self.max_requests_per_second, minimum=1e-3)
        key = self.api_key_env
        if key is not None and (not isinstance(key, str) or not key.isidentifier()):
            raise ValueError(f"api_key_env must name an environment variable (e.g. OPENAI_API_KEY), got "
                             f"{short_repr(key)}: a key never belongs in a config file")


def transport_setting(**defaults: Any) -> Any:
    """A served scorer's ``transport`` field: the shared record with this scorer's defaults.

    Args:
        defaults: The scorer's own transport defaults (``Transport``'s fields).

    Example:
        >>> field = prm_jax.scorers.transport_setting(request_timeout=120.0)
        >>> field.default.request_timeout, field.default.attempts
        (120.0, 4)
    """
    return setting(Transport(**defaults), doc="How the scorer talks to its server (flat: the transport's keys are "
                   "the scorer's own).")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServedSettings(Settings):
    """The base of a served scorer's record: ``check`` needs httpx (the ``judge`` extra) and an http(s) URL in
    the field ``url_field``; a subclass's ``check`` calls it first.

    Example:
        >>> record = prm_jax.scorers.OpenAIJudgeScorer.settings_class
        >>> settings = record.build({"base_url": "http://127.0.0.1:8000/v1", "model": "m"})
        >>> settings.url_field, settings.transport.request_timeout
        ('base_url', 30.0)
        >>> try:
        ...     prm_jax.scorers.OpenAIJudgeScorer.validate_kwargs(base_url="ftp://host", model="m")
        ... except ValueError as err:
        ...     print(err)
        ...
        base_url must be an http:// or https:// URL, got 'ftp://host'
    """

    scorer: ClassVar[str] = "a served scorer"
    url_field: ClassVar[str] = "base_url"

    def check(self) -> None:
        httpx_module(self.scorer)
        check_url(self.url_field, getattr(self, self.url_field))


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


class JSONService:
    """POSTs JSON to one server and returns its decoded JSON answer, under the limiter and the retry rules.

    A 200 answer of at most ``max_body_bytes`` that is valid JSON is the result; 429, 408 and 5xx answers,
    connection errors and timeouts are retried (after the server's ``Retry-After``, which holds every
    request of the limiter, else full jitter), up to ``attempts`` per call; any other answer is a
    ``ServiceError`` at once (a 400 does not get better by asking again).
    """

    def __init__(self, base_url: str, *, who: str, transport: Transport):
        httpx = httpx_module(who)
        self.base_url, self.who = base_url, who
        self.request_timeout, self.attempts = float(transport.request_timeout), transport.attempts
        self.backoff, self.max_backoff = float(transport.backoff), float(transport.max_backoff)
        self.max_body_bytes = transport.max_body_bytes
        max_concurrency, max_requests_per_second = transport.max_concurrency, transport.max_requests_per_second
        api_key_env = transport.api_key_env
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

    async def probe(self, scorer: str, path: str, payload: Mapping[str, Any], check: Callable[[Any], object]) -> Probe:
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


Item = tuple[Any, Mapping[str, Any]]  # what a call scores: (a turn, or a branch's turns root first; ctx)
Reads = Literal["number", "probability", "logprob", "text"]
PROBE_TEXT = "Reply with the number 0."


def probe_turn() -> Interaction:
    """The one small turn a probe scores: one input token, one output token (with its log-prob, which a
    teacher reads), a question and its answer."""
    return Interaction("probe", [0], [1], messages=[{"role": "user", "content": PROBE_TEXT}],
                       output_messages=[{"role": "assistant", "content": "0"}], output_logprobs=[-1.0])


class ServedScorer:
    """What every scorer served over HTTP shares, from what it declares.

    A served scorer declares its settings (a ``ServedSettings`` record with a ``transport`` field,
    ``transport_setting(...)``, and the server's URL in the field its ``url_field`` names), its ``route``,
    how a request is built from the items of one call
    (``request(items)``: one turn for a per-turn scorer, the branches of a batch for a batched one), how the
    answer is read (``read(answer, items, where)``, through the one ``AnswerReader``, ``self.service.reader``:
    one score per item; what both derive from the items, a branch's tokens, is its ``layout(items)``,
    computed once a call), and an example answer of its server's documented shape (``example_answer(request,
    value)``, with ``value`` where the score is read, of the kind ``reads()`` says). Scoring (``evaluate``,
    ``evaluate_batch``) and ``probe`` come from those; the judge suite
    (``tests/scorers/test_every_served_scorer.py``) runs every malformed answer against each one.

    Example:
        >>> judge = prm_jax.scorers.HTTPJudgeScorer("http://127.0.0.1:8000/judge")
        >>> turn = prm_jax.Interaction("t0", [1], [2], output_messages=[{"role": "assistant", "content": "4"}])
        >>> judge.request([(turn, {})])["output_messages"]
        [{'role': 'assistant', 'content': '4'}]
        >>> answer = judge.example_answer(judge.request([(turn, {})]), 0.75)
        >>> answer, judge.read(answer, [(turn, {})], "here")
        ({'score': 0.75}, [0.75])
    """

    service: JSONService
    settings: Any
    name: ClassVar[str]
    route: ClassVar[str] = ""
    read_in_thread: ClassVar[bool] = False  # answers of megabytes (a teacher's log-probs) are read off the loop
    # The settings each example runs with besides the declared examples (one entry per way of reading an answer).
    example_modes: ClassVar[tuple[Mapping[str, Any], ...]] = ({},)

    def prepare(self) -> None:
        super().prepare()  # type: ignore[misc]
        record = self.settings
        url = check_url(record.url_field, getattr(record, record.url_field))
        self.service = JSONService(url, who=f"scorer {self.name!r}", transport=self.settings.transport)

    # -- what a served scorer declares ---------------------------------------------------------------------

    def endpoint(self) -> str:
        """The route requests go to, after the URL (the declared ``route``; a setting may choose it)."""
        return self.route

    def layout(self, items: Sequence[Item]) -> Any:
        """What ``request`` and ``read`` both derive from one call's items (a branch's tokens with its step
        tags), computed once a call and given to both as ``layout``; ``None`` (the default): nothing shared.

        Args:
            items: One call's items.
        """
        return None

    def request(self, items: Sequence[Item], layout: Any = None) -> dict[str, Any]:
        raise NotImplementedError(f"scorer {self.name!r} must declare request(items)")

    def read(self, answer: Any, items: Sequence[Item], where: str, layout: Any = None) -> list[Any]:
        raise NotImplementedError(f"scorer {self.name!r} must declare read(answer, items, where)")

    def example_answer(self, request: Mapping[str, Any], value: Any) -> Any:
        """An answer of the server's documented shape to ``request``, ``value`` where the score is read.

        Args:
            value: The value standing where the score is read (a number, or anything a malformed answer could
                hold).
        """
        raise NotImplementedError(f"scorer {type(self).__name__} declares no example answer (example_answer)")

    def reads(self) -> Reads:
        """What the value an answer holds is read as (``AnswerReader``'s rule for it)."""
        return "number"

    # -- what comes from it --------------------------------------------------------------------------------

    def where(self, items: Sequence[Item]) -> str:
        """How errors name one call: the turn, or the batch."""
        turns = all(isinstance(item, Interaction) for item, _ in items)
        if len(items) == 1 and turns:
            return f"scorer {self.name!r} on interaction {items[0][0].interaction_id!r}"
        return f"scorer {self.name!r} on a batch of {len(items)} {'turns' if turns else 'branches'}"

    async def exchange(self, items: Sequence[Item]) -> list[Any]:
        """One request for ``items`` and its answer read: one score per item."""
        layout = self.layout(items)
        answer = await self.service.post(self.endpoint(), self.request(items, layout))
        if self.read_in_thread:
            return await anyio.to_thread.run_sync(self.read, answer, items, self.where(items), layout)
        return self.read(answer, items, self.where(items), layout)

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> Any:
        return (await self.exchange([(interaction, ctx)]))[0]

    async def evaluate_batch(self, items: Sequence[Item]) -> list[Any]:
        return await self.exchange(items)

    def probe_items(self) -> list[Item]:
        """The probe's one item (``probe_turn``, alone or as a branch) and a context that answers any key (a
        prompt's ``{ctx[task]}`` reads ``probe``)."""
        ctx: Mapping[str, Any] = defaultdict(lambda: "probe")
        turn = probe_turn()
        return [((turn,) if getattr(self, "unit", "turn") == "trajectory" else turn, ctx)]

    async def probe(self) -> Probe:
        """One small request built and read as every call is (``prm-jax validate-config --probe``): the
        endpoint's status, the model that answered, the round trip, and whether the answer can be scored."""
        items = self.probe_items()
        where = f"scorer {self.name!r} (probe)"
        layout = self.layout(items)
        return await self.service.probe(self.name, self.endpoint(), self.request(items, layout),
                                        lambda answer: self.read(answer, items, where, layout))

    def client_stats(self) -> dict[str, float]:
        """Requests sent, retries, rate-limit waits (the client's figures)."""
        return self.service.stats()

    async def aclose(self) -> None:
        await self.service.aclose()
