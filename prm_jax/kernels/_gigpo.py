"""GiGPO: group-in-group advantages for multi-turn agents, as one jitted array program.

Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training" (2025, arXiv:2505.10978). Rows are
trajectories of GRPO groups; each row has up to ``K`` turns (steps) with a step reward ``r_{i,k}`` and an
anchor-state id (the environment state the turn acted on):

  episode  A^E_i = R_i - mean_g(R)                       (``mean_norm``)
                 = (R_i - mean_g(R)) / (std_g(R) + eps)  (``mean_std_norm``; std unbiased)
           statistics over the group's trajectories, or (``episode_stats="step"``, verl-agent's trainer)
           over its steps, each trajectory's outcome counted once per turn; a group of one entry has mean 0
           and std 1 (under ``step`` that is a single one-step trajectory: one trajectory of n >= 2 steps
           has n equal entries, mean R, so its episode advantage is 0, as in verl-agent).
  returns  R_{i,k} = sum_{j >= k} gamma^(j - k) r_{i,j} over the row's active turns (a reverse scan; an
           inactive turn consumes no discount)
  step     turns of one group with the same anchor id form a step group;
           A^S_{i,k} = R_{i,k} - mean(step group)  (or divided by std + eps, std unbiased, 1 for one member);
           a step group of one gives 0, a turn without an anchor (id -1) gives 0
  result   A_{i,k} = A^E_i + omega * A^S_{i,k} on active turns, 0 elsewhere.

Without anchor ids every active turn of a group is in one step group: discounted per-step returns
normalized across the group's steps (the special case of verifiers #1554 / Kevin, arXiv:2507.11948).

Per-turn-index normalization (MT-GRPO style: normalizing turn ``k`` across a group's ``k``-th turns) is
deliberately not offered: it is biased when the policy controls its number of turns (verl #7244).

Step groups are found on device: the ``(group, anchor)`` pairs are sorted (one value sort of the pair packed
beside the entry index, or two stable argsorts where it does not fit), each step group is then a
contiguous run, and its statistics are sorted segment sums, so no Python loop runs over turns. Anchor ids are any
integers (64-bit hashes, signed or unsigned, with x64 on; host arrays of them from an eager call with x64 off):
only -1 means "no anchor", and ids are compared whole, never truncated to 32 bits. Under ``jit`` with x64
off JAX has already made 64-bit inputs int32: map such hashes to dense ids first (``dense_anchor_ids``;
``pack_branches`` does).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from prm_jax._validation import finite_number, one_of, short_repr
from prm_jax.errors import ConfigError
from prm_jax.kernels import _checks
from prm_jax.kernels._estimator_contract import EstimatorSpec, SummaryHook, on_turn_timesteps
from prm_jax.kernels._normalization import NormConfig, group_layout, group_sizes_check, weighted_moments, z_score
from prm_jax.kernels._recurrence import ScanStrategy, StepGroupMethod, linear_recurrence, resolve_step_groups
from prm_jax.kernels._schema import is_anchor_id
from prm_jax.kernels._stage import StageResult
from prm_jax.kernels._turns import TurnSteps, turn_segments, turn_sums
from prm_jax.native import _ffi as ffi

GiGPONorm = Literal["mean_norm", "mean_std_norm"]
EpisodeStats = Literal["trajectory", "step"]
StepReward = Literal["mean", "sum", "last"]
STEP_REWARDS: tuple[StepReward, ...] = get_args(StepReward)


@dataclasses.dataclass(frozen=True)
class GiGPOConfig:
    """``actor.credit_assignment`` with ``mode: gigpo``; hashable, a static argument.

    Args:
        step_weight: ω, the weight of the step-level advantage beside the episode-level one (GiGPO's
            ``step_advantage_w``).
        step_discount: γ of the step returns within a trajectory, in [0, 1] (GiGPO's 0.95).
        norm: ``mean_norm`` (centre within each group) or ``mean_std_norm`` (and divide by its std).
        eps: Added to a group's std before dividing, >= 0.
        episode_stats: The episode groups' statistics over ``trajectory`` rows (verl-agent's) or over ``step``
            entries.
        step_reward: A step's reward from its turn's process rewards: ``mean``, ``sum`` or ``last``.

    Example:
        >>> credit = prm_jax.AdvantageConfig(credit_assignment={"mode": "gigpo", "step_weight": 0.5}).credit_assignment
        >>> type(credit).__name__, credit.step_weight, credit.norm
        ('GiGPOConfig', 0.5, 'mean_norm')
    """

    step_weight: float = 1.0        # omega
    step_discount: float = 0.95     # gamma over turns
    norm: GiGPONorm = "mean_norm"
    eps: float = 1e-6
    episode_stats: EpisodeStats = "trajectory"
    # A turn's step reward when none is given: its process rewards' mean (a scalar scorer's own value,
    # whatever the turn's length), sum, or value at its last trained timestep.
    step_reward: StepReward = "mean"

    def __post_init__(self):
        object.__setattr__(self, "step_weight", finite_number("step_weight", self.step_weight))
        object.__setattr__(self, "step_discount", finite_number("step_discount", self.step_discount,
                                                                minimum=0.0, maximum=1.0))
        object.__setattr__(self, "eps", finite_number("eps", self.eps, minimum=0.0))
        if self.norm not in ("mean_norm", "mean_std_norm"):
            raise ConfigError("norm", f"must be 'mean_norm' or 'mean_std_norm', got {short_repr(self.norm)}")
        if self.episode_stats not in ("trajectory", "step"):
            raise ConfigError("episode_stats", f"must be 'trajectory' or 'step', got {short_repr(self.episode_stats)}")
        one_of("step_reward", self.step_reward, STEP_REWARDS, config=True)


class GiGPOOutput(NamedTuple):
    """What ``gigpo`` returns: the combined per-turn advantages and their episode and step parts, the step
    returns, and each turn's step-group size.

    Attributes:
        episode_advantages: ``[B]`` the episode-level advantage ``A^E`` of each row.
        step_advantages: ``[B, K]`` the step-level advantage ``A^S`` of each turn.
        step_returns: ``[B, K]`` each turn's discounted step return.
        step_group_sizes: ``[B, K]`` the size of each turn's step group (0 for an inactive turn).

    Example:
        >>> out = prm_jax.credit.gigpo(np.array([[0.0, 1.0], [0.0, 0.0]], np.float32), np.ones((2, 2), bool),
        ...                            np.array([1.0, 0.0], np.float32), group_sizes=np.array([2]))
        ...
        >>> np.asarray(out.advantages, np.float64).round(3).tolist(), np.asarray(out.step_group_sizes).tolist()
        ([[0.962, 1.013], [-0.988, -0.988]], [[4, 4], [4, 4]])
    """

    advantages: jax.Array          # [B, K] A^E + omega A^S on active turns, 0 elsewhere
    episode_advantages: jax.Array  # [B]
    step_advantages: jax.Array     # [B, K]
    step_returns: jax.Array        # [B, K]
    step_group_sizes: jax.Array    # [B, K] members of each turn's step group (0 where none)


def dense_anchor_ids(anchor_ids: ArrayLike) -> np.ndarray:
    """Host helper: any 64-bit anchor ids (signed or unsigned state hashes; Python ints too, e.g. -1 beside
    hashes of 2**63 or more, which no numpy integer dtype holds together) to dense int32 ids; -1 stays -1.

    Args:
        anchor_ids: ``[B, K]`` anchor ids of any 64-bit integers (signed or unsigned hashes, Python ints), -1 for
            none.

    Example:
        >>> prm_jax.kernels.dense_anchor_ids(np.array([[2**62, -1, 7], [7, 2**62, -1]])).tolist()
        [[1, -1, 0], [0, 1, -1]]
    """
    ids = np.asarray(anchor_ids)
    if ids.dtype == object:
        if not all(map(is_anchor_id, ids.ravel().tolist())):
            raise ValueError("anchor_ids must be 64-bit integers, signed or unsigned, in [-2**63, 2**64 - 1]")
    elif not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"anchor_ids must be integers, got dtype {ids.dtype}")
    dense = np.full(ids.shape, -1, np.int32)
    has = ids != -1
    _, inverse = np.unique(ids[has], return_inverse=True)
    dense[has] = inverse.astype(np.int32)
    return dense


def _dense_anchors(anchors: jax.Array, anchored: jax.Array) -> jax.Array:
    """int32 ids ``>= 0`` that are equal exactly where the anchors are, ``-1`` where a turn has none.

    Ids that already fit (int32 or narrower, none negative) are used as they are; 64-bit or unsigned 32-bit
    ids, and negative ids other than -1, are ranked (one sort): the step-group sort and the native pass read
    non-negative int32 ids, and a cast would merge hashes that share their low 32 bits.
    """
    if anchors.size == 0:
        return jnp.full(anchors.shape, -1, jnp.int32)

    def rank(_: None) -> jax.Array:
        flat = anchors.ravel()
        order = jnp.argsort(flat)
        ordered = flat[order]
        new = jnp.concatenate([jnp.zeros(1, jnp.int32), (ordered[1:] != ordered[:-1]).astype(jnp.int32)])
        return jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.cumsum(new)).reshape(anchors.shape)

    dtype = jnp.dtype(anchors.dtype)
    if dtype.itemsize > 4 or dtype == jnp.uint32:
        dense = rank(None)
    else:
        narrow = anchors.astype(jnp.int32)
        dense = lax.cond(jnp.any(anchored & (narrow < 0)), rank, lambda _: narrow, None)
    return jnp.where(anchored, dense, jnp.full((), -1, jnp.int32))


def host_anchor_ids(anchor_ids: ArrayLike) -> ArrayLike:
    """What an eager caller passes, safe from JAX's int32 canonicalization: host (numpy or list) anchor ids
    wider than 32 bits become dense int32 ids when x64 is off (JAX would keep only their low 32 bits);
    anything else is returned as it is. Inside ``jit`` the arrays already have JAX's dtypes."""
    if isinstance(anchor_ids, jax.Array) or _checks.is_traced(anchor_ids):
        return anchor_ids
    ids = np.asarray(anchor_ids)
    if ids.dtype == object or (ids.dtype.kind in "iu" and ids.dtype.itemsize > 4
                               and not jax.config.read("jax_enable_x64")):
        return dense_anchor_ids(ids)  # (object: Python ints that share no numpy dtype; checked there)
    return anchor_ids


def _step_returns(rewards: jax.Array, active: jax.Array, gamma: float) -> jax.Array:
    """``R_k = r_k + gamma R_{k+1}`` over active turns; inactive turns carry the return unchanged, chosen by the
    platform it is lowered for: a sequential scan on the CPU, the associative form (log depth, no loop over
    the turns) on a GPU or TPU, where a scan over turns is one kernel launch per step."""
    return lax.platform_dependent(rewards, active, cpu=lambda r, a: step_returns(r, a, gamma, "scan"),
                                  default=lambda r, a: step_returns(r, a, gamma, "associative"))


def step_returns(rewards: jax.Array, active: jax.Array, gamma: float, method: str) -> jax.Array:
    """GiGPO's step returns as the affine recurrence ``R_k = c_k R_{k+1} + d_k`` (``c = gamma, d = r`` where
    active, ``c = 1, d = 0`` elsewhere; 0 after the last turn), by ``method`` (``scan`` or ``associative``:
    ``prm_jax.kernels._recurrence.linear_recurrence``); 0 at inactive turns."""
    dtype = rewards.dtype
    coeffs = jnp.where(active, jnp.asarray(gamma, dtype), jnp.ones((), dtype))
    offsets = jnp.where(active, rewards, jnp.zeros((), dtype))
    returns = linear_recurrence(coeffs, offsets, jnp.zeros(rewards.shape[:1], dtype), method)
    return jnp.where(active, returns, jnp.zeros((), dtype))


def _pair_order(group: jax.Array, anchor: jax.Array) -> jax.Array:
    """A permutation that sorts the entries by ``(group, anchor)``.

    Where the pair fits beside the entry's index in one int32 (the usual case: dense anchors), one plain
    sort of packed ``key << bits | index`` values does it (a value sort is several times faster than an
    argsort on XLA:CPU); otherwise two stable argsorts.
    """
    size = group.shape[0]
    bits = max(1, (size - 1).bit_length())
    span = jnp.max(anchor) + 2  # anchors from -1
    fits = (jnp.max(group).astype(jnp.float32) + 1) * span.astype(jnp.float32) < 2.0 ** (31 - bits)

    def packed(_):
        key = group * span + anchor + 1
        values = (key << bits) | jnp.arange(size, dtype=jnp.int32)
        return jnp.sort(values) & ((1 << bits) - 1)

    def stable(_):
        by_anchor = jnp.argsort(anchor, stable=True)
        return by_anchor[jnp.argsort(group[by_anchor], stable=True)].astype(jnp.int32)

    return lax.cond(fits, packed, stable, None)


def _step_advantages(returns: jax.Array, anchored: jax.Array, anchors: jax.Array, row_group: jax.Array,
                     config: GiGPOConfig, method: StepGroupMethod) -> tuple[jax.Array, jax.Array]:
    """Step advantages and step-group sizes, ``[B, K]`` each.

    With ``method="native"`` (the CPU's, ``resolve_step_groups``) the native kernel names each step group by
    its first entry in one hash-table pass. With ``sort`` the entries are sorted by ``(group, anchor)``: every
    step group is then a contiguous run, its statistics are sorted segment sums, and one scatter puts the
    results back in place.
    """
    rows, turns = returns.shape
    size = rows * turns
    flat_group = jnp.broadcast_to(row_group[:, None], anchors.shape).ravel()
    flat_anchor = jnp.where(anchored, anchors, -1).ravel()
    values = returns.ravel()
    if size == 0:  # (no step: no step group)
        return jnp.zeros((rows, turns), values.dtype), jnp.zeros((rows, turns), jnp.int32)
    if method == "native":
        step, sizes = _step_stats(values, flat_anchor < 0, ffi.step_groups(flat_group, flat_anchor), config)
    else:
        order = _pair_order(flat_group, flat_anchor)
        key_group, key_anchor, free = flat_group[order], flat_anchor[order], flat_anchor[order] < 0
        new = jnp.concatenate([jnp.ones(1, bool), (key_group[1:] != key_group[:-1])
                               | (key_anchor[1:] != key_anchor[:-1]) | free[1:]])
        sorted_step, sorted_sizes = _step_stats(values[order], free, jnp.cumsum(new) - 1, config, sorted_segments=True)
        unsorted = jnp.zeros((2, size), values.dtype).at[:, order].set(jnp.stack([sorted_step, sorted_sizes]))
        step, sizes = unsorted[0], unsorted[1]
    return step.reshape(rows, turns), sizes.reshape(rows, turns).astype(jnp.int32)


def _step_stats(values: jax.Array, free: jax.Array, segment: jax.Array, config: GiGPOConfig,
                sorted_segments: bool = False) -> tuple[jax.Array, jax.Array]:
    """``[N]`` step advantages and step-group sizes (0 for an entry without an anchor) from segment ids."""
    count, mean, std = weighted_moments(values, (~free).astype(values.dtype), segment, values.shape[0],
                                    indices_are_sorted=sorted_segments)
    sizes = jnp.where(free, 0.0, count)
    step = z_score(values, mean, std, config.eps, sizes <= 1, alone_rule="zero", scale=config.norm == "mean_std_norm")
    return step, sizes


def _gigpo_core(turn_rewards: jax.Array, turn_active: jax.Array, anchor_ids: jax.Array | None,
               outcome: jax.Array, row_group: jax.Array, num_groups: int, config: GiGPOConfig,
               real_rows: jax.Array | None = None, step_groups: StepGroupMethod = "sort") -> GiGPOOutput:
    """GiGPO on validated arrays (module docstring has the rules); ``real_rows [B]`` bool leaves padding
    rows out of the episode statistics (default: every row is real)."""
    dtype = turn_rewards.dtype
    rows, turns = turn_rewards.shape
    active_f = turn_active.astype(dtype)
    real = jnp.ones((rows,), dtype) if real_rows is None else real_rows.astype(dtype)
    # Episode statistics: per trajectory, or per step (each trajectory weighted by its turns).
    weights = jnp.sum(active_f, axis=1) if config.episode_stats == "step" else real
    count, mean, std = weighted_moments(outcome, weights, row_group, num_groups)
    # A group of one entry (one trajectory; under step statistics one step, as verl-agent counts) has mean 0
    # and std 1: the entry is its own outcome advantage.
    episode = z_score(outcome, mean, std, config.eps, count <= 1, alone_rule="itself",
                      scale=config.norm == "mean_std_norm")
    returns = _step_returns(turn_rewards, turn_active, config.step_discount)
    anchors = jnp.zeros((rows, turns), jnp.int32) if anchor_ids is None else anchor_ids
    anchored = turn_active & (anchors != -1)
    anchors = _dense_anchors(anchors, anchored)
    step, sizes = _step_advantages(returns, anchored, anchors, row_group, config, step_groups)
    advantages = jnp.where(turn_active, episode[:, None] + config.step_weight * step, 0.0)
    return GiGPOOutput(advantages, episode, step, returns, sizes)


def step_group_counts(step_group_sizes: jax.Array) -> dict[str, jax.Array]:
    """Exact int32 counts of the step groups behind ``GiGPOOutput.step_group_sizes`` (``[B, K]``, each
    anchored turn holding its group's size, 0 elsewhere): ``n_s`` turns of size ``s`` are ``n_s / s`` groups.

    ``gigpo/step_groups``: how many; ``gigpo/step_group_turns``: the turns in them;
    ``gigpo/step_groups_with_more_than_one``: those of two turns or more (a group of one gives no step
    advantage). ``compute_advantages`` with GiGPO returns them in its diagnostics."""
    sizes = step_group_sizes.ravel()
    turns_of_size = jnp.bincount(sizes, length=sizes.shape[0] + 1).astype(jnp.int32)  # n_s for s = 0..N
    size = jnp.arange(sizes.shape[0] + 1, dtype=jnp.int32)
    groups_of_size = turns_of_size // jnp.maximum(size, 1)
    anchored = size > 0
    return {"gigpo/step_groups": jnp.sum(jnp.where(anchored, groups_of_size, 0)),
            "gigpo/step_group_turns": jnp.sum(jnp.where(anchored, turns_of_size, 0)),
            "gigpo/step_groups_with_more_than_one": jnp.sum(jnp.where(size > 1, groups_of_size, 0))}


def gigpo(turn_rewards: ArrayLike, turn_mask: ArrayLike, outcome_rewards: ArrayLike, *,
          anchor_ids: ArrayLike | None = None, group_sizes: ArrayLike | None = None,
          config: GiGPOConfig = GiGPOConfig(),
          step_groups: StepGroupMethod | Literal["auto"] = "auto") -> GiGPOOutput:
    """GiGPO advantages per turn.

    Args:
      turn_rewards: ``[B, K]`` float, the step reward of each turn (e.g. the sum of its process rewards).
      turn_mask: ``[B, K]`` bool/0-1, the turns that exist (and are trained on).
      outcome_rewards: ``[B]`` float, each trajectory's outcome reward ``R_i``.
      anchor_ids: ``[B, K]`` int of any width, the anchor state of each turn (-1 alone: none); ``None``: one
        step group per GRPO group.
      group_sizes: ``[G]`` int, consecutive GRPO groups; ``None``: the batch is one group.
      config: ``GiGPOConfig`` (static).
      step_groups: how the step groups are found: ``native`` (the CPU's hash pass), ``sort`` (every
        backend), or ``auto`` (native where it runs); the same numbers.

    Returns:
      ``GiGPOOutput``; ``broadcast_turn_rewards(output.advantages, turn_ids)`` puts them on tokens.

    Example:
        >>> turn_rewards = np.array([[0.0, 1.0], [0.0, 0.0]], np.float32)     # two rollouts of one prompt, two turns
        >>> out = prm_jax.credit.gigpo(turn_rewards, np.ones((2, 2), bool), np.array([1.0, 0.0], np.float32),
        ...                            anchor_ids=np.array([[7, 8], [7, 9]]), group_sizes=np.array([2]))
        >>> np.asarray(out.episode_advantages, np.float64).round(3).tolist()
        [0.5, -0.5]
        >>> np.asarray(out.step_advantages, np.float64).round(3).tolist()
        [[0.475, 0.0], [-0.475, 0.0]]
    """
    if not isinstance(config, GiGPOConfig):
        raise TypeError(f"config must be a GiGPOConfig, got {type(config).__name__}")
    _checks.check_rank("turn_rewards", turn_rewards, 2)
    shape = np.shape(turn_rewards)
    _checks.check_shape("turn_mask", turn_mask, shape, "turn_rewards")
    _checks.check_shape("outcome_rewards", outcome_rewards, shape[:1], "turn_rewards' batch axis")
    if anchor_ids is not None:
        anchor_ids = host_anchor_ids(anchor_ids)
        _checks.check_shape("anchor_ids", anchor_ids, shape, "turn_rewards")
    if group_sizes is not None:
        group_sizes = jnp.asarray(group_sizes)
        _checks.check_rank("group_sizes", group_sizes, 1)
    return _checks.checked(_gigpo_jit, turn_rewards, turn_mask, outcome_rewards, anchor_ids, group_sizes,
                           config=config, step_groups=resolve_step_groups(step_groups))


@functools.partial(jax.jit, static_argnames=("config", "step_groups"))
def _gigpo_jit(turn_rewards, turn_mask, outcome_rewards, anchor_ids, group_sizes, *, config, step_groups):
    dtype = _checks.accumulation_dtype(turn_rewards, outcome_rewards)
    rewards = _checks.as_float("turn_rewards", turn_rewards, dtype)
    outcome = _checks.as_float("outcome_rewards", outcome_rewards, dtype)
    active = _checks.as_mask("turn_mask", turn_mask)
    anchors = None if anchor_ids is None else _checks.as_integer("anchor_ids", anchor_ids)
    rows = rewards.shape[0]
    checks = _checks.mask_check("turn_mask", turn_mask)
    if group_sizes is None:
        row_group, num_groups = jnp.zeros((rows,), jnp.int32), 1
    else:
        checks.append(group_sizes_check(group_sizes, rows))
        layout = group_layout(rows, NormConfig("group", "group"), group_sizes)
        row_group, num_groups = layout.row_group, layout.num_groups
    return _gigpo_core(rewards, active, anchors, outcome, row_group, num_groups, config, step_groups=step_groups), checks


def _gigpo_turns(batch: Mapping[str, Any], default: int) -> int:
    """``K``, GiGPO's turn slots: the width of its per-turn inputs, else ``default``."""
    for key in ("turn_rewards", "anchor_ids"):
        if key in batch:
            return int(np.shape(batch[key])[1])
    return default


def _estimate(stage: GiGPOConfig, batch: Mapping[str, jax.Array], outcome: jax.Array,
              process: jax.Array | None, active: jax.Array, turn_ids: jax.Array, turns: TurnSteps,
              row_group: jax.Array, num_groups: int, real_rows: jax.Array, num_turns: int,
              strategy: ScanStrategy, dtype: Any) -> StageResult:
    """GiGPO in place of GAE: per-turn advantages broadcast to each turn's active timesteps, and the step
    groups' counts (``step_group_counts``).

    Step rewards are ``batch['turn_rewards'] [B, K]`` where ``batch['turn_reward_mask'] [B, K]`` is True (all
    of them without a mask; each must be finite on a turn that exists: a failed scorer row's NaN is refused,
    never read as "derive"), else derived from each turn's process rewards by ``step_reward`` (``mean``,
    ``sum`` or ``last``); anchors are ``batch['anchor_ids'] [B, K]`` (none: one step group per GRPO group).
    """
    checks = []
    num_turns = _gigpo_turns(batch, num_turns)
    in_turn, segment = turn_segments(active, turn_ids, num_turns)
    counts = turn_sums(active.astype(dtype), in_turn, segment, num_turns)
    derived = _derived_step_rewards(process, turns, in_turn, segment, counts, num_turns, stage.step_reward)
    if "turn_rewards" in batch:
        given = _checks.as_float("batch['turn_rewards']", batch["turn_rewards"], dtype)
        use = (_checks.as_mask("batch['turn_reward_mask']", batch["turn_reward_mask"])
               if "turn_reward_mask" in batch else jnp.ones(given.shape, jnp.bool_))
        checks.append(_checks.finite_check(
            "batch['turn_rewards']", given, use & (counts > 0), axis="turn",
            hint=" (NaN is no step reward: a failed scorer row's, which is dropped, not trained on; mark the turns "
                 "whose step reward is to be derived False in batch['turn_reward_mask'])"))
        step_rewards = jnp.where(use, given, derived)
    else:
        step_rewards = derived
    anchors = _checks.as_integer("batch['anchor_ids']", batch["anchor_ids"]) if "anchor_ids" in batch else None
    per_turn = _gigpo_core(step_rewards, counts > 0, anchors, outcome, row_group, num_groups, stage, real_rows,
                           strategy.step_groups)
    return StageResult(on_turn_timesteps(per_turn.advantages, in_turn, turn_ids),
                       step_group_counts(per_turn.step_group_sizes), tuple(checks))


def _derived_step_rewards(process: jax.Array | None, turns: TurnSteps, in_turn: jax.Array, segment: jax.Array,
                          counts: jax.Array, num_turns: int, rule: str) -> jax.Array:
    """GiGPO's step reward of each turn from its process rewards: their ``mean``, ``sum`` or ``last``."""
    if process is None:
        return jnp.zeros(counts.shape, counts.dtype)
    if rule == "last":
        return turn_sums(jnp.where(turns.ends, process, jnp.zeros((), process.dtype)), in_turn, segment, num_turns)
    total = turn_sums(process, in_turn, segment, num_turns)
    return total if rule == "sum" else total / jnp.maximum(counts, 1)


def step_group_stats(diagnostics: Mapping[str, Any]) -> dict[str, float]:
    """GiGPO's step groups, from the counts ``compute_advantages`` returns with GiGPO (the kernel's own step
    groups: the turns of one GRPO group with the same anchor id, without anchors all of the group's turns,
    only turns with trained timesteps): how many, their mean size, the share with more than one turn."""
    count = int(diagnostics["gigpo/step_groups"])
    turns = int(diagnostics["gigpo/step_group_turns"])
    more = int(diagnostics["gigpo/step_groups_with_more_than_one"])
    return {"count": count, "mean_size": turns / count if count else 0.0,
            "share_with_more_than_one": more / count if count else 0.0}


def _step_groups_line(stats: Mapping[str, float]) -> str:
    return (f"GiGPO step groups: {stats['count']}, mean size {stats['mean_size']:.2f}, "
            f"{stats['share_with_more_than_one']:.0%} with more than one turn")


GIGPO = EstimatorSpec(GiGPOConfig, _estimate, "credit_assignment 'gigpo'", mode="gigpo", reads=("turn_ids",),
                      may_read=("turn_rewards", "turn_reward_mask", "anchor_ids"), needs_turn_ids=True,
                      diagnostics="gigpo/", turn_slots=_gigpo_turns,
                      summary=SummaryHook("gigpo_step_groups", step_group_stats, _step_groups_line),
                      # (mean_norm: after decoupled's z-scores an all-equal group's outcomes are float32 noise,
                      # which a std normalization with eps 1e-6 would amplify a millionfold; test_gigpo covers
                      # mean_std_norm)
                      example={"credit_assignment": {"mode": "gigpo", "step_weight": 0.7, "step_discount": 0.9,
                                                     "norm": "mean_norm", "step_reward": "last"}})
