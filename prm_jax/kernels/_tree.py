"""Credit over a session tree: AReaL's tree reward discount and TreeRL's tree advantages.

A tree (or a forest) is ``parent [N]``: each node's parent index, ``-1`` for a root; ``mask [N]`` marks the
nodes in use (padding nodes are ignored and come out as 0). Parents need not come before children; a
node whose parent chain does not end at a root (a cycle) or whose parent is out of range or masked out is
an error (``ValueError`` eagerly, a count under ``jit``). Both passes are bottom-up or top-down sweeps
repeated until nothing changes (tree height + 1 segment sums), so no Python loop runs over nodes.

``tree_discount`` (AReaL's turn reward discount (areal-project/AReaL @ cbff54d6, areal/experimental/openai/cache.py; PR #1666's
per-tree rule); prm-jax's rules where the originals disagree (the credit-assignment guide states each), AReaL PR #1666's rule):
``r(n) = raw(n) + gamma * mean_c r(c)``
over ``n``'s own children (a leaf keeps ``raw``); separate roots are separate trees, and on a single
chain it equals AReaL's linear discount. AReaL's own discount runs one value over the insertion order and
leaks reward across branches (root -> A1 -> A2 (reward 1), root -> B1 (reward 0), gamma 0.9: AReaL gives
B1 0.9; this rule gives B1 0, A1 0.9, root 0.405).

``tree_advantages`` (TreeRL, Hou et al. 2025; THUDM/TreeRL @ f0edbea6, openrlhf/trainer/ppo_utils/tree_node.py); prm-jax's rules
where the originals disagree (the credit-assignment guide states each)), per group of nodes (a group is one
prompt's forest; leaves are the nodes without children):

  centring   R~_l = R_l - (S - R_l) / (N_L - 1) over the group's N_L leaves (one leaf: every value 0)
  subtree    A(n) = sum of R~ over the leaves below n, c(n) their number, k(n) the selected ones
  weighting  A(n) / sqrt(k(n)) (``sqrt``), A(n) / k(n) (``uniform``), A(n) (``none``); k(n) = 0: A(n)
  value      V(n) = A(n) / c(n); a root's parent is the group's synthetic root over all its leaves
  local      l(n) = V(n) - V(parent(n)); below the first node of a path a node with no local signal takes
             its parent's (filled) local value (TreeRL's fill-in, ``|l(n)| < 1e-8`` in its float64): here
             ``|l(n)| < max(1e-8, 8 eps32 * the scale of the rewards involved)``, never an exact comparison
  output     ``state_value`` l(n) + V(n) (TreeRL's released script), ``value_only`` V(n),
             ``local_only`` l(n)
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

from prm_jax._validation import one_of
from prm_jax.kernels import _checks
from prm_jax.kernels._estimator_contract import EstimatorSpec, on_turn_timesteps
from prm_jax.kernels._stage import StageResult
from prm_jax.kernels._turns import turn_segments, turns_present

TreeWeighting = Literal["sqrt", "uniform", "none"]
TreeValue = Literal["state_value", "value_only", "local_only"]
TREE_WEIGHTINGS: tuple[TreeWeighting, ...] = get_args(TreeWeighting)
TREE_VALUES: tuple[TreeValue, ...] = get_args(TreeValue)
FILL_IN_EPS = 1e-8


@dataclasses.dataclass(frozen=True)
class TreeCredit:
    """``actor.credit_assignment`` with ``mode: tree``; hashable, a static argument.

    Args:
        weighting: How a node's subtree sum ``A(n)`` is weighted by its selected leaves ``k(n)``: ``sqrt`` (``A /
            sqrt(k)``, TreeRL's), ``uniform`` (``A / k``) or ``none``.
        value: A node's advantage: ``state_value`` (``l(n) + V(n)``, TreeRL's script), ``value_only`` (``V(n)``) or
            ``local_only`` (``l(n)``).

    Example:
        >>> prm_jax.AdvantageConfig(credit_assignment={"mode": "tree", "weighting": "uniform"}).credit_assignment
        TreeCredit(weighting='uniform', value='state_value')
    """

    weighting: TreeWeighting = "sqrt"
    value: TreeValue = "state_value"

    def __post_init__(self):
        one_of("weighting", self.weighting, TREE_WEIGHTINGS, config=True)
        one_of("value", self.value, TREE_VALUES, config=True)


class TreeAdvantages(NamedTuple):
    """What ``tree_advantages`` returns per node: the value its tokens get, V(n), the local signal l(n), its
    leaf count and the centred leaf rewards (the module docstring gives each formula).

    Attributes:
        values: ``[N]`` the value each node's tokens get (by ``value``).
        state_values: ``[N]`` V(n), the node's mean centred leaf reward.
        local: ``[N]`` l(n), the node's local signal ``V(n) - V(parent)``.
        leaf_counts: ``[N]`` c(n), the leaves below each node.
        centred: ``[N]`` the centred leaf rewards (at leaves; 0 elsewhere).

    Example:
        >>> out = prm_jax.credit.tree_advantages(np.array([-1, 0, 0]), np.array([0.0, 1.0, 0.0]))
        >>> np.asarray(out.leaf_counts).tolist(), np.asarray(out.state_values, np.float64).round(3).tolist()
        ([2, 1, 1], [0.0, 1.0, -1.0])
    """

    values: jax.Array        # [N] the value each node's tokens get (``value`` mode), 0 at masked nodes
    state_values: jax.Array  # [N] V(n)
    local: jax.Array         # [N] l(n) after the fill-in
    leaf_counts: jax.Array   # [N] int32 c(n)
    centred: jax.Array       # [N] R~ at leaves, 0 elsewhere


def children_sum(x: jax.Array, parent: jax.Array, mask: jax.Array) -> jax.Array:
    """``[N]``: the sum of ``x`` over each node's children in use."""
    size = parent.shape[0]
    index = jnp.where(mask & (parent >= 0), parent, size)
    return jax.ops.segment_sum(jnp.where(mask, x, jnp.zeros((), x.dtype)), index, num_segments=size + 1)[:size]


def _until_stable(step, x: jax.Array, bound: int) -> jax.Array:
    """``x = step(x)`` until nothing changes (NaN equal to NaN), at most ``bound`` times."""
    def same(a, b):
        return jnp.all((a == b) | (jnp.isnan(a) & jnp.isnan(b))) if jnp.issubdtype(a.dtype, jnp.floating) else (
            jnp.all(a == b))

    def cond(state):
        i, _, changed = state
        return changed & (i < bound)

    def body(state):
        i, old, _ = state
        new = step(old)
        return i + 1, new, ~same(new, old)

    return lax.while_loop(cond, body, (0, x, jnp.asarray(True)))[1]


def subtree_sums(x: jax.Array, parent: jax.Array, mask: jax.Array) -> jax.Array:
    """``[N]``: ``x`` summed over each node's subtree (itself included), on validated arrays."""
    own = jnp.where(mask, x, jnp.zeros((), x.dtype))
    return _until_stable(lambda s: own + children_sum(s, parent, mask), own, parent.shape[0] + 1)


def tree_check(parent: jax.Array, mask: jax.Array) -> _checks.ValueCheck:
    """Every node in use has parent -1 or a node in use other than itself, and its chain reaches a root."""
    size = parent.shape[0]
    in_range = (parent >= -1) & (parent < size)
    safe = jnp.where(in_range, parent, -1)
    parent_used = jnp.where(safe >= 0, mask[jnp.maximum(safe, 0)], True)
    bad = mask & (~in_range | (parent == jnp.arange(size)) | ~parent_used)
    # Pointer jumping: after ceil(log2 N) + 1 doublings a chain that ends at a root has reached it.
    up = safe
    for _ in range(max(1, size.bit_length()) + 1):
        up = jnp.where(up >= 0, up[jnp.maximum(up, 0)], up)
    bad = bad | (mask & (up >= 0))
    node = _checks.first_true(bad)
    return _checks.ValueCheck(
        "tree_parent_invalid", _checks.violations(bad),
        lambda node, value: f"parent must give every node in use a parent -1 (a root) or another node in use, "
                            f"on a chain that ends at a root; node {int(node)} has parent {int(value)}",
        node, parent[node])


def _tree_discount_core(parent: jax.Array, raw: jax.Array, mask: jax.Array, gamma: jax.Array) -> jax.Array:
    """``tree_discount`` on validated arrays."""
    zero = jnp.zeros((), raw.dtype)
    raw = jnp.where(mask, raw, zero)
    children = children_sum(jnp.ones_like(raw), parent, mask)

    def step(r):
        mean = children_sum(r, parent, mask) / jnp.maximum(children, 1)
        return raw + gamma * jnp.where(children > 0, mean, zero)

    return jnp.where(mask, _until_stable(step, raw, parent.shape[0] + 1), zero)


def _tree_advantages_core(parent: jax.Array, leaf_reward: jax.Array, mask: jax.Array, selected: jax.Array,
                         group: jax.Array, num_groups: int, weighting: TreeWeighting,
                         value: TreeValue) -> TreeAdvantages:
    """``tree_advantages`` on validated arrays; ``group [N]`` in ``[0, num_groups)``.

    The fill-in rule asks whether a node has a local signal. TreeRL asks ``|l(n)| < 1e-8`` in float64; in
    float32 a local value that is 0 in exact arithmetic comes out as 0 or as rounding noise of the order of
    ``eps32`` times the rewards' scale, depending on how XLA fuses the program around it (the same tree gave
    exact zeros alone and 1.49e-8 inside ``compute_advantages``). So "no local signal" is decided with a
    tolerance, never by an exact comparison: ``|l(n)| < max(1e-8, TIE_ULPS * eps * scale)``, the scale being
    the mean absolute reward below the node and its parent and over the group (weighted as the values are).
    The subtree sums are taken of the raw leaf rewards (``A(n) = (N R(n) - c(n) S) / (N - 1)`` with ``R(n)``
    the sum of the rewards below ``n``, ``c(n)`` their number, ``S`` and ``N`` the group's), which keeps them
    exact for integer rewards. A real local value of a group of N leaves with integer rewards is at least
    about ``1 / N**2`` (above the band for groups of up to ~1,000 leaves), so the decisions are TreeRL's.
    """
    dtype = leaf_reward.dtype
    zero = jnp.zeros((), dtype)
    leaf = mask & (children_sum(jnp.ones_like(leaf_reward), parent, mask) == 0)
    selected = leaf & selected
    reward = jnp.where(leaf, leaf_reward, zero)

    def per_group(x):
        return jax.ops.segment_sum(jnp.where(leaf, x, zero), group, num_segments=num_groups)

    total, leaves = per_group(reward), per_group(jnp.ones_like(leaf_reward))
    peers = (leaves - 1)[group]
    below_sum = subtree_sums(reward, parent, mask)
    counts = subtree_sums(leaf.astype(dtype), parent, mask)
    chosen = subtree_sums(selected.astype(dtype), parent, mask)
    spread = leaves[group] * below_sum - counts * total[group]          # (N - 1) A(n), exact for exact sums
    alone = peers <= 0                                                  # a group of one leaf: every value 0
    scale = jnp.where(alone, zero, 1 / jnp.maximum(peers, 1))
    centred = jnp.where(leaf, spread, zero) * scale
    root_k = jax.ops.segment_sum(selected.astype(dtype), group, num_segments=num_groups)

    def weighted(mean, k):
        if weighting == "sqrt":
            return jnp.where(k > 0, mean / jnp.sqrt(jnp.maximum(k, 1)), mean)
        if weighting == "uniform":
            return jnp.where(k > 0, mean / jnp.maximum(k, 1), mean)
        return mean

    state = jnp.where(mask, weighted(spread / jnp.maximum(counts, 1), chosen) * scale, zero)
    # The synthetic root holds every leaf of the group: N S - N S = 0 exactly, whatever the weighting.
    root_state = weighted(jnp.zeros_like(root_k), root_k)
    above = jnp.where(parent >= 0, state[jnp.maximum(parent, 0)], root_state[group])
    local = jnp.where(mask, state - above, zero)
    magnitude = subtree_sums(jnp.abs(reward), parent, mask) / jnp.maximum(counts, 1) + (
        per_group(jnp.abs(reward)) / jnp.maximum(leaves, 1))[group]
    magnitude = weighted(magnitude, chosen) * jnp.where(alone, zero, leaves[group] * scale)
    noise = TIE_ULPS * jnp.finfo(dtype).eps * (magnitude + jnp.where(parent >= 0, magnitude[jnp.maximum(parent, 0)],
                                                                     magnitude))
    tie = jnp.abs(local) < jnp.maximum(noise, FILL_IN_EPS)
    keep = (parent < 0) | ~tie
    filled = _until_stable(lambda f: jnp.where(keep, local, f[jnp.maximum(parent, 0)]), local, parent.shape[0] + 1)
    filled = jnp.where(mask, filled, zero)
    out = {"state_value": filled + state, "value_only": state, "local_only": filled}[value]
    return TreeAdvantages(jnp.where(mask, out, zero), state, filled, counts.astype(jnp.int32), centred)


TIE_ULPS = 8  # a local value within this many float32 epsilons of the rewards' scale has no local signal


def _tree_inputs(parent: ArrayLike, mask: ArrayLike | None, like: ArrayLike, like_name: str):
    _checks.check_rank("parent", parent, 1)
    _checks.check_shape(like_name, like, np.shape(parent), "parent")
    if mask is not None:
        _checks.check_shape("mask", mask, np.shape(parent), "parent")


def tree_discount(parent: ArrayLike, raw_reward: ArrayLike, gamma: ArrayLike, *,
                  mask: ArrayLike | None = None) -> jax.Array:
    """AReaL's tree reward discount, per tree: ``r(n) = raw(n) + gamma * mean over n's children of r``.

    Args:
      parent: ``[N]`` int, each node's parent index, -1 for a root.
      raw_reward: ``[N]`` float, each node's own reward (0 where none was set, as AReaL's None).
      gamma: the turn discount in [0, 1].
      mask: ``[N]`` bool, the nodes in use (default all); masked nodes come out as 0.

    Returns:
      ``[N]`` float32 (float64 for float64 input) discounted rewards.

    Example:
        >>> rewards = prm_jax.credit.tree_discount(np.array([-1, 0, 0]), np.array([0.0, 1.0, 0.0]), 0.9)
        >>> np.asarray(rewards, np.float64).round(3).tolist()
        [0.45, 1.0, 0.0]
    """
    _tree_inputs(parent, mask, raw_reward, "raw_reward")
    if np.shape(parent)[0] == 0:  # no node: nothing to discount (an empty result, as every credit kernel's)
        return jnp.zeros((0,), _checks.accumulation_dtype(raw_reward))
    return _checks.checked(_discount_jit, parent, raw_reward, gamma, mask)


@jax.jit
def _discount_jit(parent, raw_reward, gamma, mask):
    dtype = _checks.accumulation_dtype(raw_reward)
    parent = _checks.as_int("parent", parent)
    used = jnp.ones(parent.shape, jnp.bool_) if mask is None else _checks.as_mask("mask", mask)
    raw = _checks.as_float("raw_reward", raw_reward, dtype)
    return _tree_discount_core(parent, raw, used, jnp.asarray(gamma, dtype)), [tree_check(parent, used)]


def tree_advantages(parent: ArrayLike, leaf_reward: ArrayLike, *, mask: ArrayLike | None = None,
                    selected: ArrayLike | None = None, group: ArrayLike | None = None,
                    weighting: TreeWeighting = "sqrt", value: TreeValue = "state_value") -> TreeAdvantages:
    """TreeRL's tree advantages per node (module docstring has the rules).

    Args:
      parent: ``[N]`` int, each node's parent, -1 for a root (a node is a maximal unbranched run of turns, or
        a turn: an unbranched chain of turns gets its run's values either way).
      leaf_reward: ``[N]`` float, the outcome reward at each leaf (read only at leaves).
      mask: ``[N]`` bool, the nodes in use (default all).
      selected: ``[N]`` bool, the selected leaves for the weighting (default every leaf).
      group: ``[N]`` int in ``[0, N)``, each node's group (one prompt's forest; default one group): leaves are
        centred within their group and a root's parent is its group's synthetic root.
      weighting: ``sqrt | uniform | none`` (``TreeCredit.weighting``).
      value: ``state_value | value_only | local_only`` (``TreeCredit.value``).

    Returns:
      ``TreeAdvantages``: per-node ``values`` (what each node's tokens get), ``state_values``, ``local``,
      ``leaf_counts`` and the ``centred`` leaf rewards.

    Example:
        >>> parent = np.array([-1, 0, 0, 1, 1])                 # a root, two children, the first with two leaves
        >>> leaf_reward = np.array([0.0, 0.0, 0.0, 1.0, 0.0], np.float32)
        >>> out = prm_jax.credit.tree_advantages(parent, leaf_reward)
        >>> np.asarray(out.values, np.float64).round(3).tolist()
        [0.0, 0.354, -1.0, 1.823, -1.177]
    """
    one_of("weighting", weighting, TREE_WEIGHTINGS)
    one_of("value", value, TREE_VALUES)
    _tree_inputs(parent, mask, leaf_reward, "leaf_reward")
    for name, x in (("selected", selected), ("group", group)):
        if x is not None:
            _checks.check_shape(name, x, np.shape(parent), "parent")
    if np.shape(parent)[0] == 0:  # no node: empty results (as every credit kernel's), of one node's dtypes
        one = jax.eval_shape(functools.partial(_advantages_jit, weighting=weighting, value=value),
                             jax.ShapeDtypeStruct((1,), jnp.int32),
                             jax.ShapeDtypeStruct((1,), _checks.accumulation_dtype(leaf_reward)), None, None, None)[0]
        return TreeAdvantages(*(jnp.zeros((0,), x.dtype) for x in one))
    return _checks.checked(_advantages_jit, parent, leaf_reward, mask, selected, group, weighting=weighting,
                           value=value)


@functools.partial(jax.jit, static_argnames=("weighting", "value"))
def _advantages_jit(parent, leaf_reward, mask, selected, group, *, weighting, value):
    dtype = _checks.accumulation_dtype(leaf_reward)
    parent = _checks.as_int("parent", parent)
    size = parent.shape[0]
    used = jnp.ones(parent.shape, jnp.bool_) if mask is None else _checks.as_mask("mask", mask)
    chosen = jnp.ones(parent.shape, jnp.bool_) if selected is None else _checks.as_mask("selected", selected)
    groups = jnp.zeros(parent.shape, jnp.int32) if group is None else _checks.as_int("group", group)
    checks = [tree_check(parent, used)]
    bad_group = used & ((groups < 0) | (groups >= max(size, 1)))
    checks.append(_checks.ValueCheck("tree_group_invalid", _checks.violations(bad_group),
                                     lambda: f"group must be in [0, {size}) at every node in use"))
    reward = _checks.as_float("leaf_reward", leaf_reward, dtype)
    out = _tree_advantages_core(parent, reward, used, chosen, jnp.clip(groups, 0, max(size, 1) - 1), max(size, 1),
                               weighting, value)
    return out, checks


def _estimate(stage: TreeCredit, batch: Mapping[str, jax.Array], outcome: jax.Array,
              active: jax.Array, turn_ids: jax.Array, real_rows: jax.Array, row_group: jax.Array, dtype: Any) -> StageResult:
    """TreeRL over each group's session tree: ``batch['node_ids'] [B, K]`` names the node of each row's
    turn ``k`` (-1: none) in ``batch['node_parents'] [N]`` (-1: a root); a row's outcome reward is the reward
    of its last node, which must be a leaf, and no two rows end at one node. Each turn's timesteps get its
    node's value."""
    checks = []
    node_ids = _checks.as_int("batch['node_ids']", batch["node_ids"])
    parents = _checks.as_int("batch['node_parents']", batch["node_parents"])
    rows, turns = node_ids.shape
    size = parents.shape[0]
    in_turn, segment = turn_segments(active, turn_ids, turns)
    trained = turns_present(in_turn, segment, turns)
    # Every trained turn names a node, and every id names a node of node_parents (or is -1: none).
    stray = real_rows[:, None] & ((node_ids < -1) | (node_ids >= size))
    unnamed = trained & (node_ids == -1)
    count = _checks.violations(stray | unnamed)
    where_row, where_turn, bad_id = _checks.located(count, lambda: _checks.first_flagged(stray | unnamed, node_ids))
    checks.append(_checks.ValueCheck(
        "tree_node_ids_invalid", count,
        lambda row, turn, node: f"credit_assignment 'tree': batch['node_ids'] row {int(row)}, turn {int(turn)} has "
                                f"node id {int(node)}, " + (f"which is not a node of batch['node_parents'] ({size} nodes)"
                                                           if int(node) != -1 else "but the turn is trained: every "
                                                           "trained turn needs its node"), where_row, where_turn, bad_id))
    has = (node_ids >= 0) & (node_ids < size) & real_rows[:, None]
    flat = jnp.where(has, node_ids, size).ravel()
    used = jax.ops.segment_max(jnp.ones(flat.shape, jnp.int32), flat, num_segments=size + 1)[:size] > 0
    row_groups = jnp.broadcast_to(row_group[:, None], has.shape).ravel()
    group = jax.ops.segment_max(row_groups, flat, num_segments=size + 1)[:size]
    mixed = used & (jax.ops.segment_min(row_groups, flat, num_segments=size + 1)[:size] != group)
    # Each row is a path from a root: its first node is a root, each next turn is the same node or a child.
    safe_ids = jnp.clip(node_ids, 0, size - 1)
    above = jnp.where(has, parents[safe_ids], -2)
    before = jnp.concatenate([jnp.full((rows, 1), -1, jnp.int32), jnp.where(has, node_ids, -3)[:, :-1]], axis=1)
    first = has & (jnp.cumsum(has, axis=1) == 1)
    off_path = has & jnp.where(first, above != -1, (node_ids != before) & (above != before))
    checks.append(_checks.ValueCheck(
        "tree_paths_invalid", _checks.violations(off_path | mixed[jnp.clip(node_ids, 0, size - 1)] & has),
        lambda: "credit_assignment 'tree': each row's batch['node_ids'] must run from a root down "
                "batch['node_parents'] (each next turn the same node or a child of it), and a node belongs to "
                "one group"))
    last_turn = jnp.max(jnp.where(has, jnp.arange(turns, dtype=jnp.int32)[None, :], -1), axis=1)
    last_node = jnp.where(last_turn >= 0, jnp.take_along_axis(node_ids, jnp.maximum(last_turn, 0)[:, None],
                                                               axis=1)[:, 0], size)
    ends = jax.ops.segment_sum(jnp.ones((rows,), jnp.int32), last_node, num_segments=size + 1)[:size]
    reward = jax.ops.segment_sum(outcome, last_node, num_segments=size + 1)[:size]
    checks.append(tree_check(parents, used))
    children = children_sum(jnp.ones(size, jnp.int32), parents, used)
    bad_end = used & (((ends > 0) & (children > 0)) | (ends > 1) | ((ends == 0) & (children == 0)))
    node = _checks.first_true(bad_end)
    checks.append(_checks.ValueCheck(
        "tree_leaves_invalid", _checks.violations(bad_end),
        lambda node: f"credit_assignment 'tree': every leaf of batch['node_parents'] must be the last node of exactly "
                     f"one row, and no row may end at a node with children; node {int(node)} breaks this", node))
    tree = _tree_advantages_core(parents, reward, used, used, jnp.clip(group, 0, size - 1), max(size, 1),
                                stage.weighting, stage.value)
    per_turn = jnp.where(has, tree.values[jnp.clip(node_ids, 0, size - 1)], jnp.zeros((), dtype))
    leaves = used & (children == 0)
    diagnostics = {"tree/nodes": jnp.sum(used, dtype=jnp.int32), "tree/leaves": jnp.sum(leaves, dtype=jnp.int32)}
    return StageResult(on_turn_timesteps(per_turn, in_turn, turn_ids), diagnostics, tuple(checks))


TREE = EstimatorSpec(TreeCredit, _estimate, "credit_assignment 'tree'", mode="tree",
                     reads=("turn_ids", "node_ids", "node_parents"), needs_turn_ids=True, diagnostics="tree/",
                     turn_slots=lambda batch, num_turns: int(np.shape(batch["node_ids"])[1]),
                     missing_hint=" (pack_branches(..., sessions=...) builds them)", units=("token",),
                     example={"credit_assignment": {"mode": "tree", "weighting": "sqrt"}})
