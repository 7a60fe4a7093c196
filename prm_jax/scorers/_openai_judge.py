"""``OpenAIJudgeScorer``: an LLM judge behind an OpenAI-compatible ``POST {base_url}/chat/completions``
(vLLM, SGLang, OpenAI, any compatible server), one request per turn.

The request: ``{"model", "messages": [system?, {"role": "user", "content": prompt}], "max_tokens", ...}``
plus ``extra_body`` passed through (``temperature``, ``seed``, a vLLM ``guided_regex``, ...). ``prompt`` is a
``str.format`` template over these fields:

- ``{prompt}``: the turn's input messages, one ``role: content`` line each;
- ``{response}``: the turn's output text (its output messages' content);
- ``{conversation}``: the branch's whole conversation up to and including the turn, as ``{prompt}`` is;
- ``{ctx[...]}``: the caller's context (``{ctx[task]}``; ``score_arrays`` sets ``{ctx[row]}``).

The score comes from the answer (``score: regex``, the first group of ``pattern`` in the content, or
``score: json``, the number at ``json_field`` of the content parsed as JSON) or from its log-probs
(``score: logprobs``: the summed probability of ``logprob_tokens`` among the first answer token's
``top_logprobs``, e.g. P("Yes")). ``score_range: [lo, hi]`` maps a parsed number to [0, 1] and refuses one
outside it. A turn without output text (an array-built turn carries tokens only) is an error naming it,
never a silent score: override ``turn_text`` to supply text (e.g. detokenize).

Limits: ``max_concurrency`` requests in flight and ``max_requests_per_second`` (set them from the server's
published limits), shared by every run of the runner; retries only on 429 / 408 / 5xx / connection
errors, after ``Retry-After`` or full jitter, ``attempts`` per turn; ``request_timeout`` per request (the
entry's ``timeout``, if set, bounds the whole call, waits for the limiter included: leave it unset for a
judge). ``api_key_env`` names the environment variable holding the key (a key never goes in a config).
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from prm_jax._validation import finite_number, integer, one_of, short_repr
from prm_jax.errors import NoTextError, TemplateError
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

ScoreFrom = Literal["regex", "json", "logprobs"]
SCORE_FROM: tuple[ScoreFrom, ...] = get_args(ScoreFrom)
TEMPLATE_FIELDS = ("prompt", "response", "conversation", "ctx")
DEFAULT_PROMPT = ("Rate how good the assistant's last reply is, from 0 (useless or wrong) to 10 (excellent).\n\n"
                  "Conversation so far:\n{prompt}\n\nReply:\n{response}\n\nAnswer with the number only.")
DEFAULT_PATTERN = r"(-?\d+(?:\.\d+)?)"


def _field_of(template: str, err: BaseException) -> str:
    """The template field that ``err`` (a ``KeyError`` of ``format``) came from, as written in the template."""
    missing = err.args[0] if err.args else None
    for _, field, _, _ in string.Formatter().parse(template):
        if field is not None and missing is not None and (field == missing or f"[{missing}]" in field
                                                           or field.endswith(f".{missing}")):
            return "{" + field + "}"
    return repr(missing)


def message_text(content: Any) -> str:
    """A message's content as text: a string, or OpenAI content parts' text joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def output_text(scorer: str, turn: Interaction, purpose: str, override: str) -> str:
    """A turn's text (its output messages joined); ``NoTextError`` naming the scorer and the turn for a turn
    without any (``purpose``: what the text was for; ``override``: the method that may supply it instead)."""
    text = "".join(message_text(m.get("content")) for m in turn.output_messages)
    if not text:
        raise NoTextError(f"scorer {scorer!r}: interaction {turn.interaction_id!r} has no output text to {purpose} "
                          "(turns built from token arrays carry tokens only: score sessions with messages, or "
                          f"override {override} to detokenize); it was not scored")
    return text


def render_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(f"{m.get('role', 'user')}: {message_text(m.get('content'))}" for m in messages)


class OpenAIJudgeScorer(ServedScorer, BaseScorer):
    """Scores each turn with an LLM judge on an OpenAI-compatible server (see the module docstring).

    Example:
        >>> judge = prm_jax.scorers.OpenAIJudgeScorer(base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen2.5-7B-Instruct",
        ...                                           max_concurrency=8, max_requests_per_second=50)
        >>> judge.name
        'openai_judge'
    """

    name = "openai_judge"

    def __init__(self, base_url: str, model: str, prompt: str = DEFAULT_PROMPT, system: str | None = None,
                 score: ScoreFrom = "regex", pattern: str = DEFAULT_PATTERN, json_field: str = "score",
                 logprob_tokens: Sequence[str] = ("Yes",), top_logprobs: int = 5,
                 score_range: Sequence[float] | None = (0.0, 10.0), max_tokens: int = 16,
                 extra_body: Mapping[str, Any] | None = None, api_key_env: str | None = None,
                 request_timeout: float = 30.0, attempts: int = 4, backoff: float = 0.25, max_backoff: float = 8.0,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_concurrency: int | None = 16,
                 max_requests_per_second: float | None = None, **kwargs: Any):
        settings = dict(base_url=base_url, model=model, prompt=prompt, system=system, score=score, pattern=pattern,
                        json_field=json_field, logprob_tokens=logprob_tokens, top_logprobs=top_logprobs,
                        score_range=score_range, max_tokens=max_tokens, extra_body=extra_body,
                        api_key_env=api_key_env, request_timeout=request_timeout, attempts=attempts,
                        backoff=backoff, max_backoff=max_backoff, max_body_bytes=max_body_bytes,
                        max_concurrency=max_concurrency, max_requests_per_second=max_requests_per_second)
        type(self).validate_kwargs(**settings)
        super().__init__(**kwargs)  # (max_concurrency bounds requests in the limiter, not calls)
        self.model, self.prompt, self.system, self.score_from = model, prompt, system, score
        self.pattern = re.compile(pattern)
        self.json_field, self.logprob_tokens = json_field, tuple(logprob_tokens)
        self.top_logprobs, self.max_tokens = top_logprobs, max_tokens
        self.score_range = None if score_range is None else (float(score_range[0]), float(score_range[1]))
        self.extra_body = dict(extra_body or {})
        self.service = JSONService(check_url("base_url", base_url), who=f"scorer {self.name!r}",
                                   **transport(settings))

    @classmethod
    def validate_kwargs(cls, base_url: Any = None, model: Any = None, prompt: Any = DEFAULT_PROMPT,
                        system: Any = None, score: Any = "regex", pattern: Any = DEFAULT_PATTERN,
                        json_field: Any = "score", logprob_tokens: Any = ("Yes",), top_logprobs: Any = 5,
                        score_range: Any = (0.0, 10.0), max_tokens: Any = 16, extra_body: Any = None,
                        api_key_env: Any = None, request_timeout: Any = 30.0, attempts: Any = 4,
                        backoff: Any = 0.25, max_backoff: Any = 8.0, max_body_bytes: Any = DEFAULT_MAX_BODY_BYTES,
                        max_concurrency: Any = 16, max_requests_per_second: Any = None, **kwargs: Any) -> None:
        httpx_module("OpenAIJudgeScorer")
        check_url("base_url", base_url)
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be the served model's name, got {short_repr(model)}")
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a str.format template, got {short_repr(prompt)}")
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None]
        except ValueError as err:
            raise ValueError(f"prompt is not a valid str.format template: {err}") from None
        unknown = sorted({re.split(r"[.\[]", f, maxsplit=1)[0] for f in fields} - set(TEMPLATE_FIELDS))
        if unknown:
            raise ValueError(f"prompt uses unknown fields {unknown}; it may use {list(TEMPLATE_FIELDS)}")
        if system is not None and not isinstance(system, str):
            raise ValueError(f"system must be a string or None, got {short_repr(system)}")
        one_of("score", score, SCORE_FROM)
        try:
            if re.compile(pattern).groups < 1:
                raise ValueError("it needs one group: the number")
        except (re.error, TypeError) as err:
            raise ValueError(f"pattern {short_repr(pattern)} is not a usable regular expression: {err}") from None
        if not isinstance(json_field, str) or not json_field:
            raise ValueError(f"json_field must be a non-empty string, got {short_repr(json_field)}")
        if isinstance(logprob_tokens, str) or not isinstance(logprob_tokens, Sequence) or not logprob_tokens \
                or not all(isinstance(t, str) and t for t in logprob_tokens):
            raise ValueError(f"logprob_tokens must be a list of token strings, got {short_repr(logprob_tokens)}")
        integer("top_logprobs", top_logprobs, minimum=1)
        if score_range is not None:
            if isinstance(score_range, str) or not isinstance(score_range, Sequence) or len(score_range) != 2:
                raise ValueError(f"score_range must be [lo, hi] or null, got {short_repr(score_range)}")
            lo, hi = (finite_number("score_range", v) for v in score_range)
            if not lo < hi:
                raise ValueError(f"score_range must have lo < hi, got {short_repr(score_range)}")
        integer("max_tokens", max_tokens, minimum=1)
        if extra_body is not None and not isinstance(extra_body, Mapping):
            raise ValueError(f"extra_body must be a mapping, got {short_repr(extra_body)}")
        reserved = sorted({"model", "messages"} & set(extra_body or {}))
        if reserved:
            raise ValueError(f"extra_body must not set {reserved}: the scorer sends them")
        check_transport(request_timeout, attempts, backoff, max_backoff, max_body_bytes, max_concurrency,
                        max_requests_per_second, api_key_env)

    def turn_text(self, interaction: Interaction, ctx: Mapping[str, Any]) -> dict[str, str]:
        """The template's text fields for a turn; override to supply text for turns without messages."""
        response = output_text(self.name, interaction, "judge", "turn_text")
        prompt = render_messages(interaction.messages)
        conversation = render_messages(tuple(interaction.messages) + tuple(interaction.output_messages))
        return {"prompt": prompt, "response": response, "conversation": conversation}

    def render(self, interaction: Interaction, ctx: Mapping[str, Any]) -> str:
        """The prompt template filled for a turn; a field without a value (``{ctx[task]}`` with no ``task`` in
        ctx) is a ``TemplateError`` naming the judge, the turn and the field."""
        try:
            return self.prompt.format(ctx=ctx, **self.turn_text(interaction, ctx))
        except (KeyError, IndexError, AttributeError) as err:
            keys = sorted(str(key) for key in ctx)
            raise TemplateError(f"scorer {self.name!r} on interaction {interaction.interaction_id!r}: the prompt's "
                                f"template field {_field_of(self.prompt, err)} has no value ({type(err).__name__}: "
                                f"{err}); ctx holds {keys}") from None

    def request(self, interaction: Interaction, ctx: Mapping[str, Any]) -> dict[str, Any]:
        """The chat completion request for a turn."""
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + [
            {"role": "user", "content": self.render(interaction, ctx)}]
        return self._body(messages)

    def _body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        """A chat completion request with this judge's settings: ``extra_body``, the model, ``max_tokens`` and,
        scoring by log-probs, ``logprobs`` / ``top_logprobs``."""
        body: dict[str, Any] = {**self.extra_body, "model": self.model, "messages": messages,
                                "max_tokens": self.max_tokens}
        if self.score_from == "logprobs":
            body.update(logprobs=True, top_logprobs=self.top_logprobs)
        return body

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> float:
        answer = await self.service.post("/chat/completions", self.request(interaction, ctx))
        return self.parse(answer, interaction)

    def parse(self, answer: Any, interaction: Interaction) -> float:
        """The score in a chat completion, read by the judges' one ``AnswerReader``."""
        read = self.service.reader
        where = f"scorer {self.name!r} on interaction {interaction.interaction_id!r}"
        choice = read.field(answer, ("choices", 0), where)
        message = read.field(choice, ("message",), where)
        if not isinstance(message, Mapping):
            raise read.error(where, f"not a chat completion: {short_repr(answer)}")
        content = message_text(message.get("content"))
        if self.score_from == "logprobs":
            return self._logprob_score(choice, where)
        if self.score_from == "json":
            parsed = read.json(content, where, "the answer's content")
            if not isinstance(parsed, Mapping) or self.json_field not in parsed:
                raise read.error(where, f"the answer is not JSON with field {self.json_field!r}: {short_repr(content)}")
            number = read.number(parsed[self.json_field], where, f"the answer's field {self.json_field!r}")
        else:
            match = self.pattern.search(content)
            if match is None:
                raise read.error(where, f"no score in the answer {short_repr(content)} (pattern "
                                        f"{self.pattern.pattern!r}; finish_reason {choice.get('finish_reason')!r})")
            try:
                number = float(match.group(1))
            except (TypeError, ValueError):
                raise read.error(where, f"the score {short_repr(match.group(1))} is not a number") from None
            if not math.isfinite(number):
                raise read.error(where, f"the score {match.group(1)!r} is not finite")
        if self.score_range is None:
            return number
        lo, hi = self.score_range
        if not lo <= number <= hi:
            raise read.error(where, f"the score {number} is outside score_range [{lo}, {hi}]")
        return (number - lo) / (hi - lo)

    def _logprob_score(self, choice: Any, where: str) -> float:
        """P(any of ``logprob_tokens``) among the first answer token's top log-probs: every log-prob at most
        0, their probabilities one distribution (summing to at most 1)."""
        read = self.service.reader
        path = "choices[0].logprobs.content[0].top_logprobs"
        top = read.field(choice, ("logprobs", "content", 0, "top_logprobs"), where)
        if not isinstance(top, list) or not all(isinstance(t, Mapping) and "logprob" in t for t in top):
            raise read.error(where, f"the answer has no top_logprobs for its first token (does the server return "
                                    f"logprobs?): {short_repr(choice)}")
        probabilities = [math.exp(read.logprob(t["logprob"], where, f"{path}[{i}].logprob")) for i, t in enumerate(top)]
        read.distribution(probabilities, where, f"the probabilities of {path}")
        chosen = [p for t, p in zip(top, probabilities) if str(t.get("token", "")).strip() in self.logprob_tokens]
        return min(math.fsum(chosen), 1.0)  # (within the distribution's slack of 1e-6)

    PROBE_TEXT = "Reply with the number 0."

    async def probe(self) -> Probe:
        """One small chat completion with this judge's settings (``prm-jax validate-config --probe``): its
        endpoint's status, the model that answered, the round trip."""
        def check(answer: Any) -> None:
            read, where = self.service.reader, f"scorer {self.name!r} (probe)"
            choice = read.field(answer, ("choices", 0), where)
            read.field(choice, ("message",), where)
            if self.score_from == "logprobs":
                read.field(choice, ("logprobs", "content", 0, "top_logprobs"), where)

        body = self._body([{"role": "user", "content": self.PROBE_TEXT}])
        return await self.service.probe(self.name, "/chat/completions", body, check)
