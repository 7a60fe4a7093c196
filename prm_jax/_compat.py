"""Python 3.10 support for ``ExceptionGroup`` and ``BaseException.add_note`` (built in from 3.11)."""

from __future__ import annotations

import sys

__all__ = ["BaseExceptionGroup", "ExceptionGroup", "add_note", "first_in_group"]

if sys.version_info >= (3, 11):
    import builtins

    BaseExceptionGroup = builtins.BaseExceptionGroup
    ExceptionGroup = builtins.ExceptionGroup
else:  # anyio depends on the backport on 3.10
    from exceptiongroup import BaseExceptionGroup, ExceptionGroup


def add_note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:
        setattr(error, "__notes__", [*getattr(error, "__notes__", []), note])  # noqa: B010


def first_in_group(group: BaseExceptionGroup, kinds: type[BaseException] | tuple[type[BaseException], ...]
                   ) -> BaseException | None:
    """The first exception of ``kinds`` in a (nested) exception group, depth first; ``None`` when none is."""
    for error in group.exceptions:
        if isinstance(error, kinds):
            return error
        if isinstance(error, BaseExceptionGroup):
            found = first_in_group(error, kinds)
            if found is not None:
                return found
    return None
