"""The pipeline's input checks, derived from ``BATCH_SCHEMA`` alone: the keys read, their shapes and dtype
classes (at trace time), the masks' 0/1 rule, the groups' structure and where each float key must be finite
(value checks), the float dtype the pipeline computes in, and the host-side preparation of a batch (arrays,
an empty batch padded). A key added to the schema is checked with no other change.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from prm_jax.kernels import _checks
from prm_jax.kernels._alignment import shift_to_next_token, shift_to_previous_position
from prm_jax.kernels._gigpo import host_anchor_ids
from prm_jax.kernels._normalization import group_ids_check, group_sizes_check, member_counts_check
from prm_jax.kernels._plan import AdvantagePlan
from prm_jax.kernels._schema import BATCH_SCHEMA, READ_KEYS, REQUIRED_KEYS, described, float_keys, timestep_checked_keys


def float_dtype(batch: Mapping[str, Any]) -> jnp.dtype:
    """The dtype the pipeline computes in: float32, or float64 where a float key holds float64 (x64)."""
    return _checks.accumulation_dtype(*(batch[k] for k in float_keys(BATCH_SCHEMA) if k in batch))


def check_shapes(batch: Mapping[str, jax.Array], plan: AdvantagePlan) -> tuple[int, int]:
    """Trace-time checks of every key's dtype class and shape (``BATCH_SCHEMA``) and of the keys the
    estimator needs; returns ``(B, T)``."""
    _checks.check_rank("batch['attention_mask']", batch["attention_mask"], 2)
    shape = np.shape(batch["attention_mask"])
    for name, key in BATCH_SCHEMA.items():
        if name not in batch or name == "attention_mask":
            continue
        where = f"batch[{name!r}]"
        _checks.check_dtype_class(where, batch[name], key.dtype)
        if key.shape == "BT":
            _checks.check_shape(where, batch[name], shape, "attention_mask")
        elif key.shape == "B":
            _checks.check_shape(where, batch[name], shape[:1], "the batch axis")
        elif key.shape in ("G", "N"):
            _checks.check_rank(where, batch[name], 1)
        else:
            _checks.check_rank(where, batch[name], 2)
            if np.shape(batch[name])[0] != shape[0]:
                raise ValueError(f"{where} must be [B, K] with B = {shape[0]}, got {np.shape(batch[name])}")
        if key.like is not None:
            if key.like not in batch:
                raise ValueError(f"{where} goes with batch[{key.like!r}]; it needs them")
            _checks.check_shape(where, batch[name], np.shape(batch[key.like]), f"batch[{key.like!r}]")
    spec = plan.estimator_spec
    missing = tuple(name for name in spec.reads if name not in batch)
    if missing:
        raise ValueError(f"{spec.label} needs {described(spec.reads)}{spec.missing_hint}")
    return shape[0], shape[1]


def structure_checks(batch: Mapping[str, jax.Array], num_rows: int) -> list[_checks.ValueCheck]:
    """Value checks of the inputs themselves: every mask of the schema is bool or 0/1, groups add up."""
    masks = {name: jnp.asarray(batch[name]) for name, key in BATCH_SCHEMA.items()
             if key.dtype == "mask" and name in batch}
    summed = [name for name, mask in masks.items() if mask.ndim == 2 and mask.dtype != jnp.bool_]  # (in one pass)
    counts = dict(zip(summed, _checks.bad_entries([masks[name] for name in summed])))
    checks = [check for name, mask in masks.items()
              for check in _checks.mask_check(f"batch[{name!r}]", mask, counts=counts.get(name))]
    if "group_sizes" in batch:
        checks.append(group_sizes_check(batch["group_sizes"], num_rows))
    elif "group_ids" in batch:
        checks.append(group_ids_check(batch["group_ids"], num_rows))
    if "group_member_counts" in batch:
        checks.append(member_counts_check(batch["group_member_counts"]))
    return checks


def finite_checks(batch: Mapping[str, jax.Array], active: jax.Array, values: jax.Array, last_value: jax.Array,
                  truncated: jax.Array, plan: AdvantagePlan) -> list[_checks.ValueCheck]:
    """Every float input on positions or timesteps is finite where it is used, by ``BATCH_SCHEMA``'s
    ``finite`` rule: a ``trained`` key on the trained timesteps ``active`` (a key on positions as the stages
    read it, shifted to the next token), a ``reader`` key on timesteps where a stage reads it
    (``plan.reads``: the model outputs, OTB's ``rollout_is_weights``; one no stage reads may hold anything),
    and a truncated row's bootstrap value ``V[seqlen - 1]`` (one NaN there would reach every advantage
    through batch normalization). A model output a stage reads is also within its declared range
    (``bounds``: log-probs <= 0, ``sum_pi_squared`` in [0, 1], weights >= 0), as the session readers check it.
    The other keys' rules are kept where they are read: ``rows`` by the
    outcome stage (``batch['rewards']``), a ``reader`` key of turns or rows by its stage (GiGPO's
    ``turn_rewards``, the λ), ``nan_is_missing`` by GDPO's sources."""
    dtype = values.dtype
    read = []  # (name, the array as the stages read it: on timesteps, or on positions with the mask moved)
    for name in timestep_checked_keys(BATCH_SCHEMA):
        key = BATCH_SCHEMA[name]
        # (values: without a critic the pipeline's zeros, checked all the same, so the diagnostics keep one
        # structure whatever the batch holds)
        if (name not in batch and name != "values") or not (key.finite == "trained" or name in plan.reads):
            continue
        read.append((name, _checks.as_float(f"batch[{name!r}]", batch[name], dtype) if name in batch else values))
    # Every key's rows probed in one pass over the inputs as given (a key on positions is read where the
    # timestep mask, moved back one position, says: the same entries as its shifted copy, which is not made).
    # A model output a stage reads is probed for its declared range in the same pass.
    on_positions = shift_to_previous_position(active)
    bounded = [BATCH_SCHEMA[name].bounds is not None and BATCH_SCHEMA[name].finite == "reader" for name, _ in read]
    probes = []
    for (name, array), ranged in zip(read, bounded):
        used = on_positions if BATCH_SCHEMA[name].on == "positions" else active
        probes += [_checks.Probe(array, used)] + ([_checks.Probe(array, used, "bounds", BATCH_SCHEMA[name].bounds)]
                                                   if ranged else [])
    found = iter(_checks.probed_rows(probes))
    checks = []
    for (name, array), ranged in zip(read, bounded):
        key = BATCH_SCHEMA[name]
        if key.on == "positions":  # as the stages read it: on the next token's timestep
            array = shift_to_next_token(array)
        safe = jnp.where(active, array, jnp.zeros((), dtype))
        checks.append(_checks.finite_check(f"batch[{name!r}]", safe, active, hint=key.hint, bad_rows=next(found)))
        if ranged:  # a model output: its declared range too
            checks.append(_checks.bounds_check(f"batch[{name!r}]", safe, active, key.bounds, bad_rows=next(found)))
    checks.append(_checks.finite_check("batch['values'] (the bootstrap value V[seqlen - 1] of a truncated row)",
                                       last_value, truncated, key="values_bootstrap"))
    return checks


def warn_about_fallbacks(batch: Mapping[str, Any], plan: AdvantagePlan) -> None:
    """AReaL's fallbacks for keys a batch may leave out, said once per call."""
    if "is_truncated" not in batch:
        warnings.warn("batch has no 'is_truncated'; falling back to seqlen == width, which also marks a "
                      "complete row that exactly fills the padded width as truncated", stacklevel=3)
    if "ref_logprobs" not in batch and plan.kl.kl_ctl != 0:
        warnings.warn("batch has no 'ref_logprobs' but kl_ctl != 0: the KL reward uses a zero reference "
                      "log-prob (AReaL's rule), i.e. it rewards or penalizes the log-probs themselves; set "
                      "actor.kl_ctl: 0 to train without a KL term, or give the reference model's log-probs "
                      "(batch['ref_logprobs'], the sessions' output_ref_logprobs)",
                      stacklevel=3)


def prepared(batch: Any) -> tuple[dict[str, Any], tuple[int, int] | None]:
    """A caller's batch as the jitted pipeline takes it (``batch_arrays``, then ``padded_if_empty``), after
    checking that it is a mapping holding every required key."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of arrays, got {type(batch).__name__}")
    missing = [key for key in REQUIRED_KEYS if batch.get(key) is None]
    if missing:
        raise ValueError(f"batch is missing required keys {missing}")
    return padded_if_empty(batch_arrays(batch))


def batch_arrays(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The keys the pipeline reads, lists and scalars as arrays (as everywhere else); host anchor ids wider
    than JAX's integers made dense (exact) first."""
    arrays = {key: batch[key] if isinstance(batch[key], (np.ndarray, jax.Array)) or _checks.is_traced(batch[key])
              else np.asarray(batch[key]) for key in READ_KEYS if batch.get(key) is not None}
    if "anchor_ids" in arrays:
        arrays["anchor_ids"] = host_anchor_ids(arrays["anchor_ids"])
    return arrays


def padded_if_empty(arrays: dict[str, Any]) -> tuple[dict[str, Any], tuple[int, int] | None]:
    """A batch of no rows (every group filtered) or no timesteps, padded with one padding row (no attention,
    group id -1, or a group of its own) or timestep, and the real ``(B, T)`` to cut the outputs back to;
    ``None`` for a batch with both."""
    shape = np.shape(arrays["attention_mask"])
    if len(shape) != 2 or (shape[0] > 0 and shape[1] > 0):
        return arrays, None
    padded = {}
    for key, value in arrays.items():
        layout, fill = BATCH_SCHEMA[key].shape, BATCH_SCHEMA[key].fill
        xp = np if isinstance(value, np.ndarray) else jnp
        value = xp.asarray(value)
        if shape[0] == 0 and layout in ("BT", "B", "BK") and value.ndim >= 1:
            value = xp.concatenate([value, xp.full((1, *value.shape[1:]), fill, value.dtype)], axis=0)
        elif shape[0] == 0 and layout == "G" and not ("group_ids" in arrays and "group_sizes" not in arrays):
            value = xp.concatenate([value, xp.full((1,), fill, value.dtype)])
        if shape[1] == 0 and layout == "BT" and value.ndim == 2:
            value = xp.concatenate([value, xp.full((value.shape[0], 1), fill, value.dtype)], axis=1)
        padded[key] = value
    return padded, (shape[0], shape[1])
