"""Issue 41 ("every judge parses through one answer reader"): the same malformed answers fed to every
built-in judge (``OpenAIJudgeScorer`` in its json and logprobs modes, ``ClassifyPRMScorer``,
``HTTPJudgeScorer``, ``PoolingPRMScorer``) through its real transport (an ``httpx.MockTransport`` in place of
the server), each refused as a ``ServiceError`` naming the judge and the turn: numbers only (41.4: JSON
``true`` was read as 1), finite, in range, log-probs at most 0 and probabilities summing to at most 1
(41.2: a log-prob of +5 became P = 1.0), indices each once (41.3), nesting bounded (41.19: a bare
``RecursionError``), secrets redacted (41.14: a 401 body quoting the key)."""

import json
import math

import httpx
import pytest
from scorers_for_tests import chain, committed

from prm_jax import PRMRunner
from prm_jax.errors import ServiceError, TemplateError
from prm_jax.runtime._runner import error_text
from prm_jax.scorers import ClassifyPRMScorer, HTTPJudgeScorer, OpenAIJudgeScorer, PoolingPRMScorer

pytestmark = pytest.mark.anyio
KEY = "sk-test-0123456789abcdef"
URL = "http://127.0.0.1:9"  # never reached: the transport is a mock


NO_LOGPROBS = object()


def chat(content=None, logprob=NO_LOGPROBS):
    choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content or "Yes"}}
    if logprob is not NO_LOGPROBS:
        choice["logprobs"] = {"content": [{"token": "Yes", "logprob": -0.1,
                                           "top_logprobs": [{"token": "Yes", "logprob": logprob},
                                                            {"token": "No", "logprob": -3.0}]}]}
    return {"choices": [choice]}


# Each judge: how it is built, and the answer it reads with ``value`` where its score stands.
JUDGES = {
    "openai_json": (lambda: OpenAIJudgeScorer(URL, "m", score="json", score_range=None, api_key_env="JUDGE_KEY"),
                    lambda v: chat(content=json.dumps({"score": v}))),
    "openai_logprobs": (lambda: OpenAIJudgeScorer(URL, "m", score="logprobs", api_key_env="JUDGE_KEY"),
                        lambda v: chat(logprob=v)),
    "classify": (lambda: ClassifyPRMScorer(URL, "m", api_key_env="JUDGE_KEY"),
                 lambda v: {"data": [{"index": 0, "probs": [0.0, v]}]}),
    "http": (lambda: HTTPJudgeScorer(URL), lambda v: {"score": v}),
    "pooling": (lambda: PoolingPRMScorer(URL, "m", step_tag_id=99, api_key_env="JUDGE_KEY", max_wait=0.001),
                lambda v: {"data": [{"index": 0, "data": [[0.0, v]]}]}),
}
NAMES = {"openai_json": "openai_judge", "openai_logprobs": "openai_judge", "classify": "classify_prm",
         "http": "http_judge", "pooling": "pooling_prm"}
PROBABILITIES = {"openai_logprobs", "classify", "pooling"}  # where the read value must be a (log-)probability


def judge_answering(monkeypatch, kind, status, body: bytes):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    scorer = JUDGES[kind][0]()
    scorer.service._client = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(status, content=body)))
    return scorer


async def refused(scorer) -> str:
    """The turn's failure, as ``score_arrays`` reports a failed row (with its notes)."""
    with pytest.raises(ServiceError) as info:
        await PRMRunner(scorers=(scorer,)).run(chain(1, messages=True))
    await scorer.aclose()
    text = error_text(info.value)
    assert f"'{scorer.name}'" in text and "'t0'" in text, text
    return text


def body_of(kind, value) -> bytes:
    return json.dumps(JUDGES[kind][1](value)).encode()  # (json writes NaN and Infinity as Python reads them)


@pytest.mark.parametrize("kind", sorted(JUDGES))
@pytest.mark.parametrize("value,needle", [
    (True, "must be a number, got True"),
    (None, "must be a number, got None"),
    ("7", "must be a number, got '7'"),
    ([1, 2], "must be a number, got [1, 2]"),
    (math.nan, "must be finite"),
    (math.inf, "must be finite"),
])
async def test_every_judge_refuses_a_score_that_is_not_a_finite_number(monkeypatch, kind, value, needle):
    text = await refused(judge_answering(monkeypatch, kind, 200, body_of(kind, value)))
    assert needle in text, text


@pytest.mark.parametrize("kind", sorted(JUDGES))
async def test_a_value_beyond_a_probability_or_a_log_prob_is_refused_never_clipped(monkeypatch, kind):
    # 41.2: a top log-prob of +5 gave P = 1.0 (clipped); a probability of 1.5 is no probability.
    scorer = judge_answering(monkeypatch, kind, 200, body_of(kind, 5.0))
    if kind not in PROBABILITIES:  # a plain number: 5.0 is a score there
        await PRMRunner(scorers=(scorer,)).run(branch := chain(1, messages=True))
        await scorer.aclose()
        assert committed(branch) == [[5.0, 5.0]]
        return
    text = await refused(scorer)
    assert ("must be a log-probability (at most 0), got 5.0" if kind == "openai_logprobs" else
            "must be a probability in [0, 1], got 5.0") in text, text


async def test_top_log_probs_whose_probabilities_sum_past_one_are_malformed(monkeypatch):
    answer = chat(logprob=-0.1)
    answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["logprob"] = -0.2  # 0.905 + 0.819
    scorer = judge_answering(monkeypatch, "openai_logprobs", 200, json.dumps(answer).encode())
    assert "sum to 1.72" in await refused(scorer)
    tiny = chat(logprob=1e-7)  # a server's rounding of log 1: within the slack, read as 0
    scorer = judge_answering(monkeypatch, "openai_logprobs", 200, json.dumps(tiny).encode())
    tiny["choices"][0]["logprobs"]["content"][0]["top_logprobs"].pop()
    scorer.service._client = httpx.AsyncClient(transport=httpx.MockTransport(
        lambda request: httpx.Response(200, content=json.dumps(tiny).encode())))
    await PRMRunner(scorers=(scorer,)).run(branch := chain(1, messages=True))
    await scorer.aclose()
    assert committed(branch) == [[1.0, 1.0]]


@pytest.mark.parametrize("kind", sorted(JUDGES))
async def test_an_answer_nested_too_deeply_is_a_located_service_error(monkeypatch, kind):
    # 41.19: a bare RecursionError.
    deep = b"[" * 100_000 + b"]" * 100_000
    text = await refused(judge_answering(monkeypatch, kind, 200, deep))
    assert "nested too deeply" in text


@pytest.mark.parametrize("kind", sorted(JUDGES))
async def test_a_key_echoed_by_the_server_never_reaches_a_message(monkeypatch, kind):
    # 41.14: a 401 body quoting the Authorization header put the key in the error message and traceback.
    # The key the scorer sent is redacted wherever it appears, and any bearer token (HTTPJudgeScorer sends no
    # key: the bearer token is what it can know).
    echoed = f', "key": "{KEY}"' if kind != "http" else ""
    body = f'{{"error": "bad header Authorization: Bearer {KEY}"{echoed}, "other": "bearer abc.def"}}'
    text = await refused(judge_answering(monkeypatch, kind, 401, body.encode()))
    assert "401" in text and KEY not in text and "abc.def" not in text and "[redacted]" in text, text


async def test_pooling_answers_must_hold_each_index_of_the_request_exactly_once(monkeypatch):
    # 41.3: duplicate indices in another order gave branch 0 the score of branch 2.
    from prm_jax.scorers._answers import AnswerReader

    read = AnswerReader("pooling_prm")
    rows = [{"index": 2, "data": 2}, {"index": 0, "data": 0}, {"index": 1, "data": 1}]
    assert [r["data"] for r in read.indexed(rows, 3, "here")] == [0, 1, 2]  # any order, each once
    for bad, needle in [([{"index": 2}, {"index": 2}, {"index": 0}], "index 2 appears more than once"),
                        ([{"index": 0}, {"index": 1}], r"answered 2 of 3 inputs \(index \[2\] missing\)"),
                        ([{"index": 0}, {"index": True}, {"index": 2}], "must be an integer in"),
                        ([{"index": 0}, {"index": 1}, {"index": 3}], "must be an integer in")]:
        with pytest.raises(ServiceError, match=needle):
            read.indexed(bad, 3, "here")
    answer = {"data": [{"index": 0, "data": [[0.1, 0.9]]}, {"index": 0, "data": [[0.8, 0.2]]}]}
    scorer = judge_answering(monkeypatch, "pooling", 200, json.dumps(answer).encode())
    with pytest.raises(ServiceError, match="index 0 appears more than once"):
        await PRMRunner(scorers=(scorer,)).run(chain(1, messages=True))
    await scorer.aclose()


@pytest.mark.parametrize("kind", ["openai_json", "classify"])
async def test_a_template_field_without_a_value_names_the_judge_the_turn_and_the_field(monkeypatch, kind):
    # 41.19: '{ctx[task]}' with no task in ctx gave a bare KeyError: 'task'.
    monkeypatch.setenv("JUDGE_KEY", KEY)
    cls = OpenAIJudgeScorer if kind == "openai_json" else ClassifyPRMScorer
    scorer = cls(URL, "m", prompt="Task {ctx[task]}: {response}", api_key_env="JUDGE_KEY")
    with pytest.raises(TemplateError) as info:
        await PRMRunner(scorers=(scorer,)).run(chain(1, messages=True), {"topic": "x"})
    await scorer.aclose()
    text = str(info.value)
    assert f"'{scorer.name}'" in text and "'t0'" in text and "{ctx[task]}" in text and "'topic'" in text, text


async def test_the_http_judges_list_of_scores_is_read_number_by_number(monkeypatch):
    scorer = judge_answering(monkeypatch, "http", 200, b'{"scores": [0.5, true]}')
    assert "'scores'[1] must be a number, got True" in await refused(scorer)
    scorer = judge_answering(monkeypatch, "http", 200, b'{"scores": [0.5, 0.25]}')
    await PRMRunner(scorers=(scorer,)).run(branch := chain(1, messages=True))
    await scorer.aclose()
    assert committed(branch) == [[0.5, 0.25]]
