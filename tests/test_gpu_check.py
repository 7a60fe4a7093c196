"""Issue 56.7: the device check fits one lease. Its parts' time bounds (each ``bounded N`` a part runs, times
the items of a loop around it) add up to what the script's header says, and that with the start (jax and the
GPU, the imports: 25 s allowed) stays within 6 minutes; everything it leaves under $OUT is at most 8 files, the
ones the header names; the parts run in the issue's order."""

import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"
START_ALLOWANCE_S = 25


def bounds(text: str) -> list[int]:
    """Each part's bound in seconds, a bound inside a ``for`` loop once per item of the loop."""
    out, repeat = [], [1]
    for line in text.splitlines():
        code = line.split("#", 1)[0].strip()
        loop = re.match(r"for \w+ in (.*); do$", code)
        if loop:
            repeat.append(repeat[-1] * len(loop.group(1).split()))
        elif code == "done":
            repeat.pop()
        found = re.search(r"\bbounded (\d+) ", code)
        if found:
            out.append(int(found.group(1)) * repeat[-1])
    return out


def test_the_bounds_add_up_to_the_header_and_fit_six_minutes():
    text = SCRIPT.read_text()
    total = sum(bounds(text))
    said = int(re.search(r"its parts' bounds add up to (\d+) s", text).group(1))
    assert total == said and total + START_ALLOWANCE_S <= 360, (total, said)


def test_at_most_eight_files_come_back_and_the_header_names_them():
    text = SCRIPT.read_text()
    written = set(re.findall(r'\$OUT/([\w.]+)', text))
    named = set(re.findall(r"\b([\w]+\.(?:log|json))\b", text.split("set -uo pipefail")[0]))
    assert len(written) <= 8 and written == named, (sorted(written), sorted(named))
    assert "--trace" not in text  # (a profiler trace is a folder of many files)


def test_the_parts_run_in_the_issues_order():
    text = SCRIPT.read_text()
    assert re.search(r'ALL_PARTS="([^"]*)"', text).group(1).split() == ["tests", "gae", "credit", "scorer", "step"]
    positions = [text.index(f"if wanted {part}; then") for part in ("tests", "gae", "credit", "scorer", "step")]
    assert positions == sorted(positions)


def test_the_bound_count_can_fail():
    assert bounds("bounded 10 x\nfor a in b c; do\n  bounded 5 y\ndone\n") == [10, 10]
