"""Checks of plain Python values shared by every floor: finite numbers, bounded reprs for messages."""

from __future__ import annotations

import math
import reprlib
from typing import Any


def finite_number(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None) -> float:
    """A finite Python number (not a bool) within the given bounds, as float; else ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {short_repr(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {short_repr(value)}")
    return float(value)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxset = 3, 6, 6, 6, 6
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 80, 80, 40


def short_repr(value: Any) -> str:
    """A bounded ``repr`` for error messages: user input can be arbitrarily large or deep."""
    return _SHORT.repr(value)
