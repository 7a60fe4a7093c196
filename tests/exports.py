"""One way the tests export a program for a platform from this host (issue 56.2)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax import export

import prm_jax


def exported(fn: Callable[..., Any], platform: str, *args: Any, custom_calls: Sequence[str] = ()) -> export.Exported:
    """``fn`` exported for ``platform`` at the shapes of ``args`` (arrays or ``ShapeDtypeStruct`` pytrees),
    traced within ``lowering_platform(platform)``, so the program takes that platform's choices. A new
    function each call (jit's trace cache does not key on the lowering platform, so a trace cached outside it
    would be reused); a kernel's own warnings about its defaults are not the test's; ``custom_calls`` names the
    non-portable calls the export may carry (a Pallas kernel's)."""
    checks = [export.DisabledSafetyCheck.custom_call(name) for name in custom_calls]
    with prm_jax.kernels.lowering_platform(platform), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export.export(jax.jit(lambda *a: fn(*a)), platforms=(platform,), disabled_checks=checks)(*args)


def module(fn: Callable[..., Any], platform: str, *args: Any, custom_calls: Sequence[str] = ()) -> str:
    """The StableHLO text of ``exported``."""
    return exported(fn, platform, *args, custom_calls=custom_calls).mlir_module()


def shapes_of(tree: Any) -> Any:
    """A pytree of arrays as ``ShapeDtypeStruct``s."""
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), tree)
