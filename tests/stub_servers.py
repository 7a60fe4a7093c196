"""Stub servers that speak the serving stacks' protocols, for tests and benchmarks/bench_scorers.py.

Each listens on 127.0.0.1 only (port 0: the system picks), serves in daemon threads, and stops by itself
after ``lifetime`` seconds if nobody stops it first. They follow the published request and response
schemas:

- ``ChatServer``: OpenAI's ``POST /v1/chat/completions`` (what vLLM, SGLang and OpenAI serve) with the
  published limits of a real deployment: ``capacity`` requests in flight and ``rate`` requests per second;
  beyond either it answers ``429`` with ``Retry-After`` (and ``retry-after-ms``), as OpenAI does. The answer
  is a chat completion whose content is a score (``answer(messages)``), with ``logprobs`` when asked.
  ``service_s`` is the time one request takes.
- ``ChatServer(classify=...)`` also answers SGLang's ``POST /v1/classify`` (the vLLM 0.7 classification
  API): ``{"model", "input": text}`` -> one ``probs`` distribution for the text.
- ``PoolingServer``: vLLM's ``POST /pooling`` for a process reward model with ``STEP`` pooling
  (``token_classify`` in vLLM >= 0.11, the default ``encode`` before): one ``[p_bad, p_good]`` row per
  step-tag token of each input. ``engine_s(tokens)`` is the engine's time for a request of that many tokens
  (one forward for the batch).
- ``SandboxFusionServer``: SandboxFusion's ``POST /run_code`` (``RunCodeRequest`` -> ``RunCodeResponse``),
  running each program in prm-jax's local sandbox, with the request's files beside it in its working
  folder; ``fail(payload)`` may answer a status first (a 503 the client retries).
- ``PromptLogprobServer``: a teacher's prompt log-probs, on vLLM's ``POST /v1/completions`` with
  ``prompt_logprobs`` and SGLang's ``POST /generate`` with ``return_logprob`` (one forward per request, no
  token generated that anyone reads).
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _HTTPServer(ThreadingHTTPServer):
    request_queue_size = 1024  # a real server's listen backlog (socketserver's default is 5)
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that closed its keep-alive connection is normal (a run that ended): not a traceback."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Server:
    def __init__(self, lifetime: float):
        handler = self._handler()
        self.httpd = _HTTPServer(("127.0.0.1", 0), handler)
        self.requests: list[dict[str, Any]] = []
        self.statuses: dict[int, int] = {}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()
        self._timer = threading.Timer(lifetime, self.close)
        self._timer.daemon = True
        self._timer.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self._timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def count(self, status: int) -> None:
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real servers

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                try:
                    payload = json.loads(body)
                except json.JSONDecodeError:
                    self.reply(400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}})
                    return
                server.handle(self, self.path, payload)

            def reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
                server.count(status)

        return Handler

    def handle(self, request: Any, path: str, payload: Any) -> None:
        raise NotImplementedError


def _error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class ChatServer(_Server):
    """OpenAI-compatible chat completions with a capacity and a rate limit (see the module docstring)."""

    def __init__(self, answer: Callable[[list[dict[str, Any]]], str], *, capacity: int = 16, rate: float = 250.0,
                 service_s: float = 0.0, model: str = "judge", api_key: str | None = None,
                 lifetime: float = 120.0, fail: Callable[[dict[str, Any]], int | None] | None = None,
                 burst: float = 4.0, classify: Callable[[str], float] | None = None):
        self.classify = classify  # SGLang's /v1/classify: P(label 1) of an input text
        self.answer, self.capacity, self.rate, self.service_s = answer, capacity, rate, service_s
        self.burst = burst
        self.model, self.api_key, self.fail = model, api_key, fail
        self.in_flight = self.most_in_flight = 0
        self._bucket, self._bucket_at = burst, time.monotonic()
        super().__init__(lifetime)

    def _admit(self) -> float | None:
        """None when the request may run, else the seconds the client should wait (a 429)."""
        with self.lock:
            now = time.monotonic()
            # A token bucket: `rate` tokens a second, at most `burst` saved up (a gateway's few requests
            # of slack); beyond it, or beyond `capacity` requests in flight, a 429.
            self._bucket = min(self.burst, self._bucket + (now - self._bucket_at) * self.rate)
            self._bucket_at = now
            if self.in_flight >= self.capacity:
                return max(self.service_s, 1.0 / self.rate)
            if self._bucket < 1.0 - 1e-9:
                return (1.0 - self._bucket) / self.rate
            self._bucket -= 1.0
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            return None

    def handle(self, request: Any, path: str, payload: Any) -> None:
        with self.lock:
            self.requests.append(payload)
        if path == "/v1/classify" and self.classify is not None:
            if payload.get("model") != self.model or not isinstance(payload.get("input"), str):
                request.reply(400, _error("'model' and a string 'input' are required"))
                return
            good = self.classify(payload["input"])
            request.reply(200, {"id": f"classify-{len(self.requests)}", "object": "list", "created": int(time.time()),
                                "model": self.model, "data": [{"index": 0, "label": "Default",
                                                               "probs": [1.0 - good, good], "num_classes": 2}],
                                "usage": {"prompt_tokens": len(payload["input"].split()), "completion_tokens": 0,
                                          "total_tokens": len(payload["input"].split()),
                                          "prompt_tokens_details": None}})
            return
        if path != "/v1/chat/completions":
            request.reply(404, _error(f"no route {path}", "not_found_error"))
            return
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            request.reply(401, _error("invalid api key", "authentication_error"))
            return
        if not isinstance(payload.get("model"), str) or not isinstance(payload.get("messages"), list):
            request.reply(400, _error("'model' and 'messages' are required"))
            return
        if payload["model"] != self.model:
            request.reply(404, _error(f"the model {payload['model']!r} does not exist", "not_found_error"))
            return
        status = self.fail(payload) if self.fail is not None else None
        if status is not None:
            request.reply(status, _error(f"stub failure {status}", "server_error"))
            return
        wait = self._admit()
        if wait is not None:
            request.reply(429, _error("rate limit reached", "rate_limit_exceeded"),
                          {"Retry-After": str(max(1, math.ceil(wait))), "retry-after-ms": str(int(wait * 1000) + 1)})
            return
        try:
            if self.service_s:
                time.sleep(self.service_s)
            content = self.answer(payload["messages"])
        finally:
            with self.lock:  # the engine is done: the slot is free before the bytes are sent (as vLLM's is)
                self.in_flight -= 1
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": content}, "logprobs": None}
        if payload.get("logprobs"):
            top = int(payload.get("top_logprobs") or 1)
            first = content.split()[0] if content.split() else content
            # One distribution (its probabilities sum to 0.99), as a real server's top log-probs are.
            alternatives = [(first, -0.105), ("No" if first == "Yes" else "Yes", -2.5), ("Maybe", -4.7)]
            choice["logprobs"] = {"content": [{"token": first, "logprob": -0.105, "bytes": list(first.encode()),
                                               "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())}
                                                                for t, lp in alternatives[:top]]}]}
        words = sum(len(str(m.get("content", "")).split()) for m in payload["messages"])
        request.reply(200, {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion",
                            "created": int(time.time()), "model": self.model, "choices": [choice],
                            "usage": {"prompt_tokens": words, "completion_tokens": 1, "total_tokens": words + 1}})


class PoolingServer(_Server):
    """vLLM's /pooling for a step-tag PRM (see the module docstring): each input's rows come from
    ``step_score(tokens_before_tag)``, the probability that the step is good."""

    def __init__(self, step_score: Callable[[list[int]], float], *, step_tag_id: int, model: str = "prm",
                 engine_s: Callable[[int], float] = lambda tokens: 0.0, task: str | None = "token_classify",
                 lifetime: float = 120.0, fixed_task: str | None = None):
        self.step_score, self.step_tag_id, self.model = step_score, step_tag_id, model
        # ``fixed_task``: the task the server was started with (vLLM >= 0.21's --pooler-config.task): a request
        # naming another is refused as vLLM refuses it ("Unsupported task"); one naming none gets it.
        self.engine_s, self.task, self.fixed_task = engine_s, task, fixed_task
        self.tokens_received = 0
        self.engine_total_s = 0.0
        self.busy = threading.Lock()  # one engine: requests run one after another
        super().__init__(lifetime)

    def handle(self, request: Any, path: str, payload: Any) -> None:
        with self.lock:
            self.requests.append(payload)
        if path != "/pooling":
            request.reply(404, _error(f"no route {path}", "not_found_error"))
            return
        inputs = payload.get("input")
        if payload.get("model") != self.model or not isinstance(inputs, list):
            request.reply(400, _error("'model' and a list 'input' are required"))
            return
        if self.fixed_task is not None and payload.get("task", self.fixed_task) != self.fixed_task:
            request.reply(400, _error(f"Unsupported task: {payload.get('task')!r} Supported tasks: "
                                      f"({self.fixed_task!r},)", "BadRequestError"))
            return
        if payload.get("task", "encode") not in ("encode", "token_classify", self.task):
            request.reply(400, _error(f"task {payload.get('task')!r} is not supported by this model"))
            return
        if inputs and isinstance(inputs[0], int):
            inputs = [inputs]
        data, tokens = [], 0
        for index, ids in enumerate(inputs):
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                request.reply(400, _error("input must hold lists of token ids"))
                return
            tokens += len(ids)
            rows = []
            for position, token in enumerate(ids):
                if token == self.step_tag_id:
                    good = self.step_score(ids[:position])
                    rows.append([1.0 - good, good])
            data.append({"index": index, "object": "pooling", "data": rows})
        with self.busy:
            spent = self.engine_s(tokens)
            time.sleep(spent)
            self.tokens_received += tokens
            self.engine_total_s += spent
        request.reply(200, {"id": f"pool-{len(self.requests)}", "object": "list", "created": int(time.time()),
                            "model": self.model, "data": data,
                            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})


class ReplayServer(_Server):
    """Answers every ``POST path`` with one recorded JSON answer (a server's documented example) and keeps
    the requests: pins a scorer's request against a documented schema and its reading against a
    documented answer."""

    def __init__(self, path: str, answer: Any, *, lifetime: float = 60.0):
        self.path, self.answer = path, answer
        super().__init__(lifetime)

    def handle(self, request: Any, path: str, payload: Any) -> None:
        with self.lock:
            self.requests.append(payload)
        if path != self.path:
            request.reply(404, _error(f"no route {path}", "not_found_error"))
            return
        request.reply(200, self.answer)


def answer_seven(messages: list[dict[str, Any]]) -> str:
    """A judge that always answers 7 (picklable: for a server in another process)."""
    return "7"


def step_by_last_token(prefix: list[int]) -> float:
    """A PRM whose step is good in proportion to the step's last token (picklable)."""
    return (prefix[-1] % 10) / 10


def engine_time(tokens: int) -> float:
    """A pooling engine's time for a request of ``tokens`` tokens: 10 ms plus 4 us a token (picklable)."""
    return 0.01 + 4e-6 * tokens


def _summary(server: _Server) -> dict[str, Any]:
    return {"statuses": dict(server.statuses), "requests": len(server.requests),
            "most_in_flight": getattr(server, "most_in_flight", None),
            "tokens_received": getattr(server, "tokens_received", None),
            "engine_total_s": getattr(server, "engine_total_s", None)}


def _serve(kind: str, kwargs: dict[str, Any], conn: Any) -> None:
    server = {"chat": ChatServer, "pooling": PoolingServer, "teacher": PromptLogprobServer}[kind](**kwargs)
    conn.send(server.url)
    if conn.poll(kwargs.get("lifetime", 120.0)):
        conn.recv()
    conn.send(_summary(server))
    server.close()


@contextlib.contextmanager
def server_process(kind: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """A stub server (``kind``: ``chat``, ``pooling`` or ``teacher``) in a process of its own, so that it never competes
    with the client for the GIL: yields ``{"url": ...}``, which gets ``"summary"`` (statuses, requests,
    most in flight, tokens, engine time) once the block ends."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_serve, args=(kind, kwargs, child), daemon=True)
    process.start()
    if not parent.poll(60):
        process.kill()
        raise RuntimeError("the stub server did not start within 60 s")
    holder: dict[str, Any] = {"url": parent.recv()}
    try:
        yield holder
    finally:
        parent.send("stop")
        holder["summary"] = parent.recv() if parent.poll(10) else None
        process.join(5)
        if process.is_alive():
            process.kill()


class PromptLogprobServer(_Server):
    """A teacher's prompt log-probs (see the module docstring): vLLM's ``POST /v1/completions`` with
    ``prompt_logprobs`` (``choices[i].prompt_logprobs``: None, then ``{token id: {"logprob", "rank",
    "decoded_token"}}`` per prompt token) and SGLang's ``POST /generate`` with ``return_logprob``
    (``meta_info.input_token_logprobs``: ``[logprob, token id, None]`` per input token, None first). The
    log-prob of token ``t`` is ``logprob(ids[:t], ids[t])``; ``engine_s(tokens)`` as ``PoolingServer``'s."""

    def __init__(self, logprob: Callable[[list[int], int], float], *, model: str = "teacher",
                 engine_s: Callable[[int], float] = lambda tokens: 0.0, lifetime: float = 120.0):
        self.logprob, self.model, self.engine_s = logprob, model, engine_s
        self.tokens_received = 0
        self.engine_total_s = 0.0
        self.busy = threading.Lock()
        super().__init__(lifetime)

    def handle(self, request: Any, path: str, payload: Any) -> None:
        with self.lock:
            self.requests.append(payload)
        if path not in ("/v1/completions", "/generate"):
            request.reply(404, _error(f"no route {path}", "not_found_error"))
            return
        inputs = payload.get("prompt" if path == "/v1/completions" else "input_ids")
        if payload.get("model", self.model) != self.model or not isinstance(inputs, list) or not inputs:
            request.reply(400, _error("'model' and token-id inputs are required"))
            return
        single = isinstance(inputs[0], int)
        batch = [inputs] if single else inputs
        if not all(isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids) for ids in batch):
            request.reply(400, _error("inputs must be lists of token ids"))
            return
        if path == "/v1/completions" and payload.get("prompt_logprobs") is None:
            request.reply(400, _error("this stub answers prompt_logprobs requests only"))
            return
        with self.busy:
            tokens = sum(len(ids) for ids in batch)
            spent = self.engine_s(tokens)
            time.sleep(spent)
            self.tokens_received += tokens
            self.engine_total_s += spent
        scored = [[None] + [self.logprob(ids[:t], ids[t]) for t in range(1, len(ids))] for ids in batch]
        if path == "/v1/completions":
            choices = [{"index": i, "text": "", "logprobs": None, "finish_reason": "length", "stop_reason": None,
                        "prompt_logprobs": [None if lp is None else {str(ids[t]): {"logprob": lp, "rank": 1,
                                                                                   "decoded_token": f"<{ids[t]}>"}}
                                            for t, lp in enumerate(row)]}
                       for i, (ids, row) in enumerate(zip(batch, scored))]
            request.reply(200, {"id": f"cmpl-{len(self.requests)}", "object": "text_completion",
                                "created": int(time.time()), "model": self.model, "choices": choices,
                                "usage": {"prompt_tokens": tokens, "completion_tokens": len(batch),
                                          "total_tokens": tokens + len(batch)}})
            return
        results = [{"text": "", "output_ids": [], "meta_info": {
            "id": f"gen-{i}", "prompt_tokens": len(ids), "completion_tokens": 0,
            "input_token_logprobs": [[lp, ids[t], None] for t, lp in enumerate(row)], "output_token_logprobs": []}}
            for i, (ids, row) in enumerate(zip(batch, scored))]
        request.reply(200, results[0] if single else results)


def teacher_logprob(prefix: list[int], token: int) -> float:
    """A teacher that likes even tokens after an even count of tokens (picklable): log 0.8 or log 0.1."""
    return math.log(0.8) if (token + len(prefix)) % 2 == 0 else math.log(0.1)


class SandboxFusionServer(_Server):
    """SandboxFusion's ``POST /run_code`` (see the module docstring); ``answer(payload)``, when given, replaces
    the run's answer (a malformed one, a ``SandboxError``)."""

    RUNNER = "import os, runpy, sys; os.chdir('/task'); sys.argv = ['main.py']; runpy.run_path('main.py', run_name='__main__')"

    def __init__(self, *, lifetime: float = 120.0, fail: Callable[[dict[str, Any]], int | None] | None = None,
                 answer: Callable[[dict[str, Any]], Any] | None = None):
        from prm_jax.scorers._sandbox import Limits, LocalSandbox

        self.fail, self.answer = fail, answer
        self.sandbox = LocalSandbox(Limits(memory_mb=256, output_bytes=1 << 16))
        super().__init__(lifetime)

    def handle(self, request: Any, path: str, payload: Any) -> None:
        import base64

        with self.lock:
            self.requests.append(payload)
        status = self.fail(payload) if self.fail else None
        if status is not None:
            request.reply(status, {"detail": "sandbox queue saturated"})
            return
        if path != "/run_code":
            request.reply(404, {"detail": "Not Found"})
            return
        if self.answer is not None:
            request.reply(200, self.answer(payload))
            return
        files = {name: base64.b64decode(content) for name, content in payload.get("files", {}).items()}
        files["main.py"] = payload["code"].encode()
        run = self.sandbox.run(files, ["-c", self.RUNNER], (payload.get("stdin") or "").encode(),
                               float(payload.get("run_timeout", 10)))
        result = {"status": "TimeLimitExceeded" if run.outcome == "timeout" else "Finished",
                  "execution_time": run.seconds, "return_code": None if run.outcome == "timeout" else run.returncode,
                  "stdout": run.stdout.decode(errors="replace"), "stderr": run.stderr.decode(errors="replace")}
        ok = run.outcome == "ok"
        request.reply(200, {"status": "Success" if ok else "Failed", "message": "", "compile_result": None,
                            "run_result": result, "executor_pod_name": None, "files": {}})
