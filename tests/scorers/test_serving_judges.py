"""Issue 30, section 3: the judges on the protocols serving stacks speak (OpenAI-compatible chat
completions, vLLM's /pooling), on one client-side rate and concurrency limiter, against stub servers on
127.0.0.1 (tests/stub_servers.py) that follow the published schemas."""

import email.utils
import math
import sys
import time
from pathlib import Path

import anyio
import numpy as np
import pytest

from prm_jax import Interaction, InteractionCache, PRMRunner, score_arrays
from prm_jax.errors import NoTextError, ServiceError
from prm_jax.runtime import call_with_retry
from prm_jax.runtime._limits import RequestLimiter, retry_after_seconds, retry_delay, should_retry
from prm_jax.scorers import HTTPJudgeScorer, OpenAIJudgeScorer, PoolingPRMScorer
from prm_jax.scorers._pooling_prm import branch_tokens

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stub_servers import ChatServer, PoolingServer, answer_seven, server_process

pytestmark = pytest.mark.anyio


def session(answers, prefix="s"):
    """A branch whose turn k answers ``answers[k]`` to the question ``q{k}``."""
    turns, tokens = [], [1]
    for k, answer in enumerate(answers):
        turns.append(Interaction(f"{prefix}t{k}", list(tokens), [5 + k, 6, 7], parent_id=f"{prefix}t{k - 1}" if k else None,
                                 messages=[{"role": "user", "content": f"q{k}"}],
                                 output_messages=[{"role": "assistant", "content": answer}]))
        tokens = tokens + [5 + k, 6, 7, 2]
    return InteractionCache(turns).branches()[0]


def grade(messages):
    """The stub judge: 9 when the reply under judgement says 'good', else 2."""
    return "9" if "Reply:\ngood" in messages[-1]["content"] else "2"


# --- the stub is faithful: the official openai client reads it ---------------------------------------------

def test_the_chat_stub_speaks_what_the_official_openai_client_reads():
    openai = pytest.importorskip("openai")
    with ChatServer(lambda m: "Yes", capacity=1, rate=1000.0, api_key="sk-test") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0, timeout=5)
        done = client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "ok?"}],
                                              max_tokens=4, logprobs=True, top_logprobs=2)
        assert done.choices[0].message.content == "Yes" and done.choices[0].finish_reason == "stop"
        top = done.choices[0].logprobs.content[0].top_logprobs
        assert [t.token for t in top] == ["Yes", "No"] and math.isclose(top[0].logprob, -0.105)
        assert done.usage.total_tokens >= 1
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
        bad_key = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0, timeout=5)
        with pytest.raises(openai.AuthenticationError):
            bad_key.chat.completions.create(model="judge", messages=[{"role": "user", "content": "x"}])
    with ChatServer(lambda m: "1", capacity=1, rate=1.0, burst=1.0) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=5)
        client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "x"}])
        assert info.value.response.headers["retry-after"] == "1"
        assert 0 < int(info.value.response.headers["retry-after-ms"]) <= 1001


# --- OpenAIJudgeScorer ----------------------------------------------------------------------------------------

async def test_openai_judge_sends_the_template_and_reads_the_score(monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    with ChatServer(grade, api_key="sk-judge") as server:
        scorer = OpenAIJudgeScorer(server.url + "/v1", "judge", api_key_env="JUDGE_KEY", system="Be strict.",
                                   prompt="Task {ctx[task]}.\nConversation so far:\n{prompt}\n\nReply:\n{response}",
                                   extra_body={"temperature": 0.0, "seed": 7})
        branch = session(["good", "bad"])
        async with PRMRunner(scorers=(scorer,)) as runner:
            await runner.run(branch, {"task": "math"})
        await scorer.aclose()
    assert [t.token_rewards.tolist() for t in branch] == [[np.float32(0.9)] * 3, [np.float32(0.2)] * 3]  # 9/10, 2/10
    first = next(r for r in server.requests if "Reply:\ngood" in r["messages"][-1]["content"])
    assert first["model"] == "judge" and first["max_tokens"] == 16 and first["temperature"] == 0.0
    assert first["seed"] == 7 and first["messages"][0] == {"role": "system", "content": "Be strict."}
    assert first["messages"][1]["content"] == "Task math.\nConversation so far:\nuser: q0\n\nReply:\ngood"


@pytest.mark.parametrize("mode,answer,kwargs,expected", [
    ("json", '{"score": 0.75}', dict(score_range=None), 0.75),
    ("json", '{"verdict": {"x": 1}, "score": 3}', dict(score_range=[1, 5]), 0.5),
    ("regex", "Score: 7/10", dict(pattern=r"Score: (\d+)"), 0.7),
    ("logprobs", "Yes", dict(logprob_tokens=["Yes"]), math.exp(-0.105)),
    ("logprobs", "Yes", dict(logprob_tokens=["Yes", "Maybe"], top_logprobs=3), math.exp(-0.105) + math.exp(-4.7)),
])
async def test_openai_judge_score_modes(mode, answer, kwargs, expected):
    with ChatServer(lambda m: answer) as server:
        scorer = OpenAIJudgeScorer(server.url + "/v1", "judge", score=mode, **kwargs)
        branch = session(["a"])
        await PRMRunner(scorers=(scorer,)).run(branch)
        await scorer.aclose()
    assert branch[0].token_rewards.tolist() == [np.float32(expected)] * 3
    if mode == "logprobs":
        assert server.requests[0]["logprobs"] is True and server.requests[0]["top_logprobs"] == kwargs.get(
            "top_logprobs", 5)


@pytest.mark.parametrize("answer,needle", [("11", r"outside score_range \[0.0, 10.0\]"),
                                           ("no idea", "no score in the answer"), ("nan", "no score")])
async def test_openai_judge_refuses_an_answer_without_a_usable_score_at_once(answer, needle):
    with ChatServer(lambda m: answer) as server:
        scorer = OpenAIJudgeScorer(server.url + "/v1", "judge", attempts=3)
        with pytest.raises(ServiceError, match=needle):
            await PRMRunner(scorers=(scorer,)).run(session(["a"]))
        await scorer.aclose()
    assert len(server.requests) == 1  # a bad answer is not asked again


async def test_no_judge_scores_a_turn_it_received_no_text_for():
    # Issue 30: through score_arrays the old judge sent empty messages and every turn scored a silent 0.5.
    with ChatServer(grade) as chat:
        judges = [OpenAIJudgeScorer(chat.url + "/v1", "judge"), HTTPJudgeScorer(chat.url + "/v1/x")]
        for judge in judges:
            tokens = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
            out = await score_arrays(PRMRunner(scorers=(judge,)), tokens, np.array([[-1, 0, 0, 1]] * 2),
                                     on_error="mask")
            assert out.failed.tolist() == [True, True] and np.isnan(out.token_rewards[:, 1:]).all()
            assert "'row0/t0' has no output" in out.errors[0] or "'row0/t1' has no output" in out.errors[0]
            with pytest.raises(NoTextError, match=r"interaction 'row0/t\d' has no output"):
                await score_arrays(PRMRunner(scorers=(judge,)), tokens[:1], np.array([[-1, 0, 0, 1]]))
            await judge.aclose()
        assert chat.requests == []


@pytest.mark.parametrize("kwargs,needle", [
    (dict(model=""), "model must be"),
    (dict(prompt="{reply}"), r"unknown fields \['reply'\]"),
    (dict(prompt="{prompt"), "not a valid str.format template"),
    (dict(score="vibes"), "score must be one of"),
    (dict(pattern="no group"), "needs one group"),
    (dict(score_range=[5, 5]), "lo < hi"),
    (dict(extra_body={"messages": []}), r"must not set \['messages'\]"),
    (dict(api_key_env="sk-abc123 key"), "must name an environment variable"),
    (dict(max_requests_per_second=0), "max_requests_per_second"),
    (dict(base_url="${JUDGE}"), "unexpanded variable"),
])
def test_openai_judge_kwargs_are_checked_without_opening_anything(kwargs, needle):
    settings = dict(base_url="http://127.0.0.1:1/v1", model="judge") | kwargs
    with pytest.raises(ValueError, match=needle):
        OpenAIJudgeScorer.validate_kwargs(**settings)


def test_the_api_key_comes_from_the_named_environment_variable_only(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(ValueError, match=r"NO_SUCH_KEY \(api_key_env\) is not set"):
        OpenAIJudgeScorer("http://127.0.0.1:1/v1", "judge", api_key_env="NO_SUCH_KEY")


# --- the limiter and the retry rules --------------------------------------------------------------------------

async def test_the_judge_within_the_servers_limits_drops_nothing_and_asks_once_per_turn():
    # Issue 30's judge workload in small: a server with 4 in flight and 200 req/s, 429 beyond. With its
    # published limits set, no request is refused and none is repeated. The server runs in a process of its
    # own, as a real one does: in this process its threads waited for the GIL behind the client's event
    # loop, and a request that arrived 10 ms late made a burst the server's bucket refused (CI, stop 37).
    # Its bucket holds 50 ms of its rate (10 requests): the stub counts a request when its process gets to
    # it, and on two cores a compile in the other test worker delays it by tens of milliseconds, so requests
    # the client spaced arrive together (a bucket of 4 refused one there, stop 38). A client at twice the
    # rate still overflows it within 0.1 s.
    branches = [session(["good", "bad", "good", "bad"], prefix=f"b{i}") for i in range(24)]
    with server_process("chat", answer=answer_seven, capacity=4, rate=200.0, service_s=0.002, burst=10.0) as server:
        scorer = OpenAIJudgeScorer(server["url"] + "/v1", "judge", max_concurrency=4, max_requests_per_second=200)
        runner = PRMRunner(scorers=(scorer,))
        started = time.perf_counter()
        results = await runner.run_many(branches, return_exceptions=True)
        wall = time.perf_counter() - started
        stats = runner.scorer_stats()["openai_judge"]
        await scorer.aclose()
    assert not [r for r in results if isinstance(r, Exception)]
    summary = server["summary"]
    assert summary["statuses"] == {200: 96} and summary["most_in_flight"] <= 4
    assert stats["requests_sent"] == 96 and stats["retries"] == 0 and stats["calls"] == 96
    assert wall >= 95 / 200  # paced: the rate holds


async def test_without_limits_429s_are_retried_after_retry_after_and_every_turn_scores():
    branches = [session(["good", "bad"], prefix=f"b{i}") for i in range(16)]
    with ChatServer(grade, capacity=2, rate=400.0, service_s=0.01) as server:
        scorer = OpenAIJudgeScorer(server.url + "/v1", "judge", max_concurrency=None, attempts=8, backoff=0.01)
        runner = PRMRunner(scorers=(scorer,))
        results = await runner.run_many(branches, return_exceptions=True)
        stats = runner.scorer_stats()["openai_judge"]
        await scorer.aclose()
    assert not [r for r in results if isinstance(r, Exception)]
    assert server.statuses[429] > 0 and server.statuses[200] == 32
    assert stats["retries"] == server.statuses[429] and stats["rate_limit_waits"] > 0


@pytest.mark.parametrize("status,sent", [(400, 1), (401, 1), (404, 1), (422, 1), (500, 3), (503, 3), (429, 3)])
async def test_only_retryable_answers_are_retried(status, sent):
    # Issue 30: the old judge retried a 422 three times.
    with ChatServer(grade, fail=lambda payload: status) as server:
        scorer = OpenAIJudgeScorer(server.url + "/v1", "judge", attempts=3, backoff=0.001)
        with pytest.raises(Exception) as info:
            await PRMRunner(scorers=(scorer,)).run(session(["good"]))
        await scorer.aclose()
    assert len(server.requests) == sent
    error = info.value if sent == 1 else info.value.__cause__
    assert isinstance(error, ServiceError) and error.status == status


def test_retry_after_is_read_in_milliseconds_seconds_and_dates():
    assert retry_after_seconds({"retry-after-ms": "250", "Retry-After": "3"}) == 0.25
    assert retry_after_seconds({"Retry-After": "3"}) == 3.0
    date = email.utils.formatdate(1_000_010.0, usegmt=True)
    assert retry_after_seconds({"Retry-After": date}, now=1_000_000.0) == 10.0
    assert retry_after_seconds({"Retry-After": "soon"}) is None and retry_after_seconds({}) is None
    assert retry_after_seconds({"Retry-After": "-1"}) is None


def test_retry_waits_are_the_servers_or_fully_jittered():
    told = ServiceError("429", status=429, retryable=True, retry_after=1.5)
    assert retry_delay(told, 1, 0.1, 5.0) == 1.5
    draws = [retry_delay(ConnectionError(), 3, 0.1, 5.0) for _ in range(400)]
    assert 0.0 <= min(draws) and max(draws) <= 0.4 and len(set(draws)) > 300  # uniform in [0, 0.1 * 2^2]
    assert abs(np.mean(draws) - 0.2) < 0.03
    assert max(retry_delay(ConnectionError(), 30, 0.1, 5.0) for _ in range(50)) <= 5.0


def test_what_is_worth_retrying():
    httpx = pytest.importorskip("httpx")
    assert should_retry(ConnectionError()) and should_retry(TimeoutError()) and should_retry(httpx.ReadTimeout("x"))
    assert not should_retry(ServiceError("bad", status=422)) and should_retry(ServiceError("busy", retryable=True))
    assert not should_retry(KeyError("bug")) and not should_retry(ValueError("bad input"))


async def test_call_with_retry_keeps_the_rules_for_any_caller():
    calls = []

    async def refused():
        calls.append(1)
        raise ServiceError("422", status=422)

    with pytest.raises(ServiceError):
        await call_with_retry(refused, timeout=1, attempts=3)  # never retried, whatever retry_on says
    with pytest.raises(ServiceError):
        await call_with_retry(refused, timeout=1, attempts=3, retry_on=(Exception,))
    assert len(calls) == 2
    flaky = iter([ConnectionError("reset"), ConnectionError("reset"), None])

    async def recovers():
        error = next(flaky)
        if error is not None:
            raise error
        return 1.0

    assert await call_with_retry(recovers, timeout=1, attempts=3, backoff=0.001) == 1.0


async def test_the_limiter_paces_starts_and_bounds_requests_in_flight():
    limiter = RequestLimiter(max_concurrency=3, max_requests_per_second=100.0)
    starts, now, most = [], [0], [0]

    async def one():
        async with limiter.request():
            starts.append(time.monotonic())
            now[0] += 1
            most[0] = max(most[0], now[0])
            await anyio.sleep(0.005)
            now[0] -= 1

    async with anyio.create_task_group() as group:
        for _ in range(21):
            group.start_soon(one)
    gaps = np.diff(sorted(starts))
    assert most[0] <= 3 and limiter.requests == 21
    assert starts and max(starts) - min(starts) >= 0.2 - 0.005  # 21 starts, 10 ms apart
    assert gaps.min() >= 0.01 - 0.002
    limiter.hold(0.1)
    before = time.monotonic()
    await one()
    assert time.monotonic() - before >= 0.095


# --- PoolingPRMScorer -----------------------------------------------------------------------------------------

TAG = 99


def step_score(prefix):
    """The stub PRM: a step is good in proportion to its last output token."""
    return (prefix[-1] % 10) / 10


def tree_branches(n, turns=4, prefix="p"):
    out = []
    for i in range(n):
        tokens, chain = [1, 2], []
        for k in range(turns):
            output = [10 + i, 20 + k, (i + k) % 10 + 30]
            chain.append(Interaction(f"{prefix}{i}t{k}", list(tokens), output,
                                     parent_id=chain[-1].interaction_id if chain else None))
            tokens = tokens + output + [3, 4]
        out.append(chain)
    return out


@pytest.mark.parametrize("spread", ["turn", "tokens"])
async def test_pooling_prm_batches_branches_and_scores_every_turn_from_the_leaf(spread):
    branches = tree_branches(16)
    with PoolingServer(step_score, step_tag_id=TAG) as server:
        scorer = PoolingPRMScorer(server.url, "prm", step_tag_id=TAG, max_batch_size=8, max_wait=1.0, spread=spread)
        runner = PRMRunner(scorers=(scorer,))
        await runner.run_many(branches, limit=None)
        await scorer.aclose()
    assert len(server.requests) == 2 and [len(r["input"]) for r in server.requests] == [8, 8]
    assert all(r["task"] == "token_classify" for r in server.requests)
    # Each branch's context once: its leaf's tokens plus one tag per turn (per-turn requests re-sent it).
    assert server.tokens_received == sum(len(c[-1].input_tokens) + c[-1].output_len + len(c) for c in branches)
    for chain in branches:
        for turn in chain:
            p = np.float32(step_score(list(turn.output_tokens)))
            expected = [p] * 3 if spread == "turn" else [np.float32(float(p) / 3)] * 3
            np.testing.assert_allclose(turn.token_rewards, expected, rtol=1e-6)


def test_the_pooling_request_is_the_leaf_with_a_tag_after_each_turn():
    chain = tree_branches(1, turns=2)[0]
    assert branch_tokens(chain, TAG).ids == [1, 2, 10, 20, 30, TAG, 3, 4, 10, 21, 31, TAG]
    broken = [chain[0], Interaction("x", [1, 2, 10, 20, 31, 3, 4], [5], parent_id=chain[0].interaction_id)]
    with pytest.raises(ValueError, match="input_tokens must start with its parent"):
        branch_tokens(broken, TAG)


async def test_pooling_prm_task_for_older_vllm_and_located_errors():
    with PoolingServer(step_score, step_tag_id=TAG) as server:
        scorer = PoolingPRMScorer(server.url, "prm", step_tag_id=TAG, task=None, max_wait=0.01)
        await PRMRunner(scorers=(scorer,)).run(tree_branches(1)[0])
        assert "task" not in server.requests[0]  # vLLM 0.8-0.10: no task field
        own_tag = [Interaction("a", [1], [TAG, 5])]
        with pytest.raises(ValueError, match=r"the output of turn .a. holds step_tag_id 99 1 time\(s\)"):
            await PRMRunner(scorers=(scorer,)).run(own_tag)
        await scorer.aclose()
    with PoolingServer(step_score, step_tag_id=TAG + 1) as server:  # the model's tag is another token
        scorer = PoolingPRMScorer(server.url, "prm", step_tag_id=TAG, max_wait=0.01)
        with pytest.raises(ServiceError, match=r"expected one row per step tag \(4\), got 0"):
            await PRMRunner(scorers=(scorer,)).run(tree_branches(1)[0])
        await scorer.aclose()


async def test_a_server_that_fixes_its_pooling_task_refuses_once_naming_the_settings_to_change():
    # Issue 55.22: vLLM (from v0.21) fixes the pooling task when it starts (--pooler-config.task) and refuses a
    # request naming another ("Unsupported task"). The scorer says which settings to change: each batch in
    # flight fails with that one error (a 400 is not retried), and every batch after it without a request.
    branches = tree_branches(6)
    with PoolingServer(step_score, step_tag_id=TAG, fixed_task="classify") as server:
        scorer = PoolingPRMScorer(server.url, "prm", step_tag_id=TAG, max_batch_size=2, max_wait=0.01)
        runner = PRMRunner(scorers=(scorer,))
        results = await runner.run_many(branches, return_exceptions=True)
        sent = len(server.requests)
        assert sent <= 3  # (three batches, none retried)
        later = await runner.run_many(tree_branches(4, prefix="q"), return_exceptions=True)
        await scorer.aclose()
        assert len(server.requests) == sent and all(isinstance(r, ServiceError) for r in later)
    assert all(isinstance(r, ServiceError) for r in results), results
    message = str(results[0])
    assert "the server refused the per-request pooling task 'token_classify'" in message and "Unsupported task" in message
    assert "set the scorer's kwargs task: null, or start the server with --pooler-config.task token_classify" in message
    assert len({str(r) for r in results}) == 1  # one cause, said once by the command line
    with PoolingServer(step_score, step_tag_id=TAG, fixed_task="token_classify") as server:  # task: null works
        scorer = PoolingPRMScorer(server.url, "prm", step_tag_id=TAG, task=None, max_wait=0.01)
        await PRMRunner(scorers=(scorer,)).run(tree_branches(1)[0])
        await scorer.aclose()
        assert "task" not in server.requests[0]


# --- ClassifyPRMScorer (SGLang's /v1/classify) ------------------------------------------------------------

async def test_classify_prm_scores_each_turn_by_classifying_the_conversation_through_it():
    def good_if_correct(text):
        return 0.9 if text.rstrip().endswith("correct") else 0.2

    with ChatServer(grade, classify=good_if_correct, model="rm") as server:
        from prm_jax.scorers import ClassifyPRMScorer

        scorer = ClassifyPRMScorer(server.url, "rm", max_concurrency=2)
        branch = session(["correct", "wrong", "correct"])
        await PRMRunner(scorers=(scorer,)).run(branch)
        await scorer.aclose()
    assert [t.token_rewards.tolist() for t in branch] == [[np.float32(0.9)] * 3, [np.float32(0.2)] * 3,
                                                          [np.float32(0.9)] * 3]
    inputs = sorted(r["input"] for r in server.requests)
    assert inputs[0] == "user: q0\nassistant: correct" and len(inputs) == 3  # the conversation through the turn
    with pytest.raises(ValueError, match=r"\['score'\] set how a chat answer is read"):
        ClassifyPRMScorer("http://127.0.0.1:1", "rm", score="logprobs")
