"""Issue 10, the command line: located errors, exit codes, no partial output, bounded messages.

These run the installed ``prm-jax`` in a subprocess, as a user would.
"""

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from prm_jax import AdvantageConfig, NormConfig, compute_advantages
from prm_jax.app import cli, outputs
from prm_jax.kernels import normalize

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
DEMO = ROOT / "prm_jax" / "data" / "demo_sessions.jsonl"
CONFIG = ROOT / "examples" / "prm_config.yaml"
PRM_JAX = Path(sys.executable).with_name("prm-jax")


def sessions():
    return [json.loads(line) for line in DEMO.read_text().splitlines()]


def write_jsonl(path, items, raw=None):
    path.write_text(raw if raw is not None else "".join(json.dumps(s) + "\n" for s in items))
    return path


def prm_jax(*args, umask=None):
    env = dict(os.environ, PYTHONPATH=str(TESTS), JAX_PLATFORMS="cpu")
    command = [str(PRM_JAX), *map(str, args)]
    if umask is not None:
        command = ["sh", "-c", f"umask {umask:03o} && exec \"$@\"", "sh", *command]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def score(tmp_path, input_path, *extra, config=CONFIG, out="out"):
    return prm_jax("score", "--config", config, "--input", input_path, "--output", tmp_path / out, *extra)


def assert_input_error(proc, needle, out):
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert needle in err, err
    assert "Traceback" not in err and len(err) < 2000
    assert not out.exists()


# --- 10.6 non-finite numbers ------------------------------------------------------------------------------

@pytest.mark.parametrize("field,values,needle", [
    ("token_rewards", ["NaN", "0.5", "Infinity"], "interactions[0].token_rewards: must be finite"),
    ("output_logprobs", ["NaN", "-Infinity", "-0.5"], "interactions[0].output_logprobs: must be finite"),
    ("reward", "NaN", "interactions[0].reward: must be finite"),
])
def test_non_finite_numbers_are_refused_with_file_line_and_field(tmp_path, field, values, needle):
    items = sessions()
    turn = items[2]["interactions"][0]
    turn[field] = "@@"
    if isinstance(values, list):  # a full-length vector: the bad values, then zeros
        values = "[" + ", ".join(values + ["0"] * (len(turn["output_tokens"]) - len(values))) + "]"
    raw = "".join(json.dumps(s) + "\n" for s in items).replace('"@@"', values)
    path = write_jsonl(tmp_path / "bad.jsonl", None, raw)
    assert_input_error(score(tmp_path, path), f"bad.jsonl:3: {needle}", tmp_path / "out")


def test_a_positive_log_prob_is_refused(tmp_path):
    items = sessions()
    n = len(items[0]["interactions"][0]["output_tokens"])
    items[0]["interactions"][0]["output_logprobs"] = [7.5] + [-0.1] * (n - 1)
    proc = score(tmp_path, write_jsonl(tmp_path / "lp.jsonl", items))
    assert_input_error(proc, "lp.jsonl:1: interactions[0].output_logprobs: log-probabilities must be <= 0",
                       tmp_path / "out")


def test_metrics_json_is_strict_json(tmp_path):
    proc = score(tmp_path, DEMO)
    assert proc.returncode == 0, proc.stderr[-2000:]

    def refuse(name):
        raise ValueError(name)
    json.loads((tmp_path / "out" / "metrics.json").read_text(), parse_constant=refuse)


# --- 10.7 token ids -------------------------------------------------------------------------------------

@pytest.mark.parametrize("token,shown", [(2147483648, "2147483648"), (-3, "-3")])
def test_token_ids_that_do_not_fit_are_refused(tmp_path, token, shown):
    items = sessions()
    items[1]["interactions"][0]["output_tokens"][0] = token
    proc = score(tmp_path, write_jsonl(tmp_path / "ids.jsonl", items))
    assert_input_error(proc, "ids.jsonl:2: interactions[0].output_tokens: token ids must be in [0, 2147483647]",
                       tmp_path / "out")
    assert shown in proc.stderr


# --- 10.8, 10.9 masks and numbers in compute_advantages -------------------------------------------------

def mask_batch(**overrides):
    batch = dict(attention_mask=np.ones((1, 5), np.int32), loss_mask=np.array([[0, 1, 1, 1, 0]]),
                 logprobs=np.zeros((1, 5), np.float32), rewards=np.array([1.0], np.float32),
                 is_truncated=np.array([False]))
    batch.update(overrides)
    return batch


@pytest.mark.parametrize("key,value", [
    ("attention_mask", np.array([[1, 1, 2, 1, 1]])),
    ("attention_mask", np.array([[1, 1, 0.5, 1, 1]], np.float32)),
    ("loss_mask", np.array([[0, 1, 2, 1, 0]])),
    ("loss_mask", np.array([[0, 1, np.nan, 1, 0]], np.float32)),
])
def test_every_mask_is_bool_or_zero_one(key, value):
    # Before: an attention_mask of 2 or 0.5 silently dropped the outcome reward; loss_mask took any nonzero.
    with pytest.raises(ValueError, match=rf"batch\['{key}'\] must be bool or hold only 0 and 1"):
        compute_advantages(mask_batch(**{key: value}), AdvantageConfig(kl_ctl=0.0))
    with pytest.raises(ValueError, match="mask must be bool or hold only 0 and 1"):
        normalize(np.zeros((1, 5), np.float32), value, NormConfig())
    # bool masks and 0/1 numbers are fine
    compute_advantages(mask_batch(**{key: np.asarray(value == 1)}), AdvantageConfig(kl_ctl=0.0))


def test_nan_rewards_and_a_per_row_lambda_outside_the_unit_interval_are_refused():
    with pytest.raises(ValueError, match=r"batch\['rewards'\] must be finite"):
        compute_advantages(mask_batch(rewards=np.array([np.nan], np.float32)), AdvantageConfig(kl_ctl=0.0))
    for lam in (1.5, -0.1, np.nan):
        with pytest.raises(ValueError, match="gae_lambda must be finite and in"):
            compute_advantages(mask_batch(gae_lambda=np.array([lam], np.float32)), AdvantageConfig(kl_ctl=0.0))


# --- 10.10 validate-config rejects what start-up rejects --------------------------------------------------

def config_with(tmp_path, scorers_yaml, shaping="process_weighted"):
    path = tmp_path / "config.yaml"
    path.write_text(f"""
rollout:
  agent:
    prm:
      advantage_shaping: {{mode: {shaping}}}
      scorers:
{scorers_yaml}
actor:
  token_rewards_as_adv: true
""")
    return path


@pytest.mark.parametrize("scorers,needle", [
    ("        - {path: scorers_for_tests.StrictKwargs, kwargs: {threshold: 3, colour: red}}",
     "does not accept ['colour']"),
    ("        - {path: scorers_for_tests.StrictKwargs}", "needs ['threshold']"),
    ("        - {path: scorers_for_tests.ConstantScorer, kwargs: {value: 1, weight: 2}}",
     "['weight'] belong to the entry itself"),
    ("        - {path: scorers_for_tests.ConstantScorer}\n        - {path: scorers_for_tests.ConstantScorer}",
     "scorer name 'constant' is already used"),
    ("        - &base {path: scorers_for_tests.ConstantScorer, weight: 1.0}\n        - {<<: *base, weight: 2.0}",
     "scorer name 'constant' is already used"),
    ("        - {path: scorers_for_tests.Nameless}", "has no class-level name"),
    ("        - {path: scorers_for_tests.NoGvpo}", "rejects this PRM config: a 0/1 judge"),
])
def test_validate_config_rejects_everything_start_up_would(tmp_path, scorers, needle):
    shaping = "gvpo" if "NoGvpo" in scorers else "process_weighted"
    path = config_with(tmp_path, scorers, shaping)
    for args in (("validate-config", path), ("score", "--config", path, "--input", DEMO, "--output",
                                              tmp_path / "out")):
        proc = prm_jax(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr[-2000:])
        assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_validate_config_builds_no_scorer(tmp_path):
    # ClosingScorer records construction side effects nowhere, but a constructor that raises would.
    path = config_with(tmp_path, "        - {path: scorers_for_tests.BrokenConstructor}")
    proc = prm_jax("validate-config", path)
    assert proc.returncode == 0 and "ok" in proc.stdout


# --- 10.11 bounded errors ---------------------------------------------------------------------------------

def test_a_yaml_alias_bomb_is_refused_quickly_with_a_short_message(tmp_path):
    levels = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        levels.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(levels) + "\nactor: *i\n")
    assert len(path.read_bytes()) < 700
    start = time.monotonic()
    proc = prm_jax("validate-config", path)
    elapsed = time.monotonic() - start
    assert proc.returncode == 2 and "nested aliases" in proc.stderr
    assert len(proc.stderr) < 2000
    assert elapsed < 30  # the whole process, start-up included; the refusal itself is milliseconds
    from prm_jax.config.loader import parse_yaml
    start = time.monotonic()
    with pytest.raises(ValueError, match="expands to more than"):
        parse_yaml(path.read_text(), "bomb.yaml")
    assert time.monotonic() - start < 0.5


def test_long_values_in_errors_are_truncated(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text("actor:\n  kl_estimator: " + "k" * 100_000 + "\n")
    proc = prm_jax("validate-config", path)
    assert proc.returncode == 2 and "kl_estimator" in proc.stderr and len(proc.stderr) < 1000


# --- 10.12 arguments first, outputs atomic ----------------------------------------------------------------

@pytest.mark.parametrize("make_args,needle", [
    (lambda p: ["--bucket", "0"], "--bucket must be >= 1"),
    (lambda p: ["--row-bucket", "0"], "--row-bucket must be >= 1"),
    (lambda p: ["--plot", str(p / "no" / "such" / "dir" / "rows.png")], "does not exist"),
])
def test_argument_errors_come_before_the_input_is_read(tmp_path, make_args, needle):
    # The input does not even exist: the argument error must come first.
    proc = score(tmp_path, tmp_path / "missing.jsonl", *make_args(tmp_path))
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr[-2000:]
    assert "missing.jsonl" not in proc.stderr


def test_an_output_path_that_is_a_file_is_refused_first(tmp_path):
    (tmp_path / "out").write_text("not a folder")
    proc = score(tmp_path, tmp_path / "missing.jsonl")
    assert proc.returncode == 2 and "exists and is not a directory" in proc.stderr
    assert (tmp_path / "out").read_text() == "not a folder"


def test_output_files_get_the_umask_mode_and_batch_is_uncompressed_by_default(tmp_path):
    proc = prm_jax("score", "--config", CONFIG, "--input", DEMO, "--output", tmp_path / "out", umask=0o022)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("batch.npz", "metrics.json"):
        assert stat.S_IMODE((tmp_path / "out" / name).stat().st_mode) == 0o644
    import zipfile
    with zipfile.ZipFile(tmp_path / "out" / "batch.npz") as archive:
        assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_STORED}
    proc = prm_jax("score", "--config", CONFIG, "--input", DEMO, "--output", tmp_path / "c", "--compress")
    with zipfile.ZipFile(tmp_path / "c" / "batch.npz") as archive:
        assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_DEFLATED}


# --- 10.13 why a group was rejected; exit codes -------------------------------------------------------------

def test_rejected_groups_are_reported_with_sessions_and_reason(tmp_path):
    path = config_with(tmp_path, "        - {path: scorers_for_tests.FailOnGroup, kwargs: {prefix: g1}}")
    proc = score(tmp_path, DEMO, config=path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "metrics.json").read_text())["summary"]
    rejected = summary["rejected_groups"]
    assert list(rejected) == ["g1"]
    assert rejected["g1"]["status"] == "rejected"
    assert rejected["g1"]["sessions"] == ["g1-s0", "g1-s1", "g1-s2", "g1-s3"]
    assert all("judge unavailable" in reason for reason in rejected["g1"]["reason"].values())
    assert "rejected group g1 (sessions g1-s0" in proc.stdout


def test_exit_status_1_when_no_group_is_accepted(tmp_path):
    path = config_with(tmp_path, "        - {path: scorers_for_tests.FailOnGroup, kwargs: {prefix: g}}")
    proc = score(tmp_path, DEMO, config=path)
    assert proc.returncode == 1 and "no group was accepted" in proc.stderr and "judge unavailable" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_library_bug_is_a_traceback_not_no_group_accepted(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the library")
    monkeypatch.setattr(cli, "compute_advantages", broken)
    monkeypatch.setattr(cli, "compute_advantage_variants", broken)
    with pytest.raises(RuntimeError, match="a bug in the library"):
        cli.main(["score", "--config", str(CONFIG), "--input", str(DEMO), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


# --- 10.14 smaller ------------------------------------------------------------------------------------------

def test_a_session_without_group_warns_once(tmp_path):
    items = sessions()
    for s in items[:2]:
        s.pop("group")
    proc = score(tmp_path, write_jsonl(tmp_path / "nogroup.jsonl", items))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("have no 'group'") == 1 and "2 session(s)" in proc.stderr


def test_json_lines_split_on_newline_only(tmp_path):
    items = sessions()
    items[0]["interactions"][0]["messages"] = [{"role": "user", "content": "line\u2028separator\u0085next"}]
    raw = "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in items)
    proc = score(tmp_path, write_jsonl(tmp_path / "u2028.jsonl", None, raw))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_failure_after_the_batch_began_keeps_an_earlier_output_set_whole(tmp_path, monkeypatch):
    # Issue 12: batch.npz is begun while the advantages compute; a failure then leaves no temporary file,
    # and the outputs of an earlier run as they were.
    out = tmp_path / "out"
    assert cli.main(["score", "--config", str(CONFIG), "--input", str(DEMO), "--output", str(out)]) == 0
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the library")
    monkeypatch.setattr(cli, "compute_advantage_variants", broken)
    monkeypatch.setattr(cli, "compute_advantages", broken)
    with pytest.raises(RuntimeError, match="a bug in the library"):
        cli.main(["score", "--config", str(CONFIG), "--input", str(DEMO), "--output", str(out), "--overwrite"])
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # no staging folder left


def test_a_failed_write_in_the_batch_thread_keeps_an_earlier_output_set_whole(tmp_path, monkeypatch):
    # Issue 12: the writer thread takes the timestep arrays while the summary is computed; a failure there
    # (a full disk) is raised by the command and leaves the earlier outputs as they were, no temporary file.
    out = tmp_path / "out"
    assert cli.main(["score", "--config", str(CONFIG), "--input", str(DEMO), "--output", str(out)]) == 0
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    write_npy = outputs.write_npy
    written = []

    def failing(handle, array):
        written.append(array)
        if len(written) == len(before_names) + 2:  # a timestep array: the batch's own keys came first
            raise OSError("disk full")
        return write_npy(handle, array)
    import zipfile
    with zipfile.ZipFile(out / "batch.npz") as archive:
        before_names = [name for name in archive.namelist() if not name.startswith("timestep_")]
    monkeypatch.setattr(outputs, "write_npy", failing)
    with pytest.raises(OSError, match="disk full"):
        cli.main(["score", "--config", str(CONFIG), "--input", str(DEMO), "--output", str(out), "--overwrite"])
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # no staging folder left


@pytest.mark.parametrize("array", [np.arange(12, dtype=np.int32).reshape(3, 4), np.zeros((2, 0), np.float32),
                                   np.array([True, False]), np.arange(6.0).reshape(2, 3)[:, 1],
                                   np.arange(4, dtype=">i4"), np.float32(2.5)])
def test_the_batch_writer_writes_numpys_npy_bytes(array):
    # Issue 12: batch.npz's members are written from the arrays' own memory (numpy copies every chunk twice
    # for a zip member); the bytes must be np.lib.format.write_array's, for any array.
    import io
    ours, numpys = io.BytesIO(), io.BytesIO()
    outputs.write_npy(ours, np.asanyarray(array))
    np.lib.format.write_array(numpys, np.asanyarray(array), allow_pickle=False)
    assert ours.getvalue() == numpys.getvalue()
