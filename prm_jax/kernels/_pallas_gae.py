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

Where rows are few and long (16x32768) one program per row leaves most of a GPU idle; chunking rows with a
carry pass is the next step, for when a device run has measured this one (``auto`` does not pick it until
then: ``benchmarks/auto_table.py`` from a device run).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pallas_triton

# The custom call a Pallas Triton kernel lowers to: what a program exported for a GPU holds (``jax.export``
# needs it named in ``disabled_checks``: XLA gives it no compatibility guarantee across versions).
TRITON_TARGET = "__gpu$xla.gpu.triton"


def _kernel(rewards_ref, values_ref, mask_ref, gamma_ref, gamma_lam_ref, bootstrap_ref, advantages_ref,
            returns_ref):
    steps = rewards_ref.shape[1]
    gamma, gamma_lam = gamma_ref[0], gamma_lam_ref[0]

    def step(i, carry):
        last, next_value = carry
        t = steps - 1 - i
        reward, value = rewards_ref[0, t], values_ref[0, t]
        flag = mask_ref[0, t]
        is_active = flag if flag.dtype == jnp.bool_ else flag != jnp.zeros((), flag.dtype)
        new = reward + gamma * next_value - value + gamma_lam * last
        last = jnp.where(is_active, new, last)
        next_value = jnp.where(is_active, value, next_value)
        advantages_ref[0, t] = last
        returns_ref[0, t] = last + value
        return last, next_value

    lax.fori_loop(0, steps, step, (jnp.zeros((), advantages_ref.dtype), bootstrap_ref[0]))


def pallas_gae(rewards: jax.Array, values: jax.Array, active: jax.Array, gamma: jax.Array, gamma_lam: jax.Array,
               bootstrap: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(advantages, returns)`` ``[B, T]`` of validated float arrays, ``active`` bool or a float 0/1 mask,
    ``gamma``, ``gamma_lam`` and ``bootstrap`` ``[B]``: the kernel (its gradient is ``_token_gae``'s)."""
    rows, steps = rewards.shape
    if rows == 0 or steps == 0:
        return jnp.zeros_like(rewards), values + jnp.zeros_like(rewards)
    row = pl.BlockSpec((1, steps), lambda b: (b, 0))
    scalar = pl.BlockSpec((1,), lambda b: (b,))
    shape = jax.ShapeDtypeStruct(rewards.shape, rewards.dtype)
    operands = (rewards, values, active, gamma, gamma_lam, bootstrap)

    def call(interpret: bool) -> tuple[jax.Array, jax.Array]:
        return pl.pallas_call(
            _kernel, out_shape=(shape, shape), grid=(rows,), in_specs=[row, row, row, scalar, scalar, scalar],
            out_specs=(row, row), interpret=interpret, name="prm_jax_gae",
            compiler_params=None if interpret else pallas_triton.CompilerParams(num_warps=1, num_stages=1),
        )(*operands)

    # Chosen by the platform the program is lowered for, not when it is traced (a trace cached on the CPU and
    # exported for a GPU still takes the Triton kernel): interpreted elsewhere (a TPU is refused before).
    return lax.platform_dependent(cuda=lambda: call(False), rocm=lambda: call(False), default=lambda: call(True))
