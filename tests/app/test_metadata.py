"""Issue 42.2: per-session data for scorers. A session line may carry ``metadata`` (any JSON object, at most
64 KiB encoded and 32 levels deep; refused beyond with file, line and field, exit 2), given to every scorer
of the session as ``ctx["metadata"]`` (read-only) and carried on the exported trajectories; the array path
takes the same per row (``metadata=[...]``); ``Interaction.turn_index`` is the turn's index in its branch."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from app_helpers import DEMO, config_with, equal_records, sessions, write_jsonl

from prm_jax import PRMRunner, score_arrays
from prm_jax.app._cli import main
from prm_jax.app.sessions import InputError, _fast_session, _slow_session, read_sessions
from prm_jax.runtime._context import MAX_METADATA_BYTES, check_metadata

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scorers_for_tests import AnswerMatch, TurnIndexInAProcess

pytestmark = pytest.mark.anyio


def answer_sessions(n=20):
    """``n`` sessions with the same interactions (each turn replies "42"), their ``metadata`` answers
    "42" on even sessions and "41" on odd ones: only the metadata tells them apart."""
    base = sessions()[0]
    out = []
    for i in range(n):
        line = json.loads(json.dumps(base))
        line["session_key"], line["group"] = f"s{i}", f"g{i // 4}"
        for turn in line["interactions"]:
            turn["id"] = f"s{i}-{turn['id']}"
            turn["parent_id"] = None if turn["parent_id"] is None else f"s{i}-{turn['parent_id']}"
            turn["output_messages"] = [{"role": "assistant", "content": "42"}]
        line["ready"] = [f"s{i}-{leaf}" for leaf in line["ready"]] if "ready" in line else line.get("ready")
        if line["ready"] is None:
            del line["ready"]
        line["metadata"] = {"answer": "42" if i % 2 == 0 else "41", "task_id": f"gsm8k/{i}"}
        out.append(line)
    return out


def test_20_sessions_that_differ_only_in_metadata_score_by_it(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", answer_sessions(20))
    config = config_with(tmp_path, "        - {path: scorers_for_tests.AnswerMatch}", shaping="additive")
    assert main(["score", "--config", str(config), "--input", str(path), "--output", str(tmp_path / "out")]) == 0
    with np.load(tmp_path / "out" / "batch.npz") as batch:
        rewards, turns = batch["token_rewards"], batch["turn_ids"]
        # One row per session, in input order (groups of 4 consecutive sessions).
        assert rewards.shape[0] == 20
        for b in range(20):
            scored = rewards[b][turns[b] >= 0]
            assert scored.size and np.all(scored == (1.0 if b % 2 == 0 else 0.0)), (b, scored)


def test_both_readers_read_metadata_alike_and_default_to_none(tmp_path):
    line = answer_sessions(1)[0]
    for metadata in ({"answer": "42"}, {"n": [1, 2.5, {"x": None}], "ok": True, "big": 2 ** 70}, {}):
        line["metadata"] = metadata
        raw = json.dumps(line).encode()
        fast, _ = _fast_session(raw, tmp_path, 1)
        slow, _ = _slow_session(raw, tmp_path, 1)
        equal_records(fast, slow)
        assert fast.metadata == slow.metadata == metadata
    del line["metadata"]
    assert _fast_session(json.dumps(line).encode(), tmp_path, 1)[0].metadata == {}


def nested(levels):
    """An object ``levels`` levels deep (the object itself is level 1)."""
    value = {"a": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("metadata, message", [
    (nested(33), "nested more than 32 levels deep"),
    ({"s": "x" * MAX_METADATA_BYTES}, "65,544 bytes encoded as JSON, more than 65,536"),
    ([1, 2], "must be a JSON object"), ("42", "must be a JSON object"), (None, "must be a JSON object"),
])
def test_metadata_beyond_the_limits_is_refused_with_file_line_and_field(tmp_path, metadata, message):
    lines = answer_sessions(3)
    lines[2]["metadata"] = metadata
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    with pytest.raises(InputError, match=rf"in.jsonl:3: metadata: .*{message}") as err:
        read_sessions(path)
    assert err.value.line == 3 and err.value.field == "metadata"


def test_the_limits_themselves_are_accepted():
    assert check_metadata(nested(32)) == nested(32)
    at_limit = {"s": "x" * (MAX_METADATA_BYTES - len('{"s":""}'))}
    assert check_metadata(at_limit) is at_limit
    with pytest.raises(ValueError, match=r"metadata.a.b\[1\] is nan"):
        check_metadata({"a": {"b": [1, float("nan")]}})


def test_the_command_line_exits_2_naming_the_line_and_writes_nothing(tmp_path, capsys):
    lines = answer_sessions(2)
    lines[1]["metadata"] = nested(40)
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    config = config_with(tmp_path, "        - {path: scorers_for_tests.AnswerMatch}", shaping="additive")
    out = tmp_path / "out"
    assert main(["score", "--config", str(config), "--input", str(path), "--output", str(out)]) == 2
    assert "in.jsonl:2: metadata: metadata is nested more than 32 levels deep" in capsys.readouterr().err
    assert not out.exists()


async def test_metadata_is_read_only_for_scorers_and_carried_on_the_exported_trajectories(tmp_path):
    from prm_jax.config._loader import load_config
    from prm_jax.runtime._export import ExportService

    config = load_config(config_with(tmp_path, "        - {path: scorers_for_tests.AnswerMatch}",
                                                    shaping="additive"))
    records = read_sessions(write_jsonl(tmp_path / "in.jsonl", answer_sessions(4)))
    service = await ExportService.start(config)
    try:
        for record in records:
            for turn in record.cache:
                service.store.add(record.key, turn)
            service.store.set_metadata(record.key, record.metadata)
            for leaf in record.ready:
                service.store.mark_ready(record.key, leaf)
        result = await service.export([r.key for r in records])
    finally:
        await service.aclose()
    assert [t.metadata["answer"] for t in result.trajectories] == ["42", "41", "42", "41"]
    with pytest.raises(TypeError):
        result.trajectories[0].metadata["answer"] = "0"  # the exported copy is read-only too
    with pytest.raises(ValueError, match="metadata is nested more than 32"):
        service.store.set_metadata("s0", nested(33))


async def test_a_scorer_writing_into_metadata_fails_its_row():
    from scorers_for_tests import chain

    cache = chain(1, messages=True)
    turn = next(iter(cache))
    turn.output_messages = [{"role": "assistant", "content": "overwrite"}]
    with pytest.raises(TypeError, match="does not support item assignment"):
        await PRMRunner(scorers=(AnswerMatch(),)).run(cache, {"metadata": {"answer": "42"}})


def rows():
    """Two rows of two turns each (row 1's second turn is padding-free)."""
    ids = np.array([[1, 5, 6, 2, 7, 8], [1, 5, 6, 2, 7, 0]])
    turns = np.array([[-1, 0, 0, -1, 1, 1], [-1, 0, 0, -1, 1, -1]])
    return ids, turns


async def test_the_array_path_takes_metadata_per_row_absent_present_and_on_some_rows():
    ids, turns = rows()
    scorer = TurnIndexInAProcess()
    runner = PRMRunner(scorers=(scorer,))
    try:
        # Absent: ctx["metadata"] is {} (k = 0); turn_index is k of row{b}/t{k}, through a worker process.
        absent = await score_arrays(runner, ids, turns)
        np.testing.assert_array_equal(absent, np.where(turns >= 0, turns, 0).astype(np.float32))
        present = await score_arrays(runner, ids, turns, metadata=[{"k": 1}, {"k": 2}])
        np.testing.assert_array_equal(present, np.where(turns >= 0, turns + 10 * np.array([[1], [2]]), 0))
        some = await score_arrays(runner, ids, turns, metadata=[None, {"k": 3}])
        np.testing.assert_array_equal(some, np.where(turns >= 0, turns + 10 * np.array([[0], [3]]), 0))
    finally:
        await runner.aclose()


async def test_the_array_paths_metadata_is_checked_and_meets_ctx():
    ids, turns = rows()
    runner = PRMRunner(scorers=(AnswerMatch(),))
    with pytest.raises(ValueError, match="metadata has 1 entries for 2 rows"):
        await score_arrays(runner, ids, turns, metadata=[{}])
    with pytest.raises(ValueError, match=r"metadata\[1\] is nested more than 32"):
        await score_arrays(runner, ids, turns, metadata=[{}, nested(33)])
    with pytest.raises(ValueError, match="metadata must be a list"):
        await score_arrays(runner, ids, turns, metadata={"answer": "42"})
    with pytest.raises(ValueError, match=r"ctx\['metadata'\] and metadata= both give row 0's metadata"):
        await score_arrays(runner, ids, turns, ctx={"metadata": {}}, metadata=[{}, {}])


async def test_turn_index_on_sessions_is_the_depth_in_the_branch():
    from scorers_for_tests import chain

    from prm_jax import InteractionCache, SyncScorer

    seen = {}

    class Record(SyncScorer):
        name = "record"

        def evaluate(self, interaction, ctx):
            seen[interaction.interaction_id] = interaction.turn_index
            return 0.0

    cache = chain(3)
    await PRMRunner(scorers=(Record(),)).run(cache)
    assert seen == {"t0": 0, "t1": 1, "t2": 2}
    assert next(iter(cache)).turn_index is None  # an interaction not being scored
    assert isinstance(cache, InteractionCache)


def test_demo_sessions_have_no_metadata_and_read_unchanged():
    assert all(record.metadata == {} for record in read_sessions(DEMO))
