"""Python 3.10 support for ``ExceptionGroup`` and ``BaseException.add_note`` (built in from 3.11)."""

from __future__ import annotations

import sys

__all__ = ["ExceptionGroup", "add_note"]

if sys.version_info >= (3, 11):
    import builtins

    ExceptionGroup = builtins.ExceptionGroup
else:  # anyio depends on the backport on 3.10
    from exceptiongroup import ExceptionGroup


def add_note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:
        setattr(error, "__notes__", [*getattr(error, "__notes__", []), note])  # noqa: B010
