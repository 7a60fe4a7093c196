"""Issue 20.13: the native library is recorded (size and hash) when built and verified before it is loaded:
a truncated build is rebuilt, or skipped with a clear warning, never loaded (it was SIGBUS, exit 135)."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from prm_jax.native import _build as build
from prm_jax.native import _ffi as ffi

COMPILER = build.find_compiler()
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler: the native kernels are not built")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One build for the module: its cache folder (the library and its record)."""
    cache = tmp_path_factory.mktemp("native")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PRM_JAX_CACHE", str(cache))
        assert build.verified(build.build_library(COMPILER))
    return cache


@pytest.fixture
def cache(built, tmp_path, monkeypatch):
    """A test's own copy of the built cache."""
    for path in built.iterdir():
        shutil.copy2(path, tmp_path / path.name)
    monkeypatch.setenv("PRM_JAX_CACHE", str(tmp_path))
    return tmp_path


@pytest.fixture
def damaged_cache(cache):
    """A cache holding a built library, then truncated to half its size (as a crash or a full disk leaves it)."""
    library = build.build_library(COMPILER)  # found, verified: not built again
    assert build.verified(library)
    whole = library.read_bytes()
    library.write_bytes(whole[: len(whole) // 2])
    assert not build.verified(library)
    return cache, library, whole


def test_a_damaged_library_is_rebuilt(damaged_cache, caplog):
    _, library, whole = damaged_cache
    with caplog.at_level("WARNING", logger="prm_jax.native"):
        rebuilt = build.build_library(COMPILER)
    assert rebuilt == library and build.verified(library) and len(library.read_bytes()) == len(whole)
    assert "does not match its recorded size and hash" in caplog.text


def test_a_damaged_library_that_cannot_be_rebuilt_is_skipped_with_a_warning(damaged_cache, monkeypatch, caplog):
    _, library, _ = damaged_cache
    real_run = build.subprocess.run

    def failing_compile(command, *args, **kwargs):
        if "-o" in command:  # the build itself (the compiler's --version still answers)
            raise subprocess.CalledProcessError(1, command, stderr="the compiler failed")
        return real_run(command, *args, **kwargs)
    monkeypatch.setattr(build.subprocess, "run", failing_compile)
    monkeypatch.setenv("CXX", COMPILER)
    monkeypatch.setenv("PRM_JAX_NATIVE", "build")  # the source build's path, not a wheel's library
    with caplog.at_level("INFO", logger="prm_jax.native"):
        assert ffi._load() is False  # before: the truncated file was loaded (SIGBUS, exit 135)
    assert "does not match its recorded size and hash" in caplog.text
    assert "building the native CPU kernels failed" in caplog.text and "the compiler failed" in caplog.text
    assert not library.exists()  # the damaged file is gone: a later run with a compiler rebuilds it


def test_a_library_without_a_record_is_not_loaded(cache):
    library = build.build_library(COMPILER)
    build._record(library).unlink()
    assert not build.verified(library)
    assert build.build_library(COMPILER) == library and build.verified(library)


def test_collecting_the_suite_builds_nothing(tmp_path):
    # Issue 21: test_gae and test_pipeline built the native kernel while pytest collected them.
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PRM_JAX_CACHE=str(tmp_path / "cache"), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert " tests collected" in proc.stdout or "tests collected" in proc.stdout
    assert not list((tmp_path / "cache").glob(f"{build.LIBRARY_PREFIX}*"))
    assert not list((tmp_path / "cache").glob(f"{build.HOST_PREFIX}*"))


def test_the_host_functions_are_built_alone_beside_the_kernels_whatever_the_backend(cache):
    # Issue 56.6: where no packaged library holds the host functions (score_arrays' survey of a trainer's arrays),
    # rows_cpu.cc is built alone under its own name (no XLA header: a second or so), also where the default
    # backend is an accelerator (the kernels are not loaded there), and the kernels' library beside it stays
    # (a build removes only its own stale keys); PRM_JAX_NATIVE=0 turns it off (numpy checks the rows).
    code = ("import jax, numpy as np; jax.default_backend = lambda: 'gpu'; from prm_jax.native import _ffi as ffi; "
            "out = ffi.survey_rows(np.array([[5, 6, 7]]), np.array([[-1, 0, 0]]), None); "
            "print(None if out is None else out[1].tolist(), ffi.available())")
    env = {k: v for k, v in os.environ.items() if k != "PRM_JAX_NATIVE"}
    kernels = set(cache.glob(f"{build.LIBRARY_PREFIX}*"))
    assert kernels
    for mode, printed in (("build", "[1] False"), ("0", "None False")):
        proc = subprocess.run([sys.executable, "-c", code], env=dict(env, PRM_JAX_NATIVE=mode, PRM_JAX_CACHE=str(cache),
                                                                      CXX=COMPILER, JAX_PLATFORMS="cpu"),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == printed
    assert len(list(cache.glob(f"{build.HOST_PREFIX}*.so"))) == 1
    assert set(cache.glob(f"{build.LIBRARY_PREFIX}*")) == kernels


def test_a_packaged_library_that_cannot_be_loaded_gives_way_to_the_source_build(cache, tmp_path):
    # Issue 32.1: a wheel's library that this jaxlib refuses (or that does not load) is said, and the
    # sources are built instead (here found in the cache: the same build key). A damaged file stands in for
    # a refused one; tests/wheel (python3 dev.py wheel) checks a real refusal under jax 0.7.0.
    damaged = tmp_path / "_prm_jax_cpu.so"
    damaged.write_bytes(b"not a shared library")
    code = (f"from pathlib import Path; from prm_jax.native import _ffi as ffi; ffi.PACKAGED_LIBRARY = Path({str(damaged)!r}); "
            "print(ffi.status())")
    env = {k: v for k, v in os.environ.items() if k != "PRM_JAX_NATIVE"}
    proc = subprocess.run([sys.executable, "-c", code], env=dict(env, PRM_JAX_CACHE=str(cache), CXX=COMPILER,
                                                                  JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("(True, ") and "the packaged library cannot be used with jaxlib" in proc.stdout
    assert f"loaded from {cache}" in proc.stdout and "XLA FFI API 0." in proc.stdout
    assert "building the kernels from their sources instead" in proc.stderr


def test_the_packaged_library_is_loaded_first_where_the_install_built_it():
    if not ffi.PACKAGED_LIBRARY.exists():
        pytest.skip("this install has no packaged library (installed without a compiler)")
    env = {k: v for k, v in os.environ.items() if k not in ("PRM_JAX_NATIVE", "CXX")}
    with tempfile.TemporaryDirectory() as empty:
        proc = subprocess.run([sys.executable, "-c", "from prm_jax.native import _ffi as ffi; print(ffi.status())"],
                              env=dict(env, PATH=empty, PRM_JAX_CACHE=empty, JAX_PLATFORMS="cpu"),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.startswith(f"(True, \"loaded from the package's library {ffi.PACKAGED_LIBRARY}")
        assert not list(Path(empty).iterdir())  # nothing built, no compiler needed
