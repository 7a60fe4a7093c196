"""Issue 41 ("every judge parses through one answer reader"), the cases particular to one judge: top
log-probs summing to at most 1, indices each once (41.3), a template field without a value (41.19), the
HTTP judge's list of scores. The cases every served scorer shares (numbers only, finite, in range, fields
missing, nesting bounded, secrets redacted) run over each of them from its declarations in
``tests/scorers/test_every_served_scorer.py``."""

import json

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


# The judges these cases are about (the cases every served scorer shares are tests/scorers/test_every_served_scorer.py's).
JUDGES = {
    "openai_logprobs": lambda: OpenAIJudgeScorer(URL, "m", score="logprobs", api_key_env="JUDGE_KEY"),
    "http": lambda: HTTPJudgeScorer(URL),
    "pooling": lambda: PoolingPRMScorer(URL, "m", step_tag_id=99, api_key_env="JUDGE_KEY", max_wait=0.001),
}


def judge_answering(monkeypatch, kind, status, body: bytes):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    scorer = JUDGES[kind]()
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
