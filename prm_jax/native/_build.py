"""Building the native CPU kernels: compile, cache, lock, verify (the only code that runs a compiler).

The C++ sources beside this file (``gae_cpu.cc``, ``step_groups_cpu.cc``, ``turns_cpu.cc``, ``otb_cpu.cc``,
``sum_pi_squared_cpu.cc``, sharing ``row_tasks.h``; ``rows_cpu.cc``, a host function) are compiled into one
library once per machine with the system C++ compiler into a cache directory (``$PRM_JAX_CACHE``, default
``~/.cache/prm_jax``). The build is keyed on the sources' and headers' text, the flags, the compiler and JAX
(not on the folder the sources are in), synced to disk with its size and SHA-256 recorded beside it, and
verified before every load: a damaged file (a crash or a full disk while it was written) is rebuilt. Concurrent
processes wait on a file lock, then find the finished library.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax

logger = logging.getLogger("prm_jax.native")
SOURCES = tuple(Path(__file__).parent / name
                for name in ("gae_cpu.cc", "step_groups_cpu.cc", "turns_cpu.cc", "otb_cpu.cc", "sum_pi_squared_cpu.cc",
                             "rows_cpu.cc"))
HEADERS = (Path(__file__).parent / "row_tasks.h",)  # included by the sources: part of the build key
INPUTS = SOURCES + HEADERS
LIBRARY_PREFIX = "prm_jax_cpu_"
# The host functions (numpy buffers in, no XLA header): in the one library a wheel carries, and built alone
# (a second or so) where no packaged library holds them, whatever the backend (``_ffi._host_library``).
HOST_SOURCES = (Path(__file__).parent / "rows_cpu.cc",)
HOST_PREFIX = "prm_jax_host_"
# What a wheel carries: the library setup.py builds from SOURCES with FLAGS, loaded without a compiler.
PACKAGED_LIBRARY = Path(__file__).parent / "_prm_jax_cpu.so"


def cache_dir() -> Path | None:
    """``$PRM_JAX_CACHE``, else ``~/.cache/prm_jax``; None (no native kernel) without a home directory.

    Never a shared temporary folder with a predictable name, where another user could plant a library.
    """
    if os.environ.get("PRM_JAX_CACHE"):
        return Path(os.environ["PRM_JAX_CACHE"])
    try:
        return Path.home() / ".cache" / "prm_jax"
    except RuntimeError:
        return None


COMPILERS = ("c++", "g++", "clang++")  # looked for on PATH in this order, after $CXX


def find_compiler(environ: Mapping[str, str] | None = None) -> str | None:
    """The C++ compiler to build the kernels with: ``$CXX``, else the first of ``COMPILERS`` on ``$PATH``
    (of ``environ``, default this process's); None without one."""
    environ = os.environ if environ is None else environ
    if environ.get("CXX"):
        return environ["CXX"]
    for name in COMPILERS:
        found = shutil.which(name, path=environ.get("PATH"))
        if found:
            return found
    return None


def _compiler_version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-pthread")


def build_key(compiler: str, sources: Sequence[Path]) -> str:
    """The build is reused only for the same source texts, flags, compiler, machine and JAX version, and
    for nothing else: not the folder the sources are in. (Keyed on the absolute command, two checkouts or
    installs of one version on a machine removed each other's build as stale and rebuilt it, ~4 s, on
    every alternation.)"""
    parts = [*(f"{source.name}\0{source.read_text()}" for source in sources), compiler, *FLAGS,
             _compiler_version(compiler), platform.machine(), sys.platform, jax.__version__]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _fingerprint(path: Path) -> str:
    """``"<size> <sha256>"`` of a file."""
    data = path.read_bytes()
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def _record(library: Path) -> Path:
    return library.with_suffix(".sha256")


def verified(library: Path) -> bool:
    """The library is whole: its size and hash are those recorded when it was built. (A library truncated
    by a crash or a full disk was loaded as it was: SIGBUS, exit 135, no message.)"""
    try:
        return _record(library).read_text().strip() == _fingerprint(library)
    except OSError:
        return False


def _write_synced(path: Path, data: bytes) -> None:
    """``data`` at ``path``, on disk before the rename that publishes it (and the rename itself synced)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def build_library(compiler: str, *, host: bool = False) -> Path:
    """The library for this build key: a verified cached one, else built now (a damaged one is rebuilt).
    ``host``: the host functions alone (``HOST_SOURCES``), under their own name.

    Args:
        host: Whether to build the host functions alone (``HOST_SOURCES``) instead of every kernel.
    """
    cache = cache_dir()
    if cache is None:
        raise OSError("no cache directory for the native kernel: set PRM_JAX_CACHE")
    sources, inputs, prefix = (HOST_SOURCES, HOST_SOURCES, HOST_PREFIX) if host else (SOURCES, INPUTS, LIBRARY_PREFIX)
    command = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, sources)]
    library = cache / f"{prefix}{build_key(compiler, inputs)}.so"
    if verified(library):
        return library
    cache.mkdir(parents=True, exist_ok=True)
    # One build per machine: concurrent processes wait on a file lock, then find the finished library.
    with open(library.with_suffix(".lock"), "a") as lock:
        _lock_file(lock)
        if verified(library):
            return library
        if library.exists():
            if _record(library).exists():
                logger.warning("the cached native library %s does not match its recorded size and hash (a crash "
                               "or a full disk while it was written?): rebuilding it", library)
            else:
                logger.info("the cached native library %s has no recorded hash (an older build): rebuilding it",
                            library)
            library.unlink()
        fd, tmp = tempfile.mkstemp(prefix=f".{prefix}", suffix=".so", dir=cache)
        os.close(fd)
        try:
            subprocess.run([*command, "-o", tmp], check=True, capture_output=True, text=True, timeout=300)
            with open(tmp, "rb+") as built:
                os.fsync(built.fileno())
            _write_synced(_record(library), _fingerprint(Path(tmp)).encode())
            os.replace(tmp, library)  # the record first: a library without its record is never loaded
            _sync_folder(cache)
        finally:
            Path(tmp).unlink(missing_ok=True)
        _remove_stale(cache, keep=library, prefix=prefix)
    return library


def _remove_stale(cache: Path, keep: Path, prefix: str) -> None:
    """Builds of other keys (older sources, compilers or JAX versions) of the same library (``prefix``) are not
    used again."""
    legacy = cache.glob("gae_cpu_*") if prefix == LIBRARY_PREFIX else ()  # gae_cpu_: the GAE-only library
    for old in [*cache.glob(f"{prefix}*"), *legacy]:
        if old.stem != keep.stem:  # (the record and the lock share the library's stem)
            old.unlink(missing_ok=True)


def _lock_file(handle) -> None:
    try:
        import fcntl
    except ImportError:  # no POSIX locks (Windows): the atomic rename still keeps the library whole
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
