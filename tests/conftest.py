import os
from pathlib import Path

import jax
import pytest

# The multi-device tests run in their own processes (tests/test_multidevice.py starts them).
collect_ignore = [] if os.environ.get("PRM_JAX_MULTIDEVICE") else ["multidevice"]
# The wheel's test builds a wheel and a virtual environment (minutes): its own CI step, python3 dev.py wheel.
if not os.environ.get("PRM_JAX_WHEEL_TEST"):
    collect_ignore.append("wheel")
# The site's browser check needs the built site and the docs extra: python3 dev.py docs runs it.
if not os.environ.get("PRM_JAX_DOCS_TEST"):
    collect_ignore.append("docs")
# Ray binds every interface and advertises the machine's address: its tests run only inside a private network
# namespace with the ray extra installed (python3 dev.py ray sets that up and says so here).
RAY_SUITE = bool(os.environ.get("PRM_JAX_RAY_SUITE"))

# The end-to-end tests: the command line run as a user runs it (most in processes of their own: signals,
# exits, outputs), the examples, the multi-device processes, the native library built from the sources, the
# benchmark scripts (and a test elsewhere marked ``e2e`` itself: the README's and the guides' code blocks, each
# run as written in a process of its own). Marked ``e2e``: ``python3 dev.py e2e`` runs
# them, a CI step of their own;
# ``python3 dev.py test`` runs the rest (``-m "not e2e"``); plain ``pytest`` runs both.
E2E_FILES = ("app/test_cli.py", "app/test_cli_credit.py", "app/test_cli_faults.py", "app/test_cli_input.py",
             "app/test_first_hour_outputs.py",
             "app/test_doctor.py", "app/test_host_path.py", "app/test_outputs.py", "app/test_serving_cli.py",
             "native/test_native.py", "ray/test_ray_cluster.py", "runtime/test_worker_footprint.py",
             "scorers/test_sandbox_fusion.py",
             "test_audit.py", "test_benchmarks.py", "test_example.py", "test_multidevice.py",
             "test_test_command.py")  # (the test command run in processes of its own: its watcher, its hook)


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).parent
    for item in items:
        if item.path.relative_to(root).as_posix() in E2E_FILES:
            item.add_marker(pytest.mark.e2e)


# The tests' plug-in estimators, registered as a user registers one (tests/rloo_estimator.py): the option
# matrix and the strategy tests run every registered estimator, so they run these too.
from rloo_estimator import RLOO  # noqa: E402

from prm_jax.estimators import register_estimator  # noqa: E402

PLUGINS = (register_estimator(RLOO),)

# Every test runs with the strictest promotion rules, so implicit rank or dtype promotion is a bug.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


# The test command's watcher (dev.py's _watched) names the tests in flight when a run goes silent: each process
# writes the test it runs to a file of its own there.
_INFLIGHT = os.environ.get("PRM_JAX_INFLIGHT")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _INFLIGHT:
        yield
        return
    record = Path(_INFLIGHT) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.txt"
    try:
        record.write_text(item.nodeid)
    except OSError:  # (the watcher's folder gone: nothing to tell)
        pass
    yield
    record.unlink(missing_ok=True)


# A failing test's traceback, written the moment it fails (issue 56.3): a run cut at its time bound (the device
# check's) still says why each failure failed. ``PRM_JAX_FAILURES`` names the file; each process appends
# (under xdist the workers write, where the test ran; the controller, which only relays, does not).
_FAILURES = os.environ.get("PRM_JAX_FAILURES")


def pytest_runtest_logreport(report):
    if not _FAILURES or not report.failed or _RELAYS:
        return
    with open(_FAILURES, "a", encoding="utf-8") as out:
        out.write(f"==== {report.nodeid} ({report.when}) ====\n{report.longreprtext}\n\n")


_RELAYS = False  # this process is xdist's controller (it relays the workers' reports; read from its config,
# not the environment, which a test's own pytest run inherits from the worker that starts it)


def pytest_configure(config):
    global _RELAYS
    _RELAYS = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


# PRM_JAX_TESTS_AS_PLATFORM=cuda (or tpu): every test's backend choices are the ones made for that platform
# (prm_jax.kernels._platform.choices_for around it) while the programs still run here: on a CPU host, the GPU's
# branches (associative GAE, sorted step groups, scattered alignment) against every float64 reference, and
# every native case skipping with its reason (issue 56.1; python3 dev.py gpu runs the kernel tests so).
_AS_PLATFORM = os.environ.get("PRM_JAX_TESTS_AS_PLATFORM")


@pytest.fixture(autouse=True)
def _no_implicit_promotion():
    with jax.numpy_rank_promotion("raise"), jax.numpy_dtype_promotion("strict"):
        if _AS_PLATFORM:
            from prm_jax.kernels._platform import choices_for

            with choices_for(_AS_PLATFORM):
                yield
        else:
            yield


@pytest.fixture(scope="module", autouse=True)
def _bounded_memory_maps():
    """After each module, JAX's caches are dropped when the process's memory mappings near the kernel's limit
    (tests/memory_maps.py: past it XLA:CPU's next compilation crashes the worker)."""
    yield
    import memory_maps

    memory_maps.relieve()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def _clear_scorer_events():
    import scorers_for_tests

    scorers_for_tests.EVENTS.clear()


@pytest.fixture(scope="module", autouse=True)
def _one_ray_per_module(request):
    """In the Ray suite, a module that sets ``ONE_RAY_PER_MODULE`` gets one local Ray (this machine's CPUs, two
    named ``verifier`` resources, dashboard off, on 127.0.0.1) for all its tests; the ray executor reuses a
    driver's connection and never closes it."""
    if not (RAY_SUITE and getattr(request.module, "ONE_RAY_PER_MODULE", False)):
        yield
        return
    import tempfile

    import ray

    # The actors import the tests' scorers as a user's import theirs: from a path given to the cluster.
    paths = os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parent.parent)])
    with tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp") as temp:
        ray.init(address="local", num_cpus=2, resources={"verifier": 2}, include_dashboard=False,
                 _node_ip_address="127.0.0.1", _temp_dir=temp, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": paths}})
        try:
            yield
        finally:
            ray.shutdown()
