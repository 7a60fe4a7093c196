"""``TeacherLogprobScorer``: on-policy distillation's teacher, served by vLLM or SGLang, as a scorer
(on-policy distillation as verl computes it (verl-project/verl @ 1dda039b, verl/trainer/distillation/losses.py) and AReaL's MOPD
(areal/trainer/mopd/loss.py); prm-jax's rules where verl's break (the credit-assignment guide states each)).

Per branch, the teacher reads the student's own tokens (the leaf's input and output tokens, by the concat
rule) in one forward without generating, and answers the log-prob of every token given the ones before it
(vLLM: ``POST {base_url}/v1/completions`` with ``prompt_logprobs: 0``; SGLang: ``POST {base_url}/generate``
with ``return_logprob`` from position 0 and no new tokens). The branches of a batch (``max_batch_size``,
``max_wait``: see ``BatchScorer``) go in one request, each branch's context sent once.

Each turn's score is, per output token, the dense distillation reward of the reverse KL (``k1``)::

    r_t = log pi_T(y_t) - log pi_S(y_t)

with ``log pi_S`` the student's log-probs of its sampled tokens (the turn's ``output_logprobs``, required: a
turn without them fails), optionally clipped to ``[reward_min, reward_max]`` (the rule of both teachers:
``prm_jax.runtime._model_scorer.teacher_rewards``; ``TeacherModelScorer`` is the same teacher as a JAX model).
The runner multiplies by the scorer's ``weight`` and sums the scorers, so several teachers, one scorer each
with ``weight: w_j``, give AReaL's multi-teacher reward with raw weights, ``sum_j w_j log pi_Tj - W log
pi_S``. As process rewards the rewards enter the advantages by the configured shaping
(``token_rewards_as_adv``), which with the PPO loss is verl's policy-gradient distillation; to combine at the
loss instead (AReaL's ``rl_coef * rl + distill_coef * opd``), give the trainer the teacher's log-probs
themselves (``teacher_logprobs``, or the sessions' ``output_teacher_logprobs``) and call
``prm_jax.losses.distillation_loss``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, get_args

import anyio
import numpy as np

from prm_jax._validation import one_of, short_repr
from prm_jax.kernels._distillation import reward_bounds
from prm_jax.kernels._schema import LOGPROB_SLACK
from prm_jax.runtime._model_scorer import REWARD_MAX_DOC, REWARD_MIN_DOC, teacher_rewards
from prm_jax.runtime._scoring import BatchTrajectoryScorer
from prm_jax.runtime._settings import setting
from prm_jax.runtime._trajectory import Interaction, concat_spans
from prm_jax.scorers._http import (
    DEFAULT_MAX_BODY_BYTES,
    Item,
    Reads,
    ServedScorer,
    ServedSettings,
    Transport,
    transport_setting,
)

Server = Literal["vllm", "sglang"]
SERVERS: tuple[Server, ...] = get_args(Server)
# Each server's route for prompt log-probs.
ROUTES: Mapping[Server, str] = {"vllm": "/v1/completions", "sglang": "/generate"}


def branch_ids(turns: Sequence[Interaction]) -> tuple[list[int], list[tuple[int, int]]]:
    """A branch's token ids (its leaf's input and output tokens) and each turn's output span in them (the
    concat rule: ``concat_spans``)."""
    spans = concat_spans(turns)
    leaf = turns[-1]
    return np.concatenate([leaf.input_tokens, leaf.output_tokens]).tolist(), spans


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherLogprobSettings(ServedSettings):
    scorer: ClassVar[str] = "TeacherLogprobScorer"
    base_url: str = setting(doc="The server's URL (http or https, without ``/v1``): vLLM's ``/v1/completions`` "
                            "or SGLang's ``/generate`` is under it.", example="http://127.0.0.1:8000")
    model: str = setting(doc="The served teacher's name, as the server lists it.", example="Qwen/Qwen3-8B")
    server: Server = setting("vllm", doc="Which server answers: ``vllm`` (``prompt_logprobs``) or ``sglang`` "
                             "(``return_logprob``); they take different requests.")
    reward_min: float | None = setting(None, doc=REWARD_MIN_DOC)
    reward_max: float | None = setting(None, doc=REWARD_MAX_DOC)
    transport: Transport = transport_setting(request_timeout=120.0, max_body_bytes=64 * DEFAULT_MAX_BODY_BYTES,
                                             max_concurrency=4)

    def check(self) -> None:
        super().check()
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be the served teacher's name, got {short_repr(self.model)}")
        one_of("server", self.server, SERVERS)
        reward_bounds(self.reward_min, self.reward_max)


class TeacherLogprobScorer(ServedScorer, BatchTrajectoryScorer):
    """Scores each output token with a served teacher's log-prob of it, less the student's (see the module
    docstring).

    Example:
        >>> teacher = prm_jax.scorers.TeacherLogprobScorer("http://127.0.0.1:30000", "Qwen/Qwen3-8B", server="sglang")
        >>> teacher.name, teacher.endpoint()
        ('teacher_logprobs', '/generate')
    """

    name = "teacher_logprobs"
    settings_class = TeacherLogprobSettings
    pads: ClassVar[bool] = True  # the server pads a batch to its longest input: sorted by length
    read_in_thread = True  # a batch's answer runs to megabytes
    example_modes = ({"server": "vllm"}, {"server": "sglang"})

    def endpoint(self) -> str:
        return ROUTES[self.settings.server]

    def layout(self, items: Sequence[Item]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Each branch's token ids and its turns' output spans in them (``branch_ids``), which the request sends
        and the answer is read by.

        Args:
            items: One call's branches.
        """
        return [branch_ids(turns) for turns, _ in items]

    def request(self, items: Sequence[Item], layout: Any = None) -> dict[str, Any]:
        layouts = layout if layout is not None else self.layout(items)
        return self._body([ids for ids, _ in layouts])

    def _body(self, inputs: list[list[int]]) -> dict[str, Any]:
        model = self.settings.model
        if self.settings.server == "vllm":  # one token generated (vLLM's least), the prompt's log-probs of its tokens
            return {"model": model, "prompt": inputs, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0.0}
        return {"model": model, "input_ids": inputs, "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {"max_new_tokens": 0, "temperature": 0.0}}

    def read(self, answer: Any, items: Sequence[Item], where: str, layout: Any = None) -> list[Any]:
        """Each branch's rewards (``teacher_rewards``) from the teacher's log-probs of its tokens."""
        out = []
        layouts = layout if layout is not None else self.layout(items)
        teachers = self._read_all(answer, [ids for ids, _ in layouts], where)
        for (turns, _), teacher, (_, spans) in zip(items, teachers, layouts):
            out.append(teacher_rewards(self.name, turns, [teacher[start:stop] for start, stop in spans],
                                       self.settings.reward_min, self.settings.reward_max))
        return out

    def reads(self) -> Reads:
        return "logprob"

    def example_answer(self, request: Mapping[str, Any], value: Any) -> Any:
        """vLLM's completion with ``prompt_logprobs`` (entry 0 ``None``, then ``{token id: {logprob, rank,
        decoded_token}}``), or SGLang's ``/generate`` result(s) with ``meta_info.input_token_logprobs`` (``[logprob,
        token id, text]``, the first logprob ``None``), ``value`` as every token's log-prob.

        Args:
            value: The value standing where the score is read (a number, or anything a malformed answer could hold).
        """
        if self.settings.server == "vllm":
            choices = [{"index": i, "text": "", "logprobs": None, "finish_reason": "length", "stop_reason": None,
                        "prompt_logprobs": [None] + [{str(t): {"logprob": value, "rank": 1, "decoded_token": "x"}}
                                                     for t in ids[1:]]}
                       for i, ids in enumerate(request["prompt"])]
            return {"id": "cmpl-1", "object": "text_completion", "created": 1745383213,
                    "model": self.settings.model, "choices": choices,
                    "usage": {"prompt_tokens": 1, "total_tokens": 2, "completion_tokens": 1}}
        results = [{"text": "", "meta_info": {"id": f"r{i}", "prompt_tokens": len(ids), "completion_tokens": 0,
                                              "input_token_logprobs": [[None, ids[0], None]]
                                              + [[value, t, None] for t in ids[1:]]}}
                   for i, ids in enumerate(request["input_ids"])]
        return results[0] if len(results) == 1 else results

    async def teacher_logprobs(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """The teacher's log-prob of each token of each input given the tokens before it, in one request:
        float64 ``[len(input)]`` per input (entry 0, which has no context, is NaN). The answer (a few MB for
        a batch of long branches) is read in a worker thread: the event loop serves the other scorers.

        Args:
            inputs: Token id lists, one per input.
        """
        answer = await self.service.post(self.endpoint(), self._body(inputs))
        where = f"scorer {self.name!r} on a batch of {len(inputs)} branches"
        return await anyio.to_thread.run_sync(self._read_all, answer, inputs, where)

    def _read_all(self, answer: Any, inputs: list[list[int]], where: str) -> list[np.ndarray]:
        return [self._read(item, ids, where) for item, ids in zip(self._items(answer, len(inputs), where), inputs)]

    def _items(self, answer: Any, count: int, where: str) -> list[Any]:
        read = self.service.reader
        if self.settings.server == "vllm":
            if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
                raise read.error(where, f"not a completions response: {short_repr(answer)}")
            return read.indexed(answer["choices"], count, where)
        items = [answer] if count == 1 and isinstance(answer, dict) else answer
        if not isinstance(items, list) or len(items) != count:
            raise read.error(where, f"expected a list of {count} results, got {short_repr(answer)}")
        return items

    def _read(self, item: Any, ids: list[int], where: str) -> np.ndarray:
        """One input's log-probs: each token's entry found (by its id) and every value a log-prob by the
        answer reader's rule (checked in one pass; the first bad one is reported as the reader words it)."""
        read = self.service.reader
        if self.settings.server == "vllm":
            entries, field = read.field(item, ("prompt_logprobs",), where), "prompt_logprobs"
            shape = "one entry per prompt token"
        else:
            entries, field = read.field(item, ("meta_info", "input_token_logprobs"), where), "input_token_logprobs"
            shape = "one [logprob, token id, text] per input token"
        if not isinstance(entries, list) or len(entries) != len(ids):
            raise read.error(where, f"{field} must hold {shape} ({len(ids)}), got {short_repr(entries)} (does the "
                                    "server return prompt log-probs?)")
        values: list[Any] = [None]
        for t in range(1, len(ids)):
            entry = entries[t]
            if self.settings.server == "vllm":
                token = entry.get(str(ids[t])) if isinstance(entry, dict) else None
                if not isinstance(token, dict):
                    raise read.error(where, f"{field}[{t}] has no entry for token {ids[t]}: {short_repr(entry)}")
                values.append(token.get("logprob"))
            else:
                if not isinstance(entry, list) or len(entry) < 2 or entry[1] != ids[t]:
                    raise read.error(where, f"{field}[{t}] must be [logprob, {ids[t]}, ...], got {short_repr(entry)}")
                values.append(entry[0])
        numbers = all(type(v) in (int, float) for v in values[1:])
        out = np.array([np.nan, *values[1:]], np.float64) if numbers else np.empty(0)
        if not numbers or not (np.isfinite(out[1:]) & (out[1:] <= LOGPROB_SLACK)).all():
            bad = next(t for t in range(1, len(ids)) if not (type(values[t]) in (int, float) and math.isfinite(values[t])
                                                              and values[t] <= LOGPROB_SLACK))
            read.logprob(values[bad], where, f"{field}[{bad}]")  # raises, worded as every judge's
        out[1:] = np.minimum(out[1:], 0.0)
        return out
