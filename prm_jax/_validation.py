"""Checks of plain Python values shared by every floor: finite numbers, bounded reprs for messages, and the
one path by which every config class is built from a mapping (``from_mapping``, errors as ``ConfigError``
with the key path)."""

from __future__ import annotations

import dataclasses
import importlib
import math
import reprlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from prm_jax.errors import ConfigError

T = TypeVar("T")


# The kernels compute in float32: a setting is used there, so it must be a finite float32 and, unless it is
# 0, a normal one (XLA on the CPU flushes subnormals to 0: a temperature of 1e-39 would divide by zero).
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def finite_number(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
                  positive: bool = False) -> float:
    """A finite number (a Python or numpy scalar; not a bool) within the given bounds (``positive``: > 0), as
    float; else ``ValueError`` naming it.

    Every setting is finite in float32 (``|value| <= 3.4e38``) and is 0 or at least float32's smallest
    normal number (``1.2e-38``) in magnitude: the kernels read it in float32.
    """
    if not is_number(value) or not _isfinite(value):
        raise ConfigError(name, f"must be a finite number, got {short_repr(value)}")
    value = int(value) if isinstance(value, np.integer) else float(value) if isinstance(value, np.floating) else value
    if abs(value) > FLOAT32_MAX:
        raise ConfigError(name, f"must be finite in float32 (|value| <= {FLOAT32_MAX:.4g}), got {short_repr(value)}")
    if value != 0 and abs(value) < FLOAT32_TINY:
        raise ConfigError(name, f"must be 0 or at least {FLOAT32_TINY:.4g} in magnitude (a float32 subnormal is "
                                f"flushed to 0 where the kernels read it), got {short_repr(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ConfigError(name, f"must be {bound}, got {short_repr(value)}")
    if positive and value <= 0:
        raise ConfigError(name, f"must be > 0, got {short_repr(value)}")
    return float(value)


def is_number(value: Any) -> bool:
    """A real number: a Python ``int`` or ``float`` or a numpy integer or floating scalar, never a bool
    (Python's or numpy's: YAML's ``true`` is no number)."""
    return (isinstance(value, (int, float, np.integer, np.floating))
            and not isinstance(value, (bool, np.bool_)))


def _isfinite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond a float's range
        return False


# Weighted process rewards live in float32 and are squared in statistics (normalization, summaries): a scorer
# weight beyond this turns ordinary scores into infinities (1e38 did). Scores themselves are checked finite.
MAX_SCORER_WEIGHT = 1e6


def scorer_weight(name: str, value: Any) -> float:
    """A scorer's ``weight``: finite and within ``±MAX_SCORER_WEIGHT``."""
    return finite_number(name, value, minimum=-MAX_SCORER_WEIGHT, maximum=MAX_SCORER_WEIGHT)


def integer(name: str, value: Any, *, minimum: int | None = None) -> int:
    """An integer (a Python or numpy one; not a bool: YAML's ``true`` is no count) of at least ``minimum``, as
    ``int``; else a ``ConfigError`` naming it."""
    if (not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_))
            or (minimum is not None and value < minimum)):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise ConfigError(name, f"must be an integer{bound}, got {short_repr(value)}")
    return int(value)


def boolean(name: str, value: Any, *, config: bool = True) -> bool:
    """``value`` when it is a bool (YAML's ``true``/``false``, not ``1`` or ``"yes"``); else a ``ConfigError``
    for the key ``name`` (``config``) or a ``ValueError`` naming it."""
    if isinstance(value, bool):
        return value
    raise _problem(name, f"must be a bool, got {short_repr(value)}", config)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxset = 3, 6, 6, 6, 6
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 80, 80, 40


def deadline(name: str, value: Any) -> float | None:
    """A scorer call's deadline in seconds: ``None`` (none) or a finite number > 0."""
    if value is None:
        return None
    seconds = finite_number(name, value)
    if seconds <= 0:
        raise ConfigError(name, f"must be > 0 seconds (or null for no deadline), got {short_repr(seconds)}")
    return seconds


def integer_dtype(name: str, dtype: Any) -> None:
    """The one check that an array (numpy or JAX, host or traced) holds integers: ``TypeError`` naming it."""
    if not np.issubdtype(dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {dtype}")


def one_of(name: str, value: Any, choices: tuple[Any, ...], *, config: bool = False) -> Any:
    """``value`` when it is one of ``choices`` (a setting's values, usually ``typing.get_args`` of its
    ``Literal``); else a ``ConfigError`` for the key ``name`` (``config``) or a ``ValueError`` naming it."""
    if isinstance(value, (str, type(None))) and value in choices:
        return value
    raise _problem(name, f"must be one of {choices}, got {short_repr(value)}", config)


def _problem(name: str, problem: str, config: bool) -> ValueError:
    """A setting's error: a ``ConfigError`` for the key ``name`` (``config``), else a ``ValueError`` naming it."""
    return ConfigError(name, problem) if config else ValueError(f"{name} {problem}")


def imported_callable(name: str, path: str) -> Callable[..., Any]:
    """The callable a dotted path ``package.module.attr`` names (a config's function: a lambda schedule, a
    model factory); ``ValueError`` naming ``name`` and the path otherwise."""
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{name} {path!r} must be a dotted path 'module.function'")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{name} {path!r} cannot be imported: {err}") from None
    if not callable(fn):
        raise ValueError(f"{name} {path!r} names {type(fn).__name__}, not a function")
    return fn


def cut_at_word(text: str, limit: int) -> str:
    """``text`` with its whitespace runs made single spaces, cut to at most ``limit`` characters at a word's end
    (`` ...`` marks the cut): a message never ends mid-word."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    space = text.rfind(" ", 0, max(0, limit - 4) + 1)  # (the last word's end that leaves room for " ...")
    head = text[:space] if space > 0 else text[:max(0, limit - 4)]
    return head.rstrip(" ,;:") + " ..."


def body_text(body: bytes | bytearray, limit: int = 200) -> str:
    """A server's answer body for a message: decoded (UTF-8, bad bytes replaced), cut at a word."""
    return cut_at_word(bytes(body).decode("utf-8", errors="replace"), limit)


def short_repr(value: Any) -> str:
    """A bounded ``repr`` for error messages: user input can be arbitrarily large or deep."""
    return _SHORT.repr(value)


def from_mapping(cls: type[T], data: Any, where: str = "", **convert: Callable[[Any, str], Any]) -> T:
    """``cls`` (a dataclass that validates itself in ``__post_init__``) from a mapping of its fields.

    Unknown keys are errors; ``convert[key](value, path)`` builds a nested value; every error is a
    ``ConfigError`` whose key path starts at ``where``. An instance of ``cls`` is returned unchanged.
    """
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(where or cls.__name__, f"must be a mapping, got {type(data).__name__}")
    allowed = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(map(str, set(data) - allowed))
    if unknown:
        raise ConfigError(where or cls.__name__, f"has unknown keys {short_repr(unknown)} (allowed: {sorted(allowed)})")
    values = {key: convert[key](value, f"{where}.{key}" if where else key) if key in convert else value
              for key, value in data.items()}
    try:
        return cls(**values)
    except ConfigError as err:
        raise err.under(where) from None
