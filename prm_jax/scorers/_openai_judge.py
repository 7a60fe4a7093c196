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

import dataclasses
import functools
import json
import math
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, get_args

from prm_jax._validation import finite_number, integer, one_of, short_repr
from prm_jax.errors import NoTextError, TemplateError
from prm_jax.runtime._scoring import BaseScorer
from prm_jax.runtime._settings import setting
from prm_jax.runtime._trajectory import Interaction
from prm_jax.scorers._http import (
    Item,
    Reads,
    ServedScorer,
    ServedSettings,
    Transport,
    transport_setting,
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


def check_template(prompt: Any) -> None:
    """A ``str.format`` template over ``TEMPLATE_FIELDS`` only."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a str.format template, got {short_repr(prompt)}")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None]
    except ValueError as err:
        raise ValueError(f"prompt is not a valid str.format template: {err}") from None
    unknown = sorted({re.split(r"[.\[]", f, maxsplit=1)[0] for f in fields} - set(TEMPLATE_FIELDS))
    if unknown:
        raise ValueError(f"prompt uses unknown fields {unknown}; it may use {list(TEMPLATE_FIELDS)}")


def check_served_model(model: Any) -> None:
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be the served model's name, got {short_repr(model)}")


BASE_URL_DOC = "The server's OpenAI-compatible base URL (http or https, usually ending in ``/v1``)."
MODEL_DOC = "The served model's name, as the server lists it (``GET /v1/models``)."
PROMPT_DOC = ("A ``str.format`` template over ``{prompt}`` (the turn's input, one ``role: content`` line a "
              "message), ``{response}`` (its output text), ``{conversation}`` (the branch up to and including "
              "the turn) and ``{ctx[...]}`` (the caller's context).")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpenAIJudgeSettings(ServedSettings):
    scorer: ClassVar[str] = "OpenAIJudgeScorer"
    base_url: str = setting(doc=BASE_URL_DOC, example="http://127.0.0.1:8000/v1")
    model: str = setting(doc=MODEL_DOC, example="Qwen/Qwen2.5-7B-Instruct")
    prompt: str = setting(DEFAULT_PROMPT, doc=PROMPT_DOC + " The default asks for a 0-10 rating.")
    system: str | None = setting(None, doc="A system message sent before the prompt; ``None``: none.")
    score: ScoreFrom = setting("regex", doc="Where the score is read: ``regex`` (the first group of ``pattern`` "
                               "in the answer's text), ``json`` (the number at ``json_field`` of the text parsed "
                               "as JSON) or ``logprobs`` (the summed probability of ``logprob_tokens`` among the "
                               "first answer token's ``top_logprobs``).")
    pattern: str = setting(DEFAULT_PATTERN, doc="A regular expression with one group, the number (``score: "
                           "regex``); the default reads the first decimal number.")
    json_field: str = setting("score", doc="The field of the answer's JSON that holds the number (``score: "
                              "json``).")
    logprob_tokens: Sequence[str] = setting(("Yes",), doc="The answer tokens whose probabilities are summed "
                                            "(``score: logprobs``), compared with surrounding spaces stripped.")
    top_logprobs: int = setting(5, doc="How many top log-probs of the first answer token the server returns "
                                "(``score: logprobs``), >= 1.")
    score_range: Sequence[float] | None = setting((0.0, 10.0), doc="``[lo, hi]``: a parsed number is mapped "
                                                  "to [0, 1] and one outside the range is refused; ``None``: "
                                                  "the number as it is (``score: regex`` or ``json``).")
    max_tokens: int = setting(16, doc="The most tokens the judge may answer, >= 1.")
    extra_body: Mapping[str, Any] | None = setting(None, doc="Fields added to every request as they are "
                                                   "(``temperature``, ``seed``, vLLM's ``guided_regex``); it may "
                                                   "not set ``model`` or ``messages``.")
    transport: Transport = transport_setting()

    def check(self) -> None:
        super().check()
        check_served_model(self.model)
        check_template(self.prompt)
        if self.system is not None and not isinstance(self.system, str):
            raise ValueError(f"system must be a string or None, got {short_repr(self.system)}")
        one_of("score", self.score, SCORE_FROM)
        try:
            if re.compile(self.pattern).groups < 1:
                raise ValueError("it needs one group: the number")
        except (re.error, TypeError) as err:
            raise ValueError(f"pattern {short_repr(self.pattern)} is not a usable regular expression: {err}"
                             ) from None
        if not isinstance(self.json_field, str) or not self.json_field:
            raise ValueError(f"json_field must be a non-empty string, got {short_repr(self.json_field)}")
        tokens = self.logprob_tokens
        if isinstance(tokens, str) or not isinstance(tokens, Sequence) or not tokens \
                or not all(isinstance(t, str) and t for t in tokens):
            raise ValueError(f"logprob_tokens must be a list of token strings, got {short_repr(tokens)}")
        integer("top_logprobs", self.top_logprobs, minimum=1)
        if self.score_range is not None:
            bounds = self.score_range
            if isinstance(bounds, str) or not isinstance(bounds, Sequence) or len(bounds) != 2:
                raise ValueError(f"score_range must be [lo, hi] or null, got {short_repr(bounds)}")
            lo, hi = (finite_number("score_range", v) for v in bounds)
            if not lo < hi:
                raise ValueError(f"score_range must have lo < hi, got {short_repr(bounds)}")
        integer("max_tokens", self.max_tokens, minimum=1)
        if self.extra_body is not None and not isinstance(self.extra_body, Mapping):
            raise ValueError(f"extra_body must be a mapping, got {short_repr(self.extra_body)}")
        reserved = sorted({"model", "messages"} & set(self.extra_body or {}))
        if reserved:
            raise ValueError(f"extra_body must not set {reserved}: the scorer sends them")


class Templated:
    """A scorer that fills a prompt template (its setting ``prompt``) for each turn."""

    name: ClassVar[str]
    settings: Any

    def turn_text(self, interaction: Interaction, ctx: Mapping[str, Any]) -> dict[str, str]:
        """The template's text fields for a turn; override to supply text for turns without messages."""
        response = output_text(self.name, interaction, "judge", "turn_text")
        prompt = render_messages(interaction.messages)
        conversation = render_messages(tuple(interaction.messages) + tuple(interaction.output_messages))
        return {"prompt": prompt, "response": response, "conversation": conversation}

    def render(self, interaction: Interaction, ctx: Mapping[str, Any]) -> str:
        """The prompt template filled for a turn; a field without a value (``{ctx[task]}`` with no ``task`` in
        ctx) is a ``TemplateError`` naming the judge, the turn and the field."""
        template = self.settings.prompt
        try:
            return template.format(ctx=ctx, **self.turn_text(interaction, ctx))
        except (KeyError, IndexError, AttributeError) as err:
            keys = sorted(str(key) for key in ctx)
            raise TemplateError(f"scorer {self.name!r} on interaction {interaction.interaction_id!r}: the prompt's "
                                f"template field {_field_of(template, err)} has no value ({type(err).__name__}: "
                                f"{err}); ctx holds {keys}") from None


def chat_completion(model: str, content: str, top: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A chat completion object as OpenAI's API reference documents it, answering ``content`` (with the first
    token's ``top_logprobs``, where given; the sampled token's own log-prob, which no judge reads, is -0.1)."""
    logprobs = None if top is None else {"content": [{"token": top[0]["token"], "logprob": -0.1,
                                                      "bytes": None, "top_logprobs": top}], "refusal": None}
    return {"id": "chatcmpl-123", "object": "chat.completion", "created": 1677652288, "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": None},
                         "logprobs": logprobs, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}}


class OpenAIJudgeScorer(Templated, ServedScorer, BaseScorer):
    """Scores each turn with an LLM judge on an OpenAI-compatible server (see the module docstring).

    Example:
        >>> judge = prm_jax.scorers.OpenAIJudgeScorer(base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen2.5-7B-Instruct",
        ...                                           max_concurrency=8, max_requests_per_second=50)
        >>> judge.name
        'openai_judge'
    """

    name = "openai_judge"
    settings_class = OpenAIJudgeSettings
    route = "/chat/completions"
    example_modes = ({"score": "regex"}, {"score": "json", "score_range": None}, {"score": "logprobs"})

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.settings.pattern)

    def request(self, items: Sequence[Item], layout: Any = None) -> dict[str, Any]:
        """The chat completion request for a turn, with this judge's settings: ``extra_body``, the model,
        ``max_tokens`` and, scoring by log-probs, ``logprobs`` / ``top_logprobs``."""
        (interaction, ctx), = items
        s = self.settings
        messages = ([{"role": "system", "content": s.system}] if s.system else []) + [
            {"role": "user", "content": self.render(interaction, ctx)}]
        body: dict[str, Any] = {**(s.extra_body or {}), "model": s.model, "messages": messages,
                                "max_tokens": s.max_tokens}
        if s.score == "logprobs":
            body.update(logprobs=True, top_logprobs=s.top_logprobs)
        return body

    def read(self, answer: Any, items: Sequence[Item], where: str, layout: Any = None) -> list[Any]:
        return [self.parse(answer, where)]

    def reads(self) -> Reads:
        return {"regex": "text", "json": "number", "logprobs": "logprob"}[self.settings.score]  # type: ignore[return-value]

    def example_answer(self, request: Mapping[str, Any], value: Any) -> Any:
        s = self.settings
        if s.score == "logprobs":
            return chat_completion(s.model, s.logprob_tokens[0], [{"token": s.logprob_tokens[0], "logprob": value,
                                                                   "bytes": None}])
        if s.score == "json":
            return chat_completion(s.model, json.dumps({s.json_field: value}))
        return chat_completion(s.model, value if isinstance(value, str) else str(value))

    def parse(self, answer: Any, where: str) -> float:
        """The score in a chat completion, read by the judges' one ``AnswerReader``."""
        read, s = self.service.reader, self.settings
        choice = read.field(answer, ("choices", 0), where)
        message = read.field(choice, ("message",), where)
        if not isinstance(message, Mapping):
            raise read.error(where, f"not a chat completion: {short_repr(answer)}")
        content = message_text(message.get("content"))
        if s.score == "logprobs":
            return self._logprob_score(choice, where)
        if s.score == "json":
            parsed = read.json(content, where, "the answer's content")
            if not isinstance(parsed, Mapping) or s.json_field not in parsed:
                raise read.error(where, f"the answer is not JSON with field {s.json_field!r}: {short_repr(content)}")
            number = read.number(parsed[s.json_field], where, f"the answer's field {s.json_field!r}")
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
        if s.score_range is None:
            return number
        lo, hi = (float(v) for v in s.score_range)
        if not lo <= number <= hi:
            raise read.error(where, f"the score {number} is outside score_range [{lo}, {hi}]")
        return (number - lo) / (hi - lo)

    def _logprob_score(self, choice: Any, where: str) -> float:
        """P(any of ``logprob_tokens``) among the first answer token's top log-probs: every log-prob at most
        0, their probabilities one distribution (summing to at most 1)."""
        read = self.service.reader
        path = "choices[0].logprobs.content[0].top_logprobs"
        top = read.field(choice, ("logprobs", "content", 0, "top_logprobs"), where)
        if not isinstance(top, list) or not top or not all(isinstance(t, Mapping) and "logprob" in t for t in top):
            raise read.error(where, f"the answer has no top_logprobs for its first token (does the server return "
                                    f"logprobs?): {short_repr(choice)}")
        probabilities = [math.exp(read.logprob(t["logprob"], where, f"{path}[{i}].logprob")) for i, t in enumerate(top)]
        read.distribution(probabilities, where, f"the probabilities of {path}")
        tokens = tuple(self.settings.logprob_tokens)
        chosen = [p for t, p in zip(top, probabilities) if str(t.get("token", "")).strip() in tokens]
        return min(math.fsum(chosen), 1.0)  # (within the distribution's slack of 1e-6)
