"""``PoolingPRMScorer``: a process reward model served by vLLM's ``POST {base_url}/pooling`` (Qwen2.5-Math-PRM,
math-shepherd and other step-tag PRMs), batched across branches.

A causal PRM scores every turn of a branch in one forward over the branch's leaf: the scorer sends, per
branch, the tokens of every turn (each turn's new input tokens, its output tokens, then ``step_tag_id``), so
the model sees one step tag after each turn's output. With ``STEP`` pooling (these models' default) the
server returns one ``[p_bad, p_good]`` row per step tag, in order: turn ``k`` gets ``row[k][good_index]``,
broadcast over its tokens (``spread: turn``) or divided evenly among them (``spread: tokens``, the turn's
tokens summing to it). The branches of a batch (``max_batch_size``, ``max_wait``: see ``BatchScorer``)
go in one request, ``input`` a list of token-id lists, so 256 branches with ``max_batch_size: 64`` take 4
requests, each branch's context sent once.

vLLM versions: the request is ``{"model", "input", "task"}``. vLLM >= 0.11 names the task
``token_classify`` (the default here); vLLM 0.8-0.10 take no task for these models (``task: null`` leaves
it out; their default pooling task is ``encode``). The response shape, ``{"data": [{"index", "data":
[[p_bad, p_good], ...]}]}``, is the same across them. Serve a step-tag PRM with its pooler's step tag, e.g.
``vllm serve Qwen/Qwen2.5-Math-PRM-7B --runner pooling`` (step tag ``<extra_0>``, id 151651, the default
here). SGLang serves sequence classifiers on ``/v1/classify`` (one label distribution per input, not per
step): not supported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from prm_jax.runtime.limits import ServiceError
from prm_jax.runtime.scoring import BatchTrajectoryScorer
from prm_jax.runtime.trajectory import Interaction, concat_spans
from prm_jax.scorers._http import (
    DEFAULT_MAX_BODY_BYTES,
    JSONService,
    check_transport,
    check_url,
    httpx_module,
    transport,
)
from prm_jax.validation import integer, short_repr

QWEN_PRM_STEP_TAG_ID = 151651  # "<extra_0>" in Qwen2.5-Math-PRM's tokenizer
Spread = Literal["turn", "tokens"]


def branch_tokens(turns: Sequence[Interaction], step_tag_id: int) -> list[int]:
    """A branch's token ids (its leaf's input and output) with ``step_tag_id`` after each turn's output; the
    branch must follow the concat rule (``concat_spans``: each input extends its parent's input and output)."""
    spans = concat_spans(turns)
    leaf = turns[-1]
    tokens = np.concatenate([leaf.input_tokens, leaf.output_tokens]).tolist()
    out: list[int] = []
    position = 0
    for _, stop in spans:
        out.extend(tokens[position:stop])
        out.append(step_tag_id)
        position = stop
    return out


class PoolingPRMScorer(BatchTrajectoryScorer):
    """Scores every turn of a branch with a step-tag PRM on vLLM's /pooling (see the module docstring)."""

    name = "pooling_prm"
    pads: ClassVar[bool] = True  # the server pads a batch to its longest input: sorted by length

    def __init__(self, base_url: str, model: str, step_tag_id: int = QWEN_PRM_STEP_TAG_ID, good_index: int = 1,
                 task: str | None = "token_classify", spread: Spread = "turn", request_timeout: float = 60.0,
                 attempts: int = 4, backoff: float = 0.25, max_backoff: float = 8.0,
                 max_body_bytes: int = 64 * DEFAULT_MAX_BODY_BYTES, max_concurrency: int | None = 4,
                 max_requests_per_second: float | None = None, api_key_env: str | None = None, **kwargs: Any):
        settings = dict(base_url=base_url, model=model, step_tag_id=step_tag_id, good_index=good_index, task=task,
                        spread=spread, request_timeout=request_timeout, attempts=attempts, backoff=backoff,
                        max_backoff=max_backoff, max_body_bytes=max_body_bytes, max_concurrency=max_concurrency,
                        max_requests_per_second=max_requests_per_second, api_key_env=api_key_env)
        type(self).validate_kwargs(**settings)
        super().__init__(**kwargs)
        self.model, self.step_tag_id, self.good_index, self.task, self.spread = (
            model, step_tag_id, good_index, task, spread)
        self.service = JSONService(check_url("base_url", base_url), who=f"scorer {self.name!r}",
                                   **transport(settings))

    @classmethod
    def validate_kwargs(cls, base_url: Any = None, model: Any = None, step_tag_id: Any = QWEN_PRM_STEP_TAG_ID,
                        good_index: Any = 1, task: Any = "token_classify", spread: Any = "turn",
                        request_timeout: Any = 60.0, attempts: Any = 4, backoff: Any = 0.25, max_backoff: Any = 8.0,
                        max_body_bytes: Any = 64 * DEFAULT_MAX_BODY_BYTES, max_concurrency: Any = 4,
                        max_requests_per_second: Any = None, api_key_env: Any = None,
                        max_batch_size: Any = 64, max_wait: Any = 0.005, **kwargs: Any) -> None:
        httpx_module("PoolingPRMScorer")
        check_url("base_url", base_url)
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be the served model's name, got {short_repr(model)}")
        integer("step_tag_id", step_tag_id, minimum=0)
        integer("good_index", good_index, minimum=0)
        if task is not None and (not isinstance(task, str) or not task):
            raise ValueError(f"task must be a pooling task name (token_classify) or null, got {short_repr(task)}")
        if spread not in ("turn", "tokens"):
            raise ValueError(f"spread must be 'turn' or 'tokens', got {short_repr(spread)}")
        check_transport(request_timeout, attempts, backoff, max_backoff, max_body_bytes, max_concurrency,
                        max_requests_per_second, api_key_env)
        cls.validate_batching(max_batch_size=max_batch_size, max_wait=max_wait)

    async def evaluate_batch(self, items: Sequence[tuple[Sequence[Interaction], Mapping[str, Any]]]  # type: ignore[override]
                             ) -> list[dict[str, Any]]:
        inputs = [branch_tokens(turns, self.step_tag_id) for turns, _ in items]
        for ids, (turns, _) in zip(inputs, items):
            tags = sum(token == self.step_tag_id for token in ids)
            if tags != len(turns):
                raise ValueError(f"scorer {self.name!r}: the branch ending at {turns[-1].interaction_id!r} holds "
                                 f"step_tag_id {self.step_tag_id} {tags - len(turns)} time(s) in its own tokens: its "
                                 "steps cannot be told apart (pick a tag the policy never emits)")
        body: dict[str, Any] = {"model": self.model, "input": inputs}
        if self.task is not None:
            body["task"] = self.task
        answer = await self.service.post("/pooling", body)
        return [self._branch_scores(turns, rows) for (turns, _), rows in zip(items, self._rows(answer, len(items)))]

    def _rows(self, answer: Any, count: int) -> list[Any]:
        """Each input's rows, by the answer's ``index`` fields: each index of the request exactly once."""
        read = self.service.reader
        where = f"scorer {self.name!r} on a batch of {count} branches"
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
            raise read.error(where, f"not a pooling response: {short_repr(answer)}")
        ordered = read.indexed(answer["data"], count, where)
        return [read.field(item, ("data",), where) for item in ordered]

    def _branch_scores(self, turns: Sequence[Interaction], rows: Any) -> dict[str, Any]:
        where = f"scorer {self.name!r} on the branch ending at {turns[-1].interaction_id!r}"
        if not isinstance(rows, list) or len(rows) != len(turns):
            got = len(rows) if isinstance(rows, list) else type(rows).__name__
            raise ServiceError(f"{where}: expected one row per step tag ({len(turns)}), got {got} (is the model "
                               "served with STEP pooling and this step_tag_id?)", status=200)
        out: dict[str, Any] = {}
        read = self.service.reader
        for k, (turn, row) in enumerate(zip(turns, rows)):
            if not isinstance(row, list) or not -len(row) <= self.good_index < len(row):
                raise read.error(where, f"row {short_repr(row)} has no probability at good_index {self.good_index}")
            score = read.probability(row[self.good_index], where, f"step {k}'s probability [{self.good_index}]")
            out[turn.interaction_id] = (score if self.spread == "turn" else np.full(turn.output_len, score / turn.output_len))
        return out

    def client_stats(self) -> dict[str, float]:
        return self.service.stats()

    async def aclose(self) -> None:
        await self.service.aclose()
