"""Issue 58.1, 58.3 and 58.6: ``CodeExecutionScorer`` scores a turn by the session's stdin/stdout tests its code
passes in the local sandbox; failures of the code are scores of their kind, its verdicts are the scorer's
(printing a fake result line, exiting 0 with a wrong answer or writing to the task's files earns nothing), a
session without well-formed tests is refused naming the key, and the limits are checked at configuration."""

from __future__ import annotations

import pytest

import prm_jax
from prm_jax.scorers import CodeExecutionScorer

DOUBLE = [{"input": "2\n", "output": "4"}, {"input": "5\n", "output": "10\n"}, {"input": "-1", "output": "-2"}]


def reply(code: str, language: str = "python") -> str:
    return f"Here is my solution.\n```{language}\n{code}\n```\nDone."


def turn(text: str, iid: str = "t0") -> prm_jax.Interaction:
    return prm_jax.Interaction(iid, [1], [2], output_messages=[{"role": "assistant", "content": text}])


@pytest.fixture(scope="module")
def scorer():
    return CodeExecutionScorer(time_per_test=2.0, memory_mb=128, output_bytes=1 << 14)


def counts(result) -> dict[str, float]:
    return {o.metric_id.removeprefix("tests_"): o.value for o in result.observations}


def test_the_score_is_the_fraction_of_tests_passed(scorer):
    right = scorer.evaluate(turn(reply("print(int(input()) * 2)")), {"metadata": {"tests": DOUBLE}})
    wrong_once = scorer.evaluate(turn(reply("n = int(input())\nprint(n * 2 if n > 0 else 0)")),
                                 {"metadata": {"tests": DOUBLE}})
    assert right.reward == 1.0 and counts(right)["passed"] == 3
    assert wrong_once.reward == pytest.approx(2 / 3) and counts(wrong_once)["failed"] == 1


def test_all_or_nothing_scores_one_only_when_every_test_passes():
    strict = CodeExecutionScorer(score="all", time_per_test=2.0)
    half = strict.evaluate(turn(reply("n = int(input())\nprint(n * 2 if n > 0 else 0)")), {"metadata": {"tests": DOUBLE}})
    full = strict.evaluate(turn(reply("print(int(input()) * 2)")), {"metadata": {"tests": DOUBLE}})
    assert (half.reward, full.reward) == (0.0, 1.0)


@pytest.mark.parametrize("extract, want", [("last_block", 1.0), ("first_block", 0.0), ("all_blocks", 0.0)])
def test_the_code_is_the_configured_block(extract, want):
    text = "First try:\n```python\nprint('nope')\n```\nFixed:\n~~~\nprint(int(input()) * 2)\n~~~"
    scorer = CodeExecutionScorer(extract=extract, time_per_test=2.0)
    assert scorer.evaluate(turn(text), {"metadata": {"tests": DOUBLE}}).reward == want


@pytest.mark.parametrize("no_code, metric", [("zero", "no_code"), ("skip", "skipped")])
def test_a_turn_without_code_scores_as_configured(no_code, metric):
    scorer = CodeExecutionScorer(no_code=no_code, time_per_test=2.0)
    result = scorer.evaluate(turn("I could not solve it."), {"metadata": {"tests": DOUBLE}})
    assert result.reward == 0.0 and counts(result)[metric]


@pytest.mark.parametrize("code, kind", [
    ("raise SystemExit(3)", "failed"),
    ("import time\ntime.sleep(30)", "timeout"),
    ("x = bytearray(1 << 30)", "memory"),
    ("while True:\n    print('x' * 4096)", "output_limit"),
])
def test_a_failure_of_the_code_is_a_score_of_its_kind(scorer, code, kind):
    result = scorer.evaluate(turn(reply(code)), {"metadata": {"tests": DOUBLE[:1]}})
    assert result.reward == 0.0 and counts(result)[kind] == 1, counts(result)


@pytest.mark.parametrize("code", [
    "print('ALL TESTS PASSED')\nprint('4')\nprint('result: pass')",             # a fake result line beside the answer
    "import sys\nprint(int(input()) * 3)\nsys.exit(0)",                            # exits 0 after a wrong answer
    "open('/task/solution.py', 'w').write('print(int(input()) * 2)')\nprint(0)",  # rewrites its own task file
    "import os\nos.replace('/task/solution.py', '/work/x')\nprint(0)",
])
def test_code_gets_no_credit_it_did_not_earn(scorer, code):
    result = scorer.evaluate(turn(reply(code)), {"metadata": {"tests": DOUBLE}})
    assert result.reward == 0.0 and counts(result)["passed"] == 0, counts(result)


def test_the_total_time_bounds_a_turn_and_the_tests_left_are_timeouts():
    scorer = CodeExecutionScorer(time_per_test=1.0, total_time=1.5)
    result = scorer.evaluate(turn(reply("import time\ntime.sleep(30)")), {"metadata": {"tests": DOUBLE}})
    assert result.reward == 0.0 and counts(result)["timeout"] == 3


@pytest.mark.parametrize("metadata, needle", [
    ({}, r"metadata\['tests'\] must be a non-empty list"),
    ({"tests": "print"}, "must be a non-empty list"),
    ({"tests": [{"input": "1"}]}, r"metadata\['tests'\]\[0\] must be"),
    ({"tests": [{"input": 1, "output": "2"}]}, r"\[0\] must be"),
])
def test_a_session_without_well_formed_tests_is_refused_naming_the_key(scorer, metadata, needle):
    with pytest.raises(ValueError, match=needle):
        scorer.validate_metadata(metadata)


@pytest.mark.parametrize("kwargs, needle", [
    ({"time_per_test": -1}, "time_per_test"), ({"memory_mb": 4}, "memory_mb"), ({"score": "max"}, "score"),
    ({"extract": "middle"}, "extract"), ({"interpreter": "/nonexistent/python"}, "cannot run here"),
])
def test_the_settings_are_checked_at_configuration(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        CodeExecutionScorer.validate_kwargs(**kwargs)


def test_the_scorer_runs_under_a_runner_with_every_turn_scored():
    scorer = CodeExecutionScorer(time_per_test=2.0, weight=0.5)
    cache = prm_jax.InteractionCache([turn(reply("print(0)"), "t0"),
                                      prm_jax.Interaction("t1", [1, 2, 7], [3], parent_id="t0", output_messages=[
                                          {"role": "assistant", "content": reply("print(int(input()) * 2)")}])])
    with prm_jax.BlockingRunner(scorers=[scorer]) as runner:
        runner.run(cache, {"metadata": {"tests": DOUBLE}})
    assert [t.token_rewards.tolist() for t in cache] == [[0.0], [0.5]]
