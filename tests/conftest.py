import os

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

# Every test runs with the strictest promotion rules, so implicit rank or dtype promotion is a bug.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(autouse=True)
def _no_implicit_promotion():
    with jax.numpy_rank_promotion("raise"), jax.numpy_dtype_promotion("strict"):
        yield


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def _clear_scorer_events():
    import scorers_for_tests

    scorers_for_tests.EVENTS.clear()
