"""Issue 12: the host path of `prm-jax score` on many sessions, under a memory ceiling."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from app_helpers import equal_records

from examples.rollout_dump import generate
from prm_jax.app.sessions import read_sessions

ROOT = Path(__file__).resolve().parents[2]

MEMORY_CEILING_MB = 1500  # jax itself takes ~300 MB; 10,000 small sessions are a 48 MB file


def test_ten_thousand_small_sessions_are_scored_under_a_memory_ceiling(tmp_path):
    data = tmp_path / "sessions.jsonl"
    size = generate(data, sessions=10_000, turns=2, tokens=20, group=8)
    out = tmp_path / "out"
    # The command as the prm-jax process runs it (entry: tune_process=True). Its own peak: VmHWM belongs to
    # the process image; ru_maxrss survives execve on Linux, so a child forked from a large pytest process
    # reported the parent's size (1.58 GB here against 0.69 GB of its own).
    script = ("import resource, sys; from prm_jax.app._cli import main; code = main(sys.argv[1:], tune_process=True); "
              "status = open('/proc/self/status').read() if sys.platform == 'linux' else ''; "
              "hwm = [line.split()[1] for line in status.splitlines() if line.startswith('VmHWM:')]; "
              "print('peak_kb', hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", script, "score", "--config",
                           str(ROOT / "prm_jax" / "data" / "demo_config.yaml"), "--input", str(data),
                           "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak_mb = int(proc.stdout.split("peak_kb")[-1].split()[0]) / 1024
    assert peak_mb < MEMORY_CEILING_MB, f"peak RSS {peak_mb:.0f} MB for a {size / 1e6:.0f} MB input"
    summary = json.loads((out / "metrics.json").read_text())["summary"]
    assert summary["trajectories"] == 10_000 and summary["groups"]["accepted"] == 1250


def test_turns_share_one_token_buffer_per_branch(tmp_path):
    # The repeated prefixes are held once: every turn's input and output tokens are views of the leaf's.
    data = tmp_path / "s.jsonl"
    generate(data, sessions=3, turns=4, tokens=10, group=3)
    for record in read_sessions(data):
        turns = list(record.cache)
        base = turns[-1].input_tokens.base
        assert base is not None and all(t.input_tokens.base is base and t.output_tokens.base is base for t in turns)
        assert not turns[0].input_tokens.flags.writeable
        # ... and hold exactly what the file says.
        raw = json.loads(data.read_text().splitlines()[record.line - 1])["interactions"]
        for turn, item in zip(turns, raw):
            np.testing.assert_array_equal(turn.input_tokens, item["input_tokens"])
            np.testing.assert_array_equal(turn.output_tokens, item["output_tokens"])


def test_lines_the_fast_path_cannot_take_are_read_by_the_checked_path(tmp_path):
    # A token list written in another style than its ancestor's (other spacing) is valid JSON that the byte
    # prefix check cannot take: the field-by-field path reads it instead of refusing it.
    line = {"session_key": "s", "group": "g", "interactions": [
        {"id": "a", "input_tokens": [1, 2], "output_tokens": [3], "output_logprobs": [-0.5]},
        {"id": "b", "parent_id": "a", "input_tokens": [1, 2, 3, 4], "output_tokens": [5], "reward": 1.0}]}
    text = json.dumps(line).replace('"input_tokens": [1, 2, 3, 4]', '"input_tokens": [1,2,3,  4]')
    path = tmp_path / "styles.jsonl"
    path.write_text(text + "\n")
    (record,) = read_sessions(path)
    np.testing.assert_array_equal(record.cache.get("b").input_tokens, [1, 2, 3, 4])
    np.testing.assert_array_equal(record.cache.get("a").output_tokens, [3])


def test_the_fast_path_builds_the_same_interactions_as_the_checked_path():
    # Issue 12: the fast path validates once per branch and builds interactions without per-turn re-checks
    # (Interaction.prevalidated); every field must equal what the field-by-field path builds.
    from importlib import resources

    from prm_jax.app.sessions import _fast_session, _slow_session

    path = resources.files("prm_jax") / "data" / "demo_sessions.jsonl"
    lines = path.read_bytes().splitlines()
    assert lines
    for number, line in enumerate(lines, start=1):
        fast, _ = _fast_session(line, path, number)
        slow, _ = _slow_session(line, path, number)
        equal_records(fast, slow)


def _session_line(rng: np.random.Generator, spacing: str) -> tuple[bytes, bool]:
    """A session of 1-4 turns (sometimes two leaves sharing their ancestors), token lists written with
    ``spacing`` after commas, possibly with one flaw or with the leaf's inputs in another style; returns the
    line and whether it is unflawed and in one style."""
    turns, items, prefix, parent = int(rng.integers(1, 5)), [], [], None
    for k in range(turns):
        outputs = [int(t) for t in rng.integers(0, 200, int(rng.integers(1, 4)))]
        items.append({"id": f"t{k}", "parent_id": parent, "input_tokens": list(prefix), "output_tokens": outputs,
                      "output_logprobs": [-0.25] * len(outputs)})
        prefix = prefix + outputs + [int(t) for t in rng.integers(0, 200, int(rng.integers(0, 3)))]
        parent = f"t{k}"
    items[-1]["reward"] = 1.0
    if turns > 1 and rng.random() < 0.3:  # a second leaf branching off the root
        root = items[0]
        items.append({"id": "b", "parent_id": "t0", "input_tokens": root["input_tokens"] + root["output_tokens"],
                      "output_tokens": [7], "reward": 0.0})
    flaw = rng.integers(0, 8)
    if flaw == 1:  # one token changed in an ancestor: the concat rule breaks
        victim = items[int(rng.integers(0, len(items)))]
        field = "input_tokens" if victim["input_tokens"] and rng.random() < 0.5 else "output_tokens"
        if victim[field]:
            victim[field][int(rng.integers(0, len(victim[field])))] += 1000
    elif flaw == 2:  # a token id out of range, a float, or a bool somewhere
        victim = items[int(rng.integers(0, len(items)))]
        victim["output_tokens"] = victim["output_tokens"] + [rng.choice([-1, 2**31, 2**70, 1.5, True])]
    elif flaw == 3:  # a number cut short: "[.., 12]" of a parent against "[.., 123, ..]" in the leaf
        for item in items[1:]:
            if item["input_tokens"]:
                item["input_tokens"][-1] = item["input_tokens"][-1] * 10 + 3
                break
    elif flaw == 5:  # a turn that generated nothing (issue 29.23: refused by both readers)
        victim = items[int(rng.integers(0, len(items)))]
        victim["output_tokens"], victim["output_logprobs"] = [], []
    restyled = None
    if flaw == 4:  # valid, but the leaf's inputs are written in another style than its ancestors'
        restyled, items[-1]["input_tokens"] = items[-1]["input_tokens"], "@"
    text = json.dumps({"session_key": "s", "group": "g", "interactions": items}, separators=("," + spacing, ":"))
    if restyled is not None:
        text = text.replace('"@"', "[ " + " ,".join(map(str, restyled)) + "]")
    return text.encode(), flaw in (0, 6, 7)


def test_the_fast_reader_agrees_with_the_checked_path_on_valid_and_flawed_lines(tmp_path):
    # Issue 12: the fast path parses only each leaf's tokens and compares every ancestor's token lists to
    # the leaf's as bytes. Whatever a line holds, reading it gives exactly what the field-by-field path gives:
    # the same interactions, or an error naming the same line and field.
    from prm_jax.app.sessions import InputError, _fast_session, _slow_session

    rng = np.random.default_rng(12)
    outcomes = {"fast": 0, "checked": 0, "refused": 0}
    for case in range(600):
        line, clean = _session_line(rng, ["", " ", "  "][case % 3])
        path = tmp_path / f"{case}.jsonl"
        path.write_bytes(line + b"\n")
        try:
            slow, _ = _slow_session(line, path, 1)
        except InputError as err:
            with pytest.raises(InputError) as caught:
                read_sessions(path)
            assert str(caught.value) == str(err)
            outcomes["refused"] += 1
            continue
        (record,) = read_sessions(path)
        equal_records(record, slow)
        try:
            fast, _ = _fast_session(line, path, 1)
            outcomes["fast"] += 1
            equal_records(fast, slow)
        except ValueError:
            outcomes["checked"] += 1
            assert not clean, line  # a well-formed line in one style takes the fast path
    assert min(outcomes.values()) > 20, outcomes


def test_a_turn_whose_parent_is_missing_is_a_located_error(tmp_path):
    # The fast path raised a bare KeyError here (a traceback instead of the file, line and field).
    from prm_jax.app.sessions import InputError

    path = tmp_path / "orphan.jsonl"
    path.write_text(json.dumps({"session_key": "s", "interactions": [
        {"id": "b", "parent_id": "zz", "input_tokens": [1], "output_tokens": [2], "reward": 1.0}]}) + "\n")
    with pytest.raises(InputError, match=r"orphan.jsonl:1: interactions: interaction 'b' has parent 'zz'"):
        read_sessions(path)
