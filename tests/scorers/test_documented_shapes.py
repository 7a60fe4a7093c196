"""Issue 42.6: every built-in served scorer's request and answer shapes, pinned against the servers'
documented formats. The answers below are recorded as the servers' documentation shows them (field for
field; only the values a scorer reads are chosen): OpenAI's chat completion object, without and with
``logprobs`` (platform.openai.com/docs/api-reference/chat/object), vLLM's ``/pooling`` answer
(``PoolingResponse``: ``{"id", "object": "list", "created", "model", "data": [{"index", "object":
"pooling", "data"}], "usage"}``, the same for 0.8-0.10 and >= 0.11, whose request differs only by
``task``), and SGLang's ``/v1/classify`` (vLLM 0.7's classification API, its documented example). A
replay server answers each scorer with the recorded answer and keeps its request; the official ``openai``
client reads the recorded chat answers and sends our request bodies to the chat stub."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from prm_jax import Interaction, PRMRunner
from prm_jax.scorers import ClassifyPRMScorer, OpenAIJudgeScorer, PoolingPRMScorer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stub_servers import ChatServer, ReplayServer

pytestmark = pytest.mark.anyio

# OpenAI's documented chat completion object (the API reference's example; the content is the judge's score).
CHAT_COMPLETION = {
    "id": "chatcmpl-123", "object": "chat.completion", "created": 1677652288, "model": "gpt-4o-mini",
    "system_fingerprint": "fp_44709d6fcb",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "8", "refusal": None},
                 "logprobs": None, "finish_reason": "stop"}],
    "service_tier": "default",
    "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21,
              "completion_tokens_details": {"reasoning_tokens": 0, "accepted_prediction_tokens": 0,
                                            "rejected_prediction_tokens": 0}},
}
# The API reference's logprobs example: the first token "Hello" with its top log-probs.
CHAT_COMPLETION_LOGPROBS = {
    "id": "chatcmpl-123", "object": "chat.completion", "created": 1702685778, "model": "gpt-4o-mini",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello! How can I assist you today?"},
                 "logprobs": {"content": [
                     {"token": "Hello", "logprob": -0.31725305, "bytes": [72, 101, 108, 108, 111],
                      "top_logprobs": [{"token": "Hello", "logprob": -0.31725305, "bytes": [72, 101, 108, 108, 111]},
                                       {"token": "Hi", "logprob": -1.3190403, "bytes": [72, 105]}]},
                     {"token": "!", "logprob": -0.02380986, "bytes": [33],
                      "top_logprobs": [{"token": "!", "logprob": -0.02380986, "bytes": [33]},
                                       {"token": " there", "logprob": -3.787621, "bytes": [32, 116, 104, 101, 114, 101]}]},
                 ], "refusal": None}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 9, "total_tokens": 18}, "system_fingerprint": None,
}
# vLLM's PoolingResponse for a step-tag PRM with STEP pooling: one [p_bad, p_good] row per step tag.
POOLING = {
    "id": "pool-5b2c1a", "object": "list", "created": 1745383213, "model": "Qwen/Qwen2.5-Math-PRM-7B",
    "data": [{"index": 0, "object": "pooling", "data": [[0.0078125, 0.9921875], [0.7666015625, 0.2333984375]]}],
    "usage": {"prompt_tokens": 12, "total_tokens": 12, "completion_tokens": 0, "prompt_tokens_details": None},
}
# SGLang's /v1/classify (the vLLM 0.7 classification API's documented example).
CLASSIFY = {
    "id": "classify-9bf17f2847b046c99f5d8c3f5bc7e3a8", "object": "list", "created": 1745383213,
    "model": "jason9693/Qwen2.5-1.5B-apeach",
    "data": [{"index": 0, "label": "Default", "probs": [0.565970778465271, 0.4340292513370514], "num_classes": 2}],
    "usage": {"prompt_tokens": 10, "total_tokens": 10, "completion_tokens": 0, "prompt_tokens_details": None},
}


def turn(iid="t0", output=(5, 6)):
    return Interaction(iid, [1, 2], list(output), messages=[{"role": "user", "content": "What is 2 + 2?"}],
                       output_messages=[{"role": "assistant", "content": "4"}])


def test_the_recorded_chat_answers_are_what_the_official_client_reads():
    openai = pytest.importorskip("openai")
    for recorded in (CHAT_COMPLETION, CHAT_COMPLETION_LOGPROBS):
        parsed = openai.types.chat.ChatCompletion.model_validate(recorded)
        assert parsed.choices[0].message.role == "assistant"
    top = openai.types.chat.ChatCompletion.model_validate(CHAT_COMPLETION_LOGPROBS).choices[0].logprobs
    assert [t.token for t in top.content[0].top_logprobs] == ["Hello", "Hi"]


@pytest.mark.parametrize("logprobs", [False, True])
async def test_openai_judge_request_and_answer_match_the_documented_chat_completion(logprobs):
    recorded = CHAT_COMPLETION_LOGPROBS if logprobs else CHAT_COMPLETION
    with ReplayServer("/v1/chat/completions", recorded) as server:
        kwargs = dict(score="logprobs", logprob_tokens=["Hello"], top_logprobs=2) if logprobs else \
            dict(score_range=[0, 10])
        scorer = OpenAIJudgeScorer(server.url + "/v1", "gpt-4o-mini", extra_body={"temperature": 0.0}, **kwargs)
        branch = [turn()]
        await PRMRunner(scorers=(scorer,)).run(branch)
        await scorer.aclose()
    request = server.requests[0]
    # The documented request: model, messages [{role, content}], max_tokens, and logprobs / top_logprobs.
    assert set(request) == {"model", "messages", "max_tokens", "temperature"} | (
        {"logprobs", "top_logprobs"} if logprobs else set())
    assert request["model"] == "gpt-4o-mini" and request["messages"][-1]["role"] == "user"
    assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in request["messages"])
    if logprobs:
        assert request["logprobs"] is True and request["top_logprobs"] == 2
    want = math.exp(-0.31725305) if logprobs else 0.8  # P("Hello"); "8" on [0, 10]
    np.testing.assert_allclose(branch[0].token_rewards, [want, want], rtol=1e-6)


@pytest.mark.parametrize("logprobs", [False, True])
def test_our_request_bodies_are_what_the_official_client_sends(logprobs):
    openai = pytest.importorskip("openai")
    kwargs = dict(score="logprobs", logprob_tokens=["Yes"], top_logprobs=2) if logprobs else {}
    with ChatServer(lambda m: "Yes" if logprobs else "7", rate=1000.0) as server:
        scorer = OpenAIJudgeScorer(server.url + "/v1", "judge", extra_body={"temperature": 0.0, "seed": 7}, **kwargs)
        body = scorer.request([(turn(), {})])
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=5)
        done = client.chat.completions.create(**body)  # every key of ours is a documented parameter
        sent = server.requests[-1]
        assert {k: sent[k] for k in body} == body  # the client sends our body as it is
        want = pytest.approx(math.exp(-0.105)) if logprobs else 0.7
        assert scorer.read(done.model_dump(), [(turn(), {})], "here") == [want]


@pytest.mark.parametrize("task", ["token_classify", None])  # vLLM >= 0.11, vLLM 0.8-0.10
async def test_pooling_prm_request_and_answer_match_vllms_pooling_api(task):
    with ReplayServer("/pooling", POOLING) as server:
        scorer = PoolingPRMScorer(server.url, "Qwen/Qwen2.5-Math-PRM-7B", step_tag_id=99, task=task,
                                  step_separator=[[271]], spread="step", max_wait=0.01)
        branch = [turn(output=(11, 271, 12))]
        await PRMRunner(scorers=(scorer,)).run(branch)
        await scorer.aclose()
    request = server.requests[0]
    assert request == {"model": "Qwen/Qwen2.5-Math-PRM-7B", "input": [[1, 2, 11, 271, 99, 12, 99]],
                       **({"task": task} if task else {})}
    np.testing.assert_allclose(branch[0].token_rewards, [0.9921875, 0.9921875, 0.2333984375], rtol=1e-7)


async def test_classify_prm_request_and_answer_match_sglangs_classify_api():
    with ReplayServer("/v1/classify", CLASSIFY) as server:
        scorer = ClassifyPRMScorer(server.url, "jason9693/Qwen2.5-1.5B-apeach")
        branch = [turn()]
        await PRMRunner(scorers=(scorer,)).run(branch)
        await scorer.aclose()
    request = server.requests[0]
    assert set(request) == {"model", "input"} and isinstance(request["input"], str)
    assert request["input"] == "user: What is 2 + 2?\nassistant: 4"
    np.testing.assert_allclose(branch[0].token_rewards, [0.4340292513370514] * 2, rtol=1e-7)


@pytest.mark.parametrize("recorded, path, make", [
    (CHAT_COMPLETION, "/v1/chat/completions", lambda url: OpenAIJudgeScorer(url + "/v1", "gpt-4o-mini")),
    ({**POOLING, "data": [{"index": 0, "object": "pooling", "data": [[0.0078125, 0.9921875]]}]},  # one tag
     "/pooling", lambda url: PoolingPRMScorer(url, "Qwen/Qwen2.5-Math-PRM-7B", step_tag_id=99)),
    (CLASSIFY, "/v1/classify", lambda url: ClassifyPRMScorer(url, "jason9693/Qwen2.5-1.5B-apeach")),
])
async def test_the_probe_reads_the_documented_answers(recorded, path, make):
    with ReplayServer(path, recorded) as server:
        scorer = make(server.url)
        probe = await scorer.probe()
        await scorer.aclose()
    assert probe.ok and probe.status == "HTTP 200 OK" and probe.model == recorded["model"], probe
