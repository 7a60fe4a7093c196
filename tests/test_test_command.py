"""Issue 55.9: the test command always ends. A run of ``python3 dev.py test`` once had a worker killed by a
segfault inside XLA:CPU's compiler and then stalled at 98% with every process idle until it was killed. Now
each test is bounded (pytest-timeout), crashed workers are replaced at most twice, and a run that prints
nothing for a while is ended by dev.py's watcher, naming the tests in flight; a test whose worker crashed is
rerun alone with XLA's dumps."""

import importlib.util
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dev():
    spec = importlib.util.spec_from_file_location("prm_jax_dev", ROOT / "dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suites_commands_bound_each_test_and_the_worker_restarts():
    module = dev()
    assert f"--timeout={module.TEST_TIMEOUT_S}" in module.BOUNDED and "--timeout-method=thread" in module.BOUNDED
    # (no replacement for a crashed worker: with --dist loadfile one waits forever for work, pytest-xdist #784
    # and #1378; four runs of 2026-12-06 stalled so)
    assert "--max-worker-restart=0" in module.BOUNDED and "loadfile" in module.PARALLEL
    assert module.SILENCE_S > module.TEST_TIMEOUT_S  # (a test's own bound speaks first)
    source = (ROOT / "dev.py").read_text()
    assert source.count("*BOUNDED") == 2  # the suite and the end-to-end tests; the floor's kernel tests
    assert "pytest_timeout" in sys.modules or importlib.util.find_spec("pytest_timeout") is not None


def test_a_silent_run_is_ended_naming_the_test_in_flight(tmp_path, capfd):
    # A "pytest" that starts a test (as tests/conftest.py records it), prints, then hangs with no output.
    hang = tmp_path / "hang.py"
    hang.write_text(textwrap.dedent("""
        import os, sys, time
        from pathlib import Path
        print("....", flush=True)
        Path(os.environ["PRM_JAX_INFLIGHT"], "gw1.txt").write_text("kernels/test_x.py::test_stuck")
        time.sleep(120)
    """))
    started = time.monotonic()
    code = dev()._watched([sys.executable, str(hang)], dict(os.environ), silence_s=2.0)
    assert code == 124 and time.monotonic() - started < 30
    out = capfd.readouterr().out
    assert "...." in out
    assert "printed nothing for 2 s and is ended; tests in flight: kernels/test_x.py::test_stuck" in out


def test_a_run_that_ends_returns_its_status_and_passes_its_output_through(capfd):
    code = dev()._watched([sys.executable, "-c", "print('3 passed'); raise SystemExit(3)"], dict(os.environ),
                          silence_s=30.0)
    assert code == 3 and "3 passed" in capfd.readouterr().out


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups")
def test_a_crashed_workers_test_is_rerun_alone_with_xlas_dumps(tmp_path, capfd, monkeypatch):
    module = dev()
    monkeypatch.setattr(module, "CRASH_DUMPS", tmp_path / "dumps")
    fake = tmp_path / "fake_pytest.py"  # says what xdist says of a crashed worker, then exits 1
    fake.write_text("import sys\nprint(\"[gw0] node down: worker 'gw0' crashed while running "
                    "'kernels/test_y.py::test_crash'\")\nsys.exit(1 if '-p' not in sys.argv else 0)\n")
    code = module._watched([sys.executable, str(fake), "-q"], dict(os.environ), silence_s=30.0)
    out = capfd.readouterr().out
    assert code == 1
    assert "kernels/test_y.py::test_crash crashed its worker; rerunning it alone with XLA's dumps into" in out
    assert "alone it exited 0 (no crash)" in out


def test_a_failing_tests_traceback_is_written_the_moment_it_fails(tmp_path):
    # Issue 56.3: the device check's run was cut at its bound before pytest printed its tracebacks (four GPU
    # failures kept no cause). PRM_JAX_FAILURES names a file each failure is appended to as it happens, by the
    # process that ran it: once per failure, with or without xdist.
    import subprocess

    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_cases.py").write_text("def test_fails():\n    assert 1 == 2, 'the reason'\n\n"
                                            "def test_passes():\n    pass\n")
    for extra in ([], ["-n", "2"]):
        log = tmp_path / f"failures{len(extra)}.log"
        env = dict(os.environ, PRM_JAX_FAILURES=str(log), PYTHONPATH=str(ROOT / "tests"))
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra,
                               "--rootdir", str(tmp_path), str(tmp_path / "test_cases.py")],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert "1 failed, 1 passed" in done.stdout, done.stdout[-2000:]
        text = log.read_text()
        assert text.count("==== ") == 1 and "test_cases.py::test_fails (call)" in text and "the reason" in text
