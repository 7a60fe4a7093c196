"""Kernel tests: the native CPU kernel joins every comparison wherever it builds and the backend is the CPU
(decided when a test runs, not while the suite is collected: collecting builds nothing; elsewhere each native
case skips with its reason, tests/native_where.py); tests/kernels/test_token_gae.py checks that it builds
wherever a C++ compiler exists, so it cannot drop out of the suite unnoticed."""

import pytest
from native_where import skip_without_native


@pytest.fixture(autouse=True)
def _native_where_it_builds(request):
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "native" in callspec.params.values():
        skip_without_native()


@pytest.fixture
def needs_native():
    skip_without_native()
