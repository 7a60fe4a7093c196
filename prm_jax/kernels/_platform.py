"""The platform the programs traced now will be lowered for: the process's default backend, or the one
``lowering_platform`` names (``jax.export`` of a program for an accelerator from a CPU host). Every backend
choice reads it (``_recurrence``'s methods, the native kernels' policy), and so does the checks' host
callback, which no exported program can carry (``_checks.raise_when_run``)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

from prm_jax._validation import one_of

_LOWERING_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("prm_jax_lowering_platform",
                                                                                 default=None)
# Whether the programs traced now are for export (``lowering_platform``'s), not run here (``choices_for``'s).
_EXPORTING: contextvars.ContextVar[bool] = contextvars.ContextVar("prm_jax_exporting", default=False)


@contextlib.contextmanager
def lowering_platform(platform: str) -> Iterator[None]:
    """Within: every backend choice a kernel resolves (``auto``'s methods, the native CPU kernels) is made for
    ``platform`` (``cpu``, ``cuda``, ``rocm``, ``tpu``), the platform the programs traced inside will be
    lowered for, instead of this process's default backend (``ValueError`` for another name), and restored
    on leaving. For ``jax.export`` from a CPU host: GAE exported for a GPU holds its associative form, no loop
    over T and no CPU kernel.

    An exported program cannot carry a host callback, so within, a single kernel's value check that would
    raise from one when the computation runs (a traced group size that does not add up, a mask of 0.5, ...)
    sets the first entry of each of the kernel's outputs to NaN instead (an integer output: its dtype's
    minimum). Trace within: a function already traced outside (the same ``jax.jit(f)`` called before) keeps
    the choices of that trace; export ``jax.jit(lambda *a: f(*a))``.

    Args:
        platform: ``cpu``, ``cuda``, ``rocm`` or ``tpu``: the platform the programs traced inside are lowered for.

    Example:
        >>> import jax
        >>> gae = lambda r, v, m: prm_jax.kernels.gae(r, v, m, gamma=0.9, lam=0.95).advantages
        >>> rewards, mask = jax.ShapeDtypeStruct((2, 8), np.float32), jax.ShapeDtypeStruct((2, 8), np.bool_)
        >>> with prm_jax.kernels.lowering_platform("cuda"):
        ...     exported = jax.export.export(jax.jit(gae), platforms=("cuda",))(rewards, rewards, mask)
        >>> module = exported.mlir_module()
        >>> "stablehlo.while" in module, "custom_call" in module
        (False, False)
    """
    with choices_for(platform):
        token = _EXPORTING.set(True)
        try:
            yield
        finally:
            _EXPORTING.reset(token)


@contextlib.contextmanager
def choices_for(platform: str) -> Iterator[None]:
    """Within: the backend choices are made for ``platform`` while the programs still run in this process
    (the checks keep their host callback): the tests' ``PRM_JAX_TESTS_AS_PLATFORM``, which runs the kernel
    tests on a CPU host with a GPU's choices. ``lowering_platform`` is this and export."""
    one_of("platform", platform, ("cpu", "cuda", "rocm", "tpu"))
    token = _LOWERING_PLATFORM.set(platform)
    try:
        yield
    finally:
        _LOWERING_PLATFORM.reset(token)


def target_platform() -> str:
    """The platform programs traced now will be lowered for: the one ``lowering_platform`` sets, else the
    process's default backend."""
    return _LOWERING_PLATFORM.get() or jax.default_backend()


def on_cpu() -> bool:
    """Whether programs traced now are lowered for the CPU (``target_platform``): where the native kernels run."""
    return target_platform() == "cpu"


def exporting() -> bool:
    """Whether the programs traced now are for export (within ``lowering_platform``), where a host callback
    cannot be serialized."""
    return _EXPORTING.get()
