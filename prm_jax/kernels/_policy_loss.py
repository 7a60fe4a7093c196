"""The loss side of a PPO/GRPO step, on the timesteps the advantages live on (AReaL's ``ppo_actor_loss_fn``).

``logprobs_on_timesteps(logits, input_ids)``: at timestep ``t`` the log-prob of token ``t + 1`` under
``logits[:, t]`` (0 in the last column), the alignment ``compute_advantages`` uses.

``ppo_clip_loss``, per trained timestep, with ``r = exp(logp - logp_prox)`` (0 where untrained):

  l1 = -A r,   l2 = -A clip(r, 1 - eps_clip, 1 + eps_clip_higher),   pg = max(l1, l2)
  dual clip (``c_clip > 1``):  pg = min(pg, sign(A) c_clip A)
  decoupled PPO (``old_logprobs``, the behaviour policy's): pg *= w = exp(logp_prox - logp_old), with w = 0
  where it exceeds ``behav_imp_weight_cap`` (those timesteps drop out)

then aggregated (``loss_agg_mode``): ``token-mean`` (sum over trained timesteps / their count),
``seq-mean-token-mean`` (each row's token mean, then the mean over rows with a trained timestep),
``seq-mean-token-sum`` (each row's sum, then that mean over rows). Advantages and the proximal and
behaviour log-probs are constants (stop-gradient); gradients flow through ``logprobs`` only.

The gradient is torch's, as AReaL computes it (torch's gradient rules, as verl's and AReaL's losses get them (torch.clamp: 1
strictly inside, 0 at a bound and beyond; torch.min/max: 1/2 each at a tie)): ``d pg / d logp = -A r k k_c``
with ``k = 1`` inside the clip range and on the unclipped side, 0 on the clipped side and 1/2 at exactly a
bound (``torch.clamp`` passes nothing there; the max's tie halves), and for the dual clip ``k_c = 1``, 1/2 at
a tie, 0 where it cuts. Where a term is not taken its ratio is never differentiated, so a clipped timestep
whose log-ratio overflows ``exp`` (above ~88.7 in float32, ~709.8 in float64: ``log_max``, the bound of the
input's dtype) gives a finite gradient where the loss is finite (AReaL's own gives NaN there); where the loss
itself is infinite no gradient flows through the overflowed ratio.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax._validation import finite_number, integer, integer_dtype, one_of, short_repr
from prm_jax.kernels import _checks

LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
#: verl's ``loss_agg_mode`` names ``ppo_clip_loss`` takes (derived from ``LossAggMode``).
LOSS_AGG_MODES: tuple[LossAggMode, ...] = get_args(LossAggMode)
AggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]


class GlobalBatch(NamedTuple):
    """verl's global batch info of one optimizer step (verl's agg_loss with global batch info (verl-project/verl @ 1dda039b,
    core_algos.py agg_loss); prm-jax's rules where verl's break (the credit-assignment guide states each)), for a loss computed
    on a piece
    of it (a micro-batch on one of ``dp_size`` data-parallel ranks): ``batch_num_tokens`` the trained tokens of
    the whole mini-batch (over every rank), ``global_batch_size`` its rows (empty ones included: what
    ``global_batch_info`` gives). ``None``: the piece's own counts (``dp_size`` 1 only). The pieces' losses,
    summed over micro-batches and averaged over ranks, are then the mini-batch's loss in every mode.

    Example:
        >>> info = prm_jax.losses.global_batch_info(np.array([[0, 1, 1], [0, 1, 0]], bool), dp_size=2)
        >>> prm_jax.losses.GlobalBatch(**info)
        GlobalBatch(dp_size=2, batch_num_tokens=3, global_batch_size=2)
    """

    dp_size: int = 1
    batch_num_tokens: Any = None
    global_batch_size: Any = None


def global_batch_info(loss_mask: ArrayLike, dp_size: int = 1) -> dict[str, Any]:
    """The global batch keywords of every policy loss for a mini-batch whose whole ``loss_mask [B, T]`` is
    given (on one host, or all-gathered): ``dp_size``, ``batch_num_tokens`` (its trained tokens) and
    ``global_batch_size`` (its rows, empty ones included, as verl's trainer counts ``ppo_mini_batch_size x
    rollout.n``).

    Example:
        >>> mini_batch_mask = np.array([[0, 1, 1], [0, 1, 0], [0, 0, 0]], bool)
        >>> info = prm_jax.losses.global_batch_info(mini_batch_mask, dp_size=4)
        >>> info["dp_size"], int(info["batch_num_tokens"]), int(info["global_batch_size"])
        (4, 3, 3)
    """
    integer("dp_size", dp_size, minimum=1)
    mask = np.asarray(loss_mask)
    _checks.check_rank("loss_mask", mask, 2)
    return {"dp_size": dp_size, "batch_num_tokens": int(np.count_nonzero(mask)), "global_batch_size": mask.shape[0]}


def checked_global_batch(mode: str, dp_size: int, batch_num_tokens: Any,
                         global_batch_size: Any) -> GlobalBatch:
    """The global batch keywords checked for ``mode``: ``dp_size`` an integer >= 1; with ``dp_size > 1`` the
    count the mode divides by must be given (``batch_num_tokens`` for the token modes, ``global_batch_size``
    for the sequence ones), as verl requires; a given count is an integer (a Python or numpy integer, or an
    integer array: never a bool, a float, an infinity or a NaN) and, known before tracing, >= 0. That it is at
    least what the piece itself holds is ``global_batch_checks``' (eagerly raised, under jit counted)."""
    integer("dp_size", dp_size, minimum=1)
    needed = "batch_num_tokens" if mode.startswith("token") else "global_batch_size"
    given = {"batch_num_tokens": batch_num_tokens, "global_batch_size": global_batch_size}
    if dp_size > 1 and given[needed] is None and mode != "token-sum":
        raise ValueError(f"{needed} (of the whole mini-batch) is required with dp_size > 1 under loss_agg_mode "
                         f"{mode!r}: each rank's pieces would otherwise divide by their own counts")
    for name, value in given.items():
        if value is None:
            continue
        dtype = value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype
        if isinstance(value, bool) or not np.issubdtype(dtype, np.integer) or np.ndim(value) != 0:
            raise TypeError(f"{name} must be an integer count (a scalar, not a bool or a float), got "
                            f"{short_repr(value)}")
        concrete = _checks.concrete_scalar(value)
        if concrete is not None and concrete < 0:
            raise ValueError(f"{name} must be a count >= 0, got {short_repr(value)}")
    return GlobalBatch(dp_size, batch_num_tokens, global_batch_size)


def global_batch_checks(mask: jax.Array, global_batch: GlobalBatch) -> list[_checks.ValueCheck]:
    """A given count is at least what the piece itself holds (``batch_num_tokens`` its trained tokens,
    ``global_batch_size`` its rows): a smaller one would multiply the piece's loss (a mini-batch holds its
    pieces)."""
    own = {"batch_num_tokens": (jnp.sum(mask, dtype=jnp.int32), "trained tokens"),
           "global_batch_size": (jnp.asarray(mask.shape[0], jnp.int32), "rows")}
    checks = []
    for name, (held, what) in own.items():
        given = getattr(global_batch, name)
        if given is None:
            continue
        count = jnp.asarray(given).astype(jnp.int32)
        checks.append(_checks.ValueCheck(
            f"{name}_below_piece", (count < held).astype(jnp.int32),
            lambda count, held, name=name, what=what: f"{name} (of the whole mini-batch) must be at least the piece's "
            f"own {what}, {int(held)}; got {int(count)}", count, held))
    return checks


def aggregate(losses: jax.Array, mask: jax.Array, mode: AggMode, loss_scale_factor: float | None = None,
              global_batch: GlobalBatch = GlobalBatch(), row_epsilon: bool = True) -> jax.Array:
    """verl's ``agg_loss`` of per-token ``losses [B, T]`` over the trained timesteps (``mask``), NaN-safe at
    padding (a ``where``), with the global batch info of verl's agg_loss with global batch info (verl-project/verl @ 1dda039b,
    core_algos.py agg_loss) (``global_batch``) and prm-jax's
    empty-batch rule (a count of 0 divides as 1):

    - ``token-mean``: ``sum(M L) / N * dp_size`` (``N`` the mini-batch's trained tokens, else the piece's);
      ``token-sum``: ``sum(M L) * dp_size``;
    - ``seq-mean-token-sum``: the sum over non-empty rows of each row's sum, ``/ G * dp_size`` (``G`` the
      mini-batch's rows, else the piece's non-empty rows); ``seq-mean-token-sum-norm``: that divided by
      ``loss_scale_factor``, or by the padded width ``T``;
    - ``seq-mean-token-mean``: the sum over non-empty rows of ``row sum / (n_b + 1e-8)`` (verl's; with
      ``row_epsilon`` False AReaL's ``row sum / n_b``), ``/ G * dp_size``.
    """
    zero = jnp.zeros((), losses.dtype)
    kept = jnp.where(mask, losses, zero)
    scale = jnp.asarray(global_batch.dp_size, losses.dtype)

    def divided(total: jax.Array, local: jax.Array, given: Any) -> jax.Array:
        count = local if given is None else jnp.asarray(given).astype(losses.dtype)
        return total / jnp.maximum(count, 1) * scale

    if mode == "token-mean":
        return divided(jnp.sum(kept), jnp.sum(mask, dtype=jnp.int32).astype(losses.dtype), global_batch.batch_num_tokens)
    if mode == "token-sum":
        return jnp.sum(kept) * scale
    per_row = jnp.sum(mask, axis=1, dtype=jnp.int32).astype(losses.dtype)
    present = per_row > 0
    rows = jnp.sum(present, dtype=jnp.int32).astype(losses.dtype)
    sums = jnp.sum(kept, axis=1)
    if mode == "seq-mean-token-mean":
        sums = sums / (per_row + 1e-8 if row_epsilon else jnp.maximum(per_row, 1))
    loss = divided(jnp.sum(jnp.where(present, sums, zero)), rows, global_batch.global_batch_size)
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (losses.shape[1] if loss_scale_factor is None else loss_scale_factor)
    return loss


class PPOLossStats(NamedTuple):
    """Means over trained timesteps (scalars), and the value checks' violation counts.

    Attributes:
        clip_fraction: The share of trained timesteps where the clip was taken.
        dual_clip_fraction: The share where the dual clip cut (``A < 0``).
        approx_kl: The mean of ``proximal_logprobs - logprobs``.
        importance_weight: The mean importance ratio.
        behav_imp_weight: The mean behaviour importance weight (decoupled PPO; 1 without ``old_logprobs``).
        behav_kept_fraction: The share of timesteps the behaviour cap kept.

    Example:
        >>> logprobs, old = np.log(np.array([[0.5, 0.9]], np.float32)), np.log(np.array([[0.5, 0.5]], np.float32))
        >>> advantages, mask = np.array([[1.0, 1.0]], np.float32), np.ones((1, 2), bool)
        >>> loss, stats = prm_jax.losses.ppo_clip_loss(logprobs, old, advantages, mask, eps_clip=0.2)
        >>> round(float(stats.clip_fraction), 4), round(float(stats.importance_weight), 4)
        (0.5, 1.4)
    """

    clip_fraction: jax.Array       # share where the clipped term was taken (l1 < l2)
    dual_clip_fraction: jax.Array  # share where the dual clip was taken
    approx_kl: jax.Array           # mean of logp - logp_prox
    importance_weight: jax.Array   # mean of r
    behav_imp_weight: jax.Array    # mean of w over the timesteps kept (1 without old_logprobs)
    behav_kept_fraction: jax.Array  # share of trained timesteps the cap kept
    # "checks/loss_mask_not_binary": entries of a numeric loss_mask that are neither 0 nor 1 (an eager call
    # raises instead; under jit the count comes back here, as compute_advantages' checks do).
    checks: dict[str, jax.Array] = {}  # (replaced by ppo_clip_loss, never mutated)


def logprobs_on_timesteps(logits: ArrayLike, input_ids: ArrayLike) -> jax.Array:
    """``[B, T]`` float32: ``log_softmax(logits[:, t])[input_ids[:, t + 1]]``, 0 in the last column.

    Args:
      logits: ``[B, T, V]``, the policy's logits at each position (predicting the next token).
      input_ids: ``[B, T]`` int, the tokens, each in ``[0, V)``: an eager call refuses one outside
        (``ValueError`` naming the row and position); under ``jit`` its log-prob is NaN (JAX's fill rule for
        an out-of-range gather), never the log-prob of a clipped id.

    Example:
        >>> logits = np.zeros((1, 3, 4), np.float32)            # [B, T, vocab]: uniform over 4 tokens
        >>> input_ids = np.array([[0, 2, 3]])
        >>> np.asarray(prm_jax.losses.logprobs_on_timesteps(logits, input_ids), np.float64).round(4).tolist()
        [[-1.3863, -1.3863, 0.0]]
    """
    _checks.check_rank("logits", logits, 3)
    _checks.check_shape("input_ids", input_ids, np.shape(logits)[:2], "logits' first two axes")
    if not _checks.is_traced(input_ids):
        ids = np.asarray(input_ids)
        integer_dtype("input_ids", ids.dtype)
        vocab = np.shape(logits)[2]
        bad = (ids[:, 1:] < 0) | (ids[:, 1:] >= vocab)  # the first column is never a predicted token
        if bad.any():
            row, position = np.argwhere(bad)[0]
            raise ValueError(f"input_ids must hold token ids in [0, {vocab}) (the logits' vocabulary); row {row}, "
                             f"position {position + 1} holds {int(ids[row, position + 1])}")
    return _logprobs_jit(logits, input_ids)


@jax.jit
def _logprobs_jit(logits, input_ids):
    dtype = _checks.accumulation_dtype(logits)
    logp = jax.nn.log_softmax(_checks.as_float("logits", logits, dtype), axis=-1)
    ids = _checks.as_int("input_ids", input_ids)
    following = jnp.concatenate([ids[:, 1:], jnp.zeros_like(ids[:, :1])], axis=1)
    picked = jnp.take_along_axis(logp, following[..., None], axis=-1, mode="fill", fill_value=jnp.nan)[..., 0]
    last = lax.broadcasted_iota(jnp.int32, picked.shape, 1) == picked.shape[1] - 1
    return jnp.where(last, jnp.zeros((), dtype), picked)


def log_max(dtype: Any) -> float:
    """The largest ``x`` whose ``exp`` is finite in ``dtype`` (~88.7 in float32, ~709.8 in float64): the
    bound follows the input's dtype, so a float64 loss keeps the gradients float64 can hold."""
    return float(np.log(float(jnp.finfo(dtype).max)))


def _clipped_objective(advantages: jax.Array, log_ratio: jax.Array, mask: jax.Array, low: float, high: float,
                       c_clip: float | None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The per-timestep clipped objective ``pg`` (value and torch's gradient, module docstring), the ratio,
    and where the clip and the dual clip were taken."""
    zero = jnp.zeros((), log_ratio.dtype)
    one, half = jnp.ones((), log_ratio.dtype), jnp.full((), 0.5, log_ratio.dtype)
    fixed = lax.stop_gradient(log_ratio)
    ratio = jnp.where(mask, jnp.exp(fixed), zero)
    l1, l2 = -advantages * ratio, -advantages * jnp.clip(ratio, low, high)
    value = jnp.maximum(l1, l2)
    inside = (ratio > low) & (ratio < high)
    factor = jnp.where(l1 > l2, one, jnp.where(l1 < l2, zero, jnp.where(inside, one, half)))
    dual = jnp.zeros_like(mask)
    if c_clip is not None:
        l3 = jnp.sign(advantages) * c_clip * advantages
        dual = mask & (l3 < value)
        factor = factor * jnp.where(value < l3, one, jnp.where(value > l3, zero, half))
        value = jnp.minimum(value, l3)
    # Only where the ratio's term is taken is it differentiated, from a log-ratio that cannot overflow.
    live = mask & (factor > 0) & (fixed < log_max(log_ratio.dtype))
    live_ratio = jnp.exp(jnp.where(live, log_ratio, zero))
    slope = jnp.where(live, -advantages * factor, zero)
    pg = value + slope * (live_ratio - lax.stop_gradient(live_ratio))
    return jnp.where(mask, pg, zero), ratio, mask & (l1 < l2), dual


def _ppo_clip_loss_core(logprobs: jax.Array, proximal_logprobs: jax.Array, advantages: jax.Array, mask: jax.Array,
                       old_logprobs: jax.Array | None, eps_clip: float, eps_clip_higher: float | None,
                       c_clip: float | None, behav_imp_weight_cap: float | None,
                       loss_agg_mode: LossAggMode, global_batch: GlobalBatch = GlobalBatch()
                       ) -> tuple[jax.Array, PPOLossStats]:
    """``ppo_clip_loss`` on validated float arrays and a bool mask."""
    zero = jnp.zeros((), logprobs.dtype)
    advantages = lax.stop_gradient(advantages)
    proximal_logprobs = lax.stop_gradient(proximal_logprobs)
    log_ratio = jnp.where(mask, logprobs - proximal_logprobs, zero)
    high = 1.0 + (eps_clip if eps_clip_higher is None else eps_clip_higher)
    pg, ratio, clip_mask, dual_mask = _clipped_objective(advantages, log_ratio, mask, 1.0 - eps_clip, high, c_clip)
    kept = mask
    weight = jnp.where(mask, jnp.ones((), logprobs.dtype), zero)
    if old_logprobs is not None:
        behav = jnp.exp(jnp.where(mask, proximal_logprobs - lax.stop_gradient(old_logprobs), zero))
        kept = mask & (behav <= behav_imp_weight_cap) if behav_imp_weight_cap is not None else mask
        weight = jnp.where(kept, behav, zero)
    pg = jnp.where(mask, pg * weight, zero)
    count = jnp.maximum(jnp.sum(mask, dtype=jnp.int32), 1).astype(logprobs.dtype)
    loss = aggregate(pg, mask, loss_agg_mode, global_batch=global_batch, row_epsilon=False)

    def share(flags):
        return jnp.sum(flags, dtype=jnp.int32).astype(logprobs.dtype) / count

    kept_count = jnp.maximum(jnp.sum(kept, dtype=jnp.int32), 1).astype(logprobs.dtype)
    stats = PPOLossStats(share(clip_mask), share(dual_mask), jnp.sum(lax.stop_gradient(log_ratio)) / count,
                         jnp.sum(ratio) / count, jnp.sum(weight) / kept_count, share(kept))
    return loss, stats


def check_token_arrays(logprobs: ArrayLike, **others: ArrayLike | None) -> None:
    """A loss's ``[B, T]`` inputs: ``logprobs`` of rank 2, and each of ``others`` given (not None) of its shape;
    the errors name the argument."""
    _checks.check_rank("logprobs", logprobs, 2)
    shape = np.shape(logprobs)
    for name, x in others.items():
        if x is not None:
            _checks.check_shape(name, x, shape, "logprobs")


def ppo_clip_loss(logprobs: ArrayLike, proximal_logprobs: ArrayLike, advantages: ArrayLike, loss_mask: ArrayLike, *,
                  old_logprobs: ArrayLike | None = None, eps_clip: float = 0.2, eps_clip_higher: float | None = None,
                  c_clip: float | None = None, behav_imp_weight_cap: float | None = None,
                  loss_agg_mode: LossAggMode = "token-mean", dp_size: int = 1, batch_num_tokens: Any = None,
                  global_batch_size: Any = None) -> tuple[jax.Array, PPOLossStats]:
    """AReaL's PPO clipped actor loss (module docstring), differentiable in ``logprobs``.

    Args:
      logprobs: ``[B, T]`` the current policy's log-probs on timesteps (``logprobs_on_timesteps``).
      proximal_logprobs: ``[B, T]`` the recomputed old log-probs (``AdvantageOutput.logprobs`` when
        ``compute_advantages`` got ``prox_logprobs``, else the behaviour log-probs it shifted).
      advantages, loss_mask: ``[B, T]`` from ``compute_advantages`` (``AdvantageOutput.advantages``,
        ``.loss_mask``).
      old_logprobs: ``[B, T]`` the behaviour policy's log-probs, for decoupled PPO (default: none).
      eps_clip, eps_clip_higher: the clip range ``[1 - eps_clip, 1 + eps_clip_higher]`` (default symmetric).
      c_clip: the dual clip (> 1), or None.
      behav_imp_weight_cap: with ``old_logprobs``, timesteps whose behaviour weight exceeds it drop out.
      loss_agg_mode: ``token-mean | seq-mean-token-mean | seq-mean-token-sum``.
      dp_size, batch_num_tokens, global_batch_size: verl's global batch info, for a micro-batch of a larger
        mini-batch (``global_batch_info``; ``GlobalBatch``): the micro-batches' losses summed, and averaged
        over ``dp_size`` ranks, are the mini-batch's loss.

    Returns:
      ``(loss, PPOLossStats)``, float32 scalars.

    Raises:
      ValueError: a ``loss_mask`` entry that is neither 0 nor 1 (bool masks are never checked), when called
        eagerly; under ``jit`` the count is ``stats.checks["checks/loss_mask_not_binary"]``.

    Example:
        >>> logprobs = np.log(np.array([[0.5, 0.6]], np.float32))
        >>> old = np.log(np.array([[0.5, 0.5]], np.float32))
        >>> loss, stats = prm_jax.losses.ppo_clip_loss(logprobs, old, np.array([[1.0, 1.0]], np.float32),
        ...                                            np.ones((1, 2), bool), eps_clip=0.1)
        >>> round(float(loss), 4), round(float(stats.clip_fraction), 2)
        (-1.05, 0.5)
    """
    one_of("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    eps_clip = finite_number("eps_clip", eps_clip, minimum=0.0)
    if eps_clip_higher is not None:
        eps_clip_higher = finite_number("eps_clip_higher", eps_clip_higher, minimum=0.0)
    if c_clip is not None and finite_number("c_clip", c_clip) <= 1.0:
        raise ValueError(f"c_clip must be > 1, got {c_clip!r}")
    if behav_imp_weight_cap is not None:
        behav_imp_weight_cap = finite_number("behav_imp_weight_cap", behav_imp_weight_cap, minimum=0.0)
    check_token_arrays(logprobs, proximal_logprobs=proximal_logprobs, advantages=advantages, loss_mask=loss_mask,
                       old_logprobs=old_logprobs)
    counts = checked_global_batch(loss_agg_mode, dp_size, batch_num_tokens, global_batch_size)
    # Eagerly a failed check raises; under jit its count is in stats.checks.
    return _checks.checked(_loss_jit, logprobs, proximal_logprobs, advantages, loss_mask, old_logprobs,
                           counts.batch_num_tokens, counts.global_batch_size, eps_clip=eps_clip,
                           eps_clip_higher=eps_clip_higher, c_clip=c_clip, behav_imp_weight_cap=behav_imp_weight_cap,
                           loss_agg_mode=loss_agg_mode, dp_size=dp_size, on_trace="counts")


@functools.partial(jax.jit, static_argnames=("eps_clip", "eps_clip_higher", "c_clip", "behav_imp_weight_cap",
                                             "loss_agg_mode", "dp_size"))
def _loss_jit(logprobs, proximal_logprobs, advantages, loss_mask, old_logprobs, batch_num_tokens=None,
              global_batch_size=None, *, eps_clip, eps_clip_higher, c_clip, behav_imp_weight_cap, loss_agg_mode,
              dp_size=1):
    dtype = _checks.accumulation_dtype(logprobs, proximal_logprobs, advantages)
    old = None if old_logprobs is None else _checks.as_float("old_logprobs", old_logprobs, dtype)
    mask = _checks.as_mask("loss_mask", loss_mask)
    counts = GlobalBatch(dp_size, batch_num_tokens, global_batch_size)
    loss, stats = _ppo_clip_loss_core(_checks.as_float("logprobs", logprobs, dtype),
                                     _checks.as_float("proximal_logprobs", proximal_logprobs, dtype),
                                     _checks.as_float("advantages", advantages, dtype),
                                     mask, old, eps_clip, eps_clip_higher, c_clip, behav_imp_weight_cap,
                                     loss_agg_mode, counts)
    return _checks.counted(loss, stats, [*_checks.mask_check("loss_mask", loss_mask),
                                         *global_batch_checks(mask, counts)])
