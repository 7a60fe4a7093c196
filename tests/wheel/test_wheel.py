"""Issue 32.1: the wheel carries the native kernels. Run by ``python3 dev.py wheel`` (its own CI step: it
builds the wheel and makes a virtual environment, minutes), not by the main suite.

One run: build the sdist and from it the wheel (``python -m build``: setup.py compiles the kernels against the
oldest supported jaxlib's XLA FFI headers), ``twine check`` both, install the wheel into a fresh virtual
environment, hide every compiler (``PATH`` holds that environment's ``bin`` only), and check that the native
kernels are the wheel's and that GAE there is within 10% of the source install's (the same sources built on
first use), the two libraries' calls alternating in one process. Then the ABI: the wheel's one library gives
the same numbers under the newest jax (that environment) and the oldest supported (``.venv-floor``, jax 0.7.0); a library built
against the newest jaxlib's headers is refused by jax 0.7.0, which then builds the sources itself.
"""

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest

from prm_jax.native import _build as build

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_native_install.py"
FLOOR_PYTHON = ROOT / ".venv-floor" / "bin" / "python"
COMPILER = build.find_compiler()
pytestmark = pytest.mark.skipif(COMPILER is None, reason="building the wheel's kernels needs a C++ compiler")
ROUNDS = 3  # processes timing the wheel's GAE against the source install's; the median of their ratios compared
REPEATS = 1000  # alternating pairs of calls in each


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """A fresh virtual environment with the wheel installed: ``(python, site-packages library)``."""
    work = tmp_path_factory.mktemp("wheel")
    # python -m build: the sdist, then the wheel built from that sdist (the build reproducible from it);
    # twine check: the metadata PyPI would take.
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(work / "dist"), str(ROOT)], check=True, timeout=900,
                   stdout=subprocess.DEVNULL)
    (wheel,) = (work / "dist").glob("prm_jax-*.whl")
    (sdist,) = (work / "dist").glob("prm_jax-*.tar.gz")
    subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)], check=True,
                   timeout=300)
    print(f"wheel {wheel.name}: {wheel.stat().st_size} bytes; sdist {sdist.stat().st_size} bytes")
    assert "-py3-none-" in wheel.name  # native code, no Python extension: one wheel per platform
    venv.EnvBuilder(with_pip=True).create(work / "venv")
    python = work / "venv" / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
                   check=True, timeout=900)
    found = subprocess.run([str(python), "-c", "from prm_jax.native import _ffi as ffi; print(ffi.PACKAGED_LIBRARY)"],
                           cwd=work, capture_output=True, text=True, check=True, env=without_compiler(python, work))
    library = Path(found.stdout.strip())
    assert library.is_file() and "site-packages" in str(library)
    return python, library, work


def without_compiler(python: Path, work: Path) -> dict[str, str]:
    """An environment whose PATH holds the venv's bin only (no c++, g++, clang++), no CXX, an empty cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "PRM_JAX_NATIVE", "PYTHONPATH")}
    return dict(env, PATH=str(python.parent), PRM_JAX_CACHE=str(work / "empty-cache"), JAX_PLATFORMS="cpu")


def bench(python: Path, env: dict[str, str], cwd: Path, *args: str) -> dict:
    proc = subprocess.run([str(python), str(BENCH), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_wheel_loads_its_kernels_without_a_compiler_and_is_as_fast_as_the_source_install(wheel_env):
    python, library, work = wheel_env
    hidden = without_compiler(python, work)
    assert build.find_compiler(hidden) is None
    source = dict(os.environ, PRM_JAX_NATIVE="build", PRM_JAX_CACHE=str(work / "source-cache"), JAX_PLATFORMS="cpu")
    built = bench(Path(sys.executable), source, ROOT, "--repeats", "1")  # the source install builds on first use
    assert built["native"] and str(work / "source-cache") in built["why"], built
    (source_library,) = (work / "source-cache").glob("prm_jax_cpu_*.so")
    ratios = []
    for _ in range(ROUNDS):
        # The wheel's install, compiler hidden, times its GAE against the same GAE calling the library the
        # source install built, call for call alternately in one process (a process's own median drifts by up
        # to 40% from the next one's on this shared machine; alternate calls share the drift).
        got = bench(python, hidden, work, "--repeats", str(REPEATS), "--against", str(source_library))
        assert got["native"] and got["why"].startswith(f"loaded from the package's library {library}"), got
        ratios.append(got["ratio"])
        print(f"GAE 64x8192 auto: wheel {got['median_ms']:.3f} ms, source install's library {got['against_ms']:.3f} ms "
              f"(jax {got['jax']}), ratio {got['ratio']:.3f} (median of {REPEATS} alternating pairs)")
    assert not list((work / "empty-cache").glob("prm_jax_cpu_*"))  # nothing was built there
    assert float(np.median(ratios)) <= 1.10, ratios


def test_the_wheels_library_holds_the_host_functions_without_a_compiler(wheel_env):
    # Issue 56.6: score_arrays' checks of a trainer's arrays in one native pass (rows_cpu.cc, survey_rows) come
    # with the wheel's library: loaded from it without a compiler, nothing built.
    python, library, work = wheel_env
    code = ("import numpy as np; from prm_jax.native import _ffi as ffi; "
            "print(ffi._host_library()._name, ffi.survey_rows(np.array([[5, 6, 7]]), np.array([[-1, 0, 0]]), None)[1])")
    proc = subprocess.run([str(python), "-c", code], env=without_compiler(python, work), cwd=work,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(library), "[1]"]
    assert not list((work / "empty-cache").glob("prm_jax_*"))


@pytest.mark.skipif(not FLOOR_PYTHON.exists(), reason="needs .venv-floor (python3 dev.py floor makes it)")
def test_one_library_serves_the_oldest_and_the_newest_jax_with_the_same_numbers(wheel_env, tmp_path):
    python, library, work = wheel_env
    newest = bench(python, without_compiler(python, work), work, "--repeats", "1", "--numbers", str(tmp_path / "new.npy"))
    floor_env = dict(without_compiler(FLOOR_PYTHON, work), PATH=str(FLOOR_PYTHON.parent))
    oldest = bench(FLOOR_PYTHON, floor_env, tmp_path, "--repeats", "1", "--library", str(library),
                   "--numbers", str(tmp_path / "old.npy"))
    assert oldest["jax"] == "0.7.0" and newest["jax"] != "0.7.0", (oldest, newest)
    assert oldest["why"].startswith(f"loaded from the package's library {library}"), oldest
    np.testing.assert_array_equal(np.load(tmp_path / "old.npy"), np.load(tmp_path / "new.npy"))


@pytest.mark.skipif(not FLOOR_PYTHON.exists(), reason="needs .venv-floor (python3 dev.py floor makes it)")
def test_a_library_built_for_a_newer_jaxlib_is_refused_by_jax_0_7_which_builds_the_sources(tmp_path):
    cache = tmp_path / "newest"
    code = f"from prm_jax.native import _build as build; print(build.build_library({COMPILER!r}))"
    built = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PRM_JAX_CACHE=str(cache)),
                           capture_output=True, text=True, check=True, timeout=600)
    newer = Path(built.stdout.strip().splitlines()[-1])
    env = dict(os.environ, PRM_JAX_CACHE=str(tmp_path / "floor-cache"), JAX_PLATFORMS="cpu")
    env.pop("PRM_JAX_NATIVE", None)
    got = bench(FLOOR_PYTHON, env, tmp_path, "--repeats", "1", "--library", str(newer))
    assert got["jax"] == "0.7.0" and got["native"], got
    assert "the packaged library cannot be used with jaxlib 0.7.0" in got["why"] and "API version" in got["why"], got
    assert str(tmp_path / "floor-cache") in got["why"]  # built from the sources against 0.7.0's headers
