#!/usr/bin/env python3
"""Set-up and entry commands that need only Python 3 and pip.

  python3 dev.py demo    create .venv, install prm-jax, run `prm-jax demo` (the main job)
  python3 dev.py test    create .venv, install prm-jax with its test and example extras, run the test suite
                         (all but the end-to-end tests)
  python3 dev.py e2e     the end-to-end tests (the command line in processes, the examples, multi-device,
                         the native source build, the benchmark scripts), in .venv
  python3 dev.py lint    ruff and mypy over the package (in .venv)
  python3 dev.py floor   the kernel tests on the oldest supported jax, in .venv-floor
  python3 dev.py tunix   the tunix integration's tests with tunix installed (~1.8 GB), in .venv-tunix
  python3 dev.py ray     the ray executor's tests with Ray installed, in .venv-ray, inside a private network
                         namespace (unshare): the executor tests on a local Ray, then a two-node cluster
  python3 dev.py wheel   build the wheel, install it into a fresh venv without a compiler, check its kernels
                         (speed against the source install; the ABI under jax 0.7.0 needs .venv-floor: floor)
  python3 dev.py docs    build the documentation site into docs/_build/html (in .venv-docs; any warning, a
                         broken link or an undocumented public name fails it), run its doctests, and check
                         it in headless browsers at 1,280 px (layout, maths, search; screenshots)
  python3 dev.py gpu     prepare the device check (benchmarks/gpu_check.sh): msgspec's wheels into .gpu-wheels/
                         (the device's image lacks it: carry that folder), then dry-run the check on the CPU in
                         .venv-gpu, which holds what the image holds (not prm-jax's own dependencies) on the
                         image's Python (3.12) where this machine has one
  python3 dev.py bench   create .venv, install, run the CPU benchmarks

Extra arguments are passed on (to pytest for ``test``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
FLOOR_VENV = ROOT / ".venv-floor"
TUNIX_VENV = ROOT / ".venv-tunix"  # tunix pulls ~1.8 GB: kept out of the main test environment
DOCS_VENV = ROOT / ".venv-docs"  # sphinx and myst-parser, kept out of the test environment
RAY_VENV = ROOT / ".venv-ray"  # Ray (~250 MB), kept out of the test environment
# The device machine's image (the device tool's KINDS.md: Python 3.12, jax 0.11 with CUDA 13, pytest-xdist, no
# msgspec): what of it .venv-gpu holds for the check's dry run. The check brings msgspec's wheel, from
# GPU_WHEELS, for the CPython it finds there.
GPU_VENV = ROOT / ".venv-gpu"
GPU_IMAGE = ("jax==0.11.2", "jaxlib==0.11.2", "numpy==2.5.2", "chex", "flax", "optax", "anyio", "pyyaml", "httpx",
             "pytest", "pytest-xdist", "hypothesis")
GPU_WHEELS = ROOT / ".gpu-wheels"
GPU_PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")
GPU_PYTHON_VERSION = (3, 12)  # the image's python3 (3.12.3): .venv-gpu's where this machine has one
# The ray executor's tests (python3 dev.py ray): its own tests, then the executor tests every executor passes,
# on Ray too; each run in a private network namespace (Ray binds every interface).
RAY_TESTS = (["tests/ray", "-m", "not e2e"], ["tests/runtime/test_executor_conformance.py", "-k", "ray"],
             ["tests/ray", "-m", "e2e"])
JAX_FLOOR = "0.7.0"  # keep equal to the floor in pyproject.toml
KERNEL_TESTS = ["tests/kernels"]  # the kernel floor, on the oldest supported jax too
# The suite runs on every core (pytest-xdist; CI has two), a test file on one worker (its tests share
# their compiled programs and warm-ups).
PARALLEL = ["-n", "auto", "--dist", "loadfile"]
# The test command always ends (issue 55.9: a worker killed by a segfault in XLA:CPU's compiler once left the
# run stalled at 98%, every process idle; the segfaults' cause, a worker out of memory mappings, is bounded by
# tests/memory_maps.py now): each test is bounded (pytest-timeout; its thread method also ends
# a test stuck in C code, by ending its worker), a crashed worker is not replaced (with --dist loadfile a
# replacement waits forever for work, pytest-xdist #784 and #1378, unfixed in 3.8.0: four runs of 2026-12-06
# stalled so until the watcher; without one the other workers finish the run and the crashed test is rerun
# alone below, with XLA's dumps), and a run that prints nothing for SILENCE_S is ended by the watcher
# (``_watched``), naming the tests in flight.
TEST_TIMEOUT_S = 900
BOUNDED = [f"--timeout={TEST_TIMEOUT_S}", "--timeout-method=thread", "--max-worker-restart=0"]
SILENCE_S = float(os.environ.get("PRM_JAX_TEST_SILENCE_S", 1200))
CRASH_DUMPS = ROOT / ".xla-crash"  # a crashed test rerun alone, with XLA's dumps: the compiler's reproduction
INTEGRATION_TESTS = ["tests/integrations"]  # run in the main suite too, where tunix's own are skipped
# The main suite compiles with XLA:CPU's code generation made cheap (LLVM's optimizations off, XLA's
# elemental emitters): its ~2,800 small programs compile in half the time (the suite 578 -> 271 s in a
# clean clone on two cores), and it tests the same computations, each still checked against its float64
# loop (results may differ from a default build in the last bits: no fused multiply-add). Every other step
# compiles as users do: the end-to-end tests, the floor (the kernel tests again, at the default settings),
# the wheel, tunix, the docs and the benchmarks.
SUITE_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true",
                   "--xla_cpu_use_fusion_emitters=false")


def _python(env: Path = VENV) -> Path:
    return env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _ensure_env(extras: str, env: Path = VENV, pins: tuple[str, ...] = ()) -> Path:
    python = _python(env)
    if not python.exists():
        print(f"dev.py: creating the virtual environment {env.name} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(env)
    stamp = env / f".installed-{extras or 'base'}"
    sources = [ROOT / "pyproject.toml"]
    if not stamp.exists() or any(s.stat().st_mtime > stamp.stat().st_mtime for s in sources):
        target = f"{ROOT}[{extras}]" if extras else str(ROOT)
        what = f"prm-jax with [{extras}]" if extras else "prm-jax"
        print(f"dev.py: installing {what} into {env.name} (jax and its dependencies: a few minutes the first "
              "time) ...", flush=True)
        quiet = [] if sys.stdout.isatty() else ["--quiet"]  # pip's own progress on a terminal
        subprocess.run([str(python), "-m", "pip", "install", *quiet, "--disable-pip-version-check",
                        "-e", target, *pins], check=True)
        stamp.touch()
        print(f"dev.py: {env.name} is ready", flush=True)
    return python


def _watched(command: list[str], env: dict[str, str], silence_s: float = SILENCE_S) -> int:
    """Runs a pytest ``command`` (its output passed through) and ends it when it prints nothing for
    ``silence_s``: exit status 124, after naming the tests in flight (each worker writes the test it runs to a
    file under ``PRM_JAX_INFLIGHT``: tests/conftest.py). A test whose worker crashed is then rerun alone with
    XLA's dumps (``--xla_dump_to``) into ``.xla-crash/``: the program a compiler crash needs to be reported."""
    import re
    import shutil
    import signal
    import tempfile
    import threading
    import time

    inflight = tempfile.mkdtemp(prefix="prm-jax-inflight-")
    proc = subprocess.Popen(command, cwd=ROOT, env=dict(env, PRM_JAX_INFLIGHT=inflight), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    last, seen = [time.monotonic()], bytearray()

    def pump() -> None:
        while chunk := os.read(proc.stdout.fileno(), 65536):  # type: ignore[union-attr]
            last[0] = time.monotonic()
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            seen.extend(chunk)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            if time.monotonic() - last[0] > silence_s:
                running = [Path(inflight, name).read_text().strip() for name in sorted(os.listdir(inflight))]
                print(f"\ndev.py: the run printed nothing for {silence_s:.0f} s and is ended; tests in flight: "
                      f"{', '.join(running) or 'none (the workers are idle: the run itself stalled)'}", flush=True)
                _end_group(proc, signal)
                return 124
            time.sleep(min(1.0, silence_s / 10))
        reader.join(10)
    except KeyboardInterrupt:
        _end_group(proc, signal)
        raise
    finally:
        shutil.rmtree(inflight, ignore_errors=True)
    crashed = sorted(set(re.findall(r"worker '\w+' crashed while running '([^']+)'", seen.decode(errors="replace"))))
    for nodeid in crashed[:3]:
        dump = CRASH_DUMPS / re.sub(r"[^\w.-]+", "_", nodeid)[:120]
        flags = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
        print(f"dev.py: {nodeid} crashed its worker; rerunning it alone with XLA's dumps into {dump} ...", flush=True)
        try:
            again = subprocess.run([*command[:3], "-p", "no:xdist", nodeid], cwd=ROOT, env=dict(env, XLA_FLAGS=flags),
                                   timeout=TEST_TIMEOUT_S, capture_output=True).returncode
            print(f"dev.py: alone it exited {again} ({'crashed again' if again < 0 else 'no crash'}); the HLO of its "
                  f"programs is in {dump}", flush=True)
        except subprocess.TimeoutExpired:
            print(f"dev.py: alone it ran past {TEST_TIMEOUT_S} s; the dumps so far are in {dump}", flush=True)
    return proc.returncode


def _end_group(proc: subprocess.Popen[bytes], signal: Any) -> None:
    """SIGTERM to the run's process group, SIGKILL 10 s later if it is still there."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(10)
            return
        except subprocess.TimeoutExpired:
            continue


def _in_private_network(argv: list[str]) -> int:
    """Runs ``argv`` in a network namespace of its own where only the loopback interface exists (Ray binds
    every interface and advertises the machine's address; here there is only 127.0.0.1), with Ray's token
    authentication set up as a user sets it (a token in the environment) and a HOME of its own (a stray
    ``~/.ray/auth_token`` would make new clusters refuse drivers)."""
    import secrets
    import shutil
    import tempfile

    if shutil.which("unshare") is None:
        print("dev.py ray: needs unshare (util-linux) to run Ray in a private network namespace", flush=True)
        return 1
    with tempfile.TemporaryDirectory(prefix="prm-jax-ray-home-") as home:
        env = dict(os.environ, HOME=home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16),
                   PRM_JAX_RAY_SUITE="1", RAY_USAGE_STATS_ENABLED="0")
        env.pop("RAY_ADDRESS", None)
        # (root: a network namespace alone, so that every uid stays mapped: the code scorer's sandbox runs under
        # uids of its own; otherwise a user namespace too, mapping this user to root inside it)
        users = [] if os.geteuid() == 0 else ["--map-root-user"]
        command = ["unshare", "--net", *users, "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
        return subprocess.run(command, cwd=ROOT, env=env).returncode


def _image_python() -> list[str]:
    """An interpreter of the image's Python (3.12) for .venv-gpu: ``PRM_JAX_GPU_PYTHON``, a ``python3.12``
    that runs, or pyenv's; else this one (the dry run then checks the check on another minor version)."""
    import glob

    candidates = [os.environ.get("PRM_JAX_GPU_PYTHON"), "python3.12",
                  *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))]
    for candidate in filter(None, candidates):
        try:
            probe = subprocess.run([candidate, "-c", f"import sys; assert sys.version_info[:2] == {GPU_PYTHON_VERSION}"],
                                   capture_output=True)
        except OSError:
            continue
        if probe.returncode == 0:
            return [candidate]
    return [sys.executable]


def _gpu_dry_run(rest: list[str]) -> int:
    """``dev.py gpu``: msgspec's wheels for the device (its image has no network), then the device check on the
    CPU with tiny shapes in an environment like the image's."""
    import shutil

    python = _python(GPU_VENV)
    interpreter = _image_python()
    version = subprocess.run([*interpreter, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    stamp, wanted = GPU_VENV / ".installed-image", f"Python {version}: {' '.join(GPU_IMAGE)}"
    if not stamp.exists() or stamp.read_text() != wanted:
        print(f"dev.py: creating {GPU_VENV.name} (Python {version}) with the device image's packages ...", flush=True)
        shutil.rmtree(GPU_VENV, ignore_errors=True)
        subprocess.run([*interpreter, "-m", "venv", str(GPU_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *GPU_IMAGE],
                       check=True)
        stamp.write_text(wanted)
    for wheel_python in GPU_PYTHONS:
        tag = "cp" + wheel_python.replace(".", "")
        if not list(GPU_WHEELS.glob(f"msgspec-*-{tag}-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                            "--only-binary=:all:", "--no-deps", "--python-version", wheel_python, "--platform",
                            "manylinux_2_17_x86_64", "--dest", str(GPU_WHEELS), "msgspec>=0.18"], check=True)
    env = dict(os.environ, DRY_RUN="1", JAX_PLATFORMS="cpu", PYTHON=str(python),
               OUT=os.environ.get("OUT", str(ROOT / "gpu_out" / "dry_run")))
    code = subprocess.run(["bash", "benchmarks/gpu_check.sh", *rest], cwd=ROOT, env=env).returncode
    if rest:
        return code
    # The backend-dependent kernel tests with a GPU's backend choices (issue 56.1), on this CPU: the methods,
    # step groups and alignment auto picks there against every reference, every native case skipping.
    print("dev.py: the backend-dependent kernel tests with the choices made for cuda (PRM_JAX_TESTS_AS_PLATFORM)",
          flush=True)
    tests = [f"tests/kernels/test_{name}.py" for name in AS_ACCELERATOR_TESTS]
    as_gpu = dict(os.environ, PRM_JAX_TESTS_AS_PLATFORM="cuda", JAX_PLATFORMS="cpu")
    return code or subprocess.run([str(_ensure_env("test,example")), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n",
                                   str(max(2, os.cpu_count() or 2)), *tests], cwd=ROOT, env=as_gpu).returncode


# The kernel tests whose choices depend on the backend (dev.py gpu runs them with a GPU's choices).
AS_ACCELERATOR_TESTS = ("recurrence", "token_gae", "strategy", "gigpo", "otb", "alignment", "check_callbacks",
                        "progress", "normalization", "accelerator_export", "credit_empty")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "e2e", "lint", "floor", "tunix", "ray", "wheel", "docs", "gpu",
                                   "bench"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        python = _ensure_env("")
        return subprocess.run([str(python), "-m", "prm_jax.app._cli", "demo", *rest], cwd=ROOT).returncode
    if command == "floor":
        python = _ensure_env("test", FLOOR_VENV, (f"jax=={JAX_FLOOR}", f"jaxlib=={JAX_FLOOR}"))
        env = dict(os.environ, PRM_JAX_CACHE=str(FLOOR_VENV / "prm_jax_cache"))
        return _watched([str(python), "-m", "pytest", "-q", *PARALLEL, *BOUNDED, *KERNEL_TESTS, *rest], env)
    if command == "docs":
        python = _ensure_env("docs", DOCS_VENV)
        for builder, out in (("html", "html"), ("doctest", "doctest")):
            code = subprocess.run([str(python), "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, "docs",
                                   str(ROOT / "docs" / "_build" / out), *rest], cwd=ROOT).returncode
            if code:
                return code
        # The built site in real headless browsers (Debian's chromium; Chromium as Qt WebEngine embeds it).
        code = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/docs"], cwd=ROOT,
                              env=dict(os.environ, PRM_JAX_DOCS_TEST="1")).returncode
        if code:
            return code
        print(f"docs: {ROOT / 'docs' / '_build' / 'html' / 'index.html'}")
        return 0
    if command == "tunix":
        python = _ensure_env("test,tunix", TUNIX_VENV)
        return subprocess.run([str(python), "-m", "pytest", "-q", *INTEGRATION_TESTS, *rest], cwd=ROOT).returncode
    if command == "ray":
        python = _ensure_env("test,ray", RAY_VENV, ("trio>=0.25",))
        for tests in RAY_TESTS:
            code = _in_private_network([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, *rest])
            if code:
                return code
        return 0
    if command == "gpu":
        return _gpu_dry_run(rest)
    python = _ensure_env("test,example")
    if command in ("test", "e2e"):
        marks = "not e2e" if command == "test" else "e2e"  # tests/conftest.py's E2E_FILES
        env = dict(os.environ)
        if command == "test":
            env["XLA_FLAGS"] = " ".join([*SUITE_XLA_FLAGS, os.environ.get("XLA_FLAGS", "")]).strip()
        return _watched([str(python), "-m", "pytest", *PARALLEL, *BOUNDED, "-m", marks, *rest], env)
    if command == "wheel":
        env = dict(os.environ, PRM_JAX_WHEEL_TEST="1")
        return subprocess.run([str(python), "-m", "pytest", "-q", "-s", "tests/wheel", *rest], cwd=ROOT,
                              env=env).returncode
    if command == "lint":
        for tool in (["ruff", "check", "prm_jax", "tests", "benchmarks", "examples", "dev.py", "setup.py"], ["mypy"]):
            code = subprocess.run([str(python), "-m", *tool], cwd=ROOT).returncode
            if code:
                return code
        return 0
    return subprocess.run([str(python), "benchmarks/bench_advantages.py", *rest], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
