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

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, NamedTuple, get_args

import numpy as np

from prm_jax._validation import integer, one_of, short_repr
from prm_jax.errors import ServiceError
from prm_jax.runtime._scoring import BatchTrajectoryScorer
from prm_jax.runtime._settings import setting
from prm_jax.runtime._steps import Spread, StepRule, check_spread, spread_steps
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
from prm_jax.scorers._openai_judge import MODEL_DOC, check_served_model

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolingPRMSettings(ServedSettings):
    scorer: ClassVar[str] = "PoolingPRMScorer"
    base_url: str = setting(doc="The vLLM server's URL (http or https, without ``/v1``: the scorer POSTs to "
                            "``/pooling`` under it).", example="http://127.0.0.1:8000")
    model: str = setting(doc=MODEL_DOC, example="Qwen/Qwen2.5-Math-PRM-7B")
    step_tag_id: int = setting(QWEN_PRM_STEP_TAG_ID, doc="The token id of the step tag the model's pooler "
                               "scores at, >= 0; the default is Qwen2.5-Math-PRM's ``<extra_0>``.")
    good_index: int = setting(1, doc="The column of a step's row that is P(good), >= 0.")
    task: str | None = setting("token_classify", doc="The pooling task sent with each request (vLLM >= 0.11); "
                               "``None`` sends none (vLLM 0.8-0.10, or a server started with "
                               "``--pooler-config.task``).")
    spread: Spread = setting("turn", doc="How a step's score is placed on the turn's tokens: ``step``, "
                             "``step_end``, ``turn`` (the turn's last step on all its tokens) or ``tokens`` "
                             "(that divided evenly).")
    step_separator: Sequence[Sequence[int]] | None = setting(None, doc="Token sequences that end a step inside "
                                                             "a turn's output (``[[271]]``); ``None``: each "
                                                             "turn is one step.")
    step_score: StepScore = setting("good", doc="A step's score: ``good`` (``row[good_index]``) or "
                                    "``good_minus_bad`` (``p_good - p_bad``, PURE's; two-class rows).")
    transport: Transport = transport_setting(request_timeout=60.0, max_body_bytes=64 * DEFAULT_MAX_BODY_BYTES,
                                             max_concurrency=4)

    def check(self) -> None:
        super().check()
        check_served_model(self.model)
        integer("step_tag_id", self.step_tag_id, minimum=0)
        integer("good_index", self.good_index, minimum=0)
        if self.task is not None and (not isinstance(self.task, str) or not self.task):
            raise ValueError(f"task must be a pooling task name (token_classify) or null, got {short_repr(self.task)}")
        check_spread(self.spread)
        StepRule.parse(self.step_separator, self.step_tag_id)
        one_of("step_score", self.step_score, get_args(StepScore))
        if self.step_score == "good_minus_bad" and self.good_index not in (0, 1):
            raise ValueError(f"step_score 'good_minus_bad' reads two-class rows [p_bad, p_good]: good_index must "
                             f"be 0 or 1, got {self.good_index}")


class PoolingPRMScorer(ServedScorer, BatchTrajectoryScorer):
    """Scores every step of a branch with a step-tag PRM on vLLM's /pooling (see the module docstring).

    Example:
        >>> prm = prm_jax.scorers.PoolingPRMScorer("http://127.0.0.1:8000", "Qwen/Qwen2.5-Math-PRM-7B",
        ...                                        step_separator=[[271]], spread="step", max_batch_size=64)
        >>> prm.name, prm.endpoint(), prm.settings.step_tag_id
        ('pooling_prm', '/pooling', 151651)
    """

    name = "pooling_prm"
    settings_class = PoolingPRMSettings
    route = "/pooling"
    pads: ClassVar[bool] = True  # the server pads a batch to its longest input: sorted by length
    example_modes = ({}, {"step_score": "good_minus_bad"})

    _task_refused: ServiceError | None = None  # the server refused the task: later batches fail with it

    @functools.cached_property
    def rule(self) -> StepRule:
        return StepRule.parse(self.settings.step_separator, self.settings.step_tag_id)

    def tagged(self, items: Sequence[Item]) -> list[TaggedBranch]:
        out = []
        for turns, _ in items:
            try:
                out.append(branch_tokens(turns, self.settings.step_tag_id, self.rule))
            except ValueError as err:
                raise ValueError(f"scorer {self.name!r}: {err}") from None
        return out

    def layout(self, items: Sequence[Item]) -> list[TaggedBranch]:
        """Each branch's tokens with its step tags (``tagged``), which the request sends and the answer's rows
        are read by.

        Args:
            items: One call's branches.
        """
        return self.tagged(items)

    def request(self, items: Sequence[Item], layout: Any = None) -> dict[str, Any]:
        tagged = layout if layout is not None else self.tagged(items)
        body: dict[str, Any] = {"model": self.settings.model, "input": [b.ids for b in tagged]}
        if self.settings.task is not None:
            body["task"] = self.settings.task
        return body

    async def exchange(self, items: Sequence[Item]) -> list[Any]:
        """``ServedScorer.exchange``, but a server that refuses the per-request task fails this batch and every
        later one with one error naming both settings, without a request."""
        if self._task_refused is not None:
            raise self._task_refused
        try:
            return await super().exchange(items)
        except ServiceError as err:
            refused = self._refused_task(err)
            if refused is None:
                raise
            self._task_refused = refused
            raise refused from None

    def read(self, answer: Any, items: Sequence[Item], where: str, layout: Any = None) -> list[Any]:
        rows = self._rows(answer, len(items), where)
        tagged = layout if layout is not None else self.tagged(items)
        return [self._branch_scores(turns, branch, branch_rows, where)
                for (turns, _), branch, branch_rows in zip(items, tagged, rows)]

    def reads(self) -> Reads:
        return "probability"

    def example_answer(self, request: Mapping[str, Any], value: Any) -> Any:
        """vLLM's ``PoolingResponse`` with STEP pooling: one row per step tag of each input, ``value`` at
        ``good_index`` (the other columns 0).

        Args:
            value: The value standing where the score is read (a number, or anything a malformed answer could hold).
        """
        width = max(2, self.settings.good_index + 1)

        def row() -> list[Any]:
            out: list[Any] = [0.0] * width
            out[self.settings.good_index] = value
            return out

        data = [{"index": i, "object": "pooling", "data": [row() for t in ids if t == self.settings.step_tag_id]}
                for i, ids in enumerate(request["input"])]
        tokens = sum(len(ids) for ids in request["input"])
        return {"id": "pool-5b2c1a", "object": "list", "created": 1745383213, "model": self.settings.model,
                "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                                        "prompt_tokens_details": None}}

    def _refused_task(self, err: ServiceError) -> ServiceError | None:
        """A 400 whose answer is about the per-request task (vLLM >= 0.21 fixes it when it starts): the one
        error that names the settings to change; ``None`` for any other failure."""
        task = self.settings.task
        if task is None or err.status != 400 or "task" not in str(err).rsplit("answered", 1)[-1].lower():
            return None
        return ServiceError(f"scorer {self.name!r}: the server refused the per-request pooling task {task!r} "
                            f"({str(err).rsplit('answered ', 1)[-1]}). A server that fixes its pooling task when it "
                            f"starts (vLLM >= 0.21: --pooler-config.task) takes none per request: set the scorer's "
                            f"kwargs task: null, or start the server with --pooler-config.task {task}",
                            status=400, reason=err.reason)

    def _rows(self, answer: Any, count: int, where: str) -> list[Any]:
        """Each input's rows, by the answer's ``index`` fields: each index of the request exactly once."""
        read = self.service.reader
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
            raise read.error(where, f"not a pooling response: {short_repr(answer)}")
        ordered = read.indexed(answer["data"], count, where)
        return [read.field(item, ("data",), where) for item in ordered]

    def _branch_scores(self, turns: Sequence[Interaction], branch: TaggedBranch, rows: Any,
                       where: str) -> dict[str, Any]:
        if "(probe)" not in where:
            where = f"scorer {self.name!r} on the branch ending at {turns[-1].interaction_id!r}"
        if not isinstance(rows, list) or len(rows) != branch.tags:
            got = len(rows) if isinstance(rows, list) else type(rows).__name__
            raise self.service.reader.error(where, f"expected one row per step tag ({branch.tags}), got {got} (is "
                                                   "the model served with STEP pooling and this step_tag_id?)")
        out: dict[str, Any] = {}
        for turn, ends, indices in zip(turns, branch.ends, branch.rows):
            scores = [self._step_score(rows[index], where, index) for index in indices]
            out[turn.interaction_id] = spread_steps(scores, ends, turn.output_len, self.settings.spread)
        return out

    def _step_score(self, row: Any, where: str, index: int) -> float:
        read, good = self.service.reader, self.settings.good_index
        if not isinstance(row, list) or not -len(row) <= good < len(row):
            raise read.error(where, f"row {short_repr(row)} has no probability at good_index {good}")
        p_good = read.probability(row[good], where, f"row {index}'s probability [{good}]")
        if self.settings.step_score == "good":
            return p_good
        if len(row) != 2:
            raise read.error(where, f"step_score 'good_minus_bad' reads two-class rows, got {short_repr(row)}")
        bad = read.probability(row[1 - good], where, f"row {index}'s probability [{1 - good}]")
        return p_good - bad
