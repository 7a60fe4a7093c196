"""Issue 46 (its first pieces): the command line says its version, and the demo data's generator takes a
count and an output path and never writes into the package by itself."""

import subprocess
import sys
from pathlib import Path

import pytest

import prm_jax
from prm_jax.app import _cli as cli
from prm_jax.app.sessions import read_sessions

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "examples" / "make_demo_sessions.py"


def test_prm_jax_version_prints_the_packages_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"prm-jax {prm_jax.__version__}"


def test_the_demo_generator_writes_n_sessions_where_told_and_its_defaults_are_the_bundled_data(tmp_path):
    bundled = ROOT / "prm_jax" / "data" / "demo_sessions.jsonl"
    before = bundled.read_bytes()
    run = subprocess.run([sys.executable, str(GENERATOR), "--sessions", "10", "--output", str(tmp_path / "ten.jsonl")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    records = read_sessions(tmp_path / "ten.jsonl")
    assert len(records) == 10 and len({r.group for r in records}) == 3  # groups of 4: 4, 4, 2
    run = subprocess.run([sys.executable, str(GENERATOR)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "demo_sessions.jsonl").read_bytes() == before  # the defaults: the bundled data set
    assert bundled.read_bytes() == before  # (never written by itself)
    run = subprocess.run([sys.executable, str(GENERATOR), "--sessions", "0"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and "--sessions must be at least 1" in run.stderr


def test_the_missing_reference_warning_says_how_to_fix_it():
    # Issue 46: leaving out actor.kl_ctl (0.1 by default) without reference log-probs warned with no fix.
    import numpy as np

    batch = {"attention_mask": np.ones((1, 4), np.int32), "loss_mask": np.array([[0, 1, 1, 1]], np.int32),
             "logprobs": np.full((1, 4), -0.5, np.float32), "rewards": np.ones(1, np.float32),
             "is_truncated": np.zeros(1, bool)}
    with pytest.warns(UserWarning, match=r"set actor\.kl_ctl: 0 to train without a KL term, or give the reference "
                                         r"model's log-probs \(batch\['ref_logprobs'\], the sessions' "
                                         r"output_ref_logprobs\)"):
        prm_jax.compute_advantages(batch, prm_jax.AdvantageConfig())


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_subcommand_describes_itself_with_an_example_and_its_exit_statuses(command, capsys):
    # Issue 46.4: demo, validate-config and doctor had no description, none an example or the exit codes.
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    description, example = cli.COMMANDS[command]
    assert done.value.code == 0
    assert " ".join(description.split()) in text and f"example: {example}" in text
    assert f"{cli.EXIT_WRITE_FAILED} the output could not be written" in text and "128 + N stopped by signal N" in text


def test_the_progress_line_names_each_phase_as_it_starts(tmp_path, capsys):
    # Issue 46.4: on 20,000 sessions the terminal stayed blank while reading, then froze at "ETA 0 s" while
    # packing, computing and writing, no phase named.
    code = cli.main(["score", "--config", str(ROOT / "examples" / "prm_config.yaml"), "--input",
                     str(ROOT / "prm_jax" / "data" / "demo_sessions.jsonl"), "--output", str(tmp_path / "out"),
                     "--progress"])
    err = capsys.readouterr().err
    assert code == 0, err
    phases = ["reading sessions ...", "scoring and exporting ...", "16/16 sessions", "packing the batch ...",
              "computing advantages ...", "writing outputs ..."]
    where = [err.find(phase) for phase in phases]
    assert -1 not in where and where == sorted(where), err
    code = cli.main(["score", "--config", str(ROOT / "examples" / "prm_config.yaml"), "--input",
                     str(ROOT / "prm_jax" / "data" / "demo_sessions.jsonl"), "--output", str(tmp_path / "quiet"),
                     "--quiet"])
    assert code == 0 and "reading sessions" not in capsys.readouterr().err


def test_a_scorer_module_not_found_says_where_it_was_looked_for(tmp_path, capsys, monkeypatch):
    # Issue 46: a scorer module of one's own is found from its own folder only; the error gave no hint.
    config = tmp_path / "config.yaml"
    config.write_text("rollout:\n  agent:\n    prm:\n      scorers:\n        - path: myjudge_not_here.Judge\n"
                      "actor:\n  kl_ctl: 0.0\n")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["validate-config", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "cannot import module 'myjudge_not_here'" in err
    assert f"looked in the current folder {tmp_path}" in err or f"does not hold the current folder {tmp_path}" in err
    assert "add that folder to PYTHONPATH" in err


def test_the_command_line_guide_names_every_option_of_every_subcommand():
    # Issue 46.4: the command-line guide is checked against the parser: an option added to a subcommand and left
    # out of the guide fails here.
    import argparse

    guide = (ROOT / "docs" / "guides" / "command-line.md").read_text()
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, sub in subparsers.choices.items():
        assert f"prm-jax {name}" in guide, name
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help") and option not in guide:
                    missing.append(f"{name} {option}")
    for action in parser._actions:
        missing += [option for option in action.option_strings if option not in ("-h", "--help") and option not in guide]
    assert missing == []


def test_the_release_metadata_is_complete_and_invents_no_home():
    # Issue 46.5: no public home yet, so no [project.urls] (invented addresses would publish wrong metadata); the
    # rest is complete: a readme, a license file, keywords and classifiers (a license, Python versions, typed).
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "urls" not in project
    assert project["readme"] == "README.md" and (ROOT / project["readme"]).is_file()
    license_files = project.get("license-files") or [project.get("license", {}).get("file")]
    assert license_files and all((ROOT / f).is_file() for f in license_files), project.get("license")
    assert len(project["keywords"]) >= 5 and project["description"]
    classifiers = project["classifiers"]
    assert any(c.startswith("License ::") for c in classifiers) or isinstance(project.get("license"), str)
    assert "Typing :: Typed" in classifiers
    assert {f"Programming Language :: Python :: 3.{v}" for v in (11, 12, 13)} <= set(classifiers)
    assert project["requires-python"].startswith(">=3.11")


def test_the_eta_is_smoothed_and_withheld_until_it_means_something():
    # Issue 55.21: the first ETA of a run read 24,106 s for a scoring phase of 8.9 s (the rate counted the
    # warm-up). A clock run by hand: 20 s of warm-up before the first group, then 1,000 sessions at 100/s.
    import io

    now = [0.0]
    stream = io.StringIO()
    line = cli.Progress(True, stream=stream, clock=lambda: now[0])
    now[0] = 20.0
    line(8, 1000)  # the first group: the rate starts here
    etas = []
    for done in range(18, 1001, 10):
        now[0] += 0.1
        line(done, 1000)
        etas.append(stream.getvalue().rsplit("ETA ", 1)[1].split()[0])
    assert stream.getvalue().split("\r")[1].endswith("--/s, ETA -- ")  # no rate, no ETA from one group
    assert etas[:19] == ["--"] * 19  # under 2 s of measurement: withheld
    shown = [float(eta) for eta in etas[19:-1]]
    remaining = [(1000 - done) / 100 for done in range(18, 1001, 10)][19:-1]
    assert all(abs(eta - want) <= 1 for eta, want in zip(shown, remaining)), list(zip(shown, remaining))[:5]
