import json
from pathlib import Path

import numpy as np
import pytest

from prm_jax import compute_advantages, load_config
from prm_jax.app._cli import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "prm_jax" / "data"
CONFIG = ROOT / "examples" / "prm_config.yaml"


def lines():
    return [json.loads(line) for line in (DATA / "demo_sessions.jsonl").read_text().splitlines()]


def write_jsonl(path, sessions):
    path.write_text("".join(json.dumps(s) + "\n" for s in sessions))
    return path


def test_demo(tmp_path, capsys):
    assert main(["demo", "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "4 accepted" in out and "process_weighted" in out and "length_budget" in out
    assert (tmp_path / "out" / "batch.npz").exists() and (tmp_path / "out" / "metrics.json").exists()


def test_quiet_and_no_terminal_mean_no_progress_line(tmp_path, capsys):
    for extra in (["--quiet"], ["--progress", "--quiet"], []):  # (stderr is not a terminal under pytest)
        code = main(["score", "--config", str(CONFIG), "--input", str(DATA / "demo_sessions.jsonl"),
                     "--output", str(tmp_path / "out"), "--overwrite", *extra])
        assert code == 0 and "scoring [" not in capsys.readouterr().err


def test_score_writes_a_consistent_batch_and_plot(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["score", "--config", str(CONFIG), "--input", str(DATA / "demo_sessions.jsonl"), "--output", str(out),
                 "--plot", str(tmp_path / "rows.png"), "--progress"])
    assert code == 0
    captured = capsys.readouterr()
    # Issue 30: sessions scored of the total, the rate and the time left (it counted groups only).
    assert "scoring [" in captured.err and "16/16 sessions" in captured.err and "/s, ETA" in captured.err
    assert (tmp_path / "rows.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = dict(np.load(out / "batch.npz"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["summary"]["groups"] == {"total": 4, "accepted": 4, "rejected": 0, "filtered": 0}
    assert 0 <= metrics["metrics"]["rollout/prm_turn_reward/length_budget"] <= 1
    # The saved advantages are what compute_advantages gives on the saved batch.
    batch = {k: saved[k] for k in ("attention_mask", "loss_mask", "logprobs", "rewards", "token_rewards", "turn_ids",
                                   "is_truncated", "group_sizes", "ref_logprobs")}  # (the demo has reference log-probs)
    redo = compute_advantages(batch, load_config(CONFIG).actor)
    np.testing.assert_allclose(saved["timestep_advantages"], redo.advantages, rtol=1e-6)
    assert saved["input_ids"].shape[1] % 128 == 0 and saved["group_sizes"].sum() == saved["rewards"].shape[0]
    # Process rewards are the length-budget scores: 1 on turns of at most 128 tokens, 0 on longer ones.
    for b in range(saved["turn_ids"].shape[0]):
        for k in set(saved["turn_ids"][b].tolist()) - {-1}:
            span = saved["turn_ids"][b] == k
            assert np.all(saved["token_rewards"][b][span] == float(span.sum() <= 128))


def test_validate_config(capsys):
    assert main(["validate-config", str(CONFIG)]) == 0
    assert "ok" in capsys.readouterr().out


def broken(tmp_path, name, mutate):
    sessions = lines()
    mutate(sessions)
    return write_jsonl(tmp_path / name, sessions)


@pytest.mark.parametrize("make,needle", [
    (lambda p: (p / "bad.jsonl").write_text(json.dumps(lines()[0]) + "\n{not json\n") and p / "bad.jsonl",
     "bad.jsonl:2: json: malformed JSON"),
    (lambda p: broken(p, "tokens.jsonl", lambda s: s[3]["interactions"][1].pop("output_tokens")),
     "tokens.jsonl:4: interactions[1].output_tokens: token ids are required"),
    (lambda p: broken(p, "reward.jsonl", lambda s: s[5]["interactions"][-1].pop("reward")),
     "reward.jsonl:6: reward:"),
    (lambda p: broken(p, "extra.jsonl", lambda s: s[0].update(colour="red")), "extra.jsonl:1: colour: unknown key"),
    (lambda p: broken(p, "prefix.jsonl", lambda s: s[2]["interactions"][1]["input_tokens"].__setitem__(0, 99999)),
     "prefix.jsonl:3: interactions: interaction"),
])
def test_broken_inputs_fail_cleanly_and_write_nothing(tmp_path, capsys, make, needle):
    path = make(tmp_path)
    out = tmp_path / "out"
    assert main(["score", "--config", str(CONFIG), "--input", str(path), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c.replace("prm_jax.scorers.LengthBudgetScorer", "prm_jax.scorers.NoSuchScorer"), "NoSuchScorer"),
    (lambda c: c.replace("prm_jax.scorers.LengthBudgetScorer", "nowhere.Scorer"), "cannot import module 'nowhere'"),
    (lambda c: c.replace("  _version: v1", "  _version: v1\n  queue_size: 4"), "rollout has unknown keys ['queue_size']"),
    (lambda c: c.replace("token_rewards_as_adv: true", "token_rewards_as_adv: true\n  colour: red"),
     "actor has unknown keys ['colour']"),
])
def test_bad_configs(tmp_path, capsys, edit, needle):
    config = tmp_path / "config.yaml"
    config.write_text(edit(CONFIG.read_text()))
    assert main(["validate-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(config) in err
    out = tmp_path / "out"
    assert main(["score", "--config", str(config), "--input", str(DATA / "demo_sessions.jsonl"),
                 "--output", str(out)]) == 2
    assert not out.exists()


def test_no_accepted_group_is_an_error_without_output(tmp_path, capsys):
    sessions = [s for s in lines() if s["group"] == "g0"]
    for s in sessions:
        s["interactions"][-1]["reward"] = 0.0
    path = write_jsonl(tmp_path / "wrong.jsonl", sessions)
    code = main(["score", "--config", str(CONFIG), "--input", str(path), "--output", str(tmp_path / "out"),
                 "--filter", "mixed_or_penalized_all_wrong"])
    assert code == 1 and "no group was accepted" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_group_filter_counts(tmp_path, capsys):
    sessions = lines()
    for s in sessions:
        if s["group"] == "g0":
            s["interactions"][-1]["reward"] = 1.0
    path = write_jsonl(tmp_path / "s.jsonl", sessions)
    out = tmp_path / "out"
    assert main(["score", "--config", str(CONFIG), "--input", str(path), "--output", str(out),
                 "--filter", "mixed_or_penalized_all_wrong"]) == 0
    summary = json.loads((out / "metrics.json").read_text())["summary"]
    assert summary["groups"]["filtered"] >= 1 and summary["group_status"]["g0"] == "filtered"
    counters = summary["filter"]
    assert counters["name"] == "mixed_or_penalized_all_wrong"
    filtered = summary["groups"]["filtered"]
    assert counters["rejected_by_failed_or_perfect"] == filtered
    assert counters["rejected_by_all_correct"] + counters["rejected_by_all_wrong"] == filtered
    assert counters["rejected_by_all_correct"] >= 1  # g0: every reward 1


def test_plain_filter_function_is_selectable(tmp_path):
    # filter_function (AReaL's plain filter): g0 all 1.0 is rejected as all correct, g1 all 0.5 as all wrong
    # (the plain filter's "correct" is r >= 1 - 1e-3), the rest are mixed.
    sessions = lines()
    for s in sessions:
        for interaction in s["interactions"]:
            if s["group"] in ("g0", "g1") and interaction.get("reward") is not None:
                interaction["reward"] = 1.0 if s["group"] == "g0" else 0.5
    path = write_jsonl(tmp_path / "s.jsonl", sessions)
    out = tmp_path / "out"
    assert main(["score", "--config", str(CONFIG), "--input", str(path), "--output", str(out),
                 "--filter", "filter_function"]) == 0
    summary = json.loads((out / "metrics.json").read_text())["summary"]
    assert summary["group_status"]["g0"] == summary["group_status"]["g1"] == "filtered"
    assert summary["filter"] == {"name": "filter_function", "rejected_by_failed_or_perfect": 2,
                                 "rejected_by_all_correct": 1, "rejected_by_all_wrong": 1,
                                 "accepted_penalized_all_wrong": 0}


def test_the_command_keeps_its_compiled_programs_in_a_persistent_cache(tmp_path):
    # Issue 12: the second run of the same shapes loads the advantage programs instead of compiling them.
    import os
    import subprocess
    import sys

    data = ROOT / "prm_jax" / "data"
    command = [sys.executable, "-m", "prm_jax.app._cli", "score", "--config", str(data / "demo_config.yaml"),
               "--input", str(data / "demo_sessions.jsonl"), "--output", str(tmp_path / "out")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    cache = tmp_path / "cache"
    proc = subprocess.run(command, env=dict(env, PRM_JAX_CACHE=str(cache), PRM_JAX_NATIVE="0"), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entries = list((cache / "xla").iterdir())
    assert entries and any(path.name.startswith(("jit__pipeline", "jit__variants")) for path in entries)
    off = subprocess.run([*command, "--overwrite"], env=dict(env, PRM_JAX_CACHE=str(tmp_path / "off"), PRM_JAX_NATIVE="0",
                                           PRM_JAX_COMPILE_CACHE="0"), capture_output=True, text=True, timeout=600)
    assert off.returncode == 0, off.stderr[-2000:]
    assert not (tmp_path / "off" / "xla").exists()


def _anchored_config(tmp_path):
    config = tmp_path / "gigpo.yaml"
    config.write_text(CONFIG.read_text() + "  credit_assignment: {mode: gigpo, step_weight: 0.5, step_discount: 0.9}\n")
    sessions = [json.loads(line) for line in (DATA / "demo_sessions.jsonl").read_text().splitlines()]
    for s in sessions:
        for k, turn in enumerate(s["interactions"]):
            turn["anchor_id"] = 2**40 + k % 2
    path = tmp_path / "anchored.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in sessions))
    return config, path


@pytest.mark.parametrize("gigpo", [False, True])
def test_rows_are_bucketed_for_the_device_but_not_in_the_outputs(tmp_path, gigpo):
    # Issue 12: the advantage program runs on rows padded to --row-bucket (one compiled program, and one
    # persistent-cache entry, for runs of similar size); the padding rows (no attention, group id -1) must
    # change no real row's number, and the outputs hold the real rows only.
    config, data = _anchored_config(tmp_path) if gigpo else (CONFIG, DATA / "demo_sessions.jsonl")
    saved = {}
    for row_bucket in (1, 64):
        out = tmp_path / f"out{row_bucket}"
        assert main(["score", "--config", str(config), "--input", str(data), "--output", str(out),
                     "--row-bucket", str(row_bucket)]) == 0
        saved[row_bucket] = dict(np.load(out / "batch.npz"))
    rows = saved[1]["rewards"].shape[0]
    assert rows % 64 and rows == saved[1]["group_sizes"].sum()
    assert sorted(saved[1]) == sorted(saved[64])
    for name, value in saved[1].items():
        assert saved[64][name].shape == value.shape and saved[64][name].dtype == value.dtype, name
        assert saved[64][name].tobytes() == value.tobytes(), name  # bit for bit


def test_runs_of_different_sizes_in_one_row_bucket_compile_the_advantages_once(tmp_path):
    from jax import monitoring

    sessions = (DATA / "demo_sessions.jsonl").read_text().splitlines()
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("\n".join(sessions[:-2]) + "\n")
    compiles = []
    monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kwargs: compiles.append(event) if "backend_compile" in event else None)
    counts, rows = [], []
    for data in (DATA / "demo_sessions.jsonl", fewer):
        before = len(compiles)
        assert main(["score", "--config", str(CONFIG), "--input", str(data), "--output", str(tmp_path / data.stem),
                     "--row-bucket", "64", "--bucket", "4096"]) == 0
        counts.append(len(compiles) - before)
        rows.append(np.load(tmp_path / data.stem / "batch.npz")["rewards"].shape[0])
        summary = json.loads((tmp_path / data.stem / "metrics.json").read_text())["summary"]
        assert rows[-1] == summary["trajectories"]
    assert rows[0] > rows[1] and counts[1] == 0, (rows, counts)  # the second size found the first's program


def test_main_in_process_leaves_the_callers_process_alone(tmp_path):
    # Issue 21: gc.freeze ran for every in-process caller of main() (the tests froze pytest's heap ~15
    # times); process tuning belongs to the prm-jax process (entry), not to the library.
    import gc
    gc.unfreeze()
    assert main(["score", "--config", str(CONFIG), "--input", str(DATA / "demo_sessions.jsonl"),
                 "--output", str(tmp_path / "out")]) == 0
    assert gc.get_freeze_count() == 0
