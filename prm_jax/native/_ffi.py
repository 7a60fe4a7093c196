"""The native CPU kernels as XLA FFI custom calls: loading and registering the built library, calling
it, and the one policy deciding when the native path is used (``use_native``), shared by GAE's ``auto``
and GiGPO's step groups.

XLA:CPU runs a ``lax.scan`` step in tens of nanoseconds and transposes ``[B, T]`` slowly, so a sequential
recurrence is far from memory speed there: ``gae_cpu.cc`` runs the same recurrence as the ``scan`` method
directly over the row-major buffers. XLA:CPU also sorts slowly (~1 ms for 32k keys), so
``step_groups_cpu.cc`` finds GiGPO's step groups with one hash-table pass instead of a sort, and
``turns_cpu.cc`` finds where each turn continues (the next trained timestep's turn id) in one reverse pass;
``otb_cpu.cc`` aligns OTB's rows by generated-token index without XLA's scatter and gather, and
``sum_pi_squared_cpu.cc`` takes OTB's ``sum pi^2`` of logits with one exponential per logit. Four functions of the
library are not custom calls: ``rows_cpu.cc`` checks a trainer's token arrays on the host (through ctypes on
numpy buffers, whatever the backend), the checks ``score_arrays`` makes before a model reads them, in one pass
instead of numpy's dozen: surveyed before the rows are copied (``survey_rows``), or, with one ``ModelScorer``,
as they are copied into its chunks (``plan_rows``, ``chunk_rows``), the scores written back by
``place_scores``.

Where the library comes from: a wheel carries it built (``prm_jax/native/_prm_jax_cpu.so``, setup.py), and it
is loaded as it is, no compiler needed; XLA refuses it at registration if it was built against a newer XLA
FFI than this jaxlib's (it is built against the oldest supported, so that one serves them all), and a
source install has none: then the sources are compiled on first use into ``$PRM_JAX_CACHE``
(``prm_jax.native._build``). ``PRM_JAX_NATIVE=build`` skips the packaged library and builds from the sources;
``PRM_JAX_NATIVE=0`` turns the kernels off.

Availability is checked, never assumed: with neither a usable packaged library nor a compiler, a failed
build, another backend than CPU, or ``PRM_JAX_NATIVE=0``, ``available()`` is False and callers fall back
(GAE's ``auto`` to ``scan``, GiGPO to its sort). The GAE kernel takes float32 only;
``prm_jax.kernels._token_gae`` gives it a derivative.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import warnings
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np

from prm_jax.native._build import PACKAGED_LIBRARY, build_library, find_compiler, logger

TARGET = "prm_jax_gae_f32"
FLOAT_MASK_TARGET = "prm_jax_gae_f32_float_mask"
STEP_GROUPS_TARGET = "prm_jax_step_groups"
NEXT_ACTIVE_IDS_TARGET = "prm_jax_next_active_ids"
OTB_COMPACT_TARGET = "prm_jax_otb_compact"
OTB_EXPAND_TARGET = "prm_jax_otb_expand"
SUM_PI_SQUARED_TARGET = "prm_jax_sum_pi_squared"
# Every handler of the library: its XLA target and its symbol.
HANDLERS = ((TARGET, "PrmJaxGaeF32"), (FLOAT_MASK_TARGET, "PrmJaxGaeF32FloatMask"),
            (STEP_GROUPS_TARGET, "PrmJaxStepGroups"), (NEXT_ACTIVE_IDS_TARGET, "PrmJaxNextActiveIds"),
            (OTB_COMPACT_TARGET, "PrmJaxOtbCompact"), (OTB_EXPAND_TARGET, "PrmJaxOtbExpand"),
            (SUM_PI_SQUARED_TARGET, "PrmJaxSumPiSquared"))

_lock = threading.Lock()
_state: dict[str, object] = {}


def available() -> bool:
    """Whether the native kernel is built and registered (building it on the first call).

    Thread-safe: a caller that arrives during the build waits for it; only the finished answer is
    published.
    """
    if "ok" in _state:
        return bool(_state["ok"])
    with _lock:
        if "ok" not in _state:
            _state["ok"] = _load()
        return bool(_state["ok"])


# Said once per process when there is neither a usable packaged library nor a compiler: slower is not silent
# (issue 32.1). The figures are benchmarks/RESULTS.md's (GAE, native against XLA's scan, the same 2-core machine).
NO_COMPILER_WARNING = (
    "prm-jax: no C++ compiler found to build its native CPU kernels: GAE and GiGPO fall back to XLA's scan "
    "and sort, about 4.6x slower at 64x8192 and 11x at 1024x2048; install prm-jax from its wheel (it carries "
    "them built), or a C++ compiler (g++ or clang++, or set CXX) and they are built on first use, or set "
    "PRM_JAX_NATIVE=0 to choose the fallback silently")


def status() -> tuple[bool, str]:
    """``(available, why)``: whether the native kernels are loaded and, in words, the library or the reason
    they are not (``prm-jax doctor`` prints it). Builds them on the first call, as ``available`` does."""
    ok = available()
    return ok, str(_state.get("why", ""))


def _load() -> bool:
    mode = os.environ.get("PRM_JAX_NATIVE", "1")
    if mode == "0":
        _state["why"] = "turned off (PRM_JAX_NATIVE=0)"
        return False
    if jax.default_backend() != "cpu":
        _state["why"] = f"the default backend is {jax.default_backend()}, not the CPU (they are CPU kernels)"
        return False
    refused = ""
    if mode != "build" and PACKAGED_LIBRARY.exists():
        # The wheel's library (setup.py built it): no compiler needed. XLA refuses one built against newer
        # FFI headers than this jaxlib's at registration; the sources are built instead.
        try:
            api = _register(PACKAGED_LIBRARY)
        except (OSError, RuntimeError, AttributeError) as err:
            refused = f"the packaged library cannot be used with jaxlib {jaxlib_version()} ({err}); "
            logger.warning("%sbuilding the kernels from their sources instead", refused)
        else:
            _state["why"] = f"loaded from the package's library {PACKAGED_LIBRARY} (XLA FFI API {api})"
            return True
    compiler = find_compiler()
    if not compiler:
        _state["why"] = refused + "no C++ compiler on PATH (nor $CXX) to build them"
        warnings.warn(NO_COMPILER_WARNING, RuntimeWarning, stacklevel=2)  # once: the answer is cached
        return False
    try:
        path = build_library(compiler)
        api = _register(path)
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as err:
        detail = getattr(err, "stderr", "") or err
        logger.warning("building the native CPU kernels failed: GAE's 'auto' uses 'scan', GiGPO sorts: %s", detail)
        _state["why"] = refused + f"the build failed: {str(detail).strip()[:300]}"
        return False
    _state["why"] = refused + f"loaded from {path} (built with {compiler}, XLA FFI API {api})"
    return True


def _register(path: os.PathLike[str] | str) -> str:
    """Loads the library at ``path`` and registers its handlers (``HANDLERS``) with XLA (which checks their FFI
    API version against its own); returns that version, ``"major.minor"``. Every symbol is looked up before
    any is registered: a library without one (an older build) registers nothing (``AttributeError``)."""
    library = ctypes.cdll.LoadLibrary(str(path))
    handlers = [(target, getattr(library, symbol)) for target, symbol in HANDLERS]
    for target, handler in handlers:
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler), platform="cpu")
    version = int(library.PrmJaxFfiApiVersion())
    return f"{version // 1000}.{version % 1000}"


def jaxlib_version() -> str:
    import jaxlib

    return str(getattr(jaxlib, "__version__", None) or jax.__version__)


def _require_loaded() -> None:
    """The guard of every native call. A native call is traced only after a strategy chose it, so after
    ``available()`` said yes: this reads that answer, and builds nothing and reads no environment inside a
    trace."""
    if not _state.get("ok"):
        raise RuntimeError("the native CPU kernels are not available (see prm_jax.native), or were not loaded "
                           "before tracing: resolve the method first (resolve_method / resolve_strategy)")


def gae_native(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: jax.Array, gamma_lam: jax.Array,
               bootstrap: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(advantages, returns)`` from the native kernel.

    float32 ``[..., T]`` inputs; ``mask`` is bool, or float32 (verl's and tunix's masks), read without a
    conversion pass: active where nonzero, and the kernel enforces ``_checks.mask_check``'s 0/1 rule
    itself: a violation fails the computation (a ``JaxRuntimeError`` carrying mask_check's message,
    raised when the result is read). ``gamma``, ``gamma_lam`` and ``bootstrap`` are ``[...]``.
    """
    _require_loaded()
    f32 = jnp.float32
    rows = rewards.shape[:-1]
    if mask.dtype not in (jnp.bool_, f32):
        raise TypeError(f"the native GAE kernel takes a bool or float32 mask, got {mask.dtype}")
    out = jax.ShapeDtypeStruct(rewards.shape, f32)
    call = jax.ffi.ffi_call(TARGET if mask.dtype == jnp.bool_ else FLOAT_MASK_TARGET, (out, out),
                            vmap_method="broadcast_all")
    advantages, returns = call(rewards.astype(f32), values.astype(f32), mask, jnp.broadcast_to(gamma, rows).astype(f32),
                               gamma_lam.astype(f32), bootstrap.astype(f32))
    return advantages, returns


def step_groups(group: jax.Array, anchor: jax.Array) -> jax.Array:
    """Step-group ids ``[..., N]`` int32: the index of the first entry with the same ``(group, anchor)``; an
    entry with ``anchor < 0`` is its own group. int32 ``[..., N]`` inputs."""
    _require_loaded()
    call = jax.ffi.ffi_call(STEP_GROUPS_TARGET, jax.ShapeDtypeStruct(group.shape, jnp.int32),
                            vmap_method="broadcast_all")
    return call(group.astype(jnp.int32), anchor.astype(jnp.int32))


def next_active_ids(turn_ids: jax.Array, active: jax.Array) -> jax.Array:
    """``[..., T]`` int32: the turn id of each timestep's next active timestep in its row, -1 where none
    follows (``turns_cpu.cc``). int32 ids and a bool mask."""
    _require_loaded()
    call = jax.ffi.ffi_call(NEXT_ACTIVE_IDS_TARGET, jax.ShapeDtypeStruct(turn_ids.shape, jnp.int32),
                            vmap_method="broadcast_all")
    return call(turn_ids.astype(jnp.int32), active.astype(jnp.bool_))


def otb_compact(rewards: jax.Array, weights: jax.Array, active: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """OTB's rows compacted to generated-token index (``otb_cpu.cc``): ``(G, W, lengths)``, each row's
    reward-to-go and running token weight over its trained timesteps at ``k = 0 .. L - 1`` and 0 after
    (``[B, T]`` float32), and ``L [B]`` int32. float32 rewards and weights, a bool mask."""
    _require_loaded()
    f32 = jnp.float32
    out = jax.ShapeDtypeStruct(rewards.shape, f32)
    call = jax.ffi.ffi_call(OTB_COMPACT_TARGET, (out, out, jax.ShapeDtypeStruct(rewards.shape[:1], jnp.int32)),
                            vmap_method="sequential")
    to_go, running, lengths = call(rewards.astype(f32), weights.astype(f32), active.astype(jnp.bool_))
    return to_go, running, lengths


def otb_expand(to_go: jax.Array, baselines: jax.Array, row_group: jax.Array, cut: jax.Array,
               active: jax.Array) -> tuple[jax.Array, jax.Array]:
    """OTB's ``(advantages, returns)`` ``[B, T]`` put back on the trained timesteps (``otb_cpu.cc``): at a
    row's ``k``-th trained timestep ``G_k - B[group, k]`` (``G_k`` from ``k = cut`` on) and ``G_k``; 0
    elsewhere. ``baselines [G, T]`` float32, ``row_group`` and ``cut`` ``[B]`` int32 (groups in range)."""
    _require_loaded()
    f32 = jnp.float32
    out = jax.ShapeDtypeStruct(to_go.shape, f32)
    call = jax.ffi.ffi_call(OTB_EXPAND_TARGET, (out, out), vmap_method="sequential")
    advantages, returns = call(to_go.astype(f32), baselines.astype(f32), row_group.astype(jnp.int32),
                               cut.astype(jnp.int32), active.astype(jnp.bool_))
    return advantages, returns


def sum_pi_squared(logits: jax.Array, temperature: float) -> jax.Array:
    """``sum_v pi_v^2`` of each softmax of float32 ``logits [..., V] / temperature``: ``[...]`` float32, one
    exponential per logit (``sum_pi_squared_cpu.cc``). Not differentiable (OTB reads it as an input)."""
    _require_loaded()
    call = jax.ffi.ffi_call(SUM_PI_SQUARED_TARGET, jax.ShapeDtypeStruct(logits.shape[:-1], jnp.float32),
                            vmap_method="broadcast_all")
    return call(logits.astype(jnp.float32), temperature=np.float32(temperature))


def _host_library() -> ctypes.CDLL | None:
    """The library for the host functions (``survey_rows``): the packaged one where it has them, else
    ``HOST_SOURCES`` built alone (no XLA header: a second or so, once a machine), whatever the default backend
    (they read numpy buffers); ``None`` with ``PRM_JAX_NATIVE=0``, or neither (callers use numpy). Loaded
    once, under the build's lock."""
    if "host" in _state:
        return _state["host"]  # type: ignore[return-value]
    with _lock:
        if "host" not in _state:
            _state["host"] = _load_host()
    return _state["host"]  # type: ignore[return-value]


def _load_host() -> ctypes.CDLL | None:
    mode = os.environ.get("PRM_JAX_NATIVE", "1")
    if mode == "0":
        return None
    if mode != "build" and PACKAGED_LIBRARY.exists():
        try:
            library = ctypes.cdll.LoadLibrary(str(PACKAGED_LIBRARY))
            _host_functions(library)
            return library
        except (OSError, AttributeError):  # (an older packaged library: without the host functions, or of another interface)
            pass
    compiler = find_compiler()
    if not compiler:
        return None
    try:
        library = ctypes.cdll.LoadLibrary(str(build_library(compiler, host=True)))
        _host_functions(library)
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as err:
        logger.warning("the native host functions are not available (score_arrays checks rows with numpy): %s",
                       getattr(err, "stderr", "") or err)
        return None
    return library


_HOST_SIGNATURES = {  # each host function's ctypes argument types (rows_cpu.cc)
    "PrmJaxSurveyRows": (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p),
    "PrmJaxPlanRows": (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_void_p),
    "PrmJaxChunkRows": (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                        ctypes.c_void_p, ctypes.c_void_p),
    "PrmJaxPlaceScores": (ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64),
}


HOST_API = 2  # rows_cpu.cc's PrmJaxHostApi: the host functions' arguments as _HOST_SIGNATURES declares them


def _host_functions(library: ctypes.CDLL) -> dict[str, Any]:
    """The library's host functions, typed once a library (``AttributeError`` for one without them all, or
    built from sources of another interface version: ``PrmJaxHostApi``)."""
    functions = _TYPED.get(id(library))
    if functions is None:
        version = library.PrmJaxHostApi
        version.restype, version.argtypes = ctypes.c_int64, ()
        if version() != HOST_API:
            raise AttributeError(f"the library's host functions are of interface {version()}, not {HOST_API}")
        functions = {}
        for name, arguments in _HOST_SIGNATURES.items():
            function = getattr(library, name)
            function.restype, function.argtypes = ctypes.c_int64, arguments
            functions[name] = function
        _TYPED[id(library)] = functions
    return functions


_TYPED: dict[int, dict[str, Any]] = {}  # each loaded library's typed host functions (libraries stay loaded)


SURVEY_STRAY, SURVEY_OUTSIDE, SURVEY_NOT_BINARY = 1, 2, 4  # survey_rows' flags (rows_cpu.cc)


def _address(array: np.ndarray) -> int:
    """A C-contiguous array's buffer address: through ``ctypes.c_char.from_buffer`` where it is writable (half a
    microsecond; ``array.ctypes.data`` builds an object first, one to two), else ``array.ctypes.data``."""
    if array.flags.writeable and array.nbytes:
        try:
            return ctypes.addressof(ctypes.c_char.from_buffer(cast(Any, array)))
        except (TypeError, ValueError, BufferError):
            pass
    return array.ctypes.data


class HostRows(NamedTuple):
    """A trainer's ``[B, T]`` arrays as the host functions take them (``host_rows``): the arrays (held, so their
    buffers live), the functions' leading arguments (each buffer's address and item size) and the functions."""

    tokens: np.ndarray
    turn_ids: np.ndarray
    attention: np.ndarray | None
    arguments: tuple[int | None, ...]
    functions: dict[str, Any]


def host_rows(tokens: np.ndarray, turn_ids: np.ndarray, attention: np.ndarray | None) -> HostRows | None:
    """``tokens``, ``turn_ids`` and ``attention`` for the host functions, or ``None`` where the library is not at
    hand or they are not arrays its functions take: ``[B, T]``, C-contiguous, token and turn ids signed integers
    of 4 or 8 bytes, ``attention`` bool or integers of 1, 4 or 8 bytes (``None``: every position attends)."""
    if not (tokens.ndim == 2 and turn_ids.shape == tokens.shape and tokens.flags.c_contiguous
            and turn_ids.flags.c_contiguous and tokens.dtype.kind == turn_ids.dtype.kind == "i"
            and tokens.itemsize in (4, 8) and turn_ids.itemsize in (4, 8)):
        return None
    if attention is not None and not (attention.shape == tokens.shape and attention.flags.c_contiguous and (
            attention.dtype.kind == "b" or (attention.dtype.kind in "iu" and attention.itemsize in (1, 4, 8)))):
        return None
    library = _host_library()
    if library is None:
        return None
    arguments = (_address(tokens), tokens.itemsize, _address(turn_ids), turn_ids.itemsize,
                 None if attention is None else _address(attention), 0 if attention is None else attention.itemsize)
    return HostRows(tokens, turn_ids, attention, arguments, _host_functions(library))


def survey_rows(tokens: np.ndarray, turn_ids: np.ndarray,
                attention: np.ndarray | None) -> tuple[int, np.ndarray, np.ndarray] | None:
    """A trainer's ``[B, T]`` arrays surveyed in one native pass (``rows_cpu.cc``): ``(flags, counts, lengths)``,
    ``flags`` a sum of ``SURVEY_STRAY`` (a token id outside ``[0, 2^31 - 1]``), ``SURVEY_OUTSIDE`` (a turn id
    >= 0 without attention) and ``SURVEY_NOT_BINARY`` (an attention value other than 0 and 1); ``counts [B]``
    each row's number of turns by AReaL's rule over its turn tokens (turn id >= 0 with attention), -1 where the
    rule breaks; ``lengths [B]`` each row's last attended position + 1. ``None`` where ``host_rows`` is: the
    caller checks them with numpy."""
    host = host_rows(tokens, turn_ids, attention)
    if host is None:
        return None
    rows, width = tokens.shape
    counts, lengths = np.empty(rows, np.int64), np.empty(rows, np.int64)
    flags = int(host.functions["PrmJaxSurveyRows"](*host.arguments, rows, width, _address(counts),
                                                    _address(lengths)))
    return None if flags < 0 else (flags, counts, lengths)


class PlannedRows(NamedTuple):
    """``plan_rows``' answer: ``flags``, each row's length ``lengths [B]`` int64, and over the rows of length above
    0 (the scored rows) the ``longest`` and ``shortest`` length and their number ``scored`` (0, 0, 0 for none)."""

    flags: int
    lengths: np.ndarray
    longest: int
    shortest: int
    scored: int


def plan_rows(host: HostRows) -> PlannedRows:
    """The first half of the checks made as rows are copied (``chunk_rows``): each row's last attended position
    + 1 (the mask read back from each row's end: only its padding; the turn ids are not read), with the span of
    the lengths above 0 (``PlannedRows``: the chunks' plan needs no pass over them); ``flags`` ``SURVEY_STRAY``
    where a row of length 0, which is never copied, holds a token id outside ``[0, 2^31 - 1]``."""
    rows, width = host.tokens.shape
    lengths = np.empty(rows + 3, np.int64)
    tokens, token_bytes, _, _, attention, attention_bytes = host.arguments
    flags = int(host.functions["PrmJaxPlanRows"](tokens, token_bytes, attention, attention_bytes, rows, width,
                                                  _address(lengths)))
    assert flags >= 0, "host_rows took arrays PrmJaxPlanRows refuses"
    longest, shortest, scored = lengths[rows:].tolist()
    return PlannedRows(flags, lengths[:rows], longest, shortest, scored)


def chunk_rows(host: HostRows, members: np.ndarray, chunk_sizes: list[int], widths: list[int],
               size: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``members`` copied into model calls' int32 buffers, checked as they are copied, in one native
    pass: call ``c`` the next ``chunk_sizes[c]`` members (at most ``size``) in a ``[size, widths[c]]`` block.
    ``(flags, ids, mask, turns, counts)``: ``ids``, ``mask`` and ``turns`` the blocks one after another, flat
    (``ids`` the token ids as given, ``mask`` 1 where a position attends, ``turns`` each turn token's turn id and
    -1 elsewhere; columns up to ``min(widths[c], T)`` copied, the rest and a block's rows past its members 0, -1
    in ``turns``); ``counts`` each member's number of turns by AReaL's rule, -1 where it breaks; ``flags``
    ``SURVEY_STRAY`` where a member holds a token id outside ``[0, 2^31 - 1]`` (anywhere in its row)."""
    if sum(chunk_sizes) != members.size or max(chunk_sizes, default=0) > size:
        raise ValueError(f"chunk_rows: {members.size} members in chunks {chunk_sizes} of at most {size} rows")
    n, chunks = members.size, len(chunk_sizes)
    # (T, n, chunks, size, then members, chunk sizes, widths, and room for the counts: rows_cpu.cc)
    index = np.empty(4 + 2 * n + 2 * chunks, np.int64)
    index[:4] = host.tokens.shape[1], n, chunks, size
    index[4:4 + n] = members
    index[4 + n:4 + n + chunks], index[4 + n + chunks:4 + n + 2 * chunks] = chunk_sizes, widths
    region = size * sum(widths)
    out = np.empty(3 * region, np.int32)
    flags = int(host.functions["PrmJaxChunkRows"](*host.arguments, _address(index), _address(out)))
    assert flags >= 0, "host_rows took arrays PrmJaxChunkRows refuses"
    return flags, out[:region], out[region:2 * region], out[2 * region:], index[4 + n + 2 * chunks:]


class ScoresPlacer:
    """Model calls' float32 scores written onto one ``out [B, T]`` float32 (C-contiguous, writable): ``add`` each
    call's scores, ``place`` them all in one native pass (``rows_cpu.cc``; one ctypes call a batch, not one a
    call: issue 56.6). ``scores_placer`` makes one where the library is at hand."""

    def __init__(self, function: Any, out: np.ndarray) -> None:
        self._function, self._out, self._out_address, self._width = function, out, _address(out), out.shape[1]
        self._pending: list[tuple[int, ...]] = []
        self._held: list[np.ndarray] = []  # (the pending calls' arrays, alive until they are placed)

    def add(self, scores: np.ndarray, turns: np.ndarray, rows: np.ndarray, cut: int) -> bool:
        """A call's ``scores [size, padded]`` to write onto rows ``rows`` (int64) of ``out``, up to column ``cut``:
        the scores where the call's ``turns [size, padded]`` int32 are >= 0, 0 elsewhere, at the next ``place``.
        False (nothing added) where they are not such C-contiguous buffers: the caller writes them with numpy."""
        size, padded = turns.shape
        if not (scores.dtype == np.float32 and scores.shape == turns.shape and turns.dtype == np.int32
                and rows.dtype == np.int64 and scores.flags.c_contiguous and turns.flags.c_contiguous
                and rows.flags.c_contiguous and rows.size <= size and 0 <= cut <= min(padded, self._width)):
            return False
        self._pending.append((_address(scores), _address(turns), _address(rows), rows.size, cut, padded))
        self._held += scores, turns, rows
        return True

    def place(self) -> bool:
        """The calls added since the last ``place`` written onto ``out``, in one native pass; whether a score
        placed on a turn token is not finite."""
        if not self._pending:
            return False
        table = np.array(self._pending, np.int64)
        non_finite = bool(self._function(_address(table), len(self._pending), self._out_address, self._width))
        self._pending.clear()
        self._held.clear()
        return non_finite


def scores_placer(out: np.ndarray) -> ScoresPlacer | None:
    """A ``ScoresPlacer`` onto ``out``; ``None`` where the library is not at hand or ``out`` is not a C-contiguous,
    writable ``[B, T]`` float32 buffer (the caller writes the scores with numpy)."""
    if not (out.dtype == np.float32 and out.ndim == 2 and out.flags.c_contiguous and out.flags.writeable):
        return None
    library = _host_library()
    return None if library is None else ScoresPlacer(_host_functions(library)["PrmJaxPlaceScores"], out)


def place_scores(scores: np.ndarray, turns: np.ndarray, rows: np.ndarray, cut: int, out: np.ndarray) -> bool | None:
    """One model call's float32 ``scores [size, padded]`` written onto rows ``rows`` (int64) of ``out [B, T]`` float32,
    up to column ``cut``: the scores where the call's ``turns [size, padded]`` int32 are >= 0, 0 elsewhere, in one
    native pass; whether a score placed is not finite. ``None`` (nothing written) where the library is not at
    hand or the arrays are not those C-contiguous buffers: the caller writes them with numpy. (A batch's calls
    share one ``ScoresPlacer``, placed together.)"""
    placer = scores_placer(out)
    return None if placer is None or not placer.add(scores, turns, rows, cut) else placer.place()


def use_native(*, sharded: bool, platform: str) -> bool:
    """Whether a program uses the native kernels: one lowered for the CPU (``platform``, the one it will be
    lowered for), one device and no sharded program (a custom call has no partitioning rule), and a verified
    build. The one policy for every ``auto`` choice between a native kernel and an XLA one (GAE, GiGPO's
    step groups, OTB's alignment, sum_pi_squared)."""
    return platform == "cpu" and not sharded and jax.device_count() == 1 and available()
