"""GAE as one Pallas kernel for a GPU (issue 56.4): ``method="pallas"``.

One program per row, the carry in registers: the program walks its row from the last timestep to the first,
reading each timestep's reward, value and mask once and writing its advantage and return once (17 bytes an
element with a bool mask, the least any GAE moves; XLA's associative scan moved 80 in 21 kernels on an
H200). The recurrence is ``scan``'s (``_token_gae._gae_scan``), operation for operation: on a trained
timestep ``A_t = r_t + gamma * V_next - V_t + gamma * lam * A_next`` and ``V_next = V_t``; an untrained one
carries both. The anchor, a Triton kernel of the same form, reached 60.9% of an H100's peak at 8192x2048.

On a GPU it is lowered by Pallas's Triton backend (``jax.experimental.pallas.triton``; its ``CompilerParams``
choose it where Mosaic GPU is the default); on the CPU it runs in Pallas's interpret mode, the same kernel
body as JAX operations, which is how CI checks it against the float64 loop; a TPU has no lowering for its
scalar loads (``resolve_method`` refuses it there). Its gradient is the ``associative`` form's (a custom
VJP in ``_token_gae``: a Pallas kernel has no autodiff, and the associative form has no loop over T on an
accelerator).

Where rows are few and long (16x32768: fewer rows than a GPU runs programs at once) one program per row
leaves most of it idle, so there each row is split into chunks of ``CHUNK`` timesteps (``chunked``), in two
passes of one program per chunk: the first walks its chunk from an empty carry and keeps only what the
chunk does to a carry coming in (its advantage and next value at its first timestep, and the number of
trained timesteps in it); the carries into every chunk follow from those in an associative scan over the
chunks (a few numbers a chunk, in XLA: no loop over T); the second walks each chunk again from its true
carry and writes the advantages and returns (26 bytes an element read and written, against 17 in one pass).
The chunk's incoming carry enters the recurrence linearly: with ``(A_in, V_in)`` coming in, a chunk whose
trained timesteps number ``n >= 1`` leaves ``A_out = A_local + (gamma*lam)^(n-1) * (gamma*V_in +
gamma*lam*A_in)`` and ``V_out = V_local``; a chunk with none passes both through. ``auto`` does not pick
either until a device run has measured them (``benchmarks/auto_table.py``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

# The custom call a Pallas Triton kernel lowers to: what a program exported for a GPU holds (``jax.export``
# needs it named in ``disabled_checks``: XLA gives it no compatibility guarantee across versions).
TRITON_TARGET = "__gpu$xla.gpu.triton"


# Timesteps per chunk where rows are split (``chunked``), and the most rows for which they are.
CHUNK = 1024
FEW_ROWS = 1024


def chunked(rows: int, steps: int) -> bool:
    """Whether rows are split into chunks: few rows (``< FEW_ROWS``) and at least two chunks each."""
    return rows < FEW_ROWS and steps >= 2 * CHUNK


def _walk(rewards_ref, values_ref, mask_ref, gamma, gamma_lam, steps, carry, write):
    """The recurrence backwards over the first ``steps`` timesteps of a block from ``carry``: ``(last,
    next_value, trained count)`` at its first timestep; ``write(t, last, value)`` stores each timestep's."""

    def step(i, state):
        last, next_value, count = state
        t = steps - 1 - i
        reward, value = rewards_ref[0, t], values_ref[0, t]
        flag = mask_ref[0, t]
        is_active = flag if flag.dtype == jnp.bool_ else flag != jnp.zeros((), flag.dtype)
        new = reward + gamma * next_value - value + gamma_lam * last
        last = jnp.where(is_active, new, last)
        next_value = jnp.where(is_active, value, next_value)
        if write is not None:
            write(t, last, value)
        return last, next_value, count + is_active.astype(jnp.int32)

    return lax.fori_loop(0, steps, step, carry)


def _writer(advantages_ref, returns_ref):
    """``_walk``'s ``write``: each timestep's advantage and return (advantage + value) into the output blocks."""

    def write(t, last, value):
        advantages_ref[0, t] = last
        returns_ref[0, t] = last + value

    return write


def _kernel(rewards_ref, values_ref, mask_ref, gamma_ref, gamma_lam_ref, bootstrap_ref, advantages_ref,
            returns_ref):
    """One program a row: the whole row from the empty carry (advantage 0, the row's bootstrap value)."""
    zero = jnp.zeros((), advantages_ref.dtype)
    _walk(rewards_ref, values_ref, mask_ref, gamma_ref[0], gamma_lam_ref[0], rewards_ref.shape[1],
          (zero, bootstrap_ref[0], jnp.int32(0)), _writer(advantages_ref, returns_ref))


def _pallas() -> Any:
    """``jax.experimental.pallas``, imported on the first use of the kernel (not with the library: it loads
    Pallas's Mosaic and Triton bindings, which nothing else here needs)."""
    from jax.experimental import pallas

    return pallas


def _chunk_steps(total: int, chunk: int) -> jax.Array:
    """The timesteps of this program's chunk (the last chunk of a row may be short)."""
    return jnp.minimum(chunk, total - _pallas().program_id(1) * chunk)


def _summary_kernel(total, rewards_ref, values_ref, mask_ref, gamma_ref, gamma_lam_ref, last_ref, next_ref,
                    count_ref):
    zero = jnp.zeros((), last_ref.dtype)
    last, next_value, count = _walk(rewards_ref, values_ref, mask_ref, gamma_ref[0], gamma_lam_ref[0],
                                    _chunk_steps(total, rewards_ref.shape[1]), (zero, zero, jnp.int32(0)), None)
    last_ref[0, 0], next_ref[0, 0], count_ref[0, 0] = last, next_value, count


def _chunk_kernel(total, rewards_ref, values_ref, mask_ref, gamma_ref, gamma_lam_ref, last_in_ref, next_in_ref,
                  advantages_ref, returns_ref):
    _walk(rewards_ref, values_ref, mask_ref, gamma_ref[0], gamma_lam_ref[0], _chunk_steps(total, rewards_ref.shape[1]),
          (last_in_ref[0, 0], next_in_ref[0, 0], jnp.int32(0)), _writer(advantages_ref, returns_ref))


def pallas_gae(rewards: jax.Array, values: jax.Array, active: jax.Array, gamma: jax.Array, gamma_lam: jax.Array,
               bootstrap: jax.Array, *, chunk: int | None = None) -> tuple[jax.Array, jax.Array]:
    """``(advantages, returns)`` ``[B, T]`` of validated float arrays, ``active`` bool or a float 0/1 mask,
    ``gamma``, ``gamma_lam`` and ``bootstrap`` ``[B]``: the kernel (its gradient is ``_token_gae``'s). ``chunk``:
    timesteps per chunk where rows are split (default: ``CHUNK`` where ``chunked``, else one program a row)."""
    rows, steps = rewards.shape
    if rows == 0 or steps == 0:
        return jnp.zeros_like(rewards), values + jnp.zeros_like(rewards)
    pl = _pallas()
    if chunk is None and chunked(rows, steps):
        chunk = CHUNK
    if chunk is not None and chunk < steps:
        return _chunked(rewards, values, active, gamma, gamma_lam, bootstrap, chunk)
    row = pl.BlockSpec((1, steps), lambda b: (b, 0))
    scalar = pl.BlockSpec((1,), lambda b: (b,))
    shape = jax.ShapeDtypeStruct(rewards.shape, rewards.dtype)
    operands = (rewards, values, active, gamma, gamma_lam, bootstrap)

    def call(interpret: bool) -> tuple[jax.Array, jax.Array]:
        return pl.pallas_call(
            _kernel, out_shape=(shape, shape), grid=(rows,), in_specs=[row, row, row, scalar, scalar, scalar],
            out_specs=(row, row), interpret=interpret, name="prm_jax_gae", compiler_params=_params(interpret),
        )(*operands)

    return _on_platform(call)


def _chunked(rewards, values, active, gamma, gamma_lam, bootstrap, chunk):
    pl = _pallas()
    rows, steps = rewards.shape
    chunks = -(-steps // chunk)
    block = pl.BlockSpec((1, chunk), lambda b, k: (b, k))
    scalar = pl.BlockSpec((1,), lambda b, k: (b,))
    per_chunk = pl.BlockSpec((1, 1), lambda b, k: (b, k))
    dtype = rewards.dtype
    small = (jax.ShapeDtypeStruct((rows, chunks), dtype), jax.ShapeDtypeStruct((rows, chunks), dtype),
             jax.ShapeDtypeStruct((rows, chunks), jnp.int32))

    def summaries(interpret: bool):
        return pl.pallas_call(
            lambda *refs: _summary_kernel(steps, *refs), out_shape=small, grid=(rows, chunks),
            in_specs=[block, block, block, scalar, scalar], out_specs=(per_chunk,) * 3, interpret=interpret,
            name="prm_jax_gae_chunk_summaries", compiler_params=_params(interpret),
        )(rewards, values, active, gamma, gamma_lam)

    local_last, local_next, count = _on_platform(summaries)
    # What each chunk does to the carry coming in from its right, as an affine map of (A, V):
    # A_out = a * A_in + b * V_in + c, V_out = d * V_in + e (trained: a = gl^n, b = g gl^(n-1), d = 0).
    trained = count > 0
    gl, g = gamma_lam[:, None], gamma[:, None]
    power = jnp.where(trained, gl ** jnp.maximum(count - 1, 0).astype(dtype), jnp.ones((), dtype))
    one, zero = jnp.ones((), dtype), jnp.zeros((), dtype)
    maps = (jnp.where(trained, power * gl, one), jnp.where(trained, power * g, zero), local_last,
            jnp.where(trained, zero, one), jnp.where(trained, local_next, zero))

    def compose(later, earlier):  # (later chunks' map applied first: the scan runs from the row's end)
        a1, b1, c1, d1, e1 = later
        a2, b2, c2, d2, e2 = earlier
        return (a2 * a1, a2 * b1 + b2 * d1, a2 * c1 + b2 * e1 + c2, d2 * d1, d2 * e1 + e2)

    _, b, c, d, e = lax.associative_scan(compose, maps, reverse=True, axis=1)
    # The carry out of chunk k (into chunk k - 1), from the row's own (A, V) = (0, bootstrap) at its end (A_in
    # = 0: the a term is left out, which an overflowed a would otherwise turn to NaN); chunk k's carry in is
    # chunk k + 1's carry out.
    end = bootstrap[:, None]
    last_out, next_out = b * end + c, d * end + e
    last_in = jnp.concatenate([last_out[:, 1:], jnp.zeros((rows, 1), dtype)], axis=1)
    next_in = jnp.concatenate([next_out[:, 1:], end], axis=1)
    shape = jax.ShapeDtypeStruct(rewards.shape, dtype)

    def finals(interpret: bool):
        return pl.pallas_call(
            lambda *refs: _chunk_kernel(steps, *refs), out_shape=(shape, shape), grid=(rows, chunks),
            in_specs=[block, block, block, scalar, scalar, per_chunk, per_chunk], out_specs=(block, block),
            interpret=interpret, name="prm_jax_gae_chunks", compiler_params=_params(interpret),
        )(rewards, values, active, gamma, gamma_lam, last_in, next_in)

    return _on_platform(finals)


def _params(interpret: bool) -> Any:
    """Triton's compiler parameters (they choose the Triton backend where Mosaic GPU is the default)."""
    if interpret:
        return None
    from jax.experimental.pallas import triton

    return triton.CompilerParams(num_warps=1, num_stages=1)


def _on_platform(call):
    """``call(interpret)`` chosen by the platform the program is lowered for, not when it is traced (a trace
    cached on the CPU and exported for a GPU still takes the Triton kernel): interpreted elsewhere (a TPU is
    refused before)."""
    return lax.platform_dependent(cuda=lambda: call(False), rocm=lambda: call(False), default=lambda: call(True))
