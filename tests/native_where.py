"""Where the native kernels run in this test process: they are CPU kernels (XLA FFI handlers registered for
the host platform), built where a C++ compiler exists. On a GPU or TPU backend every ``native`` case skips
with that reason, not with a failure (issue 56.1: 14 ``native`` cases failed on an H200)."""

from __future__ import annotations

import pytest

from prm_jax.kernels._platform import on_cpu, target_platform
from prm_jax.native import _ffi as native


def native_skip_reason() -> str | None:
    """Why the native kernels do not run here, or None where they do."""
    if not on_cpu():
        return f"the native kernels are CPU kernels: programs here are lowered for {target_platform()!r}"
    if not native.available():
        return "the native kernels are not built (no C++ compiler, or PRM_JAX_NATIVE=0)"
    return None


def runs_native() -> bool:
    return native_skip_reason() is None


def skip_without_native(choice: str = "native") -> None:
    """Skip the running test, with the reason, when it asks for ``native`` where the kernels do not run."""
    reason = native_skip_reason() if choice == "native" else None
    if reason:
        pytest.skip(reason)
