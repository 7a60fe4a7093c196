"""The HTTP judge example against a real judge server on 127.0.0.1."""

import json
import socket
import threading
import time

import anyio
import pytest

from prm_jax import Interaction, InteractionCache, PRMRunner
from prm_jax.runtime import RetryError, call_with_retry
from prm_jax.scorers import HTTPJudgeScorer
from prm_jax.scorers._http_judge import JudgeError


class Judge:
    """A judge on 127.0.0.1 written on raw sockets, so it can answer the way real servers do: keep the
    connection open after a complete body, send chunked bodies, ``100 Continue``, huge bodies, or close
    mid-body. ``calls`` counts requests per path, ``connections`` accepted connections."""

    def __init__(self):
        self.calls: dict = {}
        self.connections = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn):
        with conn:
            reader = conn.makefile("rb")
            while not self.stop.is_set():
                request = reader.readline()
                if not request:
                    return
                path = request.split()[1].decode()
                headers = {}
                while (line := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                payload = json.loads(reader.read(int(headers["content-length"])))
                count = self.calls[path] = self.calls.get(path, 0) + 1
                try:
                    if not self._answer(conn, path, payload, count):
                        return
                except OSError:  # the client gave up (a deadline, a body too large): the point of the test
                    return

    def _answer(self, conn, path, payload, count) -> bool:
        """Sends the answer; False closes the connection."""
        def send(status, body, extra=b""):
            conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: " + str(len(body)).encode()
                         + b"\r\n" + extra + b"\r\n" + body)
        score = {"score": 1.0 if payload["output_messages"][0]["content"] == "good" else 0.0}
        if path == "/hang":
            time.sleep(2.0)
        if path == "/broken" or (path == "/flaky" and count <= 2):
            send(b"500 Internal Server Error", b"overloaded")
        elif path == "/garbage":
            send(b"200 OK", b"{not json")
        elif path == "/tokens":
            send(b"200 OK", json.dumps({"scores": [0.1 * i for i in range(payload["output_len"])]}).encode())
        elif path == "/chunked":
            body = json.dumps(score).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % 3 + body[:3]
                         + b"\r\n" + b"%x\r\n" % (len(body) - 3) + body[3:] + b"\r\n0\r\n\r\n")
        elif path == "/continue":
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            send(b"200 OK", json.dumps(score).encode())
        elif path == "/huge":  # 400 MB announced; the client must stop reading at its bound
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 400000000\r\n\r\n")
            chunk = b" " * (1 << 16)
            for _ in range(6000):
                conn.sendall(chunk)
            return False
        elif path == "/midbody":  # the connection closes after 10 of 100 bytes
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b'{"score": ')
            return False
        else:  # a complete body on a connection kept open (keep-alive): the client must not wait for a close
            send(b"200 OK", json.dumps(score).encode(), b"Connection: keep-alive\r\n")
        return True

    def close(self):
        self.stop.set()
        self.server.close()


@pytest.fixture
def judge():
    server = Judge()
    yield server
    server.close()


@pytest.fixture
def judge_url(judge):
    return judge.url


def session(*answers):
    turns, tokens = [], [1]
    for k, answer in enumerate(answers):
        turns.append(Interaction(f"t{k}", list(tokens), [5, 6, 7], parent_id=f"t{k - 1}" if k else None,
                                 output_messages=[{"role": "assistant", "content": answer}]))
        tokens = tokens + [5, 6, 7, 2]
    return InteractionCache(turns)


def run_judge(url, path, cache, **kwargs):
    async def main():
        scorer = HTTPJudgeScorer(url + path, **kwargs)
        try:
            return await PRMRunner(scorers=(scorer,)).run(cache)
        finally:
            await scorer.aclose()
    return anyio.run(main)


def test_judge_scores_each_turn(judge_url):
    cache = session("good", "bad", "good")
    run_judge(judge_url, "/score", cache)
    assert [i.token_rewards.tolist() for i in cache] == [[1.0] * 3, [0.0] * 3, [1.0] * 3]


def test_judge_per_token_scores(judge_url):
    cache = session("x")
    run_judge(judge_url, "/tokens", cache)
    assert cache.get("t0").token_rewards.tolist() == pytest.approx([0.0, 0.1, 0.2])


def test_flaky_judge_is_retried(judge):
    cache = session("good")
    run_judge(judge.url, "/flaky", cache, attempts=3, backoff=0.01)
    assert cache.get("t0").token_rewards.tolist() == [1.0] * 3 and judge.calls["/flaky"] == 3


def test_erroring_judge_rejects_after_the_attempt_cap(judge):
    cache = session("good")
    with pytest.raises(RetryError, match="failed 2 times") as info:
        run_judge(judge.url, "/broken", cache, attempts=2, backoff=0.01)
    assert "500" in str(info.value.__cause__) and judge.calls["/broken"] == 2
    assert cache.get("t0").token_rewards is None


def test_hanging_judge_hits_the_deadline(judge_url):
    cache = session("good", "good")
    start = time.monotonic()
    with pytest.raises(RetryError) as info:
        run_judge(judge_url, "/hang", cache, request_timeout=0.2, attempts=2, backoff=0.01)
    assert time.monotonic() - start < 1.5
    assert all(isinstance(e, TimeoutError) for e in info.value.errors)


def test_garbage_answer_is_an_error_at_once_not_retried(judge):
    # Issue 30: a malformed answer does not get better by asking again (the judge was asked 3 times).
    with pytest.raises(JudgeError, match="not valid JSON"):
        run_judge(judge.url, "/garbage", session("good"), attempts=3, backoff=0.01)
    assert judge.calls["/garbage"] == 1


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


# --- issue 20.12: a well-kept client, a bounded body, the protocol as servers speak it ------------------------

@pytest.mark.parametrize("path", ["/chunked", "/continue", "/keepalive"])
def test_chunked_100_continue_and_kept_alive_answers_are_read(judge, path):
    # The hand-written client read chunked bodies as "invalid JSON", failed on 100 Continue, and waited for
    # a close after a complete Content-Length body until every attempt timed out.
    cache = session("good", "bad")
    start = time.monotonic()
    run_judge(judge.url, path, cache, request_timeout=1.0, attempts=1)
    assert [i.token_rewards.tolist() for i in cache] == [[1.0] * 3, [0.0] * 3]
    assert time.monotonic() - start < 1.0


def test_kept_alive_connections_are_reused_across_turns(judge):
    async def main():
        scorer = HTTPJudgeScorer(judge.url + "/keepalive", attempts=1)
        try:
            for _ in range(4):
                await PRMRunner(scorers=(scorer,)).run(session("good"))
        finally:
            await scorer.aclose()
    anyio.run(main)
    assert judge.calls["/keepalive"] == 4 and judge.connections == 1


def test_a_huge_answer_is_refused_at_the_bound(judge):
    # 400 MB announced (the old client read it all: 2.27 GB, accepted); the bound stops at 1 MB by default.
    cache = session("good")
    with pytest.raises(JudgeError, match="larger than max_body_bytes=65536"):
        run_judge(judge.url, "/huge", cache, attempts=3, max_body_bytes=65536)
    assert judge.calls["/huge"] == 1  # not retried
    assert cache.get("t0").token_rewards is None


def test_a_connection_closed_mid_body_is_a_failed_attempt(judge):
    cache = session("good")
    with pytest.raises(RetryError, match="failed 2 times"):
        run_judge(judge.url, "/midbody", cache, attempts=2, backoff=0.01)
    assert judge.calls["/midbody"] == 2 and cache.get("t0").token_rewards is None


@pytest.mark.parametrize("kwargs,needle", [
    (dict(url="${JUDGE_URL}"), "unexpanded variable"),
    (dict(url="http://judge:port/x"), "url"),
    (dict(url="http://judge", request_timeout=0), "request_timeout must be > 0"),
    (dict(url="http://judge", attempts=True), "attempts must be an integer >= 1"),
    (dict(url="http://judge", max_body_bytes=-1), "max_body_bytes must be an integer >= 1"),
])
def test_kwargs_are_checked_without_opening_anything(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        HTTPJudgeScorer.validate_kwargs(**kwargs)
    with pytest.raises(ValueError, match=needle):
        HTTPJudgeScorer(**kwargs)


def test_the_per_attempt_timeout_comes_from_yaml(tmp_path, judge):
    from prm_jax.config._loader import load_config
    from prm_jax.runtime._specs import check_scorer_specs
    path = tmp_path / "judge.yaml"
    path.write_text(f"""
rollout:
  agent:
    prm:
      scorers:
        - path: prm_jax.scorers.HTTPJudgeScorer
          timeout: 5
          kwargs: {{url: "{judge.url}/hang", request_timeout: 0.2, attempts: 1}}
""")
    config = load_config(path)
    check_scorer_specs(config)
    runner = PRMRunner(config)
    start = time.monotonic()
    with pytest.raises(RetryError):
        anyio.run(runner.run, session("good"))
    assert time.monotonic() - start < 1.5  # 0.2 s per attempt, not the default 10 s
    anyio.run(runner.aclose)
