"""Issue 13: GiGPO step groups and discounted step returns against a dict-and-loop reference."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from batches import compile_log
from native_where import skip_without_native

from prm_jax.kernels._gigpo import GiGPOConfig, dense_anchor_ids, gigpo

CONFIGS = [
    dict(),
    dict(norm="mean_std_norm", step_weight=0.5, step_discount=0.9),
    dict(episode_stats="step", step_discount=1.0),
    dict(norm="mean_std_norm", episode_stats="step", step_weight=2.0, step_discount=0.0),
]


@pytest.fixture(params=["native", "sort"])
def step_group_path(request):
    """Both ways of finding step groups, chosen by argument (issue 31.3: no monkeypatching, no cleared
    caches): the CPU's native hash pass and the sort every backend has."""
    skip_without_native(request.param)
    return request.param


def random_batch(rng, rows=12, turns=6, anchors=5):
    mask = rng.random((rows, turns)) < 0.75
    mask[0] = False                                   # a row with no turns
    mask[1, 3:] = False                               # a short row
    mask[2, 1::2] = False                             # a masked turn between active ones
    rewards = rng.normal(size=(rows, turns)).astype(np.float32)
    anchor_ids = rng.integers(-1, anchors, size=(rows, turns)).astype(np.int32)
    anchor_ids[3, :3] = 2                             # an anchor shared within one row
    outcome = rng.choice([0.0, 1.0, 0.5], size=rows).astype(np.float32)
    return rewards, mask, anchor_ids, outcome


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("with_anchors", [True, False])
def test_matches_the_loop_reference_on_random_batches(cfg, with_anchors, step_group_path):
    rng = np.random.default_rng(13)
    for sizes in ([12], [1, 4, 3, 4], [5, 7], [2, 1, 9]):
        rewards, mask, anchors, outcome = random_batch(rng)
        out = gigpo(rewards, mask, outcome, anchor_ids=anchors if with_anchors else None,
                    group_sizes=np.array(sizes), config=GiGPOConfig(**cfg), step_groups=step_group_path)
        want = reference.gigpo(rewards, mask, outcome, anchors if with_anchors else None, sizes, **cfg)
        for got, expected, name in zip((out.advantages, out.episode_advantages, out.step_advantages,
                                        out.step_returns), want, ("advantages", "episode", "step", "returns")):
            np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5, err_msg=f"{name} {sizes}")


def test_properties():
    rng = np.random.default_rng(131)
    rewards, mask, anchors, outcome = random_batch(rng, rows=8)
    sizes = np.array([4, 4])
    base = gigpo(rewards, mask, outcome, anchor_ids=anchors, group_sizes=sizes)
    # Permuting rows within a group permutes the output.
    perm = np.array([2, 0, 3, 1, 4, 5, 6, 7])
    permuted = gigpo(rewards[perm], mask[perm], outcome[perm], anchor_ids=anchors[perm], group_sizes=sizes)
    np.testing.assert_allclose(permuted.advantages, np.asarray(base.advantages)[perm], rtol=1e-6, atol=1e-6)
    # omega = 0 gives the episode advantage on every active turn.
    episode_only = gigpo(rewards, mask, outcome, anchor_ids=anchors, group_sizes=sizes,
                         config=GiGPOConfig(step_weight=0.0))
    np.testing.assert_allclose(episode_only.advantages,
                               np.where(mask, np.asarray(base.episode_advantages)[:, None], 0.0), atol=1e-6)
    # A step group of identical returns gives 0; so does a step group of one and a turn without anchor.
    flat = np.zeros((2, 2), np.float32)
    same = gigpo(flat, np.ones((2, 2), bool), np.array([1.0, 0.0], np.float32), anchor_ids=np.array([[0, 1], [0, -1]]))
    np.testing.assert_array_equal(same.step_advantages, 0.0)
    np.testing.assert_array_equal(same.step_group_sizes, [[2, 1], [2, 0]])
    # Values at inactive turns change nothing.
    noisy = np.where(mask, rewards, 1e6).astype(np.float32)
    out = gigpo(noisy, mask, outcome, anchor_ids=np.where(mask, anchors, 7), group_sizes=sizes)
    np.testing.assert_allclose(out.advantages, base.advantages, rtol=1e-6, atol=1e-6)


def test_a_group_of_one_has_mean_zero_and_std_one():
    out = gigpo(np.zeros((1, 2), np.float32), np.ones((1, 2), bool), np.array([0.7], np.float32),
                config=GiGPOConfig(norm="mean_std_norm", eps=0.0))
    np.testing.assert_allclose(out.episode_advantages, [0.7])


@pytest.mark.parametrize("norm", ["mean_norm", "mean_std_norm"])
def test_step_statistics_count_steps_as_verl_agent_does(norm):
    # Issue 22.6, verl-agent's core_gigpo.py run side by side: one trajectory, step rewards [0, 1], outcome 1,
    # omega = 0. Under episode_stats: step its two step entries have mean 1 (episode advantage 0, verl-agent
    # [0, 0]); under trajectory statistics it is a group of one ([1, 1], prm-jax's default).
    rewards, mask, outcome = np.array([[0.0, 1.0]], np.float32), np.ones((1, 2), bool), np.array([1.0], np.float32)
    step = gigpo(rewards, mask, outcome, config=GiGPOConfig(step_weight=0.0, episode_stats="step", norm=norm))
    np.testing.assert_allclose(step.advantages, [[0.0, 0.0]], atol=1e-7)
    trajectory = gigpo(rewards, mask, outcome, config=GiGPOConfig(step_weight=0.0, norm=norm))
    np.testing.assert_allclose(trajectory.advantages, [[1.0, 1.0]], rtol=1e-6)
    # A single one-step trajectory is a group of one entry under both: mean 0, std 1.
    one = gigpo(rewards[:, :1], mask[:, :1], outcome, config=GiGPOConfig(episode_stats="step", norm=norm, eps=0.0))
    np.testing.assert_allclose(one.episode_advantages, [1.0])
    for stats in ("step", "trajectory"):
        want = reference.gigpo(rewards, mask, outcome, step_weight=0.0, norm=norm, episode_stats=stats)[0]
        got = gigpo(rewards, mask, outcome, config=GiGPOConfig(step_weight=0.0, episode_stats=stats, norm=norm))
        np.testing.assert_allclose(got.advantages, want, atol=1e-6)


def test_jit_vmap_and_no_retrace():
    rng = np.random.default_rng(132)
    rewards, mask, anchors, outcome = random_batch(rng, rows=6)
    step = jax.jit(chex.assert_max_traces(
        lambda r, m, a, o: gigpo(r, m, o, anchor_ids=a, group_sizes=jnp.array([3, 3])).advantages, n=1))
    want = gigpo(rewards, mask, outcome, anchor_ids=anchors, group_sizes=np.array([3, 3])).advantages
    for _ in range(2):
        np.testing.assert_allclose(step(rewards, mask, anchors, outcome), want, rtol=1e-6, atol=1e-6)
    batched = jax.vmap(lambda r, m, a, o: gigpo(r, m, o, anchor_ids=a).advantages)(
        np.stack([rewards, rewards]), np.stack([mask, mask]), np.stack([anchors, anchors]), np.stack([outcome, outcome]))
    np.testing.assert_allclose(batched[1], gigpo(rewards, mask, outcome, anchor_ids=anchors).advantages, atol=1e-6)
    with compile_log() as compiled:
        for _ in range(3):
            gigpo(rewards, mask, outcome, anchor_ids=anchors, config=GiGPOConfig(step_weight=0.5))
    assert sum("Compiling jit(_gigpo_jit)" in m for m in compiled) <= 1


def test_dense_anchor_ids_from_64_bit_hashes():
    hashes = np.array([[2**40 + 5, -1], [2**40 + 5, 2**62]], np.int64)
    dense = dense_anchor_ids(hashes)
    assert dense.dtype == np.int32 and dense[0, 0] == dense[1, 0] != dense[1, 1] and dense[0, 1] == -1


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="turn_mask"):
        gigpo(np.zeros((2, 3), np.float32), np.ones((2, 2), bool), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="group_sizes"):
        gigpo(np.zeros((2, 3), np.float32), np.ones((2, 3), bool), np.zeros(2, np.float32), group_sizes=[1, 2])
    with pytest.raises(ValueError, match="norm"):
        GiGPOConfig(norm="per_turn")


@pytest.mark.parametrize("rule", ["mean", "sum", "last"])
@pytest.mark.parametrize("anchors", [True, False])
def test_gigpo_in_compute_advantages_then_shaping(anchors, rule):
    # GiGPO replaces GAE (step 6); normalization and shaping apply on top as before.
    from batches import make_batch

    from prm_jax import AdvantageConfig, ShapingConfig, compute_advantages
    rng = np.random.default_rng(133)
    batch = make_batch(rng, rows=8, width=40, max_turns=5)
    batch["group_sizes"] = np.array([4, 4], np.int32)
    if anchors:
        batch["anchor_ids"] = rng.integers(-1, 3, size=(8, 5)).astype(np.int32)
    cfg = dict(kl_ctl=0.0, credit_assignment={"mode": "gigpo", "step_weight": 0.7, "step_discount": 0.9,
                                              "norm": "mean_std_norm", "step_reward": rule})
    out = compute_advantages(batch, AdvantageConfig(**cfg))
    m = reference.shift(batch["loss_mask"]).astype(bool)
    tids = reference.shift(batch["turn_ids"], -1)
    process = np.where(m, reference.shift(batch["token_rewards"]), 0.0)
    sums, counts, last = np.zeros((8, 5)), np.zeros((8, 5)), np.zeros((8, 5))
    for b in range(8):
        for t in range(40):
            if m[b, t] and 0 <= tids[b, t] < 5:
                sums[b, tids[b, t]] += process[b, t]
                counts[b, tids[b, t]] += 1
                last[b, tids[b, t]] = process[b, t]  # the turn's last trained timestep wins
    turn_rewards = {"sum": sums, "mean": sums / np.maximum(counts, 1), "last": last}[rule]
    per_turn, *_ = reference.gigpo(turn_rewards, counts > 0, batch["rewards"], batch.get("anchor_ids"), [4, 4],
                                   step_weight=0.7, step_discount=0.9, norm="mean_std_norm")
    want = np.zeros((8, 40))
    for b in range(8):
        for t in range(40):
            if m[b, t] and 0 <= tids[b, t] < 5:
                want[b, t] = per_turn[b, tids[b, t]]
    # The default shaping is additive: A' = A + P on active timesteps; returns are never shaped.
    np.testing.assert_allclose(out.advantages, want + process * m, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(out.returns, want + batch["values"], rtol=2e-5, atol=2e-5)
    # Step rewards given per turn replace the derived ones (turn_reward_mask False: derive that one, whatever
    # turn_rewards holds there); gvpo then only reads P's sign.
    partly = turn_rewards.astype(np.float32)
    partly[::2] = 123.0
    derive = np.ones(partly.shape, bool)
    derive[::2] = False
    given = dict(batch, turn_rewards=partly, turn_reward_mask=derive)
    gvpo = compute_advantages(given, AdvantageConfig(**cfg, advantage_shaping=ShapingConfig("gvpo")))
    want_gvpo = reference.shape(want, process, m, "gvpo")
    np.testing.assert_allclose(gvpo.advantages, want_gvpo, rtol=2e-5, atol=2e-5)


def test_a_scalar_scorers_step_reward_is_its_value_whatever_the_turns_length():
    # Issue 23.4: a 4-token turn scored 1 got step reward 4 against 2 for a 2-token turn (the sum): the
    # opposite of a length penalty. The default (mean) gives each turn the scorer's own value.
    from prm_jax import AdvantageConfig, compute_advantages
    loss = np.array([[0, 1, 1, 1, 1, 0, 1, 1, 0]], np.int32)
    turn_ids = np.array([[-1, 0, 0, 0, 0, -1, 1, 1, -1]], np.int32)
    batch = dict(attention_mask=np.ones((1, 9), np.int32), loss_mask=loss, turn_ids=turn_ids,
                 logprobs=np.zeros((1, 9), np.float32), rewards=np.zeros(1, np.float32),
                 token_rewards=loss.astype(np.float32), is_truncated=np.zeros(1, bool))
    for rule, first in (("mean", 1.0), ("sum", 4.0), ("last", 1.0)):
        config = AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "gigpo", "step_discount": 0.0,
                                                                "step_weight": 1.0, "step_reward": rule})
        out = np.asarray(compute_advantages(batch, config).advantages)
        # One trajectory: a group of one (episode 0); one step group without anchors: A^S = R_k - mean(R).
        second = {"mean": 1.0, "sum": 2.0, "last": 1.0}[rule]
        want = np.array([first, second]) - (first + second) / 2
        # Timesteps 0 and 5 predict the turns' first tokens; + P = 1 there (additive shaping).
        np.testing.assert_allclose(out[0, [0, 5]], want + 1.0, atol=1e-6, err_msg=rule)


def test_cli_with_anchor_ids_and_step_rewards(tmp_path, capsys):
    import json
    from pathlib import Path

    from prm_jax.app._cli import main
    root = Path(__file__).resolve().parents[2]
    sessions = [json.loads(line) for line in (root / "prm_jax" / "data" / "demo_sessions.jsonl").read_text().splitlines()]
    for s in sessions:
        for k, turn in enumerate(s["interactions"]):
            turn["anchor_id"] = 2**40 + k % 2   # 64-bit state hashes, shared across the group's sessions
            turn["step_reward"] = 0.1 * k
    path = tmp_path / "anchored.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in sessions))
    config = tmp_path / "gigpo.yaml"
    config.write_text((root / "prm_jax" / "data" / "demo_config.yaml").read_text()
                      + "  credit_assignment: {mode: gigpo, step_weight: 0.5, step_discount: 0.9}\n")
    out = tmp_path / "out"
    assert main(["score", "--config", str(config), "--input", str(path), "--output", str(out)]) == 0
    saved = dict(np.load(out / "batch.npz"))
    # Issue 20.6: the 64-bit hashes become dense int32 ids (equal where the hashes are), never cut to 32 bits.
    assert saved["anchor_ids"].dtype == np.int32 and set(np.unique(saved["anchor_ids"])) == {-1, 0, 1}
    assert saved["turn_rewards"].shape == saved["anchor_ids"].shape
    summary = json.loads((out / "metrics.json").read_text())["summary"]
    groups = summary["gigpo_step_groups"]
    assert groups["count"] > 0 and groups["mean_size"] > 1 and 0 < groups["share_with_more_than_one"] <= 1
    assert "GiGPO step groups:" in capsys.readouterr().out


def test_large_anchor_ids_take_the_stable_sort_and_agree(step_group_path):
    # Anchors too large to pack beside the entry index use two stable argsorts (on the sort path): the
    # same result.
    rng = np.random.default_rng(134)
    rewards, mask, anchors, outcome = random_batch(rng)
    large = np.where(anchors >= 0, anchors * 100_000_000 + 7, -1).astype(np.int32)
    got = gigpo(rewards, mask, outcome, anchor_ids=large, group_sizes=np.array([5, 7]), step_groups=step_group_path)
    want = gigpo(rewards, mask, outcome, anchor_ids=anchors, group_sizes=np.array([5, 7]), step_groups=step_group_path)
    np.testing.assert_allclose(got.advantages, want.advantages, rtol=1e-6, atol=1e-6)
    ref, *_ = reference.gigpo(rewards, mask, outcome, large, [5, 7])
    np.testing.assert_allclose(got.advantages, ref, rtol=2e-5, atol=2e-5)


def test_step_group_counts_match_a_loop_over_step_groups():
    # Issue 21: the report counted step groups in its own Python loop; the counts now come from the kernel's
    # step-group sizes (exact integers), checked here against a plain count of (group, anchor) pairs.
    from prm_jax.kernels._gigpo import step_group_counts
    rng = np.random.default_rng(211)
    for sizes in ([12], [1, 4, 3, 4], [5, 7]):
        rewards, mask, anchors, outcome = random_batch(rng)
        out = gigpo(rewards, mask, outcome, anchor_ids=anchors, group_sizes=np.array(sizes))
        row_group = np.repeat(np.arange(len(sizes)), sizes)
        members: dict = {}
        for b in range(rewards.shape[0]):
            for k in range(rewards.shape[1]):
                if mask[b, k] and anchors[b, k] != -1:
                    members[(row_group[b], anchors[b, k])] = members.get((row_group[b], anchors[b, k]), 0) + 1
        counts = {key: int(value) for key, value in step_group_counts(out.step_group_sizes).items()}
        assert counts == {"gigpo/step_groups": len(members), "gigpo/step_group_turns": sum(members.values()),
                          "gigpo/step_groups_with_more_than_one": sum(n > 1 for n in members.values())}


# Issue 56.2 (GiGPO's part): the step returns were a lax.scan over the turns on every backend (a GPU ran it at
# 48x plain GAE). Lowered for a GPU or TPU they are the associative form: no loop at all; on the CPU the scan.
@pytest.mark.parametrize("method", ["scan", "associative"])
def test_the_step_returns_of_both_forms_equal_the_float64_loop(method):
    from prm_jax.kernels._gigpo import step_returns

    rng = np.random.default_rng(11)
    rewards = rng.normal(size=(5, 9)).astype(np.float32)
    active = rng.random((5, 9)) < 0.6
    want = np.zeros((5, 9))
    for b in range(5):
        carry = 0.0
        for k in reversed(range(9)):
            if active[b, k]:
                carry = float(rewards[b, k]) + 0.9 * carry
                want[b, k] = carry
    got = jax.jit(lambda r, a: step_returns(r, a, 0.9, method))(rewards, active)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_gigpo_exported_for_an_accelerator_has_no_loop_over_the_turns(platform):
    from exports import module

    from prm_jax.kernels._gigpo import GiGPOConfig, _gigpo_jit

    def step_returns(r, m, o):
        return _gigpo_jit(r, m, o, None, None, config=GiGPOConfig(), step_groups="sort")

    def shapes(turns):
        return (jax.ShapeDtypeStruct((8, turns), jnp.float32), jax.ShapeDtypeStruct((8, turns), jnp.bool_),
                jax.ShapeDtypeStruct((8,), jnp.float32))

    for turns in (16, 64):
        text = module(step_returns, platform, *shapes(turns))
        assert "stablehlo.while" not in text and "stablehlo.custom_call" not in text
    cpu = module(step_returns, "cpu", *shapes(16))
    assert "stablehlo.while" in cpu  # (the CPU keeps its scan: the check above can see a loop)
