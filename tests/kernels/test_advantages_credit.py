"""Issue 22 through ``compute_advantages``: each credit mode reached from configuration equals the float64
loop of ``tests/reference.py`` on the timesteps the pipeline uses (KL off: ``kl_ctl=0``)."""

import re
import warnings

import numpy as np
import pytest
import reference
from batches import make_batch

from prm_jax import compute_advantages
from prm_jax.config import AdvantageConfig, ConfigError
from prm_jax.estimators import credit_modes


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def on_timesteps(batch):
    """The pipeline's own view: trained timesteps m, shifted turn ids and process rewards, the outcome step."""
    active = reference.shift((batch["loss_mask"] > 0) & (batch["attention_mask"] > 0), fill=False)
    turn_ids = reference.shift(batch["turn_ids"], fill=-1)
    process = np.where(active, reference.shift(batch["token_rewards"]), 0.0)
    seqlen = batch["attention_mask"].sum(axis=1)
    return active, turn_ids, process, np.maximum(seqlen - 2, 0)


def grouped(rng, rows=8, width=24, size=4, **kwargs):
    batch = make_batch(rng, rows=rows, width=width, **kwargs)
    batch["group_sizes"] = np.full(rows // size, size)
    return batch, np.arange(rows) // size


@pytest.mark.parametrize("whiten", [True, False])
def test_pure_through_the_pipeline(whiten):
    rng = np.random.default_rng(31)
    batch, groups = grouped(rng, uniform=True)
    config = AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "pure", "temperature": 0.2, "verifier_coef": 0.5,
                                                "whiten": whiten})
    out = compute_advantages(batch, config)
    active, turn_ids, process, outcome_step = on_timesteps(batch)
    want, _ = reference.pure(process, batch["rewards"], active, turn_ids, outcome_step, groups, 0.2, 0.5, whiten)
    np.testing.assert_allclose(out.advantages, want, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(out.returns, np.asarray(out.advantages) + batch["values"], rtol=1e-6, atol=1e-6)
    assert int(out.diagnostics["pure/groups_of_one"]) == 0


def test_prime_through_the_pipeline():
    rng = np.random.default_rng(32)
    batch, groups = grouped(rng)
    batch["prm_logprobs"] = (-np.abs(batch["ref_logprobs"] + rng.normal(0, 0.3, batch["ref_logprobs"].shape))
                             ).astype(np.float32)  # (log-probs: <= 0, the schema's range)
    config = AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "prime", "beta": 0.1, "lam": 0.5, "use_gt": True})
    plain = {k: v for k, v in batch.items() if k != "token_rewards"}
    out = compute_advantages(plain, config)
    active, _, _, _ = on_timesteps(batch)
    want, _, _ = reference.prime(batch["prm_logprobs"], batch["ref_logprobs"], batch["rewards"], active, groups,
                                 beta=0.1, lam=0.5, use_gt=True)
    np.testing.assert_allclose(out.advantages, want, rtol=2e-4, atol=2e-4)
    with pytest.raises(ValueError, match=re.escape("needs batch['prm_logprobs']")):
        compute_advantages({k: v for k, v in plain.items() if k != "prm_logprobs"}, config)
    lonely = dict(plain, group_sizes=np.array([4, 3, 1]))
    with pytest.raises(ValueError, match="groups of at least two rows"):
        compute_advantages(lonely, config)


def test_decoupled_reward_norm_through_the_pipeline():
    rng = np.random.default_rng(33)
    batch, groups = grouped(rng, with_process=False, with_values=False)
    sources = rng.normal(size=(8, 2)).astype(np.float32)
    sources[rng.random((8, 2)) < 0.3] = np.nan
    batch["reward_sources"] = sources
    config = AdvantageConfig(kl_ctl=0.0, reward_norm={"mode": "decoupled", "weights": [1.0, 0.5, 2.0]})
    out = compute_advantages(batch, config)
    want = reference.decoupled(np.concatenate([batch["rewards"][:, None], sources], axis=1), [1.0, 0.5, 2.0], groups)
    _, _, _, outcome_step = on_timesteps(dict(batch, token_rewards=np.zeros_like(batch["logprobs"])))
    got = np.asarray(out.tot_rewards)[np.arange(8), outcome_step]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match=re.escape("reward_norm.weights has 2 entries but there are 3")):
        compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, reward_norm={"mode": "decoupled", "weights": [1, 1]}))


@pytest.mark.parametrize("uniform", [False, True])  # per-token rewards (spread from turn ends), or a scalar per turn
def test_min_form_process_reward_transform_through_the_pipeline(uniform):
    rng = np.random.default_rng(34)
    batch = make_batch(rng, rows=6, width=24, with_values=False, uniform=uniform)
    batch["rewards"] = np.zeros(6, np.float32)  # no outcome, no values, no KL: advantages = the shaped P'
    config = AdvantageConfig(kl_ctl=0.0, process_reward_transform={"mode": "min_form", "temperature": 0.3})
    out = compute_advantages(batch, config)
    active, turn_ids, process, _ = on_timesteps(batch)
    ends = reference.turn_ends(active, turn_ids)
    r = reference.min_form(np.where(ends, process, 0.0), ends, 0.3)
    want = np.zeros_like(r)
    for b in range(6):  # each turn's reward over its timesteps: from each turn end back to the turn's start
        value = 0.0
        for t in reversed(range(24)):
            if ends[b, t]:
                value = r[b, t]
            if active[b, t]:
                want[b, t] = value
    np.testing.assert_allclose(out.advantages, want, rtol=2e-5, atol=1e-6)


def tree_batch():
    """Two groups of branching sessions: group 0 root 0 -> 1 -> {2, 3}, 0 -> 4; group 1 root 5 -> 6, 5 -> 7 -> 8."""
    paths = [[0, 1, 2], [0, 1, 3], [0, 4], [5, 6], [5, 7, 8]]
    parents = np.array([-1, 0, 1, 1, 0, -1, 5, 5, 7] + [-1] * 6, np.int32)
    rows, width, turns = len(paths), 12, 3
    node_ids = np.full((rows, turns), -1, np.int32)
    attention = np.zeros((rows, width), np.int32)
    loss = np.zeros((rows, width), np.int32)
    turn_ids = np.full((rows, width), -1, np.int32)
    for b, path in enumerate(paths):
        node_ids[b, :len(path)] = path
        pos = 1
        for k in range(len(path)):
            loss[b, pos:pos + 2], turn_ids[b, pos:pos + 2] = 1, k
            pos += 3
        attention[b, :pos] = 1
    batch = dict(attention_mask=attention, loss_mask=loss, logprobs=np.zeros((rows, width), np.float32),
                 rewards=np.array([1.0, 0.0, 1.0, 0.0, 1.0], np.float32), turn_ids=turn_ids, node_ids=node_ids,
                 node_parents=parents, group_sizes=np.array([3, 2]), is_truncated=np.zeros(rows, bool))
    return batch, paths


@pytest.mark.parametrize("weighting", ["sqrt", "uniform", "none"])
@pytest.mark.parametrize("value", ["state_value", "value_only", "local_only"])
def test_tree_through_the_pipeline(weighting, value):
    batch, paths = tree_batch()
    out = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "tree",
                                                                                   "weighting": weighting,
                                                                                   "value": value}))
    parents = batch["node_parents"][:9]
    leaf_reward = np.zeros(9)
    for b, path in enumerate(paths):
        leaf_reward[path[-1]] = batch["rewards"][b]
    group = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1])
    values = reference.tree_advantages(parents, leaf_reward, group=group, weighting=weighting, value=value)
    active, turn_ids, _, _ = on_timesteps(dict(batch, token_rewards=np.zeros_like(batch["logprobs"])))
    want = np.zeros(active.shape)
    for b, path in enumerate(paths):
        for t in range(active.shape[1]):
            if active[b, t]:
                want[b, t] = values[path[turn_ids[b, t]]]
    np.testing.assert_allclose(out.advantages, want, rtol=1e-5, atol=1e-6)
    assert int(out.diagnostics["tree/nodes"]) == 9 and int(out.diagnostics["tree/leaves"]) == 5


def test_tree_refuses_rows_that_are_not_paths_of_the_tree():
    batch, _ = tree_batch()
    config = AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "tree"})
    skipped = dict(batch, node_ids=batch["node_ids"].copy())
    skipped["node_ids"][0] = [0, 2, 2]  # skips node 1 (every trained turn still names a node)
    with pytest.raises(ValueError, match="must run from a root"):
        compute_advantages(skipped, config)
    inner = dict(batch, node_ids=batch["node_ids"].copy())
    inner["node_ids"][2] = [0, 1, -1]  # ends at node 1, which has children
    with pytest.raises(ValueError, match="no row may end at a node with children"):
        compute_advantages(inner, config)


def test_refused_combinations_name_the_key():
    assert AdvantageConfig(credit_assignment={"mode": "pure"}).plan.shaping is None  # PURE's P goes into returns
    with pytest.raises(ConfigError, match=r"gae_timestep_unit 'turn' cannot be combined with credit_assignment\.mode"):
        AdvantageConfig(credit_assignment={"mode": "prime"}, gae_timestep_unit="turn")
    modes = " | ".join(credit_modes())  # the registered ones: gigpo | tree | pure | prime, and the tests' plug-ins
    assert modes.startswith("gigpo | tree | pure | prime")
    with pytest.raises(ConfigError, match=re.escape(f"credit_assignment.mode must be one of {modes}")):
        AdvantageConfig(credit_assignment={"mode": "mt_grpo"})
    with pytest.raises(ConfigError, match=re.escape("process_reward_transform.temperature must be > 0")):
        AdvantageConfig(process_reward_transform={"mode": "min_form", "temperature": 0})
    with pytest.raises(ConfigError, match=re.escape("reward_norm.mode must be one of decoupled")):
        AdvantageConfig(reward_norm={"mode": "gdpo"})


def test_tree_refuses_a_trained_turn_without_a_node_and_an_id_beyond_the_nodes():
    # Issue 29.13: a trained turn without a node id got advantage 0 silently; an id beyond node_parents was
    # ignored and the error then named a different node. Both are refused, naming the row, turn and id.
    batch, _ = tree_batch()
    config = AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "tree"})
    unnamed = dict(batch, node_ids=batch["node_ids"].copy())
    unnamed["node_ids"][1, 2] = -1  # row 1's third turn is trained
    with pytest.raises(ValueError, match=re.escape("row 1, turn 2 has node id -1, but the turn is trained")):
        compute_advantages(unnamed, config)
    beyond = dict(batch, node_ids=batch["node_ids"].copy())
    beyond["node_ids"][3, 1] = 15  # node_parents has 15 nodes
    with pytest.raises(ValueError, match=re.escape("row 3, turn 1 has node id 15, which is not a node of "
                                                   "batch['node_parents'] (15 nodes)")):
        compute_advantages(beyond, config)
    wide = dict(batch, turn_ids=batch["turn_ids"].copy())
    wide["turn_ids"][4, 7:9] = 3  # a turn id beyond node_ids' 3 columns names no node slot
    with pytest.raises(ValueError, match="below the number of turn slots 3"):
        compute_advantages(wide, config)


def holed_batch():
    """Two rows; row 0's first turn (ids 0 on positions 1-5) has a hole in the loss mask at position 3, as
    tunix's pads inside a completion leave; turn 1 is positions 7-8. Row 1 has no hole."""
    width = 10
    turn_ids = np.full((2, width), -1, np.int32)
    turn_ids[:, 1:6], turn_ids[:, 7:9] = 0, 1
    loss = (turn_ids >= 0).astype(np.int32)
    loss[0, 3] = 0
    token_rewards = np.where(turn_ids == 0, 0.4, np.where(turn_ids == 1, -0.6, 0.0)).astype(np.float32)
    return dict(attention_mask=np.ones((2, width), np.int32), loss_mask=loss, turn_ids=turn_ids,
                token_rewards=token_rewards, logprobs=np.zeros((2, width), np.float32),
                rewards=np.array([1.0, 0.0], np.float32), is_truncated=np.zeros(2, bool),
                group_sizes=np.array([2], np.int32))


@pytest.mark.parametrize("config", [
    {"process_reward_transform": {"mode": "min_form", "temperature": 0.3}},
    {"credit_assignment": {"mode": "pure", "temperature": 0.3, "whiten": False}},
    {"credit_assignment": {"mode": "gigpo", "step_reward": "last"}}], ids=["min_form", "pure", "gigpo_last"])
def test_a_hole_in_the_loss_mask_does_not_split_a_turn(config):
    # Issue 29.14: turns are what turn_ids say; one completion turn with a hole became two min-form steps
    # (min_form/turns 3 where 2 exist). The loops find the turn's end past the hole.
    batch = holed_batch()
    out = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, **config))
    active, turn_ids, process, outcome_step = on_timesteps(batch)
    ends = reference.turn_ends(active, turn_ids)
    assert ends.sum() == 4  # two turns a row
    if "process_reward_transform" in config:
        assert int(out.diagnostics["min_form/turns"]) == 4
        r = reference.min_form(np.where(ends, process, 0.0), ends, 0.3)
        want = np.zeros_like(r)
        for b in range(2):
            for t in range(batch["loss_mask"].shape[1]):
                if active[b, t]:
                    end = next(u for u in range(t, 10) if ends[b, u])
                    want[b, t] = r[b, end]
        want = reference.compute_advantages(dict(batch, token_rewards=np.zeros_like(batch["token_rewards"])),
                                            dict(kl_ctl=0.0))["advantages"] + want
        np.testing.assert_allclose(out.advantages, want, rtol=2e-5, atol=2e-6)
    elif config["credit_assignment"]["mode"] == "pure":
        _, want = reference.pure(process, batch["rewards"], active, turn_ids, outcome_step, [0, 0], 0.3, 1.0, False)
        np.testing.assert_allclose(out.advantages, want, rtol=2e-5, atol=2e-6)
    else:
        # The turn's last trained timestep is past the hole: step rewards 0.4 and -0.6 on both rows.
        turn_rewards = np.array([[0.4, -0.6], [0.4, -0.6]])
        per_turn, *_ = reference.gigpo(turn_rewards, np.ones((2, 2), bool), batch["rewards"], None, [2])
        want = np.where(active, np.take_along_axis(per_turn, np.maximum(turn_ids, 0), axis=1), 0.0) + process
        np.testing.assert_allclose(out.advantages, want, rtol=2e-5, atol=2e-6)


def test_folding_checks_uniformity_across_a_hole():
    batch = holed_batch()
    batch["token_rewards"][0, 4:6] = 0.5  # turn 0 of row 0 changes value after the hole
    with pytest.raises(ValueError, match="row 0 changes value at timestep 1"):
        compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, token_rewards_as_adv=False))
    batch["token_rewards"][0, 4:6] = 0.4
    out = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, token_rewards_as_adv=False))
    np.testing.assert_allclose(out.advantages, reference.compute_advantages(batch, dict(
        kl_ctl=0.0, token_rewards_as_adv=False))["advantages"], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("config", [{"credit_assignment": {"mode": "pure"}},
                                    {"process_reward_transform": {"mode": "min_form"}}], ids=["pure", "min_form"])
def test_turn_ids_that_decrease_are_refused_where_turns_are_read(config):
    batch = holed_batch()
    batch["turn_ids"][1, 7:9] = 0
    batch["turn_ids"][1, 1:6] = 1
    with pytest.raises(ValueError, match="turn ids must not decrease along a row"):
        compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, **config))


def tree_rows(parent, leaf_reward):
    """One row per leaf of the forest ``parent``: its path's turns (two tokens each), its node ids, the leaf's
    reward as the row's outcome; and each node's timestep in some row (to read its value back)."""
    n = len(parent)
    children = np.bincount(parent[parent >= 0], minlength=n)
    paths = []
    for leaf in np.flatnonzero(children == 0):
        path, node = [], int(leaf)
        while node >= 0:
            path.append(node)
            node = int(parent[node])
        paths.append(path[::-1])
    rows, turns = len(paths), max(map(len, paths))
    width = 1 + 3 * turns
    node_ids = np.full((rows, turns), -1, np.int32)
    turn_ids = np.full((rows, width), -1, np.int32)
    loss, attention = np.zeros((rows, width), np.int32), np.zeros((rows, width), np.int32)
    where = {}
    for b, path in enumerate(paths):
        node_ids[b, :len(path)] = path
        for k, node in enumerate(path):
            loss[b, 1 + 3 * k:3 + 3 * k], turn_ids[b, 1 + 3 * k:3 + 3 * k] = 1, k
            where.setdefault(node, (b, 3 * k + 1))  # the timestep of the turn's second token
        attention[b, :3 * len(path) + 1] = 1
    batch = dict(attention_mask=attention, loss_mask=loss, logprobs=np.zeros((rows, width), np.float32),
                 rewards=np.array([leaf_reward[p[-1]] for p in paths], np.float32), turn_ids=turn_ids,
                 node_ids=node_ids, node_parents=parent.astype(np.int32), group_sizes=np.array([rows]),
                 is_truncated=np.zeros(rows, bool))
    return batch, where


@pytest.mark.parametrize("value", ["local_only", "state_value"])
def test_the_pipelines_tree_values_are_the_kernels_on_every_tree(value):
    # Issue 41.6: inside compute_advantages, TreeRL's local_only case gave a local term of 1.49e-8 (float32
    # rounding, where the kernel alone gave exactly 0), the exact-zero test never fired, and entries differed
    # (-1.49e-8 returned, -0.7 expected on this tree, whose leaves 3 and 18 have no local signal). "No local
    # signal" is decided with a tolerance now: the pipeline, the kernel and the float64 loop agree.
    from prm_jax.kernels._tree import tree_advantages

    parent = np.array([1, 7, 16, 10, 16, 14, 15, 15, 9, 1, 15, 1, 21, 15, 16, -1, 19, 1, 13, 15, 12, 16], np.int32)
    rng = np.random.default_rng(41)
    forests = [parent]
    for _ in range(3):
        order, forest = rng.permutation(16), np.full(16, -1, np.int32)
        for position in range(1, 16):
            forest[order[position]] = order[rng.integers(0, position)]
        forests.append(forest)
    for forest in forests:
        reward = (rng.random(len(forest)) < 0.5).astype(np.float32)
        if forest is parent:
            reward = np.array([1, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1, 1, 0], np.float32)
        batch, where = tree_rows(forest, reward)
        out = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, credit_assignment={
            "mode": "tree", "weighting": "none", "value": value}))
        got = np.array([np.asarray(out.advantages)[where[n]] for n in range(len(forest))])
        kernel = np.asarray(tree_advantages(forest, reward, weighting="none", value=value).values)
        want = reference.tree_advantages(forest, reward, weighting="none", value=value)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(kernel, want, rtol=1e-5, atol=1e-6)
