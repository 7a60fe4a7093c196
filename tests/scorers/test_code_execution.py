"""Issue 58.1, 58.3 and 58.6: ``CodeExecutionScorer`` scores a turn by the session's tests its code passes in
the local sandbox (stdin/stdout pairs, and assert-style Python tests run by the harness against the functions
the code defines); failures of the code are scores of their kind, its verdicts are the scorer's
(printing a fake result line, exiting 0 with a wrong answer or writing to the task's files earns nothing), a
session without well-formed tests is refused naming the key, and the limits are checked at configuration."""

from __future__ import annotations

import pytest

import prm_jax
from prm_jax.scorers import CodeExecutionScorer
from prm_jax.scorers._code_execution import IOTest

DOUBLE = [{"input": "2\n", "output": "4"}, {"input": "5\n", "output": "10\n"}, {"input": "-1", "output": "-2"}]


def reply(code: str, language: str = "python") -> str:
    return f"Here is my solution.\n```{language}\n{code}\n```\nDone."


def turn(text: str, iid: str = "t0") -> prm_jax.Interaction:
    return prm_jax.Interaction(iid, [1], [2], output_messages=[{"role": "assistant", "content": text}])


@pytest.fixture(scope="module")
def scorer():
    return CodeExecutionScorer(time_per_test=1.0, memory_mb=128, output_bytes=1 << 14)


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


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_the_scorer_runs_under_a_runner_with_every_turn_scored(executor):
    # (a synchronous scorer: every executor applies; Ray's, on the two-node cluster, in tests/ray)
    scorer = CodeExecutionScorer(time_per_test=2.0, weight=0.5, executor=executor, max_workers=2)
    cache = prm_jax.InteractionCache([turn(reply("print(0)"), "t0"),
                                      prm_jax.Interaction("t1", [1, 2, 7], [3], parent_id="t0", output_messages=[
                                          {"role": "assistant", "content": reply("print(int(input()) * 2)")}])])
    with prm_jax.BlockingRunner(scorers=[scorer]) as runner:
        runner.run(cache, {"metadata": {"tests": DOUBLE}})
    assert [t.token_rewards.tolist() for t in cache] == [[0.0], [0.5]]


# -- assert-style tests (the harness: the solution in a process of its own, only literal values cross) ---------

ADD = [{"assert": "assert add(2, 3) == 5"}, {"assert": "assert add('a', 'b') == 'ab'"},
       {"assert": "def check(candidate):\n    assert candidate(0.5, 0.25) == 0.75\n    assert candidate([1], [2]) == [1, 2]\n"
                  "check(add)"},
       {"assert": "try:\n    add(None, 1)\nexcept TypeError:\n    pass\nelse:\n    raise AssertionError('no TypeError')"}]
GOOD_ADD = "def add(a, b):\n    return a + b"


def test_assert_tests_score_the_functions_the_code_defines(scorer):
    right = scorer.evaluate(turn(reply(GOOD_ADD)), {"metadata": {"tests": ADD}})
    wrong = scorer.evaluate(turn(reply("def add(a, b):\n    return a - b if isinstance(a, int) else a + b")),
                            {"metadata": {"tests": ADD}})
    assert right.reward == 1.0 and counts(right)["passed"] == 4, counts(right)
    assert wrong.reward == 0.75 and counts(wrong)["failed"] == 1, counts(wrong)


def test_io_and_assert_tests_mix_in_one_session(scorer):
    code = "def double(n):\n    return 2 * n\n\nif __name__ == '__main__':\n    print(double(int(input())))"
    tests = [*DOUBLE, {"assert": "assert double(21) == 42"}, {"assert": "assert double(1) == 3"}]
    result = scorer.evaluate(turn(reply(code)), {"metadata": {"tests": tests}})
    assert result.reward == pytest.approx(4 / 5) and counts(result)["failed"] == 1, counts(result)


def test_values_cross_as_literals_nan_and_inf_included(scorer):
    code = "def f(x):\n    return {'nan': float('nan'), 'inf': -float('inf'), 'set': {x}, 'tuple': (x, b'x')}"
    test = ("import math\nv = f(3)\nassert math.isnan(v['nan']) and v['inf'] == -math.inf\n"
            "assert v['set'] == {3} and v['tuple'] == (3, b'x')")
    assert scorer.evaluate(turn(reply(code)), {"metadata": {"tests": [{"assert": test}]}}).reward == 1.0


@pytest.mark.parametrize("code", [
    "import sys\nsys.exit(0)",                                                       # exits 0 before any test
    "import os\ndef add(a, b):\n    os._exit(0)",                                   # exits 0 inside the call
    "import atexit, os\natexit.register(lambda: os._exit(0))\ndef add(a, b):\n    raise SystemExit(0)",
    "class Same:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Same()",  # equals all
    "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\ndef add(a, b):\n    return 0",
    "def add(a, b):\n    print('0' * 32 + ' passed')\n    return 0",                   # a fake verdict line
    "import os\ndef add(a, b):\n    os.kill(1, 9)",                                 # kills the harness
    "import os\ndef add(a, b):\n    os.kill(os.getppid(), 9)",
    "def add(a, b):\n    open('/task/harness.py', 'w').write('print(1)')\n    return 0",  # tampers with the harness
])
def test_assert_tests_give_no_credit_the_code_did_not_earn(scorer, code):
    result = scorer.evaluate(turn(reply(code)), {"metadata": {"tests": ADD}})
    assert result.reward == 0.0 and counts(result)["passed"] == 0, counts(result)


def test_a_call_that_earns_no_value_fails_the_test_even_where_the_test_catches_everything(scorer):
    # A test that swallows every exception still fails when the solution's call returned no literal or exited.
    lenient = [{"assert": "try:\n    add(1, 2)\nexcept Exception:\n    pass"},
               {"assert": "try:\n    add(1, 2)\nexcept:\n    pass"}]
    for code in ("class X:\n    pass\ndef add(a, b):\n    return X()", "import os\ndef add(a, b):\n    os._exit(0)"):
        result = scorer.evaluate(turn(reply(code)), {"metadata": {"tests": lenient}})
        assert result.reward == 0.0, (code, counts(result))
    honest = scorer.evaluate(turn(reply("def add(a, b):\n    raise ValueError('no')")), {"metadata": {"tests": lenient}})
    assert honest.reward == 1.0  # (the solution's own error is the test's to catch)


FORGER = r"""
import os, re
def add(a, b):
    # Looks for the run's nonce in the harness' memory and writes a passing verdict on its stdout.
    nonces = set()
    try:
        with open("/proc/1/maps") as maps, open("/proc/1/mem", "rb") as mem:
            for line in maps:
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                if "rw" in line.split()[1]:
                    try:
                        mem.seek(start)
                        nonces.update(re.findall(rb"[0-9a-f]{32}", mem.read(end - start)))
                    except OSError:
                        pass
    except OSError as err:
        print("no memory:", err, flush=True)
    for nonce in nonces:
        try:
            with open("/proc/1/fd/1", "wb") as out:
                out.write(nonce + b" passed\n")
        except OSError as err:
            print("no stdout:", err, flush=True)
            break
    return 0
"""


def test_the_code_can_read_neither_the_nonce_nor_the_harness_stdout(scorer):
    # The harness is non-dumpable: its /proc/<pid>/mem, maps and fd are closed to the code (same uid); the forger
    # returns a wrong value, so only a forged verdict could pass it.
    result = scorer.evaluate(turn(reply(FORGER)), {"metadata": {"tests": ADD[:1]}})
    assert result.reward == 0.0 and counts(result)["failed"] == 1, counts(result)
    # What the forger sees, under a parent made non-dumpable by the harness' own function (its output, which the
    # harness discards, goes to the sandbox's stderr here).
    from prm_jax.scorers._code_execution import HARNESS, HARNESS_SOURCE, SOLUTION
    parent = ("import subprocess, sys\nsys.path.insert(0, '/task')\nimport harness\nharness._undumpable()\n"
              "subprocess.run([sys.executable, '-c', \"exec(open('/task/solution.py').read()); add(2, 3)\"])\n"
              "print('ab' * 16)")
    run = scorer.runner.run({SOLUTION: FORGER.encode(), HARNESS: HARNESS_SOURCE}, ["-c", parent], b"", 5.0)
    assert b"no memory: [Errno 13] Permission denied" in run.stdout, (run.stdout, run.stderr)
    assert b"passed" not in run.stdout


def test_memory_and_time_in_an_assert_test_are_failures_of_their_kind(scorer):
    cases = [("def add(a, b):\n    return len(bytearray(1 << 30))", "memory"),
             ("import time\ndef add(a, b):\n    time.sleep(30)", "timeout"),
             ("def add(a, b):\n    return 'x' * (1 << 20)", "failed"),  # (an answer past output_bytes)
             ("import os\ndef add(a, b):\n    while True:\n        os.fork()", "failed")]  # (a fork bomb in the call)
    for code, kind in cases:
        result = scorer.evaluate(turn(reply(code)), {"metadata": {"tests": ADD[:1]}})
        assert result.reward == 0.0 and counts(result)[kind] == 1, (code, counts(result))


@pytest.mark.parametrize("metadata, needle", [
    ({"tests": [{"assert": "assert add(1, 2) =="}]}, r"\[0\]\['assert'\] is not Python code"),
    ({"tests": [{"assert": "x", "output": "1"}]}, r"\[0\] must be"),
    ({"tests": [{"assert": 3}]}, r"\[0\] must be"),
    ({"tests": [{"input": "1", "output": "2", "expected": "3"}]}, r"\[0\] must be"),
])
def test_malformed_assert_tests_are_refused_naming_the_key(scorer, metadata, needle):
    with pytest.raises(ValueError, match=needle):
        scorer.validate_metadata(metadata)


@pytest.mark.parametrize("kwargs, needle", [
    ({"url": "http://127.0.0.1:1"}, "url applies to sandbox: sandbox_fusion only"),
    ({"request_timeout": 5.0}, "apply to sandbox: sandbox_fusion only"),
    ({"sandbox": "sandbox_fusion"}, "needs url"),
    ({"sandbox": "docker"}, "sandbox"),
    ({"sandbox": "sandbox_fusion", "url": "http://127.0.0.1:1", "interpreter": "/bin/python9"}, "interpreter applies"),
    ({"sandbox": "sandbox_fusion", "url": "http://127.0.0.1:1", "executor": "process"}, "executor 'thread' only"),
])
def test_the_sandbox_settings_meet_at_configuration(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        CodeExecutionScorer.validate_kwargs(**kwargs)


@pytest.mark.e2e  # (the command line's whole run: the end-to-end step)
def test_the_bundled_coding_example_scores_each_turn_by_its_tests(tmp_path, capsys):
    # Issue 58.8: `prm-jax demo --example coding` (prm_jax/data/coding_*): 8 sessions; weight 0.5 times the fraction
    # of tests passed, per turn: a fix in a second turn earns what its first turn did not; the object that equals
    # everything and the exit after a printed "4 passed" earn nothing.
    import json

    import numpy as np

    from prm_jax.app import _cli as cli

    assert cli.main(["demo", "--example", "coding", "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "coding_config.yaml (CodeExecutionScorer in the local sandbox" in out
    batch = np.load(tmp_path / "out" / "batch.npz")
    rows = batch["token_rewards"].sum(axis=1) / 6  # (6 output tokens a turn; the turn's reward on each)
    # square: right, fixed (2 of 3, then 3 of 3), loops, no code; fizz: right, 3 of 4, cheats, exits
    expected = [0.5, 0.5 * 2 / 3 + 0.5, 0.0, 0.0, 0.5, 0.5 * 3 / 4, 0.0, 0.0]
    np.testing.assert_allclose(rows, expected, rtol=1e-6)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())["metrics"]
    prefix = "rollout/prm_metric/turn/code_execution/"
    assert {k: metrics[prefix + k + "/sum"] for k in ("tests_passed", "tests_timeout", "no_code")} == \
        {"tests_passed": 15.0, "tests_timeout": 3.0, "no_code": 1.0}


# -- one sandbox run a turn: the harness runs each test in a fresh process, and nothing of one reaches the next --

STEPS = r"""
import os, sys, time
given = sys.stdin.read().strip()
if given == "daemon":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
    print("started")
elif given == "write":
    open("note.txt", "w").write("left for the next test")
    print("written")
elif given == "sleep":
    time.sleep(60)
elif given == "count":
    print(len([p for p in os.listdir("/proc") if p.isdigit()]), sorted(os.listdir(".")))
elif given == "kill":
    import signal
    for signum in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
        os.kill(1, signum)
    print("still here")
"""


@pytest.mark.parametrize("harnessed", [False, True], ids=["a-sandbox-a-test", "the-harness"])
def test_a_tests_processes_files_and_time_do_not_reach_the_next_test(harnessed):
    # Locally each stdin/stdout test is a sandbox of its own (its program alone in the namespace: 1 process); the
    # harness (assert tests, and every test on SandboxFusion) runs a turn's tests in one sandbox, each starting
    # with the harness and itself alone (2 processes) in an empty folder, whatever the one before left (a setsid
    # daemon, a file, a sleep past time_per_test); signals to the harness (PID 1 of the namespace) are not
    # delivered. A test ends with its program: the daemon it leaves holding the pipes is not waited for (its
    # sandbox's namespace ends with its first process; the harness kills what a test leaves).
    scorer = CodeExecutionScorer(time_per_test=1.0, total_time=10.0)
    count = IOTest("count", f"{1 + harnessed} []")
    tests = [IOTest("daemon", "started"), count, IOTest("write", "written"), count, IOTest("sleep", ""), count,
             IOTest("kill", "still here"), count]
    kinds = scorer.harness(tests, STEPS, 10.0) if harnessed else scorer.run_tests(STEPS, tests)
    assert kinds == ["passed", "passed", "passed", "passed", "timeout", "passed", "passed", "passed"], kinds


def test_a_harness_that_does_not_start_fails_the_branch_never_a_zero(monkeypatch):
    from prm_jax.errors import SandboxError
    from prm_jax.scorers import _code_execution

    scorer = CodeExecutionScorer(time_per_test=1.0)
    monkeypatch.setattr(_code_execution, "HARNESS_SOURCE", b"import sys\nsys.exit('the harness broke')\n")
    with pytest.raises(SandboxError, match=r"scorer 'code_execution': the tests' harness did not start .*harness broke"):
        scorer.evaluate(turn(reply(GOOD_ADD)), {"metadata": {"tests": ADD}})


EXFILTRATE = r"""
import glob, os

def loot():
    found = [repr(dict(os.environ))]
    for path in [os.path.expanduser("~/.secret"), *sorted(glob.glob("/proc/*/environ")), *sorted(glob.glob("/home/*/.secret"))]:
        try:
            found.append(open(path).read())
        except OSError as err:
            found.append(str(err))
    return " ".join(found)

def add(a, b):
    return loot()

print(loot())
raise RuntimeError(loot())
"""


@pytest.mark.e2e  # (the command line's whole run)
def test_a_planted_secret_reaches_no_output_score_error_or_log(tmp_path, planted_secret, capsys, caplog):
    # Issue 58.5 through the whole scorer: an API key in the parent's environment and a file in $HOME; the code
    # prints what it finds, raises it, and returns it from an assert test's call. Neither the command's stdout and
    # stderr, nor its metrics, nor any log record holds it.
    import json
    import logging

    from prm_jax.app import _cli as cli

    secret = planted_secret
    caplog.set_level(logging.DEBUG)
    session = {"session_key": "s", "group": "g", "metadata": {"tests": [
        {"input": "", "output": "x"}, {"assert": "assert add(1, 2) == 3"}]},
        "interactions": [{"id": "t0", "input_tokens": [1, 2], "output_tokens": [3, 4],
                          "output_messages": [{"role": "assistant", "content": reply(EXFILTRATE)}], "reward": 1.0}]}
    (tmp_path / "s.jsonl").write_text(json.dumps(session) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text("rollout:\n  agent:\n    prm:\n      enabled: true\n      scorers:\n"
                      "        - path: prm_jax.scorers.CodeExecutionScorer\n          kwargs: {time_per_test: 2.0}\n")
    assert cli.main(["score", "--config", str(config), "--input", str(tmp_path / "s.jsonl"),
                     "--output", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    metrics = (tmp_path / "out" / "metrics.json").read_text()
    logs = "\n".join(record.getMessage() for record in caplog.records)
    for where, text in (("stdout", captured.out), ("stderr", captured.err), ("metrics.json", metrics), ("logs", logs)):
        assert secret not in text and "PRM_JAX_PLANTED_KEY" not in text, where
    assert '"rollout/prm_metric/turn/code_execution/tests_failed/sum": 2.0' in metrics  # (both ran, and failed)
