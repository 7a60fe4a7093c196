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

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from prm_jax._validation import short_repr
from prm_jax.errors import NoTextError, ServiceError
from prm_jax.runtime._scoring import BaseScorer
from prm_jax.runtime._settings import setting
from prm_jax.scorers._http import (
    Item,
    ServedScorer,
    ServedSettings,
    Transport,
    transport_setting,
)

JudgeError = ServiceError  # the judge answered, but not with a usable score (the name of earlier versions)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class HTTPJudgeSettings(ServedSettings):
    scorer: ClassVar[str] = "HTTPJudgeScorer"
    url_field: ClassVar[str] = "url"
    url: str = setting(doc="The judge's URL (http or https); requests are POSTed to it as it is.",
                       example="http://127.0.0.1:8000/judge")
    transport: Transport = transport_setting(request_timeout=10.0, attempts=3, backoff=0.05, max_backoff=2.0)

    def check(self) -> None:
        super().check()


class HTTPJudgeScorer(ServedScorer, BaseScorer):
    """Scores each turn by asking an HTTP judge (see the module docstring).

    Example:
        >>> judge = prm_jax.scorers.HTTPJudgeScorer("http://127.0.0.1:8000/judge", max_concurrency=8)
        >>> judge.name, judge.settings.transport.request_timeout
        ('http_judge', 10.0)
    """

    name = "http_judge"
    settings_class = HTTPJudgeSettings

    def request(self, items: Sequence[Item], layout: Any = None) -> dict[str, Any]:
        (interaction, _), = items
        if not interaction.output_messages:
            raise NoTextError(f"scorer {self.name!r}: interaction {interaction.interaction_id!r} has no output "
                              "messages for the judge (turns built from token arrays carry tokens only: score "
                              "sessions with messages); it was not scored")
        return {"interaction_id": interaction.interaction_id, "messages": _plain(interaction.messages),
                "output_messages": _plain(interaction.output_messages), "output_len": interaction.output_len}

    def read(self, answer: Any, items: Sequence[Item], where: str, layout: Any = None) -> list[Any]:
        """The score (or the per-token scores) in the judge's answer."""
        read = self.service.reader
        if isinstance(answer, Mapping) and "score" in answer:
            return [read.number(answer["score"], where, "the answer's field 'score'")]
        if isinstance(answer, Mapping) and isinstance(answer.get("scores"), list):
            return [[read.number(s, where, f"the answer's field 'scores'[{i}]")
                     for i, s in enumerate(answer["scores"])]]
        raise read.error(where, f"the judge's answer needs 'score' or a list 'scores', got {short_repr(answer)}")

    def example_answer(self, request: Mapping[str, Any], value: Any) -> Any:
        return {"score": value}
