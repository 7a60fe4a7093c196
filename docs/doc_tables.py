"""The tables the guides include (``{include} <name>.inc``), each rendered at every docs build from the code's
own declarations, never pasted: conf.py calls ``write``; tests/test_doc_tables.py holds each include to its
source. The ``.inc`` files are build outputs (ignored by git)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table: the first cell of each row as code, ``|`` escaped in the others."""
    cell = lambda text: text.replace("|", "\\|")
    return "\n".join(["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
                      *("| " + " | ".join([f"`{row[0]}`", *map(cell, row[1:])]) + " |" for row in rows)])


def errors() -> str:
    from prm_jax.errors import described

    return markdown(("error", "also a", "raised when", "on the command line"), described())


def session_format() -> str:
    from prm_jax.app.sessions import format_table

    return markdown(("key", "", "JSON type", "values", "what it is", "in the batch"), format_table())


def refusals() -> str:
    from prm_jax.config import refusals_markdown

    return refusals_markdown()


# Each include of the guides, and what renders it.
TABLES: dict[str, Callable[[], str]] = {"errors-table.inc": errors, "session-format-table.inc": session_format,
                                        "refusals-table.inc": refusals}


def write(folder: Path) -> None:
    """Each of ``TABLES`` into ``folder`` (rewritten only where its text changed)."""
    for name, render in TABLES.items():
        page, text = folder / name, render() + "\n"
        if not page.exists() or page.read_text() != text:
            page.write_text(text)
