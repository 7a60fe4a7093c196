"""The HTTP judge example against a real judge server on 127.0.0.1."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import pytest

from prm_jax import Interaction, InteractionCache, PRMRunner, RetryError, call_with_retry
from prm_jax.scorers import HTTPJudgeScorer


class Judge(BaseHTTPRequestHandler):
    calls: dict = {}

    def log_message(self, *args):
        pass

    def do_POST(self):
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        count = Judge.calls[self.path] = Judge.calls.get(self.path, 0) + 1
        if self.path == "/hang":
            time.sleep(2.0)
        if self.path == "/broken" or (self.path == "/flaky" and count <= 2):
            return self._send(500, b"overloaded")
        if self.path == "/garbage":
            return self._send(200, b"{not json")
        if self.path == "/tokens":
            return self._send(200, json.dumps({"scores": [0.1 * i for i in range(payload["output_len"])]}).encode())
        score = 1.0 if payload["output_messages"][0]["content"] == "good" else 0.0
        return self._send(200, json.dumps({"score": score}).encode())

    def _send(self, status, body):
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on a hanging judge: that is the point of the test


@pytest.fixture
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    server.daemon_threads = True
    Judge.calls = {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def session(*answers):
    turns, tokens = [], [1]
    for k, answer in enumerate(answers):
        turns.append(Interaction(f"t{k}", list(tokens), [5, 6, 7], parent_id=f"t{k - 1}" if k else None,
                                 output_messages=[{"role": "assistant", "content": answer}]))
        tokens = tokens + [5, 6, 7, 2]
    return InteractionCache(turns)


def run_judge(url, path, cache, **kwargs):
    async def main():
        runner = PRMRunner(scorers=(HTTPJudgeScorer(url + path, **kwargs),))
        return await runner.run(cache)
    return anyio.run(main)


def test_judge_scores_each_turn(judge_url):
    cache = session("good", "bad", "good")
    run_judge(judge_url, "/score", cache)
    assert [i.token_rewards.tolist() for i in cache] == [[1.0] * 3, [0.0] * 3, [1.0] * 3]


def test_judge_per_token_scores(judge_url):
    cache = session("x")
    run_judge(judge_url, "/tokens", cache)
    assert cache.get("t0").token_rewards.tolist() == pytest.approx([0.0, 0.1, 0.2])


def test_flaky_judge_is_retried(judge_url):
    cache = session("good")
    run_judge(judge_url, "/flaky", cache, attempts=3, backoff=0.01)
    assert cache.get("t0").token_rewards.tolist() == [1.0] * 3 and Judge.calls["/flaky"] == 3


def test_erroring_judge_rejects_after_the_attempt_cap(judge_url):
    cache = session("good")
    with pytest.raises(RetryError, match="failed 2 times") as info:
        run_judge(judge_url, "/broken", cache, attempts=2, backoff=0.01)
    assert "500" in str(info.value.__cause__) and Judge.calls["/broken"] == 2
    assert cache.get("t0").token_rewards is None


def test_hanging_judge_hits_the_deadline(judge_url):
    cache = session("good", "good")
    start = time.monotonic()
    with pytest.raises(RetryError) as info:
        run_judge(judge_url, "/hang", cache, timeout=0.2, attempts=2, backoff=0.01)
    assert time.monotonic() - start < 1.5
    assert all(isinstance(e, TimeoutError) for e in info.value.errors)


def test_garbage_answer_is_an_error(judge_url):
    with pytest.raises(RetryError, match="invalid JSON"):
        run_judge(judge_url, "/garbage", session("good"), attempts=1)


def test_call_with_retry_arguments_and_cancellation():
    async def never():
        await anyio.sleep_forever()

    async def main():
        with pytest.raises(ValueError, match="timeout"):
            await call_with_retry(never, timeout=0)
        with pytest.raises(ValueError, match="attempts"):
            await call_with_retry(never, timeout=1, attempts=0)
        with anyio.move_on_after(0.05) as scope:
            await call_with_retry(never, timeout=10, attempts=5)
        assert scope.cancelled_caught  # cancellation is not retried

    anyio.run(main)


def test_non_retryable_errors_propagate_at_once():
    calls = []

    async def fails():
        calls.append(1)
        raise KeyError("bug")

    async def main():
        with pytest.raises(KeyError):
            await call_with_retry(fails, timeout=1, attempts=3, retry_on=(OSError,))

    anyio.run(main)
    assert calls == [1]


def test_url_validation():
    with pytest.raises(ValueError, match="http://"):
        HTTPJudgeScorer("ftp://judge")
