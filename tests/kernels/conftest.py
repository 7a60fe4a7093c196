"""Kernel tests: the native CPU kernel joins every comparison wherever it builds (decided when a test runs,
not while the suite is collected: collecting builds nothing); tests/kernels/test_token_gae.py checks that it
builds wherever a C++ compiler exists, so it cannot drop out of the suite unnoticed."""

import pytest

from prm_jax.native import _ffi as native


@pytest.fixture(autouse=True)
def _native_where_it_builds(request):
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "native" in callspec.params.values() and not native.available():
        pytest.skip("the native kernel needs a CPU with a C++ compiler")


@pytest.fixture
def needs_native():
    if not native.available():
        pytest.skip("the native kernel needs a CPU with a C++ compiler")
