"""Lazy namespaces: a package's public names are imported when first used, not when the package is, so a
scorer's worker (a process, a Ray actor) that imports ``prm_jax.runtime`` for ``SyncScorer`` never loads jax
unless the scorer does.

A package declares its names once, as ordinary imports inside ``if TYPE_CHECKING:`` (what type checkers and
editors read), and calls ``attach(__name__, __file__)``, which reads those imports from the package's source
and returns the module's ``__getattr__`` and ``__dir__`` (PEP 562). (The scientific Python ``lazy_loader``
does the same from a stub file; twenty lines of ours keep the run-time dependencies at six.)
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from typing import Any


def declared_imports(path: str) -> dict[str, tuple[str, str]]:
    """Each name imported inside the ``if TYPE_CHECKING:`` blocks of the file at ``path``: its module and
    its name there."""
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read(), path)
    where: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
                    for alias in statement.names:
                        where[alias.asname or alias.name] = (statement.module, alias.name)
    return where


def attach(package: str, path: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package ``package`` whose ``__init__`` is at ``path``."""
    where = declared_imports(path)

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = where[name]
        if module == package:  # a subpackage (``from prm_jax import config``)
            value: Any = importlib.import_module(f"{package}.{attribute}")
        else:
            value = getattr(importlib.import_module(module), attribute)
        setattr(importlib.import_module(package), name, value)  # once: later lookups are plain attributes
        return value

    def __dir__() -> list[str]:
        return sorted(set(where) | set(vars(importlib.import_module(package))))

    return __getattr__, __dir__
