"""Sequence-parallel GAE: rows whose time axis is sharded over devices.

Each device holds a contiguous chunk of timesteps of every row. GAE is a right-to-left recurrence, so a
chunk needs two things from the chunks to its right, both small (``[B]`` per device):

1. ``nextv`` entering the chunk: the value at the first active timestep to its right (else ``bootstrap``).
   Each chunk publishes whether it has an active timestep and the value at its first one.
2. The advantage entering the chunk. Within a chunk the recurrence ``A_t = c_t A_{t+1} + delta_t`` maps the
   incoming advantage affinely: ``A_start = P * A_in + L`` with ``P`` the product of the chunk's ``c`` and
   ``L`` its advantage from a zero carry. Each chunk publishes ``(P, L)``; composing the maps of the chunks
   to its right gives its incoming advantage.

So: one local pass (``affine_scan``, which returns every timestep's value from a zero carry together with
the running coefficient products), an ``all_gather`` of ``4 x [B]`` values per chunk, and one elementwise
``carry_correction`` (recurrentgemma's multi-shard correction); no second sequential pass. The result
equals unsharded ``gae`` (to float32 rounding).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from prm_jax.kernels import _checks
from prm_jax.kernels._recurrence import affine_scan, carry_correction, resolve_method
from prm_jax.kernels._token_gae import GAEOutput, _prepare, check_discounts, linear_form


def _chunk_gae(rewards, values, mask, gamma, lam, bootstrap, *, axis_name, num_chunks, method):
    rewards, values, active, bootstrap, dtype = _prepare(rewards, values, mask, lam, bootstrap)
    gamma = jnp.asarray(gamma, dtype)
    gamma_lam = gamma * jnp.broadcast_to(jnp.asarray(lam, dtype), bootstrap.shape)
    chunk = lax.axis_index(axis_name)
    later = jnp.arange(num_chunks) > chunk

    # 1. The value at the first active timestep right of this chunk.
    first = jnp.argmax(active, axis=1)
    has_active = jnp.any(active, axis=1)
    first_value = jnp.take_along_axis(values, first[:, None], axis=1)[:, 0]
    all_has = lax.all_gather(has_active, axis_name)        # [chunks, B]
    all_first = lax.all_gather(first_value, axis_name)     # [chunks, B]
    source = jnp.where(all_has & later[:, None], jnp.arange(num_chunks)[:, None], num_chunks)
    nearest = jnp.min(source, axis=0)                      # [B]
    from_right = jnp.take_along_axis(all_first, jnp.minimum(nearest, num_chunks - 1)[None], axis=0)[0]
    next_value_in = jnp.where(nearest < num_chunks, from_right, bootstrap)

    coeffs, deltas = linear_form(rewards, values, active, gamma, gamma_lam, next_value_in)

    # 2. This chunk's affine map of the incoming advantage, then the carries of all chunks.
    products, local = affine_scan(coeffs, deltas, method)
    all_products = lax.all_gather(products[:, 0], axis_name)
    all_starts = lax.all_gather(local[:, 0], axis_name)
    carry = jnp.zeros_like(bootstrap)
    carries = [carry] * num_chunks
    for c in reversed(range(num_chunks)):
        carries[c] = carry
        carry = all_products[c] * carry + all_starts[c]
    carry_in = jnp.stack(carries)[chunk]
    advantages = carry_correction(products, local, carry_in)
    return advantages, advantages + values


def sequence_parallel_gae(rewards: ArrayLike, values: ArrayLike | None, mask: ArrayLike, *, mesh: Mesh,
                          axis_name: str = "seq", batch_axis: str | None = None, gamma: float = 1.0,
                          lam: ArrayLike = 1.0, bootstrap: ArrayLike | None = None,
                          method: str = "auto") -> GAEOutput:
    """GAE (the recurrence of ``gae``) with the time axis sharded over ``mesh`` axis ``axis_name``.

    Args:
      rewards, values, mask: ``[B, T]`` on timesteps; ``T`` divisible by the size of ``axis_name``.
      mesh: the device mesh.
      axis_name: the mesh axis that splits time.
      batch_axis: an optional mesh axis that splits rows as well.
      gamma, lam, bootstrap: as for ``gae`` (``lam`` a scalar or ``[B]``).
      method: local scan per chunk: ``auto`` (``scan`` on CPU, ``associative`` elsewhere), ``scan`` or
        ``associative``.

    Returns:
      ``GAEOutput(advantages, returns)``, ``[B, T]`` float32, sharded like the inputs.

    Example:
        >>> import jax
        >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("seq",))
        >>> out = prm_jax.kernels.sequence_parallel_gae(np.array([[0.0, 0.0, 1.0, 0.0]], np.float32), None,
        ...                                             np.ones((1, 4), bool), mesh=mesh, gamma=0.5)
        ...
        >>> np.asarray(out.advantages).tolist()
        [[0.25, 0.5, 1.0, 0.0]]
    """
    _checks.check_rank("rewards", rewards, 2)
    if axis_name not in mesh.shape:
        raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh {dict(mesh.shape)}")
    num_chunks = mesh.shape[axis_name]
    width = np.shape(rewards)[1]
    if width % num_chunks:
        raise ValueError(f"the time axis ({width}) must divide evenly over {num_chunks} devices of {axis_name!r}")
    check_discounts(gamma, lam)
    method = resolve_method(method, unit_discount=False, sharded=True)
    if method not in ("scan", "associative"):
        raise ValueError(f"sequence_parallel_gae scans each chunk with 'scan' or 'associative', got {method!r}")
    rows = np.shape(rewards)[0]
    values = jnp.zeros((rows, width), jnp.float32) if values is None else values
    bootstrap = jnp.zeros((rows,), jnp.float32) if bootstrap is None else bootstrap
    lam = jnp.broadcast_to(jnp.asarray(lam, jnp.float32), (rows,))
    return _sp_gae_jit(rewards, values, mask, jnp.asarray(gamma, jnp.float32), lam, bootstrap, mesh=mesh,
                       axis_name=axis_name, batch_axis=batch_axis, method=method)


@functools.partial(jax.jit, static_argnames=("mesh", "axis_name", "batch_axis", "method"))
def _sp_gae_jit(rewards, values, mask, gamma, lam, bootstrap, *, mesh, axis_name, batch_axis, method):
    matrix, row = P(batch_axis, axis_name), P(batch_axis)
    body = functools.partial(_chunk_gae, axis_name=axis_name, num_chunks=mesh.shape[axis_name], method=method)
    advantages, returns = jax.shard_map(body, mesh=mesh, in_specs=(matrix, matrix, matrix, P(), row, row),
                                        out_specs=(matrix, matrix), check_vma=False)(
        rewards, values, mask, gamma, lam, bootstrap)
    return GAEOutput(advantages, returns)
