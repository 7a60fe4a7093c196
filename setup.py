"""Builds the native CPU kernels into the wheel (everything else is in pyproject.toml).

setuptools' ``Extension`` compiles ``prm_jax/native``'s C++ sources (``build.SOURCES``, with ``build.FLAGS``'
optimization and language flags) against the XLA FFI headers of the jaxlib in the build environment, the
oldest supported one (pyproject's ``[build-system]``): XLA refuses a handler built against newer FFI headers
than its own, and serves older ones, so one library built so serves every supported jaxlib. It goes into the
package as ``prm_jax/native/_prm_jax_cpu.so`` (it reports its FFI API version, ``PrmJaxFfiApiVersion``), and
``prm_jax.native._ffi`` loads it without a compiler. The library does not use Python's C API: the wheel is
tagged ``py3-none-<platform>``. Without a compiler the extension is skipped (``optional``): the wheel then
holds the sources only, and the first CPU call builds them or warns (prm_jax.native._ffi).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_prm_jax_native_build", ROOT / "prm_jax" / "native" / "_build.py")
assert _spec is not None and _spec.loader is not None
native = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native)  # SOURCES, FLAGS, PACKAGED_LIBRARY: declared once, there
COMPILE_FLAGS = [flag for flag in native.FLAGS if flag not in ("-shared", "-fPIC")]  # setuptools adds those two


class BuildNative(build_ext):
    """The kernels as one plain shared library (no Python ABI tag in its name), against jaxlib's headers."""

    def finalize_options(self) -> None:
        super().finalize_options()
        import jax

        for extension in self.extensions:
            extension.include_dirs.append(jax.ffi.include_dir())

    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"


class PlatformWheel(bdist_wheel):
    """``py3-none-<platform>``: the library is native code, but no Python extension."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


KERNELS = Extension(f"prm_jax.native.{native.PACKAGED_LIBRARY.stem}", language="c++", optional=True,
                    sources=[str(path.relative_to(ROOT)) for path in native.SOURCES],
                    depends=[str(path.relative_to(ROOT)) for path in native.HEADERS],
                    extra_compile_args=[*COMPILE_FLAGS, "-g0"], extra_link_args=["-pthread"])
setup(
    ext_modules=[KERNELS],
    cmdclass={"build_ext": BuildNative, "bdist_wheel": PlatformWheel},
)
