"""Sphinx configuration of prm-jax's documentation site (``python3 dev.py docs``).

The guides are Markdown (MyST); the API reference is generated from the docstrings (autodoc, autosummary,
napoleon for the Google-style ``Args:`` sections): one page per public name of each namespace, the names
read from each namespace's ``__all__`` (the one declaration of the public surface). The build runs with
``-W``: any warning fails it, a broken internal link included (MyST's missing cross-references), and so
does a public name without a docstring of its own (``check_coverage``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import shutil
from pathlib import Path

import jupyter_server_mathjax

import prm_jax

HERE = Path(__file__).resolve().parent
NAMESPACES = ("config", "kernels", "kernels.gae_lambda", "runtime", "credit", "estimators", "losses", "filters",
              "scorers")  # as tests/test_public_api

project = "prm-jax"
release = version = prm_jax.__version__
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon",
              "sphinx.ext.mathjax", "sphinx.ext.doctest"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3
autosummary_generate = True
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
# Signatures without annotations: the docstrings give each argument's shape and dtype in words, and Sphinx
# spells ``ArrayLike`` out a dozen types long (or as a TypeAliasForwardRef in a union).
autodoc_typehints = "none"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "alabaster"
html_title = f"prm-jax {release}"
html_theme_options = {"description": "Process rewards to shaped PPO/GRPO advantages, in JAX"}
doctest_global_setup = "import numpy as np\nimport prm_jax"
# MathJax from the docs extra (jupyter-server-mathjax ships MathJax 2), copied into _static: the maths render
# without a network (and the browser check runs offline).
html_static_path = [str(Path(jupyter_server_mathjax.__file__).parent / "static")]
mathjax_path = "MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"  # (the config the package ships)
# It ships the STIX-Web fonts only (no TeX fonts, no image fonts): HTML-CSS output with those.
# MyST marks the text tex2jax_ignore and the maths "math" (MathJax 3's option); MathJax 2's is tex2jax's.
# Its font-loading test declares a blank font at url('about:blank'), which Chromium refuses with a console
# error (a CORS error for every page); local() names a font that never exists: the same blank, no request.
mathjax2_config = {"HTML-CSS": {"availableFonts": ["STIX-Web"], "preferredFont": "STIX-Web", "webFont": "STIX-Web",
                                "imageFont": None,
                                "styles": {"@font-face": {"font-family": "MathJax_Blank",
                                                          "src": "local('MathJax_Blank')"}}},
                   "tex2jax": {"processClass": "tex2jax_process|mathjax_process|math|output_area",
                               "ignoreClass": "tex2jax_ignore|mathjax_ignore"}}


def public_names() -> dict[str, list[str]]:
    return {ns: list(importlib.import_module(f"prm_jax.{ns}").__all__) for ns in NAMESPACES}


def write_api_pages() -> None:
    """``api/<namespace>.rst``: an autosummary of the namespace's ``__all__`` (generated, not kept by hand);
    the pages autosummary wrote for names that are gone are removed first."""
    shutil.rmtree(HERE / "api" / "_generated", ignore_errors=True)
    for ns, names in public_names().items():
        module = importlib.import_module(f"prm_jax.{ns}")
        summary = (inspect.getdoc(module) or "").split("\n\n")[0]
        lines = [f"prm_jax.{ns}", "=" * len(f"prm_jax.{ns}"), "", summary, "", f".. currentmodule:: prm_jax.{ns}", "",
                 ".. autosummary::", "   :toctree: _generated", "", *(f"   {name}" for name in names), ""]
        page = HERE / "api" / f"{ns}.rst"
        text = "\n".join(lines)
        if not page.exists() or page.read_text() != text:
            page.write_text(text)


def alias_comments() -> set[str]:
    """Names given a ``#:`` documentation comment anywhere in the package (type aliases such as
    ``ErrorPolicy``: a ``Literal`` has no docstring of its own)."""
    from sphinx.pycode import ModuleAnalyzer

    names = set()
    for info in pkgutil.walk_packages(prm_jax.__path__, "prm_jax."):
        try:
            docs = ModuleAnalyzer.for_module(info.name).find_attr_docs()
        except Exception:  # (a module without source)
            continue
        names |= {attr for (scope, attr), lines in docs.items() if not scope and "".join(lines).strip()}
    return names


def undocumented() -> list[str]:
    """Public names whose object has no docstring of its own (an inherited one does not count)."""
    commented = alias_comments()
    missing = []
    for ns, names in public_names().items():
        module = importlib.import_module(f"prm_jax.{ns}")
        for name in names:
            value = getattr(module, name)
            if inspect.isclass(value):
                own = value.__dict__.get("__doc__")
            elif inspect.isroutine(value) or isinstance(value, functools.partial) or hasattr(value, "__wrapped__"):
                own = getattr(value, "__doc__", None)
            else:  # data and type aliases: their #: comment
                own = name if name in commented else None
            if not (own or "").strip():
                missing.append(f"prm_jax.{ns}.{name}")
    return missing


def check_coverage(app) -> None:
    missing = undocumented()
    if missing:
        from sphinx.errors import ExtensionError

        raise ExtensionError(f"public names without a docstring of their own: {missing}")


write_api_pages()


def setup(app) -> None:
    app.connect("builder-inited", check_coverage)
