"""Issue 42.5: judges say what failed. Every judge error names the scorer, the URL (without secrets), the
HTTP status or the connection error and the attempts, once per distinct cause (not once per session);
``--probe`` reports every served scorer's endpoint, status, model and latency before any input is read;
``metrics.json`` and the summary carry ``scorer_stats``."""

import json
import socket
import sys
from pathlib import Path

import pytest
from app_helpers import DEMO, config_with

from prm_jax.app._cli import main
from prm_jax.scorers._http import shown_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stub_servers import ChatServer, PoolingServer, answer_seven, step_by_last_token


def closed_port():
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def judge_config(tmp_path, base_url, model="judge", extra="", limits=""):
    """A config whose scorer is an OpenAI-compatible judge at ``base_url`` (2 attempts), ``extra`` scorer
    entries after it."""
    judge = (f'        - path: prm_jax.scorers.OpenAIJudgeScorer\n'
             f'          kwargs: {{base_url: "{base_url}", model: {model}, attempts: 2, backoff: 0.01, '
             f'score_range: [0, 10]{limits}}}\n')
    return config_with(tmp_path, judge + extra.rstrip("\n"), shaping="additive")


def test_shown_urls_hold_no_secrets():
    assert shown_url("https://user:sk-secret@judge.example:8443/v1/chat?api_key=sk-x#f") == \
        "https://judge.example:8443/v1/chat"
    assert shown_url("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1"
    assert shown_url("http://[::1]:8000/v1") == "http://[::1]:8000/v1"
    from prm_jax.scorers import OpenAIJudgeScorer

    with pytest.raises(ValueError, match=r"base_url http://judge/v1\?\.\.\. must not hold a query"):
        OpenAIJudgeScorer.validate_kwargs(base_url="http://judge/v1?api_key=sk-x", model="m")


def test_a_judge_that_is_down_is_one_line_naming_the_url_the_error_and_the_attempts(tmp_path, capsys):
    port = closed_port()
    config = judge_config(tmp_path, f"http://user:sk-secret@127.0.0.1:{port}/v1")
    assert main(["score", "--config", str(config), "--input", str(DEMO), "--output", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    # Before: one RetryError("_post_once failed ...") per session (16), no URL.
    assert err.count("connection error") == 1 and "_post_once" not in err, err
    assert f"16 session(s) (g0-s0, g0-s1, g0-s2, g0-s3, g1-s0 and 11 more): failed: RequestFailed: scorer " \
           f"'openai_judge': POST http://127.0.0.1:{port}/v1/chat/completions failed 2 times (attempts=2): " \
           "connection error (ConnectError" in err
    assert "sk-secret" not in err
    # The requests and retries made, per scorer: no longer shown nowhere.
    assert "scorer 'openai_judge': calls" in err and "failures 16" in err and "retries" in err
    assert not (tmp_path / "o").exists()


def test_an_http_error_names_its_status_and_attempt_once(tmp_path, capsys):
    with ChatServer(answer_seven, model="judge", fail=lambda payload: 503) as server:
        config = judge_config(tmp_path, server.url + "/v1")
        assert main(["score", "--config", str(config), "--input", str(DEMO), "--output", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("HTTP 503 Service Unavailable") == 1, err
    assert f"POST {server.url}/v1/chat/completions failed 2 times (attempts=2): HTTP 503" in err
    with ChatServer(answer_seven, model="judge") as server:  # a wrong model: 404, not retried
        config = judge_config(tmp_path, server.url + "/v1", model="no-such-model")
        assert main(["score", "--config", str(config), "--input", str(DEMO), "--output", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("answered 404") == 1 and "(attempt 1 of 2; not retried" in err, err
    assert "does not exist" in err and "retries 0" in err  # a 404 is not retried


def test_probe_reports_each_endpoint_and_passes(tmp_path, capsys):
    with ChatServer(answer_seven, model="judge") as chat, PoolingServer(step_by_last_token, step_tag_id=99) as pool:
        config = judge_config(tmp_path, chat.url + "/v1", extra=f"""        - path: prm_jax.scorers.PoolingPRMScorer
          kwargs: {{base_url: "{pool.url}", model: prm, step_tag_id: 99}}
""")
        assert main(["validate-config", "--probe", str(config)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert len(chat.requests) == 1 and len(pool.requests) == 1  # one small request each
    lines = [line for line in out if line.startswith("probe:")]
    assert len(lines) == 2
    assert lines[0].startswith(f"probe: scorer 'openai_judge' at {chat.url}/v1/chat/completions: HTTP 200 OK, "
                               "model judge, ") and lines[0].endswith(" ms")
    assert lines[1].startswith(f"probe: scorer 'pooling_prm' at {pool.url}/pooling: HTTP 200 OK, model prm, ")


@pytest.mark.parametrize("wrong", ["model", "url"])
def test_probe_fails_with_exit_2_naming_the_scorer_before_any_input_is_read(tmp_path, capsys, wrong):
    with ChatServer(answer_seven, model="judge") as server:
        base = server.url + "/v1" if wrong == "model" else f"http://127.0.0.1:{closed_port()}/v1"
        config = judge_config(tmp_path, base, model="no-such-model" if wrong == "model" else "judge")
        missing = tmp_path / "no-such-input.jsonl"  # never read: the probe fails first
        assert main(["score", "--probe", "--config", str(config), "--input", str(missing),
                     "--output", str(tmp_path / "o")]) == 2
        assert main(["validate-config", "--probe", str(config)]) == 2
    captured = capsys.readouterr()
    assert "no-such-input" not in captured.err
    assert "the probe failed for scorer(s) 'openai_judge' at " in captured.err
    assert ("HTTP 404 Not Found" in captured.err and "does not exist" in captured.err) if wrong == "model" else \
        "connection error" in captured.err
    assert "<- FAILED" in captured.out and not (tmp_path / "o").exists()


def test_probe_without_served_scorers_says_so(tmp_path, capsys):
    from app_helpers import CONFIG

    assert main(["validate-config", "--probe", str(CONFIG)]) == 0
    assert "probe: no served scorer in the config" in capsys.readouterr().out


def test_metrics_json_and_the_summary_carry_scorer_stats(tmp_path, capsys):
    with ChatServer(answer_seven, model="judge", rate=1000.0) as server:  # within the server's published limits
        config = judge_config(tmp_path, server.url + "/v1", limits=", max_concurrency: 8, max_requests_per_second: 500")
        assert main(["score", "--config", str(config), "--input", str(DEMO), "--output", str(tmp_path / "o")]) == 0
    stats = json.loads((tmp_path / "o" / "metrics.json").read_text())["scorer_stats"]
    judge = stats["openai_judge"]
    from prm_jax.app.sessions import read_sessions

    turns = sum(len(r.cache.chain(leaf)) for r in read_sessions(DEMO) for leaf in r.ready)  # one call per turn
    assert judge["calls"] == turns and judge["failures"] == 0 and judge["timeouts"] == 0
    assert judge["requests_sent"] == turns and judge["retries"] == 0
    assert judge["rate_limit_waits"] >= 0 and judge["rate_limit_wait_s"] >= 0  # the client's own pacing
    assert 0 < judge["latency_p50_s"] <= judge["latency_p95_s"] < 10
    out = capsys.readouterr().out
    assert f"scorers:\n  openai_judge             calls {turns}, failures 0, timeouts 0, latency p50 " in out
    assert f", requests {turns}, retries 0, rate-limit waits {judge['rate_limit_waits']}" in out


def test_an_unusable_answer_names_the_server_it_came_from():
    # A 200 answer without a score: the scorer, the turn, what is wrong, and the server (no secrets).
    import anyio

    from prm_jax import Interaction, PRMRunner
    from prm_jax.scorers import OpenAIJudgeScorer

    async def run(url):
        scorer = OpenAIJudgeScorer(url, "judge", attempts=1)
        turn = Interaction("t0", [1], [2], output_messages=[{"role": "assistant", "content": "x"}])
        try:
            await PRMRunner(scorers=(scorer,)).run([turn])
        except Exception as err:  # (the scorer's error, as the runner raised it)
            return str(err)
        finally:
            await scorer.aclose()

    with ChatServer(lambda messages: "no number here", model="judge") as server:
        port = server.url.rsplit(":", 1)[1]
        message = anyio.run(run, f"http://user:sk-secret@127.0.0.1:{port}/v1")
    assert "scorer 'openai_judge' on interaction 't0': no score in the answer 'no number here'" in message
    assert f"[HTTP 200 from http://127.0.0.1:{port}/v1]" in message and "sk-secret" not in message


def test_a_failure_line_keeps_its_sentences_whole_and_shows_the_body_decoded_cut_at_a_word(tmp_path, capsys):
    # Issue 55.12: without --probe the line was cut mid-word ("does not change by askin...") and showed the body
    # as a Python bytes repr (b'{"error": ...'). A 404 whose body is long: the sentence is whole, the body is
    # text, cut at a word's end.
    model = "a-model-" + " ".join(["whose-name-goes-on"] * 40)
    with ChatServer(answer_seven, model="judge") as server:
        config = judge_config(tmp_path, server.url + "/v1", model=json.dumps(model))
        assert main(["score", "--config", str(config), "--input", str(DEMO), "--output", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "answered 404" in line)
    assert "(attempt 1 of 2; not retried: this answer does not change by asking again)" in line, line
    assert "b'" not in line and 'answered 404 Not Found: {"error": {"message": "the model' in line, line
    body = line.split("answered 404 Not Found: ", 1)[1].split(" (attempt", 1)[0]
    assert body.endswith(" ...") and body[:-4].endswith("whose-name-goes-on"), body


def test_cut_at_word_never_cuts_a_word():
    from prm_jax._validation import body_text, cut_at_word

    assert cut_at_word("does not change by asking again", 22) == "does not change by ..."
    assert cut_at_word("short  text\n here", 100) == "short text here"
    assert body_text(b'{"error": "caf\xc3\xa9 \xff"}') == '{"error": "café \ufffd"}'
