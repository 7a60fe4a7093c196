"""Issue 32.3 (a start): ``prm-jax doctor`` prints what a bug report needs; and (32.1) when the native kernels
cannot be built for want of a compiler, the first CPU call says so once, with what is slower and how to get
them, instead of running slower in silence."""

import os
import subprocess
import sys
import tempfile

import jax

from prm_jax.app._cli import main
from prm_jax.native import _ffi as ffi


def test_doctor_prints_versions_backend_native_kernels_caches_and_extras(capsys):
    assert main(["doctor"]) == 0
    lines = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["jax"].strip() == jax.__version__ and lines["backend"].strip() == jax.default_backend()
    native, why = ffi.status()
    assert lines["native kernels"].strip() == (why if native else f"not used: {why}")
    assert "judge (" in lines["extras"] and "tunix (" in lines["extras"]
    assert lines["native build cache"].strip() and lines["compile cache"].strip()


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("CXX", "PRM_JAX_NATIVE")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          timeout=300)


def test_without_a_compiler_the_first_cpu_call_warns_once_and_doctor_says_why():
    code = ("import numpy as np, prm_jax; from prm_jax.app._doctor import report; "
            "prm_jax.kernels.gae(np.ones((2, 5), np.float32), None, np.ones((2, 5))); "
            "prm_jax.kernels.gae(np.ones((3, 5), np.float32), None, np.ones((3, 5))); "
            "print(report()['native kernels'])")
    with tempfile.TemporaryDirectory() as empty:  # a PATH with no compiler on it
        proc = run(code, PATH=empty, PRM_JAX_CACHE=empty, PRM_JAX_NATIVE="build")  # a source install's case
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "not used: no C++ compiler on PATH (nor $CXX) to build them"
    assert proc.stderr.count("no C++ compiler found to build its native CPU kernels") == 1
    assert "4.6x slower" in proc.stderr and "from its wheel" in proc.stderr and "a C++ compiler" in proc.stderr


def test_turning_the_kernels_off_is_said_by_doctor_and_warns_nothing():
    proc = run("import prm_jax; from prm_jax.app._doctor import report; print(report()['native kernels'])",
               PRM_JAX_NATIVE="0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "not used: turned off (PRM_JAX_NATIVE=0)" and "compiler" not in proc.stderr


def test_the_version_is_written_in_one_place():
    import importlib.metadata

    import prm_jax
    assert importlib.metadata.version("prm-jax") == prm_jax.__version__  # pyproject.toml reads it (dynamic)
