"""The backward linear recurrence ``x_t = c_t x_{t+1} + d_t`` and the scan methods that compute it.

GAE (token- and turn-level) is this recurrence with ``c_t = gamma * lam`` on active timesteps and 1
elsewhere; every method computes the same values:

- ``scan``: one sequential ``lax.scan`` over time: the literal recurrence.
- ``associative``: ``lax.associative_scan`` over affine maps ``x -> c x + d`` (log depth).
- ``blocked``: a sequential scan inside blocks of ``block_size`` timesteps, all blocks in parallel, then
  a scan over block carries and a fix-up pass (a chunked scan: few, wide steps).
- ``cumsum``: when ``gamma * lam == 1`` is known before tracing, ``c_t == 1`` and ``x`` is a reverse
  cumulative sum: exact, no products.
- ``native``: GAE's literal recurrence as a C++ XLA FFI kernel on the CPU (``prm_jax.native``), built on
  first use where a C++ compiler exists; float32 only.
- ``pallas``: GAE's literal recurrence as one Pallas kernel for a GPU (``_pallas_gae``: one program per row,
  one pass); on the CPU it runs in Pallas's interpret mode (how CI checks it); not for a TPU. GAE only:
  every other recurrence takes ``auto``'s method.
- ``auto``: resolved once, before tracing, by ``resolve_method``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax._validation import one_of
from prm_jax.kernels import _checks
from prm_jax.kernels._platform import on_cpu, target_platform
from prm_jax.native import _ffi as ffi

GAEMethod = Literal["auto", "scan", "associative", "blocked", "cumsum", "native", "pallas"]
#: The ``gae_method`` values (derived from ``GAEMethod``).
GAE_METHODS: tuple[GAEMethod, ...] = get_args(GAEMethod)
DEFAULT_BLOCK_SIZE = 64


def resolve_method(method: GAEMethod | str, *, unit_discount: bool, sharded: bool = False) -> GAEMethod:
    """The one place ``auto`` is resolved, outside any trace; the result is a static argument of the jit.

    ``auto``: on CPU ``native`` when it is available and the program runs on one device (``sharded``
    False and one device; a custom call has no partitioning rule), else ``scan``; on GPU/TPU ``cumsum``
    when ``gamma * lam == 1`` is known statically (``unit_discount``), else ``associative``. The platform is
    the one programs will be lowered for (``lowering_platform``; by default the process's backend): a
    program exported for an accelerator from a CPU host takes the accelerator's choice.
    """
    checked: GAEMethod = one_of("method", method, GAE_METHODS)
    if checked == "cumsum" and not unit_discount:
        raise ValueError("method='cumsum' needs gamma * lam == 1 known before tracing (Python floats); "
                         "use 'auto', 'scan', 'associative' or 'blocked' otherwise")
    if checked == "native" and not ffi.available():
        raise ValueError("method='native' needs the CPU backend and a C++ compiler to build the kernel "
                         "(see prm_jax.native); use 'auto' to fall back to 'scan'")
    if checked == "native" and not on_cpu():
        raise ValueError(f"method='native' is a CPU kernel: not for a program lowered for {target_platform()!r}; "
                         "use 'auto' or an XLA method")
    if checked == "pallas" and target_platform() == "tpu":
        raise ValueError("method='pallas' is a GPU kernel (Pallas's Triton backend; interpreted on the CPU): not "
                         "for a program lowered for 'tpu'; use 'auto' or an XLA method")
    if checked == "native" and sharded:
        raise ValueError("method='native' cannot run in a sharded program (a custom call has no partitioning "
                         "rule); use 'auto' or 'scan'")
    if checked != "auto":
        return checked
    if on_cpu():
        return "native" if ffi.use_native(sharded=sharded, platform=target_platform()) else "scan"
    return "cumsum" if unit_discount else "associative"


StepGroupMethod = Literal["native", "sort"]
STEP_GROUP_METHODS: tuple[StepGroupMethod, ...] = get_args(StepGroupMethod)
CumsumMethod = Literal["blocked", "lax"]
AlignmentMethod = Literal["native", "scatter"]


@dataclasses.dataclass(frozen=True)
class ScanStrategy:
    """Every backend choice of a program, resolved once before tracing and passed as a static argument, so
    no kernel reads the backend, the device count or the environment while it is traced (and the native
    library is built, if at all, before the first trace): ``gae`` for the configured GAE (its ``gamma *
    lam``); ``general`` for recurrences with other coefficients (the turn rule's masked fills, PRIME's
    lambda-return), never ``cumsum``; ``step_groups`` how GiGPO finds its step groups (the CPU's ``native``
    hash pass or the ``sort`` every backend has); ``cumsum`` how a reverse cumulative sum runs (``blocked``
    matrix products on the CPU, where XLA's ``lax.cumsum`` is slow, else ``lax``); ``alignment`` how OTB
    aligns rows by generated-token index (the CPU's ``native`` passes, or XLA's ``scatter`` and gather).
    ``native`` is chosen where the native kernels run (``ffi.use_native``), like the step groups.

    Args:
        gae: The method of the configured GAE (``GAEMethod``, resolved: never ``auto``).
        general: The method of recurrences with other coefficients (never ``cumsum``).
        step_groups: How GiGPO finds its step groups: ``native`` (the CPU's hash pass) or ``sort``.
        cumsum: How a reverse cumulative sum runs: ``blocked`` (matrix products, the CPU's) or ``lax``.
        alignment: How OTB aligns rows by generated-token index: ``native`` or ``scatter``.

    Example:
        >>> batch = {"loss_mask": np.ones((2, 8), np.int32)}
        >>> strategy = prm_jax.AdvantageConfig(gae_method="scan").plan.with_strategy(batch).strategy
        >>> strategy.gae, strategy.general
        ('scan', 'scan')
    """

    gae: GAEMethod
    general: GAEMethod
    step_groups: StepGroupMethod = "sort"
    cumsum: CumsumMethod = "lax"
    alignment: AlignmentMethod = "scatter"


def resolve_strategy(method: GAEMethod | str, *, unit_discount: bool, sharded: bool = False,
                     step_groups: StepGroupMethod | Literal["auto"] = "auto") -> ScanStrategy:
    """``method`` for the GAE (``resolve_method``) and the method for every other recurrence: the same one,
    unless it is ``cumsum`` (only exact for ``gamma * lam == 1``) or ``pallas`` (GAE's kernel alone), where
    ``auto``'s choice for any coefficients stands in. An explicit method (``scan``, ``native``, ...) is
    honoured everywhere. The step groups and the cumulative sums follow the platform
    (``resolve_step_groups``, ``resolve_cumsum``): under ``lowering_platform("cuda")`` every choice is the
    accelerator's and none a CPU-only kernel."""
    gae = resolve_method(method, unit_discount=unit_discount, sharded=sharded)
    general = gae if gae not in ("cumsum", "pallas") else resolve_method("auto", unit_discount=False, sharded=sharded)
    return ScanStrategy(gae, general, resolve_step_groups(step_groups, sharded=sharded), resolve_cumsum(),
                        resolve_alignment(sharded=sharded))


def native_or(name: str, method: str, fallback: str, choices: tuple[str, ...], sharded: bool) -> Any:
    """A kernel choice between the native CPU kernel and the XLA ``fallback``, outside any trace: ``auto`` is
    ``native`` where the native kernels run (``ffi.use_native``: the CPU, one device, a build), else the
    fallback; ``native`` is refused where they cannot, naming ``name``."""
    checked = one_of(name, method, ("auto", *choices))
    if checked == "auto":
        return "native" if ffi.use_native(sharded=sharded, platform=target_platform()) else fallback
    if checked == "native" and not (ffi.available() and not sharded and on_cpu()):
        raise ValueError(f"{name}='native' needs the native CPU kernels on one device (see prm_jax.native); "
                         f"use 'auto' or {fallback!r}")
    return checked


def resolve_step_groups(method: StepGroupMethod | Literal["auto"] | str = "auto", *,
                        sharded: bool = False) -> StepGroupMethod:
    """GiGPO's step-group method: the native hash pass or XLA's ``sort`` (``native_or``)."""
    return native_or("step_groups", method, "sort", STEP_GROUP_METHODS, sharded)


def resolve_alignment(method: AlignmentMethod | Literal["auto"] | str = "auto", *,
                      sharded: bool = False) -> AlignmentMethod:
    """OTB's alignment by generated-token index: the native passes or XLA's ``scatter`` (``native_or``)."""
    return native_or("alignment", method, "scatter", get_args(AlignmentMethod), sharded)


def resolve_cumsum() -> CumsumMethod:
    """``blocked`` on the CPU (``on_cpu``), else ``lax`` (``reverse_cumsum``), outside any trace."""
    return "blocked" if on_cpu() else "lax"


def _affine_combine(later, earlier):
    """Composes ``x -> a_l x + b_l`` (later timesteps, applied first) with ``x -> a_e x + b_e``."""
    a_later, b_later = later
    a_earlier, b_earlier = earlier
    return a_later * a_earlier, a_earlier * b_later + b_earlier


def affine_scan(coeffs: jax.Array, offsets: jax.Array, method: str) -> tuple[jax.Array, jax.Array]:
    """The chunked-scan primitive: ``(products, locals)`` of ``x_t = coeffs_t x_{t+1} + offsets_t`` from 0.

    Along the last axis, right to left from a zero carry: ``locals_t`` is ``x_t`` and ``products_t`` the
    product of ``coeffs`` from ``t`` to the end, so the same chunk with a carry-in ``c`` is
    ``locals_t + products_t * c`` (``carry_correction``). ``method`` is ``scan`` or ``associative``.
    """
    if method == "associative":
        return lax.associative_scan(_affine_combine, (coeffs, offsets), reverse=True, axis=coeffs.ndim - 1)

    def step(carry, coeff_offset):
        product, local = carry
        coeff, offset = coeff_offset
        carry = (coeff * product, coeff * local + offset)
        return carry, carry

    time_major = (jnp.moveaxis(coeffs, -1, 0), jnp.moveaxis(offsets, -1, 0))
    zeros = jnp.zeros(coeffs.shape[:-1], coeffs.dtype)
    _, (products, locals_) = lax.scan(step, (jnp.ones_like(zeros), zeros), time_major, reverse=True)
    return jnp.moveaxis(products, 0, -1), jnp.moveaxis(locals_, 0, -1)


def carry_correction(products: jax.Array, locals_: jax.Array, carry_in: jax.Array) -> jax.Array:
    """A chunk's values once the carry entering it from the right, ``carry_in [...]``, is known."""
    return locals_ + products * carry_in[..., None]


def backward_linear_recurrence(coeffs: ArrayLike, offsets: ArrayLike, init: ArrayLike, *,
                               method: str = "scan", block_size: int = DEFAULT_BLOCK_SIZE) -> jax.Array:
    """``x_t = coeffs_t * x_{t+1} + offsets_t`` for t = T-1 .. 0 along the last axis, ``x_T = init``.

    Args:
      coeffs, offsets: ``[B, T]`` float.
      init: ``[B]`` float.
      method: ``scan | associative | blocked``.
      block_size: timesteps per block for ``blocked``.

    Returns:
      ``[B, T]`` float32 (float64 for float64 inputs).

    Example:
        >>> x = prm_jax.kernels.backward_linear_recurrence(np.full((1, 3), 0.5, np.float32), np.ones((1, 3), np.float32),
        ...                                                np.zeros((1,), np.float32))
        ...
        >>> np.asarray(x).tolist()
        [[1.75, 1.5, 1.0]]
    """
    if method not in ("scan", "associative", "blocked"):
        raise ValueError(f"method must be 'scan', 'associative' or 'blocked', got {method!r}")
    _checks.check_rank("coeffs", coeffs, 2)
    _checks.check_shape("offsets", offsets, np.shape(coeffs), "coeffs")
    _checks.check_shape("init", init, np.shape(coeffs)[:1], "coeffs' batch axis")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return _recurrence_jit(coeffs, offsets, init, method=method, block_size=block_size)


@functools.partial(jax.jit, static_argnames=("method", "block_size"))
def _recurrence_jit(coeffs, offsets, init, *, method, block_size):
    dtype = _checks.accumulation_dtype(coeffs, offsets, init)
    return linear_recurrence(_checks.as_float("coeffs", coeffs, dtype), _checks.as_float("offsets", offsets, dtype),
                             _checks.as_float("init", init, dtype), method, block_size)


def linear_recurrence(coeffs: jax.Array, offsets: jax.Array, init: jax.Array, method: str,
                      block_size: int = DEFAULT_BLOCK_SIZE) -> jax.Array:
    """``backward_linear_recurrence`` on validated arrays, inside a trace."""
    if method == "scan":
        def step(x, coeff_offset):
            coeff, offset = coeff_offset
            x = coeff * x + offset
            return x, x
        _, xs = lax.scan(step, init, (coeffs.T, offsets.T), reverse=True)
        return xs.T
    if method == "associative":
        products, locals_ = affine_scan(coeffs, offsets, "associative")
        return carry_correction(products, locals_, init)
    if method == "blocked":
        return _blocked_recurrence(coeffs, offsets, init, block_size)
    raise ValueError(f"no linear recurrence for method {method!r}")


def _blocked_recurrence(coeffs: jax.Array, offsets: jax.Array, init: jax.Array, block_size: int) -> jax.Array:
    """Blocks of ``block_size`` timesteps scanned side by side, then one carry per block (a chunked scan)."""
    batch, num_steps = coeffs.shape
    block_size = max(1, min(block_size, num_steps))
    num_blocks = -(-num_steps // block_size)
    pad = num_blocks * block_size - num_steps
    # Identity steps on the right leave the carried-in value unchanged.
    coeffs = jnp.pad(coeffs, ((0, 0), (0, pad)), constant_values=1).reshape(batch, num_blocks, block_size)
    offsets = jnp.pad(offsets, ((0, 0), (0, pad))).reshape(batch, num_blocks, block_size)
    products, locals_ = affine_scan(coeffs, offsets, "scan")

    def across_blocks(x_after_block, product_local):
        product, local = product_local
        return product * x_after_block + local, x_after_block

    # carry_in[:, j] is x just right of block j (the first step of block j + 1, or init).
    _, carry_in = lax.scan(across_blocks, init, (products[:, :, 0].T, locals_[:, :, 0].T), reverse=True)
    xs = carry_correction(products, locals_, carry_in.T)
    return xs.reshape(batch, num_blocks * block_size)[:, :num_steps]


CUMSUM_BLOCK = 64  # timesteps per block of the CPU's blocked reverse cumulative sum


def reverse_cumsum(x: jax.Array, active: jax.Array, method: CumsumMethod) -> jax.Array:
    """``sum_{u >= t} x_u`` over the active entries of each row of ``[B, T]`` ``x`` (the return-to-go with no
    discount), 0 at inactive entries: the recurrence with every coefficient 1.

    XLA:CPU computes ``lax.cumsum`` as a reduce-window, about ten times a copy of the array; there
    (``method="blocked"``, ``resolve_cumsum``) the sum is blocked instead: within blocks of ``CUMSUM_BLOCK``
    timesteps one small matrix product (an upper triangle of ones, full precision), across blocks a
    cumulative sum of the block totals. Otherwise (and for short rows) it is ``lax.cumsum``. The two differ
    only in rounding.

    Args:
        x: ``[B, T]`` the values.
        active: ``[B, T]`` bool: the entries summed.
        method: ``lax`` or ``blocked`` (``resolve_cumsum`` chooses per backend); the numbers agree.

    Example:
        >>> x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
        >>> np.asarray(prm_jax.estimators.reverse_cumsum(x, np.array([[True, True, False, True]]), "lax")).tolist()
        [[7.0, 6.0, 0.0, 4.0]]
    """
    zero = jnp.zeros((), x.dtype)
    kept = jnp.where(active, x, zero)
    rows, width = x.shape
    if method == "lax" or width < 2 * CUMSUM_BLOCK:
        return jnp.where(active, lax.cumsum(kept, axis=1, reverse=True), zero)
    blocks = -(-width // CUMSUM_BLOCK)
    padded = jnp.pad(kept, ((0, 0), (0, blocks * CUMSUM_BLOCK - width))).reshape(rows, blocks, CUMSUM_BLOCK)
    upper = jnp.triu(jnp.ones((CUMSUM_BLOCK, CUMSUM_BLOCK), x.dtype))  # upper[i, j] = 1 for j >= i
    inner = jnp.einsum("bnj,ij->bni", padded, upper, precision=lax.Precision.HIGHEST)
    totals = inner[:, :, 0]
    after = lax.cumsum(totals, axis=1, reverse=True) - totals       # the blocks to the right
    out = (inner + after[:, :, None]).reshape(rows, blocks * CUMSUM_BLOCK)[:, :width]
    return jnp.where(active, out, zero)
