"""Trace-time argument checks and the value checks that cannot raise inside ``jit``.

Shape, rank and dtype problems are caught while tracing, with messages that name the argument.
Value problems (ranges, uniformity, group sizes) are computed on device as violation counts; the public
entry points turn them into a ``ValueError`` on the host when called eagerly. Under an outer
``jit``/``vmap``, ``compute_advantages`` (the trainer's call) pays no host round trip: it returns the counts
as data (``output.diagnostics["checks/<name>"]``), and a raising host callback is opt-in
(``AdvantageConfig(check_values="callback")``). The single kernels (``gae``, ``normalize``, ...) have no
output to carry counts in, so under a trace their outputs come back tied to a host callback that raises
when the computation runs (``raise_when_run``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

from prm_jax._validation import integer_dtype
from prm_jax.kernels._platform import exporting


def accumulation_dtype(*arrays: Any) -> jnp.dtype:
    """float32, or float64 when an input already is: bf16/f16 inputs never accumulate in low precision."""
    for x in arrays:
        if x is not None and jnp.asarray(x).dtype == jnp.float64:
            return jnp.dtype(jnp.float64)
    return jnp.dtype(jnp.float32)


def check_real_dtype(name: str, x: jax.Array) -> None:
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)
            or x.dtype == jnp.bool_):
        raise TypeError(f"{name} must be a real numeric array, got dtype {x.dtype}")


def as_float(name: str, x: Any, dtype: jnp.dtype) -> jax.Array:
    x = jnp.asarray(x)
    check_real_dtype(name, x)
    return x.astype(dtype)


def check_dtype_class(name: str, x: Any, dtype_class: str) -> None:
    """The rule of a batch key's dtype class (``prm_jax.kernels._schema``): ``float`` any real numbers,
    ``int`` integers, ``mask`` bool, integer or float (0/1 checked with the values)."""
    x = jnp.asarray(x) if not hasattr(x, "dtype") else x
    if dtype_class == "float":
        check_real_dtype(name, x)
    elif dtype_class == "int":
        integer_dtype(name, x.dtype)
    else:
        check_mask_dtype(name, x)


def check_mask_dtype(name: str, x: jax.Array) -> None:
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"{name} must be a bool, integer or float mask, got dtype {x.dtype}")


def as_mask(name: str, x: Any) -> jax.Array:
    """Any numeric mask becomes bool: nonzero is active."""
    x = jnp.asarray(x)
    check_mask_dtype(name, x)
    return x if x.dtype == jnp.bool_ else x != 0


def as_integer(name: str, x: Any) -> jax.Array:
    """An integer array kept at its own width (ids compared whole, e.g. 64-bit hashes)."""
    x = jnp.asarray(x)
    integer_dtype(name, x.dtype)
    return x


def as_int(name: str, x: Any) -> jax.Array:
    """An integer array as int32 (turn ids, group ids: values that fit)."""
    return as_integer(name, x).astype(jnp.int32)


def check_rank(name: str, x: Any, ndim: int) -> None:
    shape = np.shape(x)
    if len(shape) != ndim:
        raise ValueError(f"{name} must have rank {ndim}, got shape {tuple(shape)}")


def check_shape(name: str, x: Any, shape: tuple[int, ...], like: str) -> None:
    if tuple(np.shape(x)) != tuple(shape):
        raise ValueError(f"{name} must have the shape of {like} {tuple(shape)}, got {tuple(np.shape(x))}")


def is_traced(*xs: Any) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(xs))


def concrete_scalar(x: Any) -> float | None:
    """The Python value of a scalar known before tracing, else None."""
    if is_traced(x):
        return None
    arr = np.asarray(x)
    return float(arr) if arr.ndim == 0 else None


def first_true(flags: jax.Array, axis: int | None = None) -> jax.Array:
    """int32 index of the first True of ``flags`` (along ``axis``; flat when None), 0 where there is none:
    ``jnp.argmax``'s, except that an empty axis (a batch of no rows or no timesteps) gives 0 instead of an
    error. Every check's "where" is taken by it."""
    if flags.size == 0 if axis is None else flags.shape[axis] == 0:
        return jnp.zeros(() if axis is None else flags.shape[:axis] + flags.shape[axis + 1:], jnp.int32)
    return jnp.argmax(flags, axis=axis).astype(jnp.int32)


def first_flagged(flags: jax.Array, *arrays: jax.Array) -> tuple[jax.Array, ...]:
    """``(row, step, *values)`` of the first flagged entry of ``[B, T]`` ``flags`` (row-major), for messages.

    Built from row-local reductions and masked sums, never a gather across rows, so a batch-sharded
    program reports a failed check without collecting ``[B, T]`` (or ``[B]``) data on one device.
    """
    rows = lax.broadcasted_iota(jnp.int32, flags.shape[:1], 0)
    if flags.size == 0:  # (no entry: nothing flagged, and nothing to take values from)
        return (jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), *(jnp.zeros((), a.dtype) for a in arrays))
    step_in_row = first_true(flags, axis=1)
    row = first_true(jnp.any(flags, axis=1))
    pick = rows == row

    def select(per_row: jax.Array) -> jax.Array:
        return jnp.sum(jnp.where(pick, per_row, jnp.zeros((), per_row.dtype)))

    values = [select(jnp.take_along_axis(a, step_in_row[:, None], axis=1)[:, 0]) for a in arrays]
    return (row, select(step_in_row), *values)


def check_key(name: str) -> str:
    """A diagnostics key from an argument name: ``batch['loss_mask']`` -> ``loss_mask``."""
    return re.sub(r"[^0-9A-Za-z_]+", "_", name.replace("batch['", "").replace("']", "")).strip("_")


@jax.tree_util.register_pytree_node_class
class ValueCheck:
    """A device-computed violation count plus the host-side message built from its details.

    A pytree (the name and the message are static), so jitted functions can return their checks to the
    caller. ``count`` is the number of violating entries (for a check of a whole array, 0 or 1).

    Args:
        name: The check's name (its count is reported as ``checks/<name>``).
        count: The number of violating entries, a device scalar (0 or 1 for a check of a whole array).
        message: ``message(*details) -> str``: the error message, built on the host from the details.
        details: Device values the message is built from (the first bad row, its value, ...).

    Example:
        >>> check = prm_jax.estimators.ValueCheck("negative_reward", prm_jax.estimators.violations(np.array([False, True])),
        ...                                       lambda: "a reward below 0")
        ...
        >>> int(check.count), check.message()
        (1, 'a reward below 0')
    """

    def __init__(self, name: str, count: jax.Array, message: Callable[..., str], *details: jax.Array):
        self.name = name
        self.count = count
        self.message = message
        self.details = details

    def tree_flatten(self):
        return (self.count, *self.details), (self.name, self.message)

    @classmethod
    def tree_unflatten(cls, aux: Any, children: Any) -> ValueCheck:
        """JAX's pytree protocol: the check from ``tree_flatten``'s parts.

        Args:
            aux: The static parts: the name and the message.
            children: The device parts: the count, then the details.
        """
        return cls(aux[0], children[0], aux[1], *children[1:])


def violations(flags: jax.Array) -> jax.Array:
    """The number of True entries, int32: a check's count.

    Args:
        flags: The violation flags, bool, any shape.

    Example:
        >>> int(prm_jax.estimators.violations(np.array([[True, False], [True, True]])))
        3
    """
    return jnp.sum(flags, dtype=jnp.int32)


# Whether the program being traced computes its failed checks' details (``located``); read at trace time.
_LOCATING: contextvars.ContextVar[bool] = contextvars.ContextVar("prm_jax_locating", default=True)


@contextlib.contextmanager
def locating(on: bool) -> Iterator[None]:
    """Within: ``located`` computes a failed check's details (``on``), or leaves them out of the program
    (zeros): counts only. The caller that leaves them out traces again with them when a count is nonzero
    (``compute_advantages``): each check's search is a conditional branch of its own, and together they
    were a fifth of the pipeline's trace-and-compile time on the CPU, paid by every program for an error
    path."""
    token = _LOCATING.set(on)
    try:
        yield
    finally:
        _LOCATING.reset(token)


def located(count: jax.Array, locate: Callable[[], tuple[jax.Array, ...]]) -> tuple[jax.Array, ...]:
    """A failed check's details (``locate()``: where, what) computed only when ``count`` is nonzero.

    A check that passes then costs its count alone; the search for the first bad entry runs on failure
    (under ``vmap`` both branches run: the details are still right). Under ``locating(False)`` the details
    are zeros, and the program holds no search at all.
    """
    zeros = lambda: tuple(jnp.zeros(s.shape, s.dtype) for s in jax.eval_shape(locate))
    if not _LOCATING.get():
        return zeros()
    return lax.cond(count > 0, locate, zeros)


def mask_check(name: str, x: Any, *, counts: jax.Array | None = None) -> list[ValueCheck]:
    """Masks are bool, or numbers that are exactly 0 or 1 (one rule for every mask); [] for bool masks.
    ``counts``: ``[B]`` the bad entries of each row of a ``[B, T]`` mask, summed already with other masks'
    in one pass (``bad_entries``).

    The native GAE kernel applies the same rule, with the same message, to the float32 masks it reads
    (``prm_jax/native/gae_cpu.cc``); a test holds the two to each other.
    """
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_:
        return []
    bad = not_binary(x)
    flags = bad.reshape(bad.shape[0], -1) if bad.ndim else bad.reshape(1, 1)
    count = violations(flags) if counts is None else jnp.sum(counts)
    row, step, value = located(count, lambda: first_flagged(flags, x.reshape(flags.shape).astype(jnp.float32)))
    where = (lambda row, step: f"row {int(row)}, position {int(step)}") if x.ndim > 1 else (
        lambda row, step: f"entry {int(row)}")
    return [ValueCheck(f"{check_key(name)}_not_binary", count,
                       lambda row, step, value: f"{name} must be bool or hold only 0 and 1; "
                       f"{where(row, step)} holds {float(value):.9g}", row, step, value)]


def not_binary(x: jax.Array) -> jax.Array:
    """The mask rule's violations: entries neither 0 nor 1 (NaN included)."""
    return (x != 0) & (x != 1)


def bad_entries(masks: Sequence[jax.Array]) -> list[jax.Array]:
    """For each ``[B, T]`` numeric mask of ``masks``: ``[B]`` int32, the entries of each row that are neither 0
    nor 1, all summed in one variadic reduction that XLA fuses with the comparisons (one read of each mask;
    a lone sum over a whole array is rewritten on the CPU into a tree of windows whose input, the flags as
    int32, is written out and read again: 8 bytes an element more a mask)."""
    if not masks:
        return []
    flags = tuple(not_binary(m).astype(jnp.int32) for m in masks)
    return list(lax.reduce(flags, tuple(np.int32(0) for _ in flags), _sums, (1,)))


def _sums(left: tuple[Any, ...], right: tuple[Any, ...]) -> tuple[Any, ...]:
    """A variadic reduction's sum, one function for all (JAX's caches are keyed by the reducer)."""
    return tuple(lax.add(x, y) for x, y in zip(left, right))


ProbeKind = Literal["finite", "bounds"]


class Probe(NamedTuple):
    """One ``[B, K]`` input's row probe in ``probed_rows``, on its entries where ``used`` (``[B, K]`` bool):
    ``finite`` (a used entry is NaN or infinite) or ``bounds`` (a used entry lies outside ``bounds``, a schema
    ``Bounds`` holding 0; NaN is the finite probe's)."""

    x: jax.Array
    used: jax.Array
    kind: ProbeKind = "finite"
    bounds: Any = None


def probed_rows(probes: Sequence[Probe]) -> list[jax.Array]:
    """For each of ``probes``: ``[B]`` bool, True on the rows it flags.

    One variadic reduction along the rows per dtype (XLA reduces one precision at a time) reads every input
    and mask once, in place, each probe taken in the reducer itself, so no flags or masked copy of any
    input is written (XLA's CPU backend wrote one per input and read it again: 13 bytes an element for a
    finite check, 6 for a range check, against 4 plus the shared mask's 1 here). A probe is its own fixed
    point on the reduction's partial results (whose masks are True): ``finite`` ``where(used, x * 0, 0)``
    summed (NaN exactly when a used entry is not finite, ``inf * 0`` being NaN; never an overflow);
    ``bounds`` ``where(used and outside, a value outside the bounds, 0)`` (0 lies inside every declared
    range), the first nonzero kept. A mask shared by several probes (by identity) is read once."""
    out: list[jax.Array | None] = [None] * len(probes)
    for dtype in dict.fromkeys(jnp.dtype(p.x.dtype) for p in probes):
        picked = [i for i, p in enumerate(probes) if jnp.dtype(p.x.dtype) == dtype]
        for i, rows in zip(picked, _probed_rows([probes[i] for i in picked], dtype)):
            out[i] = rows
    return [rows for rows in out if rows is not None]


def nonfinite_rows(entries: Sequence[tuple[jax.Array, jax.Array]]) -> list[jax.Array]:
    """``probed_rows`` of ``finite`` probes: for each ``(x, used)`` of ``entries`` (``[B, K]`` floats and their
    ``[B, K]`` bool masks), ``[B]`` bool, True on the rows where a used entry of ``x`` is NaN or infinite."""
    return probed_rows([Probe(x, used) for x, used in entries])


def _probed_rows(probes: Sequence[Probe], dtype: Any) -> list[jax.Array]:
    """``probed_rows`` of probes of one dtype, in one variadic reduction."""
    masks: list[jax.Array] = []
    slots = []
    for probe in probes:
        index = next((k for k, m in enumerate(masks) if m is probe.used), None)
        if index is None:
            masks.append(probe.used)
            index = len(masks) - 1
        slots.append(index)
    zero = np.zeros((), dtype)
    ranges = tuple(None if p.kind == "finite" else p.bounds for p in probes)  # (Bounds: frozen, hashable)
    combine = _probe_combiner(tuple(slots), len(masks), ranges, jnp.dtype(dtype).name)
    inits = (*(np.bool_(True) for _ in masks), *(zero for _ in probes))
    # (a count has no gradient; JAX's derivative of a general reduction cannot take the bool masks either)
    results = lax.reduce((*masks, *(lax.stop_gradient(p.x) for p in probes)), inits, combine, (1,))[len(masks):]
    return [jnp.isnan(r) if p.kind == "finite" else r != 0 for p, r in zip(probes, results)]


@functools.cache
def _probe_combiner(slots: tuple[int, ...], count: int, ranges: tuple[Any, ...],
                    dtype_name: str) -> Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, ...]]:
    """The reducer of ``_probed_rows`` for one layout of probes: the same function for the same layout, so
    JAX's caches (keyed by the reducer) compile a layout's reduction once, also op by op outside ``jit``
    (a fresh closure a call recompiled it at every eager call)."""
    dtype = np.dtype(dtype_name)
    zero = np.zeros((), dtype)

    def flagged(value: Any, i: int) -> Any:
        bounds = ranges[i]
        if bounds is None:  # finite: x * 0 is NaN exactly where x is not finite
            return lax.mul(value, zero)
        # (a value outside the bounds marks the row; 0 lies inside every declared range)
        beyond = np.full((), bounds.high + 1 if np.isfinite(bounds.high) else bounds.low - 1, dtype)
        return lax.select(bounds.outside(value), beyond, zero)

    def combine(left: tuple[Any, ...], right: tuple[Any, ...]) -> tuple[Any, ...]:
        def probe(side: tuple[Any, ...], i: int) -> Any:
            return lax.select(side[slots[i]], flagged(side[count + i], i), zero)

        merged = []
        for i in range(len(slots)):
            a, b = probe(left, i), probe(right, i)
            merged.append(lax.add(a, b) if ranges[i] is None else lax.select(lax.ne(a, zero), a, b))
        return (*(np.bool_(True) for _ in range(count)), *merged)  # (a merged probe is used: probe(probe) = probe)

    return combine


def finite_check(name: str, x: jax.Array, where: jax.Array | None = None, *, key: str | None = None,
                 axis: str = "timestep", hint: str = "", bad_rows: jax.Array | None = None) -> ValueCheck:
    """``x`` is finite (where ``where`` is True, when given). ``[B]`` arrays: the count is the number of bad
    entries, and the message names the first. ``[B, K]`` arrays: the count is the number of rows holding a
    bad entry, and the message names the first such row and the index along ``axis``. ``key`` names the
    check (default: from ``name``).

    A row is probed in one pass (``nonfinite_rows``); the bad entry is then looked for in that one row only,
    so a check that passes costs a single read of ``x``. ``bad_rows`` (``[B]`` bool): that probe, computed
    already (``nonfinite_rows`` over several inputs at once).
    """
    scope = "" if where is None else " where it is used"
    if x.ndim < 2:
        bad = ~jnp.isfinite(x) if where is None else ~jnp.isfinite(x) & where
        flags = bad.reshape(bad.shape[0], 1) if bad.ndim else bad.reshape(1, 1)
        row, _, value = first_flagged(flags, x.reshape(flags.shape))
        return ValueCheck(f"{key or check_key(name)}_not_finite", violations(bad),
                          lambda row, value: f"{name} must be finite{scope}; entry {int(row)} is {float(value)!r}{hint}",
                          row, value)
    zero = jnp.zeros((), x.dtype)
    if x.size == 0:  # (no entry to be bad)
        return ValueCheck(f"{key or check_key(name)}_not_finite", jnp.zeros((), jnp.int32),
                          lambda row, step, value: "", jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), zero)
    used = jnp.ones(x.shape, jnp.bool_) if where is None else where
    if bad_rows is None:
        (bad_rows,) = nonfinite_rows([(x, used.astype(jnp.bool_))])
    row = first_true(bad_rows)
    in_row = lax.dynamic_index_in_dim(x, row, axis=0, keepdims=False)
    bad = ~jnp.isfinite(in_row) & lax.dynamic_index_in_dim(used, row, axis=0, keepdims=False)
    step = first_true(bad)
    return ValueCheck(f"{key or check_key(name)}_not_finite", violations(bad_rows),
                      lambda row, step, value: f"{name} must be finite{scope}; row {int(row)}, {axis} {int(step)} "
                                               f"is {float(value)!r}{hint}", row, step, in_row[step])


def bounds_check(name: str, x: jax.Array, where: jax.Array, bounds: Any, *, key: str | None = None,
                 bad_rows: jax.Array | None = None) -> ValueCheck:
    """``[B, T]`` ``x`` lies within ``bounds`` (a schema ``Bounds``) where ``where`` is True (NaN is the finite
    check's to report). The count is the number of rows holding a value outside; the message names the first
    such row, its timestep and the value. ``key`` names the check (default: from ``name``). ``bad_rows``:
    ``probed_rows``' ``bounds`` probe, computed already with other probes in one pass."""
    bad = lambda: where & bounds.outside(x)
    if bad_rows is None:
        bad_rows = jnp.any(bad(), axis=1)
    row, step, value = located(violations(bad_rows), lambda: first_flagged(bad(), x))
    return ValueCheck(f"{key or check_key(name)}_out_of_range", violations(bad_rows),
                      lambda row, step, value: f"{name} must be {bounds.text}; row {int(row)}, timestep {int(step)} "
                                               f"is {float(value)!r}", row, step, value)


def finite_floats(arrays: Mapping[str, Any], where: jax.Array, dtype: Any) -> tuple[dict[str, jax.Array],
                                                                                list[ValueCheck]]:
    """Each of ``arrays`` (by its argument name) as a float array of ``dtype``, 0 where ``where`` is False, and a
    ``finite_check`` of each where ``where`` is True: a kernel's float inputs, read at its trained tokens."""
    zero = jnp.zeros((), dtype)
    floats = {name: jnp.where(where, as_float(name, x, dtype), zero) for name, x in arrays.items()}
    return floats, [finite_check(name, x, where) for name, x in floats.items()]


def raise_value_checks(checks: list[ValueCheck], out: Any = None, *, callback: bool = False) -> Any:
    """Raise ValueError for the first failed check of an eager call; return ``out``.

    Under a trace nothing is raised and no host round trip is paid, unless ``callback``: then ``out`` comes
    back tied to the checks (``raise_when_run``), so the first failed check raises when the computation runs,
    at the latest when ``out`` is read or waited for.
    """
    traced = [check for check in checks if is_traced(check.count, *check.details)]
    for check in checks:
        if check not in traced and bool(check.count):
            raise ValueError(check.message(*(np.asarray(d) for d in check.details)))
    return raise_when_run(out, traced) if callback and traced else out


def raise_when_run(out: Any, checks: list[ValueCheck]) -> Any:
    """``out``, its values unchanged, tied to a host callback that raises the first failed of ``checks``.

    equinox's ``error_if`` is the model, and why this form and not ``jax.debug.callback``: a debug callback
    is a side effect nothing reads, and whether its error fails the computation is the backend's choice (on
    an H200 the callback tests failed, issue 56.1). Here the callback is a ``jax.pure_callback`` whose answer
    (always "keep") every array of ``out`` depends on (its first entry is selected by it, an in-place update
    of one entry), so no backend can hand any of them over without having run it, and its failure fails the
    computation that makes them. It runs under ``lax.cond`` only when a count is nonzero: one device-to-host
    read of a scalar per call, the counts (one int32 vector, ``[len(checks)]``) and details only on failure. Under ``vmap`` the
    cond runs both branches, so the callback raises only for a batch member whose count is nonzero. The
    details are ``stop_gradient``-ed: a callback has no derivative, and a check has none to give.

    A program traced within ``lowering_platform`` is for ``jax.export``, which cannot serialize a host
    callback: there a failed check sets those first entries to NaN (an integer output: its dtype's minimum;
    bool: False) instead of raising, so the exported program still fails loudly, on any platform."""
    counts = jnp.stack([check.count for check in checks])
    details = [tuple(lax.stop_gradient(d) for d in check.details) for check in checks]
    messages = [check.message for check in checks]

    def on_host(counts: Any, details: Any) -> np.ndarray:
        for message, count, detail in zip(messages, np.asarray(counts), details):
            _raise_on_host(message, count, *detail)
        return np.zeros((), np.int32)

    def fire() -> jax.Array:
        return jax.pure_callback(on_host, jax.ShapeDtypeStruct((), jnp.int32), counts, details,
                                 vmap_method="sequential")

    if exporting():
        keep = ~jnp.any(counts > 0)
    else:
        keep = lax.cond(jnp.any(counts > 0), fire, lambda: jnp.zeros((), jnp.int32)) == 0
    leaves, tree = jax.tree_util.tree_flatten(out)
    tied = [isinstance(leaf, jax.Array) and leaf.size > 0 for leaf in leaves]
    for i, leaf in enumerate(leaves):
        if tied[i]:  # (every output, so that reading any one runs the check: an in-place one-entry update)
            first = (0,) * leaf.ndim
            leaves[i] = leaf.at[first].set(jnp.where(keep, leaf[first], _poison(leaf.dtype)))
    if not any(tied) and not exporting():  # (nothing to tie to: an effect then, which nothing removes)
        io_callback(on_host, jax.ShapeDtypeStruct((), jnp.int32), counts, details)
    return jax.tree_util.tree_unflatten(tree, leaves)


def _poison(dtype: Any) -> jax.Array:
    """The value a failed check leaves in an exported program's output: NaN, an integer's minimum, False."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.full((), jnp.nan, dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.full((), jnp.iinfo(dtype).min, dtype)
    return jnp.zeros((), dtype)


OnTrace = Literal["callback", "counts"]


def checked(jitted: Callable[..., tuple[Any, list[ValueCheck]]], *args: Any, on_trace: OnTrace = "callback",
            **kwargs: Any) -> Any:
    """The one form of a kernel's runtime checks (equinox's ``error_if`` is the model: one primitive, one
    mode switch): ``jitted(*args, **kwargs)`` returns ``(out, checks)``; the first failed check is raised as
    a ``ValueError`` when called eagerly, and under a trace either when the computation runs (``on_trace=
    "callback"``: the single kernels, which have no output to carry counts in; ``out`` comes back tied to a
    raising host callback, ``raise_when_run``) or not at all (``"counts"``: the losses, whose statistics
    carry ``check_counts``); returns ``out``."""
    out, checks = jitted(*args, **kwargs)
    return raise_value_checks(checks, out, callback=on_trace == "callback")


def counted(loss: jax.Array, stats: Any, checks: list[ValueCheck]) -> tuple[tuple[jax.Array, Any], list[ValueCheck]]:
    """A loss kernel's result as ``checked`` takes it: ``((loss, stats with the checks' counts), checks)``."""
    return (loss, stats._replace(checks=check_counts(checks))), checks


def check_counts(checks: list[ValueCheck]) -> dict[str, jax.Array]:
    """``{"checks/<name>": violation count}``; checks of the same name add up."""
    counts: dict[str, jax.Array] = {}
    for check in checks:
        key = f"checks/{check.name}"
        counts[key] = counts[key] + check.count if key in counts else check.count
    return counts


# The checks a process has warned about (``Diagnostics``): each once per run.
_WARNED: set[str] = set()


class Diagnostics(dict):
    """``compute_advantages``' ``output.diagnostics``: a dict of scalars (a pytree as a dict is) that, the
    first time it is read on the host (``d[key]``, ``get``, ``items``, ``values``), warns once per process for
    each check with a nonzero count (``checks/<name>``): under ``jit`` an input mistake is counted, not
    raised, and a train step that logs no diagnostics would otherwise train on it unwarned. Reading a value
    already syncs it: the counts come along in the same transfer."""

    def _read(self) -> None:
        if self.__dict__.get("read"):
            return
        self.__dict__["read"] = True
        counts = {k: v for k, v in dict.items(self) if k.startswith("checks/") and k not in _WARNED}
        if not counts or is_traced(*counts.values()):
            return
        failed = {key: int(np.asarray(count)) for key, count in jax.device_get(counts).items() if int(np.asarray(count))}
        if failed:
            _WARNED.update(failed)
            said = ", ".join(f"{key} = {count}" for key, count in sorted(failed.items()))
            warnings.warn(f"{said} in compute_advantages' diagnostics: under jit an input mistake is counted there, "
                          "not raised, and these advantages were computed from it. Call compute_advantages on the "
                          "same batch outside jit to see the error (which row, which timestep), or pass "
                          "AdvantageConfig(check_values='callback') to raise inside jit; the train-step guide's "
                          "diagnostics table lists each check (warned once per check)", RuntimeWarning, stacklevel=3)

    def __getitem__(self, key: str) -> Any:
        self._read()
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        self._read()
        return dict.get(self, key, default)

    def items(self) -> Any:
        self._read()
        return dict.items(self)

    def values(self) -> Any:
        self._read()
        return dict.values(self)


jax.tree_util.register_pytree_node(
    Diagnostics, lambda d: (tuple(dict.__getitem__(d, k) for k in sorted(dict.keys(d))), tuple(sorted(dict.keys(d)))),
    lambda keys, values: Diagnostics(zip(keys, values)))


def _raise_on_host(message: Callable[..., str], failed: Any, *details: Any) -> None:
    if bool(failed):
        raise ValueError(message(*(np.asarray(d) for d in details)))
