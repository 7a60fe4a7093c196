"""Tree reward discount and TreeRL tree advantages (issue 22.1-22.2) against the float64 loops of
``tests/reference.py`` and the worked example of the authors' code."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference

from prm_jax.credit import tree_advantages, tree_discount


def random_forest(rng, nodes, roots=1):
    """Parents in a random order (not parents-first), ``roots`` trees."""
    order = rng.permutation(nodes)
    parent = np.full(nodes, -1, np.int32)
    for position in range(roots, nodes):
        parent[order[position]] = order[rng.integers(0, position)]
    return parent


def test_the_two_branch_leak_example():
    # AReaL's turn reward discount (areal-project/AReaL @ cbff54d6, areal/experimental/openai/cache.py; PR #1666's per-tree
    # rule): root -> A1 -> A2 (reward 1), root -> B1 (reward 0), inserted root, A1, B1, A2, gamma 0.9.
    parent = np.array([-1, 0, 0, 1], np.int32)   # root, A1, B1, A2
    raw = np.array([0.0, 0.0, 0.0, 1.0], np.float32)
    got = np.asarray(tree_discount(parent, raw, 0.9))
    np.testing.assert_allclose(got, [0.405, 0.9, 0.0, 1.0], rtol=1e-6)
    # AReaL's own running value leaks A2's reward into B1: 0.9 there, and 0.729 at the root.
    np.testing.assert_allclose(reference.areal_linear_discount(raw, 0.9), [0.729, 0.81, 0.9, 1.0], rtol=1e-12)


@pytest.mark.parametrize("nodes,roots", [(1, 1), (2, 1), (9, 1), (40, 3), (64, 1)])
def test_tree_discount_matches_the_loop(nodes, roots):
    rng = np.random.default_rng(nodes * 7 + roots)
    for _ in range(5):
        parent = random_forest(rng, nodes, roots)
        raw = rng.normal(size=nodes).astype(np.float32)
        gamma = float(rng.uniform(0, 1))
        np.testing.assert_allclose(tree_discount(parent, raw, gamma), reference.tree_discount(parent, raw, gamma),
                                   rtol=2e-5, atol=2e-6)


def test_a_single_chain_equals_the_linear_discount():
    rng = np.random.default_rng(1)
    raw = rng.normal(size=12).astype(np.float32)
    chain = np.arange(-1, 11, dtype=np.int32)  # node i's parent is i - 1
    np.testing.assert_allclose(tree_discount(chain, raw, 0.8), reference.areal_linear_discount(raw, 0.8), rtol=2e-6,
                               atol=1e-6)


def test_masked_nodes_and_padding_change_nothing():
    rng = np.random.default_rng(2)
    parent = random_forest(rng, 10, 2)
    raw = rng.normal(size=10).astype(np.float32)
    base = np.asarray(tree_discount(parent, raw, 0.7))
    padded_parent = np.concatenate([parent, [-1, 3, 11]]).astype(np.int32)  # padding hangs off a real node too
    padded_raw = np.concatenate([raw, [1e6, np.nan, -3.0]]).astype(np.float32)
    mask = np.arange(13) < 10
    got = np.asarray(tree_discount(padded_parent, padded_raw, 0.7, mask=mask))
    np.testing.assert_allclose(got[:10], base, rtol=1e-6, atol=1e-7)
    assert np.all(got[10:] == 0)


def test_bad_parents_are_named():
    for parent, match in (([-1, 5], "node 1 has parent 5"), ([1, 0], "chain that ends at a root"),
                          ([-1, 1], "node 1 has parent 1")):
        with pytest.raises(ValueError, match=match):
            tree_discount(np.array(parent, np.int32), np.zeros(2, np.float32), 0.5)
    with pytest.raises(ValueError, match="in use"):  # a used node whose parent is masked out
        tree_discount(np.array([-1, 0], np.int32), np.zeros(2, np.float32), 0.5, mask=np.array([False, True]))


@pytest.mark.parametrize("weighting", ["sqrt", "uniform", "none"])
@pytest.mark.parametrize("value", ["state_value", "value_only", "local_only"])
def test_tree_advantages_match_the_loop(weighting, value):
    rng = np.random.default_rng(hash((weighting, value)) % 2**32)
    for nodes, roots in ((7, 1), (30, 2), (64, 4)):
        parent = random_forest(rng, nodes, roots)
        reward = rng.integers(0, 2, nodes).astype(np.float32) + rng.normal(size=nodes).astype(np.float32) * 0.1
        group = np.zeros(nodes, np.int32)
        selected = rng.random(nodes) < 0.7
        got = tree_advantages(parent, reward, selected=selected, group=group, weighting=weighting, value=value)
        want = reference.tree_advantages(parent, reward, selected=selected, group=group, weighting=weighting,
                                         value=value)
        np.testing.assert_allclose(got.values, want, rtol=2e-5, atol=2e-6)


def test_groups_are_centred_separately_and_permuting_groups_permutes_the_output():
    rng = np.random.default_rng(5)
    a, b = random_forest(rng, 9, 2), random_forest(rng, 6, 1)
    parent = np.concatenate([a, np.where(b >= 0, b + 9, -1)]).astype(np.int32)
    group = np.array([0] * 9 + [1] * 6, np.int32)
    reward = rng.normal(size=15).astype(np.float32)
    both = np.asarray(tree_advantages(parent, reward, group=group).values)
    alone_a = np.asarray(tree_advantages(a, reward[:9]).values)
    alone_b = np.asarray(tree_advantages(b, reward[9:]).values)
    np.testing.assert_allclose(both, np.concatenate([alone_a, alone_b]), rtol=1e-6, atol=1e-7)
    swapped = np.concatenate([np.where(b >= 0, b, -1), np.where(a >= 0, a + 6, -1)]).astype(np.int32)
    out = np.asarray(tree_advantages(swapped, np.concatenate([reward[9:], reward[:9]]),
                                     group=np.array([1] * 6 + [0] * 9, np.int32)).values)
    np.testing.assert_allclose(out, np.concatenate([alone_b, alone_a]), rtol=1e-6, atol=1e-7)


def test_edge_cases_one_leaf_equal_rewards_deep_chain_wide_tree():
    # One leaf: every value 0 (TreeRL drops into a debugger there).
    np.testing.assert_array_equal(tree_advantages(np.array([-1, 0, 1], np.int32), np.ones(3, np.float32)).values, 0)
    # Equal rewards: all 0.
    wide = np.array([-1] + [0] * 31, np.int32)
    np.testing.assert_allclose(tree_advantages(wide, np.full(32, 0.5, np.float32)).values, 0, atol=1e-7)
    # A deep chain that branches at the end, and a wide tree: against the loop.
    deep = np.concatenate([np.arange(-1, 199), [199]]).astype(np.int32)  # 200-node chain, two leaves
    reward = np.zeros(201, np.float32)
    reward[199], reward[200] = 1.0, 0.0
    np.testing.assert_allclose(tree_advantages(deep, reward).values, reference.tree_advantages(deep, reward),
                               atol=1e-6)
    reward = np.random.default_rng(6).normal(size=32).astype(np.float32)
    np.testing.assert_allclose(tree_advantages(wide, reward).values, reference.tree_advantages(wide, reward),
                               rtol=1e-5, atol=1e-6)


def test_jit_vmap_bfloat16_and_no_retrace():
    rng = np.random.default_rng(7)
    parents = np.stack([random_forest(rng, 16, 2) for _ in range(3)])
    from prm_jax.kernels._tree import _tree_advantages_core, _tree_discount_core

    @jax.jit
    @chex.assert_max_traces(n=1)
    def batched(parent, reward):
        mask = jnp.ones(parent.shape, bool)
        zeros = jnp.zeros(parent.shape, jnp.int32)
        values = jax.vmap(lambda p, r, m, g: _tree_advantages_core(p, r, m, m, g, 16, "sqrt", "state_value").values)(
            parent, reward, mask, zeros)
        discounted = jax.vmap(lambda p, r, m: _tree_discount_core(p, r, m, jnp.float32(0.9)))(parent, reward, mask)
        return values, discounted

    for _ in range(2):  # new contents, one trace
        rewards = rng.normal(size=(3, 16)).astype(np.float32)
        values, discounted = batched(parents, rewards)
        for row in range(3):
            np.testing.assert_allclose(values[row], reference.tree_advantages(parents[row], rewards[row]),
                                       rtol=2e-5, atol=2e-6)
            np.testing.assert_allclose(discounted[row], reference.tree_discount(parents[row], rewards[row], 0.9),
                                       rtol=2e-5, atol=2e-6)
    low = rewards[0].astype(jnp.bfloat16)
    bf16 = tree_discount(parents[0], low, 0.9)
    assert bf16.dtype == jnp.float32
    np.testing.assert_allclose(bf16, reference.tree_discount(parents[0], np.asarray(low, np.float32), 0.9),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rewards", ["binary", "decimal"])
def test_treerl_fill_in_decides_exact_ties_exactly(rewards):
    # Issue 29.12: an exactly-zero local advantage came out as 1.49e-8, was not filled, and a node got -0.133
    # instead of -0.267 (2 of 270 random trees; 47 of these 900). Integer rewards: every sum is exact and a tie
    # an exact 0 (TreeRL's 1e-8 rule as it is); other rewards: the documented float32 tolerance (the loop
    # restates it in float64).
    rng = np.random.default_rng(29 + (rewards == "decimal"))
    size = 40  # every tree padded to one size (masked nodes): one compiled program per weighting
    for trial in range(100):
        nodes = int(rng.integers(3, size))
        parent = np.concatenate([random_forest(rng, nodes), np.full(size - nodes, -1)]).astype(np.int32)
        mask = np.arange(size) < nodes
        values = [0.0, 1.0] if rewards == "binary" else [0.3, 0.7, 0.1]
        reward = rng.choice(values, size).astype(np.float32)
        for weighting in ("sqrt", "uniform", "none"):
            got = np.asarray(tree_advantages(parent, reward, mask=mask, weighting=weighting).values)[:nodes]
            want = reference.tree_advantages(parent[:nodes], reward[:nodes], weighting=weighting)
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=f"tree {trial}, {weighting}")


def test_the_local_value_of_a_tie_is_exactly_zero():
    # Node 1's children 3 and 4 both have mean 1/3 over their leaves, as node 1 has: their local values are
    # exactly 0 (not float32 noise), so the fill-in gives them node 1's, -4/21 under weighting none.
    parent = np.array([-1, 0, 0, 1, 1, 3, 3, 3, 4, 4, 4, 2, 2], np.int32)
    reward = np.array([0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1], np.float32)
    out = tree_advantages(parent, reward, weighting="none", value="local_only")
    state = np.asarray(out.state_values)
    assert state[3] == state[4] == state[1]
    np.testing.assert_allclose(state[1], -4 / 21, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(out.local)[[3, 4]], np.asarray(out.local)[1])
    np.testing.assert_allclose(np.asarray(out.values), reference.tree_advantages(parent, reward, weighting="none",
                                                                                  value="local_only"), rtol=1e-6)
