"""Issue 30: ``prm-jax score`` runs the new scorers from a config: an LLM judge on an OpenAI-compatible
server (a stub on 127.0.0.1) and a JAX model named by a factory."""

import json
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from prm_jax.app._cli import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "prm_jax" / "data"
sys.path.insert(0, str(ROOT / "tests"))
from stub_servers import answer_seven, server_process  # noqa: E402


def config(tmp_path, scorer):
    path = tmp_path / "config.yaml"
    path.write_text(f"""
rollout:
  agent:
    prm:
      enabled: true
      advantage_shaping: {{mode: additive}}
      scorers:
        - {scorer}
actor:
  token_rewards_as_adv: true
""")
    return path


def test_prm_jax_score_with_an_openai_compatible_judge_from_the_config(tmp_path, capsys):
    # The server in a process of its own, as a real one (in this process its threads wait for the GIL).
    with server_process("chat", answer=answer_seven, capacity=4, rate=500.0) as server:
        path = config(tmp_path, "{path: prm_jax.scorers.OpenAIJudgeScorer, weight: 0.5, kwargs: "
                                f"{{base_url: '{server['url']}/v1', model: judge, max_concurrency: 4, "
                                "max_requests_per_second: 500}}")
        code = main(["score", "--config", str(path), "--input", str(DATA / "demo_sessions.jsonl"),
                     "--output", str(tmp_path / "out"), "--quiet"])
        assert code == 0, capsys.readouterr().err
    turns = sum(len(json.loads(line)["interactions"]) for line in (DATA / "demo_sessions.jsonl").open())
    summary = server["summary"]
    assert summary["statuses"] == {200: summary["requests"]} and summary["requests"] >= turns
    saved = np.load(tmp_path / "out" / "batch.npz")
    scored = saved["token_rewards"][saved["turn_ids"] >= 0]
    assert np.allclose(scored, np.float32(0.5 * 0.7))  # weight 0.5 x (7 - 0) / 10 on every generated token


def token_score(input_ids, attention_mask, turn_ids):
    return jnp.where(turn_ids >= 0, (input_ids % 7).astype(jnp.float32) / 7, 0.0)


def make_token_score():
    return token_score


def test_prm_jax_score_with_a_jax_model_named_by_a_factory(tmp_path, capsys):
    path = config(tmp_path, f"{{path: prm_jax.scorers.ModelScorer, kwargs: {{factory: {__name__}.make_token_score, "
                            "bucket: 64, max_batch_size: 8}}")
    code = main(["score", "--config", str(path), "--input", str(DATA / "demo_sessions.jsonl"),
                 "--output", str(tmp_path / "out"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    saved = np.load(tmp_path / "out" / "batch.npz")
    on_turns = saved["turn_ids"] >= 0
    np.testing.assert_allclose(saved["token_rewards"][on_turns],
                               (saved["input_ids"][on_turns] % 7).astype(np.float32) / 7, rtol=1e-6)
