"""The documentation a user reads, for the tests that hold it to the code: the README and the site's
Markdown pages (``docs/``, the guides), whose code blocks all run (tests/test_readme.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts))


def text() -> str:
    """Every page, in order (the README first), as one text."""
    return "\n".join(page.read_text() for page in PAGES)


def page_of(heading: str) -> Path:
    """The page that holds ``heading`` (a Markdown heading's text, with its ``#``)."""
    for page in PAGES:
        if heading in page.read_text():
            return page
    raise LookupError(f"no documentation page holds {heading!r}")


def doc_tables() -> ModuleType:
    """``docs/doc_tables.py``, the docs build's tables and the namespaces it documents (not a package)."""
    spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "docs" / "doc_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
