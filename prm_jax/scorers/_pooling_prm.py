"""``PoolingPRMScorer``: a process reward model served by vLLM's ``POST {base_url}/pooling`` (Qwen2.5-Math-PRM,
math-shepherd and other step-tag PRMs), batched across branches.

A causal PRM scores every step of a branch in one forward over the branch's leaf: the scorer sends, per
branch, the leaf's tokens (each turn's new input tokens and its output tokens) with the step tag
(``step_tag_id``) after each step, so the model sees one tag per step. With ``STEP`` pooling (these models'
default) the server returns one ``[p_bad, p_good]`` row per step tag, in order; a step's score is
``row[good_index]`` (``step_score: good``, the default) or ``p_good - p_bad`` (``step_score:
good_minus_bad``, PURE's step score; two-class rows). Tags that stand in the prompt or a tool's output get
rows too, which are skipped.

Steps (``step_separator``, ``prm_jax.runtime._steps``): by default each turn is one step (a tag after each
turn's output: today's per-turn score). With separators (``[[271]]``: Qwen2.5-Math-PRM's blank line), the
tag is inserted after each separator in a turn's output and at the end of the turn (never twice in a row);
a turn whose own output holds the tag is refused (its steps could not be told apart). With the separator
``[[step_tag_id]]`` (math-shepherd, whose tag stands in the text), nothing is inserted and every tag in a
turn's output ends a step. ``spread`` places each step's score on the turn's tokens: ``step`` (the step's
tokens), ``step_end`` (its last token; PURE and PRIME read this layout), ``turn`` (the turn's last step
on all its tokens, the default) or ``tokens`` (that divided evenly).

The branches of a batch (``max_batch_size``, ``max_wait``: see ``BatchScorer``) go in one request,
``input`` a list of token-id lists, so 256 branches with ``max_batch_size: 64`` take 4 requests, each
branch's context sent once.

vLLM versions: the request is ``{"model", "input", "task"}``. vLLM >= 0.11 names the task
``token_classify`` (the default here); vLLM 0.8-0.10 take no task for these models (``task: null`` leaves
it out; their default pooling task is ``encode``). From v0.21 a vLLM server fixes its pooling task when it
starts (``--pooler-config.task``) and refuses a request that names another ("Unsupported task"): such a
refusal fails the scorer once with one error naming both settings (``task: null``, or the server started
with ``--pooler-config.task token_classify``), and every later batch fails with it at once, without a
request. The response shape, ``{"data": [{"index", "data":
[[p_bad, p_good], ...]}]}``, is the same across them. Serve a step-tag PRM with its pooler's step tag, e.g.
``vllm serve Qwen/Qwen2.5-Math-PRM-7B --runner pooling`` (step tag ``<extra_0>``, id 151651, the default
here). SGLang serves sequence classifiers on ``/v1/classify`` (one label distribution per input, not per
step): not supported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, NamedTuple, get_args

import numpy as np

from prm_jax._validation import integer, one_of, short_repr
from prm_jax.errors import ServiceError
from prm_jax.runtime._scoring import BatchTrajectoryScorer
from prm_jax.runtime._steps import Spread, StepRule, check_spread, spread_steps
from prm_jax.runtime._trajectory import Interaction, concat_spans
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

QWEN_PRM_STEP_TAG_ID = 151651  # "<extra_0>" in Qwen2.5-Math-PRM's tokenizer
StepScore = Literal["good", "good_minus_bad"]


class TaggedBranch(NamedTuple):
    """A branch as the PRM reads it: ``ids`` (the leaf's tokens with the step tags), ``tags`` (how many tags
    ``ids`` holds, one answer row each), and per turn its step ends in its output (``ends``) and the rows of
    its steps (``rows``, indices among the tags)."""

    ids: list[int]
    tags: int
    ends: list[list[int]]
    rows: list[list[int]]


def branch_tokens(turns: Sequence[Interaction], step_tag_id: int, rule: StepRule = StepRule()) -> TaggedBranch:
    """A branch's token ids (its leaf's input and output) with ``step_tag_id`` after each step (``rule``; by
    default after each turn's output), or as they stand (the tag-in-text rule). The branch must follow the
    concat rule (``concat_spans``: each input extends its parent's input and output); ``ValueError`` for a
    turn whose output holds the tag where tags are inserted."""
    spans = concat_spans(turns)
    leaf = turns[-1]
    tokens = np.concatenate([leaf.input_tokens, leaf.output_tokens]).tolist()
    out: list[int] = []
    all_ends, all_rows = [], []
    position = tags = 0
    for turn, (start, stop) in zip(turns, spans):
        before = tokens[position:start]  # the prompt or a tool's output: its tags' rows are skipped
        out.extend(before)
        tags += before.count(step_tag_id)
        output = tokens[start:stop]
        ends = rule.ends(output)
        if rule.tag_in_text:
            out.extend(output)
            rows = [tags + k for k in range(len(ends))]
            tags += len(ends)
        else:
            if step_tag_id in output:
                raise ValueError(f"the output of turn {turn.interaction_id!r} holds step_tag_id {step_tag_id} "
                                 f"{output.count(step_tag_id)} time(s): its steps cannot be told apart (pick a "
                                 "tag the policy never emits, or step_separator [[step_tag_id]] where the tag "
                                 "stands in the text)")
            rows, begin = [], 0
            for end in ends:
                out.extend(output[begin:end])
                out.append(step_tag_id)
                rows.append(tags)
                tags += 1
                begin = end
        all_ends.append(ends)
        all_rows.append(rows)
        position = stop
    return TaggedBranch(out, tags, all_ends, all_rows)


class PoolingPRMScorer(ServedScorer, BatchTrajectoryScorer):
    """Scores every step of a branch with a step-tag PRM on vLLM's /pooling (see the module docstring)."""

    name = "pooling_prm"
    pads: ClassVar[bool] = True  # the server pads a batch to its longest input: sorted by length

    def __init__(self, base_url: str, model: str, step_tag_id: int = QWEN_PRM_STEP_TAG_ID, good_index: int = 1,
                 task: str | None = "token_classify", spread: Spread = "turn",
                 step_separator: Sequence[Sequence[int]] | None = None, step_score: StepScore = "good",
                 request_timeout: float = 60.0, attempts: int = 4, backoff: float = 0.25, max_backoff: float = 8.0,
                 max_body_bytes: int = 64 * DEFAULT_MAX_BODY_BYTES, max_concurrency: int | None = 4,
                 max_requests_per_second: float | None = None, api_key_env: str | None = None, **kwargs: Any):
        settings = dict(base_url=base_url, model=model, step_tag_id=step_tag_id, good_index=good_index, task=task,
                        spread=spread, step_separator=step_separator, step_score=step_score,
                        request_timeout=request_timeout, attempts=attempts, backoff=backoff,
                        max_backoff=max_backoff, max_body_bytes=max_body_bytes, max_concurrency=max_concurrency,
                        max_requests_per_second=max_requests_per_second, api_key_env=api_key_env)
        type(self).validate_kwargs(**settings)
        super().__init__(**kwargs)
        self.model, self.step_tag_id, self.good_index, self.task, self.spread = (
            model, step_tag_id, good_index, task, spread)
        self.rule, self.step_score = StepRule.parse(step_separator, step_tag_id), step_score
        self.service = JSONService(check_url("base_url", base_url), who=f"scorer {self.name!r}",
                                   **transport(settings))
        self._task_refused: ServiceError | None = None  # the server refused the task: later batches fail with it

    @classmethod
    def validate_kwargs(cls, base_url: Any = None, model: Any = None, step_tag_id: Any = QWEN_PRM_STEP_TAG_ID,
                        good_index: Any = 1, task: Any = "token_classify", spread: Any = "turn",
                        step_separator: Any = None, step_score: Any = "good",
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
        check_spread(spread)
        StepRule.parse(step_separator, step_tag_id)
        one_of("step_score", step_score, get_args(StepScore))
        if step_score == "good_minus_bad" and good_index not in (0, 1):
            raise ValueError(f"step_score 'good_minus_bad' reads two-class rows [p_bad, p_good]: good_index must "
                             f"be 0 or 1, got {good_index}")
        check_transport(request_timeout, attempts, backoff, max_backoff, max_body_bytes, max_concurrency,
                        max_requests_per_second, api_key_env)
        cls.validate_batching(max_batch_size=max_batch_size, max_wait=max_wait)

    async def evaluate_batch(self, items: Sequence[tuple[Sequence[Interaction], Mapping[str, Any]]]  # type: ignore[override]
                             ) -> list[dict[str, Any]]:
        branches = []
        for turns, _ in items:
            try:
                branches.append(branch_tokens(turns, self.step_tag_id, self.rule))
            except ValueError as err:
                raise ValueError(f"scorer {self.name!r}: {err}") from None
        body: dict[str, Any] = {"model": self.model, "input": [branch.ids for branch in branches]}
        if self.task is not None:
            body["task"] = self.task
        if self._task_refused is not None:
            raise self._task_refused
        try:
            answer = await self.service.post("/pooling", body)
        except ServiceError as err:
            refused = self._refused_task(err)
            if refused is None:
                raise
            self._task_refused = refused
            raise refused from None
        return [self._branch_scores(turns, branch, rows)
                for (turns, _), branch, rows in zip(items, branches, self._rows(answer, len(items)))]

    def _refused_task(self, err: ServiceError) -> ServiceError | None:
        """A 400 whose answer is about the per-request task (vLLM >= 0.21 fixes it when it starts): the one
        error that names the settings to change; ``None`` for any other failure."""
        if self.task is None or err.status != 400 or "task" not in str(err).rsplit("answered", 1)[-1].lower():
            return None
        return ServiceError(f"scorer {self.name!r}: the server refused the per-request pooling task {self.task!r} "
                            f"({str(err).rsplit('answered ', 1)[-1]}). A server that fixes its pooling task when it "
                            f"starts (vLLM >= 0.21: --pooler-config.task) takes none per request: set the scorer's "
                            f"kwargs task: null, or start the server with --pooler-config.task {self.task}",
                            status=400, reason=err.reason)

    def _rows(self, answer: Any, count: int) -> list[Any]:
        """Each input's rows, by the answer's ``index`` fields: each index of the request exactly once."""
        read = self.service.reader
        where = f"scorer {self.name!r} on a batch of {count} branches"
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
            raise read.error(where, f"not a pooling response: {short_repr(answer)}")
        ordered = read.indexed(answer["data"], count, where)
        return [read.field(item, ("data",), where) for item in ordered]

    def _branch_scores(self, turns: Sequence[Interaction], branch: TaggedBranch, rows: Any) -> dict[str, Any]:
        where = f"scorer {self.name!r} on the branch ending at {turns[-1].interaction_id!r}"
        if not isinstance(rows, list) or len(rows) != branch.tags:
            got = len(rows) if isinstance(rows, list) else type(rows).__name__
            raise ServiceError(f"{where}: expected one row per step tag ({branch.tags}), got {got} (is the model "
                               "served with STEP pooling and this step_tag_id?)", status=200)
        out: dict[str, Any] = {}
        for turn, ends, indices in zip(turns, branch.ends, branch.rows):
            scores = [self._step_score(rows[index], where, index) for index in indices]
            out[turn.interaction_id] = spread_steps(scores, ends, turn.output_len, self.spread)
        return out

    def _step_score(self, row: Any, where: str, index: int) -> float:
        read = self.service.reader
        if not isinstance(row, list) or not -len(row) <= self.good_index < len(row):
            raise read.error(where, f"row {short_repr(row)} has no probability at good_index {self.good_index}")
        good = read.probability(row[self.good_index], where, f"row {index}'s probability [{self.good_index}]")
        if self.step_score == "good":
            return good
        if len(row) != 2:
            raise read.error(where, f"step_score 'good_minus_bad' reads two-class rows, got {short_repr(row)}")
        bad = read.probability(row[1 - self.good_index], where, f"row {index}'s probability [{1 - self.good_index}]")
        return good - bad

    async def probe(self) -> Probe:
        """One tiny input, a step tag after one token (``prm-jax validate-config --probe``): the answer must hold one
        row with a probability at ``good_index`` (a model served without STEP pooling or with another tag
        answers no row)."""
        body: dict[str, Any] = {"model": self.model, "input": [[0, self.step_tag_id]]}
        if self.task is not None:
            body["task"] = self.task

        def check(answer: Any) -> None:
            rows = self._rows(answer, 1)[0]
            where = f"scorer {self.name!r} (probe)"
            if not isinstance(rows, list) or len(rows) != 1:
                raise self.service.reader.error(where, f"expected one row for one step tag, got {short_repr(rows)} "
                                                       "(is the model served with STEP pooling and this step_tag_id?)")
            self._step_score(rows[0], where, 0)

        return await self.service.probe(self.name, "/pooling", body, check)
