"""``prm-jax doctor``: what a bug report needs, in one paste.

The versions (prm-jax, Python, jax, jaxlib), the backend and its devices, whether the native CPU kernels
are loaded (their library, or why not: turned off, another backend, no compiler, a failed build), the
compile-cache folders, and which optional extras are installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
from typing import Any

EXTRAS = {  # extra -> the modules it brings (pyproject.toml's optional dependencies)
    "judge": ("httpx",),
    "example": ("flax", "optax"),
    "tunix": ("tunix",),
    "plot": ("matplotlib",),
    "test": ("chex", "pytest", "hypothesis"),
}


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def report() -> dict[str, Any]:
    """Every figure ``prm-jax doctor`` prints, as plain values."""
    import jax

    import prm_jax
    from prm_jax.native import _ffi as ffi
    from prm_jax.native._build import cache_dir

    native, why = ffi.status()
    cache = cache_dir()
    return {
        "prm-jax": prm_jax.__version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "backend": jax.default_backend(),
        "devices": ", ".join(str(device) for device in jax.devices()),
        "native kernels": why if native else f"not used: {why}",
        "native build cache": str(cache) if cache is not None else "none (no home directory; set PRM_JAX_CACHE)",
        "compile cache": (getattr(jax.config, "jax_compilation_cache_dir", None)
                          or (f"{cache / 'xla'} (the prm-jax command's)" if cache is not None else "none")),
        "extras": ", ".join(f"{extra} ({'yes' if all(importlib.util.find_spec(m) for m in modules) else 'no'})"
                            for extra, modules in EXTRAS.items()),
    }


def main() -> int:
    for key, value in report().items():
        print(f"{key + ':':<20} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
