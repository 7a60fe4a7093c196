"""Issue 57.8: the session format has a page of its own, rendered from the reader's declarations
(``prm_jax.app.sessions.format_table``): every key the reader accepts has its row (type, values, what it is,
what it becomes in the batch), the page's example line reads, and the README, ``score --help`` and the
command-line guide link the page."""

import json
import re
from pathlib import Path

from prm_jax.app import _cli as cli
from prm_jax.app import sessions
from prm_jax.kernels._schema import BATCH_SCHEMA

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guides" / "session-format.md"


def test_every_key_the_reader_accepts_has_a_described_row():
    rows = sessions.format_table()
    keys = [row[0] for row in rows]
    assert set(keys) == sessions.SESSION_KEYS | {f"interactions[].{key}" for key in sessions.INTERACTION_KEYS}
    assert len(keys) == len(set(keys))
    for key, required, label, accepted, what, becomes in rows:
        assert required.startswith(("required", "optional")) and label and accepted and what and becomes, key
    by_key = {row[0]: row for row in rows}
    # each per-token model output's row says its batch key and the range the batch schema declares for it
    for field in (f for f in sessions.TURN_FIELDS if f.batch_key is not None):
        row = by_key[f"interactions[].{field.name}"]
        assert f"`{field.batch_key}`" in row[5], field.name
        bounds = BATCH_SCHEMA[field.batch_key].bounds
        assert bounds is None or bounds.text in row[3], field.name
    assert by_key["interactions[].stop_reason"][1] == "optional (default `stop`)"
    assert [k for k, *_ in rows if _[0] == "required"] == ["session_key", "interactions", "interactions[].id",
                                                              "interactions[].input_tokens",
                                                              "interactions[].output_tokens"]


def test_the_pages_example_line_is_read_as_the_page_says(tmp_path):
    block = re.search(r"```json\n(.*?)\n```", PAGE.read_text(), re.S).group(1)
    path = tmp_path / "one.jsonl"
    path.write_text(block + "\n")
    (record,) = sessions.read_sessions(path)
    assert (record.key, record.group, record.metadata) == ("q17-s0", "q17", {"answer": "42"})
    assert record.ready == ["t1"] and json.loads(block)["interactions"][1]["parent_id"] == "t0"


def test_the_readme_score_help_and_the_command_line_guide_link_the_page():
    assert "](docs/guides/session-format.md)" in (ROOT / "README.md").read_text()
    assert "](session-format.md)" in (ROOT / "docs" / "guides" / "command-line.md").read_text()
    assert "docs/guides/session-format.md" in " ".join(cli.COMMANDS["score"][0].split())
    assert "{include} session-format-table.inc" in PAGE.read_text()
