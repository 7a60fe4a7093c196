"""Issue 46.2: what the demo and ``prm-jax score`` print explains itself (a legend of the columns, each
shaping mode's rule, what the process rewards moved, a pointer to ``--plot``). End-to-end: each runs the whole
command line in process (tests/conftest.py's E2E_FILES)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import documentation

import prm_jax
from prm_jax.app import _cli as cli


def _process_weighted(a: float, p: float) -> float:
    """AReaL's process_weighted rule for one timestep, written out for the test."""
    if a >= 0:
        return a * p
    return p if p > 0 else a


def test_the_demo_explains_its_columns_and_modes_and_says_what_process_rewards_moved(capsys):
    # Issue 46.2: the demo's P column had no legend, process_weighted turning a failed row's -0.577 into +1.0
    # and gvpo equal to none looked like bugs, and nothing said how much the process rewards changed. The
    # count of moved timesteps is checked against the rule applied by a plain loop to the unshaped
    # advantages and the process rewards of the same run.
    import numpy as np

    from prm_jax.app import _report as report
    from prm_jax.app._score import score
    from prm_jax.kernels._alignment import shift_to_next_token

    assert cli.main(["demo"]) == 0
    text = capsys.readouterr().out
    for name, _ in (*report.TURN_COLUMNS, *report.MODE_COLUMNS):
        assert f"  {name} " in text, name
    # Issue 57.11: the per-mode table's legend follows it, and the batch's rows are explained by the sessions'
    # trees, counted here from the bundled file by a plain loop (a leaf: an interaction no other one continues).
    modes_table = text.index("  mode ")
    assert text.index("columns:", modes_table) < text.index("each mode's rule")
    sessions, leaves, branched = 0, 0, 0
    for line in (Path(prm_jax.__file__).parent / "data" / "demo_sessions.jsonl").read_text().splitlines():
        interactions = json.loads(line)["interactions"]
        continued = {i.get("parent_id") for i in interactions}
        ends = sum(i["id"] not in continued for i in interactions)
        sessions, leaves, branched = sessions + 1, leaves + ends, branched + (ends > 1)
    assert (sessions, leaves, branched) == (16, 17, 1)
    assert (f"{leaves} trajectories in the batch ({sessions} sessions, one trajectory per leaf of a session's "
            f"turns: {branched} session branches)") in text
    for mode in ("none", "additive", "gvpo", "process_weighted"):
        assert any(line.startswith(f"  {mode} ") and len(line.split()) > 4 for line in text.splitlines()), mode
    assert "no P < 0 here, so it equals none" in text  # (a 0..1 length budget never gives a negative P)
    assert "--plot turns.png" in text

    data = Path(prm_jax.__file__).parent / "data"
    run = score(cli._load_config(str(data / "demo_config.yaml")), str(data / "demo_sessions.jsonl"))
    mask = np.asarray(run.configured.loss_mask) > 0
    unshaped = np.asarray(run.outputs["none"].advantages, np.float64)
    process = np.asarray(shift_to_next_token(run.batch["token_rewards"]), np.float64)
    moved = flipped = 0
    for b, t in zip(*np.nonzero(mask)):
        a = float(np.float32(unshaped[b, t]))
        after = _process_weighted(a, float(np.float32(process[b, t])))
        moved += after != a
        flipped += (after > 0 > a) or (after < 0 < a)
    assert moved > 0 and flipped > 0
    line = " ".join(text.split())
    assert (f"process rewards (process_weighted) moved the advantages of {moved:,} of {int(mask.sum()):,} trained "
            f"timesteps") in line and f"{flipped:,} changed sign" in line, line


def test_the_summary_says_nothing_of_sessions_where_each_is_one_row(tmp_path):
    import dataclasses

    from prm_jax.app import _report as report
    from prm_jax.app._score import score

    data = Path(prm_jax.__file__).parent / "data"
    summary = score(cli._load_config(str(data / "demo_config.yaml")), str(data / "demo_sessions.jsonl")).summary
    assert (summary.trajectories, summary.sessions, summary.branched_sessions) == (17, 16, 1)
    assert summary.as_json()["sessions"] == 16 and summary.as_json()["branched_sessions"] == 1
    assert report.trajectories_why(dataclasses.replace(summary, trajectories=16, branched_sessions=0)) == ""


def test_score_shows_a_per_turn_view_and_points_to_the_plot(tmp_path, capsys):
    data = Path(prm_jax.__file__).parent / "data"
    code = cli.main(["score", "--config", str(data / "demo_config.yaml"), "--input", str(data / "demo_sessions.jsonl"),
                     "--output", str(tmp_path / "out"), "--no-progress"])
    text = capsys.readouterr().out
    assert code == 0
    assert "per turn (timesteps predicting the turn's tokens)" in text and "columns:" in text
    assert "see every timestep: add --plot turns.png" in text


def test_the_first_screens_walkthrough_scores_its_three_sessions_and_says_what_moved(tmp_path):
    # Issue 46.1: a new user reaches a scored run of their own scorer from the README's first screen alone; what
    # the README says it prints is what it prints (row a's 3 and row c's 4 tokens thank the user: 7 of 9 move).
    section = documentation.text()
    section = section[section.index("## Your own scorer in five minutes"):]
    body = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-e", "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = " ".join(proc.stdout.split())
    assert "process rewards (additive) moved the advantages of 7 of 9 trained timesteps" in text, text
    assert (tmp_path / "turns.png").stat().st_size > 10_000 and (tmp_path / "out" / "batch.npz").is_file()
    assert "process rewards (additive) moved the advantages of 7 of 9 trained timesteps" in " ".join(section.split())
