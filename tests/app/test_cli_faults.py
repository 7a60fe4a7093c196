"""Issue 10, the command line: located errors, exit codes, no partial output, bounded messages.

These run the installed ``prm-jax`` in a subprocess, as a user would.
"""

import json
import math
import os
import stat
import time

import numpy as np
import pytest
from app_helpers import (
    CONFIG,
    DEMO,
    ROOT,
    assert_input_error,
    config_with,
    prm_jax,
    score,
    sessions,
    write_jsonl,
)

from prm_jax import AdvantageConfig, NormConfig, compute_advantages
from prm_jax.app import _cli as cli
from prm_jax.app import _outputs as outputs
from prm_jax.app import _score as score_module
from prm_jax.kernels import normalize

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
    assert_input_error(proc, "lp.jsonl:1: interactions[0].output_logprobs: must be log-probabilities (<= 0)",
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
    from prm_jax.config._loader import parse_yaml
    start = time.monotonic()
    with pytest.raises(ValueError, match="aliases expand it by more than"):
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
    monkeypatch.setattr(score_module, "compute_advantages", broken)
    monkeypatch.setattr(score_module, "compute_advantage_variants", broken)
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
    monkeypatch.setattr(score_module, "compute_advantage_variants", broken)
    monkeypatch.setattr(score_module, "compute_advantages", broken)
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


# --- issue 29: where options meet, where numbers get big -------------------------------------------------

def in_process(capsys, *args):
    """``prm-jax`` in this process (no import or compile per call): exit status, stdout, stderr."""
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def yaml_config(tmp_path, *, actor=None, scorers=None, prm=None, top=None, name="config.yaml"):
    import yaml
    config = yaml.safe_load(CONFIG.read_text())
    config["actor"].update(actor or {})
    if scorers is not None:
        config["rollout"]["agent"]["prm"]["scorers"] = scorers
    config["rollout"]["agent"]["prm"].update(prm or {})
    config.update(top or {})
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("field", ["output_ref_logprobs", "output_prm_logprobs"])
def test_a_model_output_a_stage_reads_must_be_on_every_trained_turn(tmp_path, capsys, field):
    # Issue 29.5: sessions carrying them on some turns only got 0 on the others, silently (the KL reward
    # flipped sign, PRIME trained on 0 - 0). Refused before scoring: file, line, field.
    items = sessions()
    del items[5]["interactions"][1][field]
    path = write_jsonl(tmp_path / "partial.jsonl", items)
    readers = {"output_ref_logprobs": {"kl_ctl": 0.1}, "output_prm_logprobs": {"credit_assignment": {"mode": "prime"}}}
    config = yaml_config(tmp_path, actor=readers[field], prm={"advantage_shaping": {"mode": "additive"}})
    code, _, err = in_process(capsys, "score", "--config", config, "--input", path, "--output", tmp_path / "out")
    assert code == 2 and f"partial.jsonl:6: interactions[1].{field}: missing" in err, err
    assert not (tmp_path / "out").exists()


def test_an_unread_model_output_may_be_partial_and_is_nan_where_missing(tmp_path, capsys):
    items = sessions()
    del items[5]["interactions"][1]["output_ref_logprobs"]
    path = write_jsonl(tmp_path / "partial.jsonl", items)
    code, _, err = in_process(capsys, "score", "--config", ROOT / "prm_jax" / "data" / "demo_config.yaml",
                              "--input", path, "--output", tmp_path / "out")  # kl_ctl 0: no stage reads them
    assert code == 0, err
    batch = np.load(tmp_path / "out" / "batch.npz")
    n = len(items[5]["interactions"][1]["output_tokens"])
    assert int(np.isnan(batch["ref_logprobs"]).sum()) == n  # the turn's tokens, on timesteps: NaN, never 0
    assert np.isfinite(batch["timestep_advantages"]).all()
    # A model output no session carries (OTB's, a teacher's) is not written: all NaN, it would say nothing.
    assert "sum_pi_squared" not in batch.files and "teacher_logprobs" not in batch.files


def with_new_model_outputs(items):
    """The demo sessions with OTB's ``output_sum_pi_squared`` (from each token's log-prob: at least its pi^2)
    and a teacher's ``output_teacher_logprobs`` on every turn (issue 44)."""
    for session in items:
        for turn in session["interactions"]:
            p = [math.exp(lp) for lp in turn["output_logprobs"]]
            turn["output_sum_pi_squared"] = [round(q * q + 0.5 * (1 - q) ** 2, 5) for q in p]
            turn["output_teacher_logprobs"] = [round(lp - 0.1 * (k % 3), 4) for k, lp in enumerate(turn["output_logprobs"])]
    return items


def test_otb_reads_the_sessions_sum_pi_squared_and_refuses_turns_without_it(tmp_path, capsys):
    # Issue 44.1: output_sum_pi_squared is a session field, packed on timesteps as batch['sum_pi_squared'];
    # credit_assignment 'otb' reads it on every trained turn (absent on one: refused before scoring, located).
    config = yaml_config(tmp_path, actor={"kl_ctl": 0.0, "credit_assignment": {"mode": "otb"}},
                         prm={"advantage_shaping": {"mode": "additive"}})
    path = write_jsonl(tmp_path / "otb.jsonl", with_new_model_outputs(sessions()))
    code, _, err = in_process(capsys, "score", "--config", config, "--input", path, "--output", tmp_path / "out")
    assert code == 0, err
    batch = dict(np.load(tmp_path / "out" / "batch.npz"))
    active = batch["timestep_loss_mask"] > 0
    assert np.isfinite(batch["sum_pi_squared"][active]).all() and (batch["sum_pi_squared"][active] > 0).all()
    import reference
    fields = {"kl_ctl": 0.0, "credit_assignment": {"mode": "otb"}}  # (the example config's: additive shaping)
    inputs = {key: batch[key] for key in ("attention_mask", "loss_mask", "logprobs", "turn_ids", "token_rewards",
                                          "group_ids", "is_truncated", "sum_pi_squared") if key in batch}
    inputs["rewards"] = batch["rewards"]  # (what compute_advantages was given; original_rewards: before export)
    want = reference.compute_advantages(inputs, fields)
    np.testing.assert_allclose(batch["timestep_advantages"], want["advantages"], rtol=2e-4, atol=2e-4)
    items = with_new_model_outputs(sessions())
    del items[3]["interactions"][0]["output_sum_pi_squared"]
    path = write_jsonl(tmp_path / "partial.jsonl", items)
    code, _, err = in_process(capsys, "score", "--config", config, "--input", path, "--output", tmp_path / "o2")
    assert code == 2 and "partial.jsonl:4: interactions[0].output_sum_pi_squared: missing" in err, err
    items = with_new_model_outputs(sessions())
    items[2]["interactions"][0]["output_sum_pi_squared"][1] = 1.5
    path = write_jsonl(tmp_path / "bad.jsonl", items)
    code, _, err = in_process(capsys, "score", "--config", config, "--input", path, "--output", tmp_path / "o3")
    assert code == 2 and "bad.jsonl:3: interactions[0].output_sum_pi_squared: must be probabilities in [0, 1], " \
        "got 1.5" in err, err


def test_teacher_logprobs_travel_from_the_sessions_to_the_batch_nan_where_a_turn_has_none(tmp_path, capsys):
    # Issue 44.3 (offline): output_teacher_logprobs is packed on timesteps as batch['teacher_logprobs'] for the
    # trainer's distillation loss; no stage reads it, so a turn without it is NaN there, never 0.
    items = with_new_model_outputs(sessions())
    del items[5]["interactions"][1]["output_teacher_logprobs"]
    path = write_jsonl(tmp_path / "teacher.jsonl", items)
    code, _, err = in_process(capsys, "score", "--config", ROOT / "prm_jax" / "data" / "demo_config.yaml",
                              "--input", path, "--output", tmp_path / "out")
    assert code == 0, err
    batch = np.load(tmp_path / "out" / "batch.npz")
    n = len(items[5]["interactions"][1]["output_tokens"])
    assert int(np.isnan(batch["teacher_logprobs"]).sum()) == n
    rows = [b for b in range(batch["input_ids"].shape[0]) if not np.isnan(batch["teacher_logprobs"][b]).any()]
    b = rows[0]
    active = batch["timestep_loss_mask"][b] > 0
    # On timesteps: at t the teacher's log-prob of position t + 1's token, as the logprobs are shifted.
    shifted = np.concatenate([batch["logprobs"][b, 1:], [0.0]])
    gap = shifted[active] - batch["teacher_logprobs"][b][active]
    assert np.isclose(gap, np.round(gap, 1), atol=2e-4).all() and (gap >= -1e-4).all() and gap.max() > 0.15


def test_gdpo_sources_follow_the_configs_order_and_are_named(tmp_path, capsys):
    # Issue 29.6: the weights went to the scorers in sorted-name order: with zeta (weight 1) then alpha (0)
    # the rows were ranked by alpha. 29.7: the columns are the config's (NaN where unscored), named.
    config = yaml_config(tmp_path, scorers=[{"path": "scorers_for_tests.Zeta"}, {"path": "scorers_for_tests.Alpha"}],
                         actor={"kl_ctl": 0.0, "reward_norm": {"mode": "decoupled", "weights": [0.0, 1.0, 0.0]}},
                         prm={"advantage_shaping": {"mode": "additive"}})
    code, _, err = in_process(capsys, "score", "--config", config, "--input", DEMO, "--output", tmp_path / "out")
    assert code == 0, err
    batch = np.load(tmp_path / "out" / "batch.npz")
    assert batch["reward_source_names"].tolist() == ["outcome", "zeta", "alpha"]
    summary = json.loads((tmp_path / "out" / "metrics.json").read_text())["summary"]
    assert summary["reward_sources"] == ["outcome", "zeta", "alpha"]
    ids, turns = batch["input_ids"], batch["turn_ids"]
    zeta = [sum(float(ids[b][np.flatnonzero(turns[b] == k)[0]] % 7) for k in range(turns[b].max() + 1))
            for b in range(ids.shape[0])]
    np.testing.assert_allclose(batch["reward_sources"][:, 0], zeta, rtol=1e-6)
    import reference
    columns = np.concatenate([batch["original_rewards"][:, None], batch["reward_sources"]], axis=1)
    outcome_step = np.maximum(batch["attention_mask"].sum(axis=1) - 2, 0)
    got = batch["timestep_tot_rewards"][np.arange(ids.shape[0]), outcome_step]
    want = reference.decoupled(columns, [0.0, 1.0, 0.0], batch["group_ids"])
    assert not np.allclose(want, reference.decoupled(columns, [0.0, 0.0, 1.0], batch["group_ids"]))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gdpo_weights_of_the_wrong_length_are_refused_at_configuration(tmp_path, capsys):
    # Issue 29.7: validate-config accepted reward_norm.weights of any length; score refused them only after
    # scoring everything.
    config = yaml_config(tmp_path, actor={"reward_norm": {"mode": "decoupled", "weights": [1.0, 1.0, 1.0]}})
    for command in (("validate-config", config), ("score", "--config", config, "--input", DEMO, "--output",
                                                  tmp_path / "out")):
        code, _, err = in_process(capsys, *command)
        assert code == 2 and "actor.reward_norm.weights has 3 entries but there are 2 reward sources" in err, err
        assert err.count(str(config)) == 1  # issue 29.26: the file is named once
    assert not (tmp_path / "out").exists()


def test_keep_original_with_the_judge_down_everywhere_keeps_every_source_and_says_so(tmp_path, capsys):
    # Issue 29.7: with keep_original and the judge down on every session the batch lost a source column, so a
    # valid config failed after scoring; 29.22: the fallbacks showed only in metrics.json.
    config = yaml_config(tmp_path, scorers=[{"path": "scorers_for_tests.FailOnGroup", "kwargs": {"prefix": "g"}}],
                         actor={"kl_ctl": 0.0, "reward_norm": {"mode": "decoupled", "weights": [1.0, 1.0]}},
                         prm={"error_policy": "keep_original", "advantage_shaping": {"mode": "additive"}})
    code, out, err = in_process(capsys, "score", "--config", config, "--input", DEMO, "--output", tmp_path / "out")
    assert code == 0, err
    assert "16 session(s) exported unscored after a scorer failed (error_policy: keep_original):" in out
    assert "g0-s0: RuntimeError: judge unavailable" in out
    batch = np.load(tmp_path / "out" / "batch.npz")
    assert batch["reward_sources"].shape[1] == 1 and np.isnan(batch["reward_sources"]).all()


@pytest.mark.parametrize("field", ["output_logprobs", "output_prm_logprobs", "output_ref_logprobs", "reward",
                                   "step_reward", "token_rewards"])
def test_one_number_rule_for_every_numeric_field(tmp_path, capsys, field):
    # Issue 29.19: a 333-digit integer in the log-prob fields ended in an OverflowError traceback; 29.20:
    # 3.5e38 passed as reward and reached batch.npz as inf. Finite, and finite in float32: located, exit 2.
    for value, needle in (("-" + "9" * 333, "must be finite"), ("-3.5e38", "must be finite in float32")):
        items = sessions()
        turn = items[2]["interactions"][-1]
        n = len(turn["output_tokens"])
        turn[field] = "@@"
        raw = "".join(json.dumps(s) + "\n" for s in items).replace(
            '"@@"', value if field in ("reward", "step_reward") else "[" + ", ".join([value] + ["-0.5"] * (n - 1)) + "]")
        path = write_jsonl(tmp_path / "big.jsonl", None, raw)
        code, _, err = in_process(capsys, "score", "--config", CONFIG, "--input", path, "--output", tmp_path / "out")
        index = len(items[2]["interactions"]) - 1
        assert code == 2 and f"big.jsonl:3: interactions[{index}].{field}: {needle}" in err, err
        assert "Traceback" not in err


def test_a_turn_without_output_tokens_is_refused_when_read(tmp_path, capsys):
    # Issue 29.23: it passed the reader, then every scorer failed on it, and under keep_original the session
    # silently fell back; unscorable input is never a fallback.
    items = sessions()
    leaf = items[4]["interactions"][-1]
    leaf["output_tokens"], leaf["output_logprobs"] = [], []
    for key in ("output_ref_logprobs", "output_prm_logprobs", "token_rewards"):
        leaf.pop(key, None)
    path = write_jsonl(tmp_path / "empty.jsonl", items)
    config = yaml_config(tmp_path, prm={"error_policy": "keep_original"})
    code, _, err = in_process(capsys, "score", "--config", config, "--input", path, "--output", tmp_path / "out")
    index = len(items[4]["interactions"]) - 1
    assert code == 2 and f"empty.jsonl:5: interactions[{index}].output_tokens: must hold at least one token" in err


def test_a_ready_inner_node_without_a_reward_under_turn_discount(tmp_path, capsys):
    # Issue 29.24: it was refused, and the message called it a leaf; README: an unset reward counts 0, so the
    # node gets the discounted mean of its children's. Without turn_discount it needs a reward of its own.
    items = sessions()
    session = items[6]  # g1-s2: t2 has two children (t3 and retry), both rewarded 1.0
    session["ready"] = ["g1-s2-t2", "g1-s2-t3"]
    path = write_jsonl(tmp_path / "inner.jsonl", items)
    code, _, err = in_process(capsys, "score", "--config", CONFIG, "--input", path, "--output", tmp_path / "a")
    assert code == 2 and "inner.jsonl:7: reward: the ready trajectory ending at 'g1-s2-t2' needs an outcome reward" \
        in err and "it has children" in err and "leaf" not in err.split("reward:")[1], err
    config = yaml_config(tmp_path, top={"turn_discount": 0.5})
    code, _, err = in_process(capsys, "score", "--config", config, "--input", path, "--output", tmp_path / "b")
    assert code == 0, err
    batch = np.load(tmp_path / "b" / "batch.npz")
    group = batch["group_ids"] == 1  # g1-s0, g1-s1, g1-s2 (t2, t3), g1-s3: t2's reward 0 + 0.5 * mean(1, 1)
    raw = np.array([0.0, 0.0, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(batch["rewards"][group], (raw - raw.mean()) / (raw.std() + 1e-8), rtol=1e-5)
    np.testing.assert_array_equal(batch["original_rewards"][group], [0.0, 0.0, 0.0, 1.0, 1.0])  # as given


def test_validate_config_refuses_tree_credit_with_turn_level_gae_naming_both_keys(tmp_path, capsys):
    # Issue 29.26: the pair was accepted for tree (and refused for pure and prime).
    config = yaml_config(tmp_path, actor={"credit_assignment": {"mode": "tree"}, "gae_timestep_unit": "turn"})
    code, _, err = in_process(capsys, "validate-config", config)
    assert code == 2 and "gae_timestep_unit 'turn' cannot be combined with credit_assignment.mode" in err, err


def test_a_long_flat_list_is_not_an_alias_bomb(tmp_path, capsys):
    # Issue 29.26: a flat list of 100,000 numbers was refused as "nested aliases?".
    import yaml
    config = yaml.safe_load(CONFIG.read_text())
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(config) + "extra: [" + ", ".join(["1"] * 100_000) + "]\n")
    code, _, err = in_process(capsys, "validate-config", path)
    assert code == 0 and "aliases" not in err, err


def test_a_closed_stdout_stops_the_command_quietly_with_status_1(tmp_path):
    # `prm-jax demo | head -1`: the summary's next line met a closed pipe; BrokenPipeError is an OSError, and the
    # OSError clause re-raised it as a traceback before the clause meant for it was reached.
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "prm_jax.app._cli", "demo", "--output", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    first = proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert first.startswith(b"prm-jax demo:") and proc.returncode == 1 and b"Traceback" not in err, err[-2000:]
