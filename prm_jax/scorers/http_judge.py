"""An example scorer that asks a judge service over HTTP, with a deadline and retries per call.

The judge receives ``POST {path}`` with JSON ``{"interaction_id", "messages", "output_messages",
"output_len"}`` and answers ``200`` with ``{"score": float}`` (broadcast over the turn) or
``{"scores": [float, ...]}`` (one per output token). A non-200 answer or malformed JSON is an error and
is retried; so is a judge that does not answer within ``timeout`` seconds.

The client is a minimal HTTP/1.1 client on ``anyio`` streams (one connection per call), enough for a
judge on the local network without adding an HTTP dependency.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import anyio

from prm_jax.runtime.authoring import call_with_retry
from prm_jax.runtime.scoring import BaseScorer
from prm_jax.runtime.trajectory import Interaction


class JudgeError(RuntimeError):
    """The judge answered, but not with a usable score."""


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


async def post_json(host: str, port: int, path: str, payload: Any) -> Any:
    """One ``POST`` with a JSON body; returns the decoded JSON of a 200 answer, else raises ``JudgeError``."""
    body = json.dumps(payload).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    async with await anyio.connect_tcp(host, port) as stream:
        await stream.send(request)
        chunks = []
        while True:
            try:
                chunks.append(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
    raw = b"".join(chunks)
    head, _, content = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise JudgeError(f"judge sent a malformed status line {status_line!r}")
    if parts[1] != "200":
        raise JudgeError(f"judge answered {status_line!r}: {content[:200]!r}")
    try:
        return json.loads(content)
    except json.JSONDecodeError as err:
        raise JudgeError(f"judge answered invalid JSON: {err}") from None


class HTTPJudgeScorer(BaseScorer):
    """Scores each turn by asking an HTTP judge (see the module docstring)."""

    name = "http_judge"

    def __init__(self, url: str, timeout: float = 10.0, attempts: int = 3, backoff: float = 0.05, **kwargs: Any):
        super().__init__(**kwargs)
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"url must be an http:// URL, got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = parts.path or "/"
        self.timeout, self.attempts, self.backoff = timeout, attempts, backoff

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> Any:
        payload = {"interaction_id": interaction.interaction_id, "messages": _plain(interaction.messages),
                   "output_messages": _plain(interaction.output_messages), "output_len": interaction.output_len}
        answer = await call_with_retry(self._ask, payload, timeout=self.timeout, attempts=self.attempts,
                                       backoff=self.backoff)
        return answer

    async def _ask(self, payload: Mapping[str, Any]) -> Any:
        answer = await post_json(self.host, self.port, self.path, payload)
        if isinstance(answer, Mapping) and "score" in answer:
            return float(answer["score"])
        if isinstance(answer, Mapping) and isinstance(answer.get("scores"), list):
            return [float(s) for s in answer["scores"]]
        raise JudgeError(f"judge answer needs 'score' or 'scores', got {str(answer)[:200]}")
