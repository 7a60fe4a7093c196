"""The benchmark scripts run (at toy sizes): a refactor that breaks one fails here, not in the next timing
run (issue 31: bench_credit called a kernel helper whose signature had changed)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
TOY = {
    "bench_advantages.py": ["--shapes", "4x64", "--repeats", "1", "--no-loop", "--estimators"],
    "bench_credit.py": ["--rows", "8", "--turns", "2", "--tokens", "16", "--group", "4", "--repeats", "1"],
    "bench_gigpo.py": ["--rows", "8", "--turns", "2", "--width", "32", "--group", "4", "--repeats", "1",
                       "--loop-repeats", "1"],
    "bench_train_step.py": ["--losses", "--rows", "4", "--width", "32", "--repeats", "1"],
    "bench_train_step.py step": ["--rows", "8", "--width", "32", "--repeats", "1", "--check-values", "counts"],
    "bench_compile.py": ["--repeats", "1"],
    "profile_gae.py": ["--shape", "4x64"],
    "bench_sum_pi_squared.py": ["--rows", "4", "--vocab", "300", "--chunk", "128", "--repeats", "1"],
    "bench_scorers.py": ["--sessions", "8", "--repeats", "1", "--only", "3t"],  # the distillation teacher
    "bench_scorers.py model": ["--sessions", "8", "--repeats", "1", "--only", "4", "--chunks", "4,16"],
    "bench_audit.py": ["--repeats", "1", "--only", "RLOO"],
}
# What each prints (the figures' unit, or their name), where not milliseconds.
SHOWN = {"bench_compile.py": "ratio", "bench_audit.py": "first/60s", "profile_gae.py": "bytes/elem",
         "bench_scorers.py": "requests 1",
         "bench_scorers.py model": "chunks of 16 rows",
         "bench_train_step.py step": "host round trips in the compiled step: 0\n"}


@pytest.mark.parametrize("run", sorted(TOY))
def test_the_benchmark_runs_at_a_toy_size(run):
    script = run.split()[0]
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *TOY[run]], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert SHOWN.get(run, "ms") in proc.stdout


def test_every_registered_estimator_runs_on_its_benchmark_batch():
    """bench_advantages --estimators times something: every estimator's advantages on its batch are finite and
    not all zero (compiling nine programs: an end-to-end test)."""
    from bench_advantages import estimator_batches, make_inputs

    import prm_jax
    from prm_jax.estimators import registered

    batch, *_ = make_inputs(8, 600)
    runs = estimator_batches(batch)
    assert sorted(runs) == sorted(spec.name for spec in registered())
    for name, (config, inputs) in runs.items():
        advantages = np.asarray(prm_jax.compute_advantages(inputs, config).advantages)
        assert np.all(np.isfinite(advantages)) and np.any(advantages != 0), name

