"""An example scorer that asks a judge service over HTTP, with a deadline, retries and a bounded answer.

The judge receives ``POST {url}`` with JSON ``{"interaction_id", "messages", "output_messages",
"output_len"}`` and answers ``200`` with ``{"score": float}`` (broadcast over the turn) or
``{"scores": [float, ...]}`` (one per output token). A non-200 answer, malformed JSON, an answer larger
than ``max_body_bytes``, a connection closed mid-answer, or no answer within ``request_timeout`` seconds
is an error of that attempt, retried up to ``attempts`` times (``prm_jax.call_with_retry``).

The client is ``httpx`` (the ``judge`` extra: ``pip install -e '.[judge]'``): HTTP/1.1 with keep-alive
connections reused across turns, chunked answers, ``100 Continue``. One client per scorer, opened on the
first call and closed by ``aclose`` (the runner closes the scorers it owns).

In a config entry, ``timeout`` (the entry's own key) bounds the whole ``evaluate`` call, retries included;
``kwargs.request_timeout`` bounds one attempt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from prm_jax.runtime.authoring import call_with_retry
from prm_jax.runtime.scoring import BaseScorer
from prm_jax.runtime.trajectory import Interaction
from prm_jax.validation import finite_number, integer, short_repr

DEFAULT_MAX_BODY_BYTES = 1 << 20  # a score answer is a few bytes; 1 MB leaves room for per-token scores


class JudgeError(RuntimeError):
    """The judge answered, but not with a usable score."""


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:
        raise ImportError("HTTPJudgeScorer needs httpx: pip install -e '.[judge]' (from a checkout) or "
                          "pip install httpx") from None
    return httpx


class HTTPJudgeScorer(BaseScorer):
    """Scores each turn by asking an HTTP judge (see the module docstring)."""

    name = "http_judge"

    def __init__(self, url: str, request_timeout: float = 10.0, attempts: int = 3, backoff: float = 0.05,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, **kwargs: Any):
        super().__init__(**kwargs)
        type(self).validate_kwargs(url=url, request_timeout=request_timeout, attempts=attempts, backoff=backoff,
                                   max_body_bytes=max_body_bytes)
        self.url = url
        self.request_timeout, self.attempts, self.backoff = float(request_timeout), attempts, float(backoff)
        self.max_body_bytes = max_body_bytes
        self._client: Any = None

    @classmethod
    def validate_kwargs(cls, url: Any = None, request_timeout: Any = 10.0, attempts: Any = 3, backoff: Any = 0.05,
                        max_body_bytes: Any = DEFAULT_MAX_BODY_BYTES, **kwargs: Any) -> None:
        """The constructor's arguments, checked without opening anything (``validate-config`` calls this)."""
        _httpx()
        if not isinstance(url, str):
            raise ValueError(f"url must be an http:// or https:// URL, got {short_repr(url)}")
        if "${" in url or url.startswith("$"):
            raise ValueError(f"url {url!r} holds an unexpanded variable: set it in the config (prm-jax does not "
                             "expand environment variables)")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be an http:// or https:// URL, got {url!r}")
        try:
            parts.port  # noqa: B018 (a port that is not a number raises here)
        except ValueError as err:
            raise ValueError(f"url {url!r}: {err}") from None
        timeout = finite_number("request_timeout", request_timeout)
        if not timeout > 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {short_repr(request_timeout)}")
        integer("attempts", attempts, minimum=1)
        finite_number("backoff", backoff, minimum=0.0)
        integer("max_body_bytes", max_body_bytes, minimum=1)

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> Any:
        payload = {"interaction_id": interaction.interaction_id, "messages": _plain(interaction.messages),
                   "output_messages": _plain(interaction.output_messages), "output_len": interaction.output_len}
        return await call_with_retry(self._ask, payload, timeout=self.request_timeout, attempts=self.attempts,
                                     backoff=self.backoff)

    async def _ask(self, payload: Mapping[str, Any]) -> Any:
        answer = await self._post(payload)
        if isinstance(answer, Mapping) and "score" in answer:
            return float(answer["score"])
        if isinstance(answer, Mapping) and isinstance(answer.get("scores"), list):
            return [float(s) for s in answer["scores"]]
        raise JudgeError(f"judge answer needs 'score' or 'scores', got {short_repr(answer)}")

    async def _post(self, payload: Mapping[str, Any]) -> Any:
        """One ``POST``; the decoded JSON of a 200 answer of at most ``max_body_bytes``, else ``JudgeError``
        (transport failures are httpx's errors: retried too)."""
        httpx = _httpx()
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.request_timeout))
        async with self._client.stream("POST", self.url, json=payload) as response:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self.max_body_bytes:
                    raise JudgeError(f"judge answer is larger than max_body_bytes={self.max_body_bytes}")
        if response.status_code != 200:
            raise JudgeError(f"judge answered {response.status_code} {response.reason_phrase}: {bytes(body[:200])!r}")
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise JudgeError(f"judge answered invalid JSON: {err}") from None

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
