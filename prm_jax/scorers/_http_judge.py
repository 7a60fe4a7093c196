"""``HTTPJudgeScorer``: a judge service that speaks prm-jax's own small JSON protocol (for a judge you write
yourself; for an LLM behind an OpenAI-compatible server use ``OpenAIJudgeScorer``).

The judge receives ``POST {url}`` with JSON ``{"interaction_id", "messages", "output_messages",
"output_len"}`` and answers ``200`` with ``{"score": float}`` (broadcast over the turn) or
``{"scores": [float, ...]}`` (one per output token). It runs on the built-in judges' transport
(``prm_jax.scorers._http.JSONService``): one ``httpx`` client per scorer (keep-alive connections reused
across turns, chunked answers, ``100 Continue``), an answer bounded by ``max_body_bytes``, at most
``max_concurrency`` requests in flight and ``max_requests_per_second``, and retries (up to ``attempts``)
only of 429 / 408 / 5xx answers, connection errors and timeouts, after the server's ``Retry-After`` or a
fully jittered backoff; any other answer (a 422, malformed JSON) fails the turn at once.

A turn without output messages (an array-built turn carries tokens only) is an error naming it: the judge
would receive empty messages (it once scored every such turn a silent 0.5).

In a config entry, ``timeout`` (the entry's own key) bounds the whole ``evaluate`` call, retries and waits
for the limiter included; ``kwargs.request_timeout`` bounds one attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prm_jax._validation import short_repr
from prm_jax.errors import NoTextError, ServiceError
from prm_jax.runtime._scoring import BaseScorer
from prm_jax.runtime._trajectory import Interaction
from prm_jax.scorers._http import (
    DEFAULT_MAX_BODY_BYTES,
    JSONService,
    Probe,
    ServedScorer,
    check_transport,
    check_url,
    httpx_module,
    transport,
)

JudgeError = ServiceError  # the judge answered, but not with a usable score (the name of earlier versions)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class HTTPJudgeScorer(ServedScorer, BaseScorer):
    """Scores each turn by asking an HTTP judge (see the module docstring)."""

    name = "http_judge"

    def __init__(self, url: str, request_timeout: float = 10.0, attempts: int = 3, backoff: float = 0.05,
                 max_backoff: float = 2.0, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_concurrency: int | None = 16, max_requests_per_second: float | None = None, **kwargs: Any):
        settings = dict(request_timeout=request_timeout, attempts=attempts, backoff=backoff, max_backoff=max_backoff,
                        max_body_bytes=max_body_bytes, max_concurrency=max_concurrency,
                        max_requests_per_second=max_requests_per_second)
        type(self).validate_kwargs(url=url, **settings)
        super().__init__(**kwargs)
        self.url = url
        self.service = JSONService(check_url("url", url), who=f"scorer {self.name!r}", **transport(settings))

    @classmethod
    def validate_kwargs(cls, url: Any = None, request_timeout: Any = 10.0, attempts: Any = 3, backoff: Any = 0.05,
                        max_backoff: Any = 2.0, max_body_bytes: Any = DEFAULT_MAX_BODY_BYTES,
                        max_concurrency: Any = 16, max_requests_per_second: Any = None, **kwargs: Any) -> None:
        """The constructor's arguments, checked without opening anything (``validate-config`` calls this)."""
        httpx_module("HTTPJudgeScorer")
        check_url("url", url)
        check_transport(request_timeout, attempts, backoff, max_backoff, max_body_bytes, max_concurrency,
                        max_requests_per_second)

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> Any:
        if not interaction.output_messages:
            raise NoTextError(f"scorer {self.name!r}: interaction {interaction.interaction_id!r} has no output "
                              "messages for the judge (turns built from token arrays carry tokens only: score "
                              "sessions with messages); it was not scored")
        payload = {"interaction_id": interaction.interaction_id, "messages": _plain(interaction.messages),
                   "output_messages": _plain(interaction.output_messages), "output_len": interaction.output_len}
        answer = await self.service.post("", payload)
        return self._score_of(answer, f"scorer {self.name!r} on interaction {interaction.interaction_id!r}")

    def _score_of(self, answer: Any, where: str) -> Any:
        """The score (or the per-token scores) in the judge's answer, read by the judges' one reader."""
        read = self.service.reader
        if isinstance(answer, Mapping) and "score" in answer:
            return read.number(answer["score"], where, "the answer's field 'score'")
        if isinstance(answer, Mapping) and isinstance(answer.get("scores"), list):
            return [read.number(s, where, f"the answer's field 'scores'[{i}]") for i, s in enumerate(answer["scores"])]
        raise read.error(where, f"the judge's answer needs 'score' or a list 'scores', got {short_repr(answer)}")

    async def probe(self) -> Probe:
        """One small turn (``prm-jax validate-config --probe``): the judge must answer a score."""
        payload = {"interaction_id": "probe", "messages": [{"role": "user", "content": "probe"}],
                   "output_messages": [{"role": "assistant", "content": "probe"}], "output_len": 1}
        return await self.service.probe(self.name, "", payload,
                                        lambda answer: self._score_of(answer, f"scorer {self.name!r} (probe)"))
