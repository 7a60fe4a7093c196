"""Issue 58.2: ``CodeExecutionScorer(sandbox="sandbox_fusion")`` runs the code on a SandboxFusion server (``POST
/run_code``, its documented ``RunCodeRequest`` and ``RunCodeResponse``) through the served scorers' one transport
(a 503 retried) and answer reader: the same scores as the local sandbox on the same tests (stdin/stdout and
assert-style: the harness runs a turn's tests remotely, one request a turn), a failure of the server's sandbox or
a malformed answer fails the row naming the scorer and the turn (never a 0), and the probe says whether it
answers. The stub (``tests/stub_servers.py``) listens on 127.0.0.1 and runs each program in the local sandbox."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest
from stub_servers import SandboxFusionServer

import prm_jax
from prm_jax.errors import ServiceError
from prm_jax.runtime._runner import error_text
from prm_jax.scorers import CodeExecutionScorer

pytestmark = pytest.mark.anyio

TESTS = [{"input": "2\n", "output": "4"}, {"input": "5\n", "output": "11"}, {"assert": "assert double(21) == 42"},
         {"assert": "assert double(0.5) == 1.0"}]
CODE = "def double(n):\n    return 2 * n\n\nif __name__ == '__main__':\n    print(double(int(input())))"
REPLIES = {"right": CODE, "exits": "import sys\nsys.exit(0)", "sleeps": "import time\ntime.sleep(30)",
           "memory": "x = bytearray(1 << 30)"}


def turn(code: str, iid: str) -> prm_jax.Interaction:
    return prm_jax.Interaction(iid, [1], [2], output_messages=[
        {"role": "assistant", "content": f"Here:\n```python\n{code}\n```"}])


def fused(url: str, **kwargs) -> CodeExecutionScorer:
    return CodeExecutionScorer(sandbox="sandbox_fusion", url=url, time_per_test=1.5, total_time=2.0, memory_mb=128,
                               backoff=0.01,
                               **kwargs)


def reward(cache) -> float:
    return float(next(iter(cache)).token_rewards[-1])


async def scores(scorer) -> dict[str, float]:
    out = {}
    async with prm_jax.PRMRunner(scorers=[scorer]) as runner:
        for name, code in REPLIES.items():
            cache = prm_jax.InteractionCache([turn(code, name)])
            await runner.run(cache, {"metadata": {"tests": TESTS}})
            out[name] = reward(cache)
    await scorer.aclose()  # (borrowed: the runner leaves it to its owner)
    return out


async def test_the_served_sandbox_scores_as_the_local_one():
    with SandboxFusionServer() as server:
        served = await scores(fused(server.url))
        sent = list(server.requests)
    local = await scores(CodeExecutionScorer(time_per_test=1.5, total_time=2.0, memory_mb=128))
    assert served == local == {"right": 0.75, "exits": 0.0, "sleeps": 0.0, "memory": 0.0}  # (5 -> "11" is wrong)
    # The documented request, one a turn: the harness as the program, its job on stdin, the limits, the solution
    # base64 beside it.
    assert len(sent) == 4 and all(set(r["files"]) == {"solution.py"} for r in sent)
    first = sent[0]
    assert first["language"] == "python" and first["memory_limit_MB"] == 128
    assert 4.9 < first["run_timeout"] <= 2.0 + 3.0  # (what is left of total_time, then the harness' slack)
    assert base64.b64decode(first["files"]["solution.py"]).decode() == CODE + "\n"  # (the fenced block, as taken)
    job = json.loads(first["stdin"])
    assert job["solution"] == "solution.py" and len(job["nonce"]) == 32 and job["tests"] == TESTS
    assert first["code"].startswith('"""The harness')


async def test_a_503_is_retried_through_the_one_transport():
    seen = {"count": 0}

    def fail(payload):
        seen["count"] += 1
        return 503 if seen["count"] <= 2 else None
    with SandboxFusionServer(fail=fail) as server:
        scorer = fused(server.url)
        cache = prm_jax.InteractionCache([turn(CODE, "t0")])
        async with prm_jax.PRMRunner(scorers=[scorer]) as runner:
            await runner.run(cache, {"metadata": {"tests": TESTS[:1]}})
        await scorer.aclose()
        assert reward(cache) == 1.0 and server.statuses == {503: 2, 200: 1}
        assert scorer.client_stats()["retries"] == 2


def answer(overall="Success", **run_result):
    result = {"status": "Finished", "execution_time": 0.01, "return_code": 0, "stdout": "4\n", "stderr": ""}
    result.update(run_result)
    return {"status": overall, "message": "", "compile_result": None, "run_result": result,
            "executor_pod_name": None, "files": {}}


def broken(change):
    value = answer()
    change(value)
    return value


@pytest.mark.parametrize("body, needle", [
    (answer("SandboxError", status="Error"), "the server's sandbox failed"),
    (answer(status="Error"), "could not run the program"),
    (broken(lambda a: a.pop("status")), r"no \['status'\]"),
    (broken(lambda a: a.update(status="Done")), r"\['status'\] must be"),
    (broken(lambda a: a.update(run_result=None)), "no run_result"),
    (broken(lambda a: a.pop("run_result")), r"no \['run_result'\]"),
    (broken(lambda a: a["run_result"].pop("status")), r"no \['run_result'\]\['status'\]"),
    (broken(lambda a: a["run_result"].update(status="Killed")), r"\['run_result'\]\['status'\] must be"),
    (broken(lambda a: a["run_result"].update(return_code=True)), "return_code'] must be an integer"),
    (broken(lambda a: a["run_result"].update(return_code="0")), "return_code'] must be an integer"),
    (broken(lambda a: a["run_result"].pop("return_code")), r"no \['run_result'\]\['return_code'\]"),
    (broken(lambda a: a["run_result"].update(stdout=4)), r"\['stdout'\] must be a string"),
    (broken(lambda a: a["run_result"].update(execution_time="fast")), "execution_time'] must be a number"),
    (broken(lambda a: a["run_result"].update(execution_time=float("nan"))), "must be finite"),
    ([answer()], r"no \['status'\]"),
    (None, r"no \['status'\]"),
])
async def test_a_failed_sandbox_or_a_malformed_answer_fails_the_row_naming_the_turn(body, needle):
    scorer = fused("http://127.0.0.1:9")
    await scorer.runner.service._client.aclose()
    scorer.runner.service._client = httpx.AsyncClient(transport=httpx.MockTransport(
        lambda request: httpx.Response(200, content=json.dumps(body).encode())))
    with pytest.raises(ServiceError, match=needle) as info:
        async with prm_jax.PRMRunner(scorers=[scorer]) as runner:
            await runner.run(prm_jax.InteractionCache([turn(CODE, "t0")]), {"metadata": {"tests": TESTS[:1]}})
    await scorer.aclose()
    assert "'code_execution'" in error_text(info.value) and "'t0'" in error_text(info.value)


@pytest.mark.parametrize("body, outcome", [
    (answer(), "ok"), (answer("Failed", return_code=2), "error"),
    (answer("Failed", return_code=1, stderr="Traceback (most recent call last):\nMemoryError\n"), "memory"),
    (answer("Failed", status="TimeLimitExceeded", return_code=None), "timeout"),
    (answer(stdout="x" * 65), "output_limit"), (answer(stderr="x" * 65), "output_limit"),
    (answer(stdout=None, stderr=None, execution_time=None), "ok"),
])
async def test_the_answers_outcomes_are_read_as_the_local_ones(body, outcome):
    scorer = fused("http://127.0.0.1:9", output_bytes=64)
    assert scorer.runner.read(body, "here").outcome == outcome
    await scorer.aclose()


async def test_the_probe_says_whether_the_server_runs_code():
    async def probe(url):
        scorer = fused(url)
        try:
            return await scorer.probe()
        finally:
            await scorer.aclose()
    with SandboxFusionServer() as server:
        good = await probe(server.url)
    with SandboxFusionServer(answer=lambda payload: answer(stdout="41\n")) as server:
        wrong = await probe(server.url)
    closed = await probe("http://127.0.0.1:9")
    assert good.ok and good.status == "HTTP 200 OK" and good.url.endswith("/run_code"), good
    assert not wrong.ok and "print(6 * 7) ran as ok" in wrong.status, wrong
    assert not closed.ok and "connection error" in closed.status, closed


async def test_called_outside_a_runner_it_says_how_to_score():
    scorer = fused("http://127.0.0.1:9")
    with pytest.raises(RuntimeError, match="score through PRMRunner"):
        scorer.evaluate(turn(CODE, "t0"), {"metadata": {"tests": TESTS[:1]}})
    await scorer.aclose()


def test_prm_jax_score_runs_the_bundled_sessions_on_the_served_sandbox_after_its_probe(tmp_path, capsys):
    # Issue 58.8 on the served sandbox: `prm-jax validate-config --probe` asks the server once, then `prm-jax
    # score --probe` scores the bundled coding sessions there: the turns' rewards are the local sandbox's.
    import numpy as np

    from prm_jax.app import _cli as cli

    data = Path(prm_jax.__file__).parent / "data"
    config = tmp_path / "served.yaml"
    with SandboxFusionServer() as server:
        config.write_text((data / "coding_config.yaml").read_text().replace(
            "            time_per_test: 1.0\n",
            f"            time_per_test: 1.0\n            sandbox: sandbox_fusion\n            url: {server.url}\n"))
        assert cli.main(["validate-config", "--probe", str(config)]) == 0
        probe = [line for line in capsys.readouterr().out.splitlines() if line.startswith("probe:")]
        assert probe and probe[0].startswith(f"probe: scorer 'code_execution' at {server.url}/run_code: HTTP 200 OK")
        assert cli.main(["score", "--probe", "--config", str(config), "--input", str(data / "coding_sessions.jsonl"),
                         "--output", str(tmp_path / "served")]) == 0
        assert len(server.requests) == 1 + 1 + 8  # (two probes, then one request a turn: 8 of the 9 turns have code)
    assert cli.main(["demo", "--example", "coding", "--output", str(tmp_path / "local")]) == 0
    served, local = (np.load(tmp_path / name / "batch.npz")["token_rewards"] for name in ("served", "local"))
    np.testing.assert_array_equal(served, local)
