"""Issue 9: the cases where prm-jax differed from AReaL's own advantage code, with the issue's numbers.

Each test states AReaL's result (the reference) and, where the issue gives it, the number prm-jax
produced before, so a regression to the old behaviour fails loudly.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
import yaml
from batches import make_batch

import prm_jax
from prm_jax import AdvantageConfig, NormConfig, compute_advantages
from prm_jax.kernels import gae_lambda as lambda_fn
from prm_jax.kernels import normalize

LOO = NormConfig("batch", "batch", mean_leave1out=True)


def one_row(**overrides):
    """loss_mask [0,1,1,1,0], values [0,1,3,0,0] (timesteps), outcome 1, full width: advantages [0, -1, -3]."""
    batch = dict(attention_mask=np.ones((1, 5), np.int32), loss_mask=np.array([[0, 1, 1, 1, 0]]),
                 logprobs=np.zeros((1, 5), np.float32), rewards=np.array([1.0], np.float32),
                 values=np.array([[0, 1, 3, 0, 0]], np.float32), is_truncated=np.array([True]))
    batch.update(overrides)
    return batch


# --- 9.1-9.5 normalization ---------------------------------------------------------------------------

def test_leave_one_out_std_is_taken_around_the_leave_one_out_means():
    out = compute_advantages(one_row(), AdvantageConfig(kl_ctl=0.0, adv_norm=LOO))
    np.testing.assert_allclose(np.asarray(out.advantages)[0, :3], [0.8729, 0.2182, -1.0911], atol=1e-4)
    # prm-jax before: [1.3093, 0.3273, -1.6366] (std around the plain mean: n / (n - 1) x AReaL's).


def test_group_leave_one_out_reward_norm_in_groups_of_four():
    got = normalize(np.array([1.0, 0.0, 0.0, 1.0], np.float32), None,
                    NormConfig("group", "group", mean_leave1out=True, group_size=4))
    # (x - (S - x) / 3) / sqrt(sum((x - mu)^2) / 3): +-0.8660 (before: +-1.1547, 4/3 x AReaL's).
    np.testing.assert_allclose(got, [0.866, -0.866, -0.866, 0.866], atol=1e-3)


def test_null_mean_level_takes_the_std_around_zero():
    got = normalize(np.array([1.0, 1.0], np.float32), None, NormConfig(None, "group", group_size=2))
    np.testing.assert_allclose(got, [0.7071, 0.7071], atol=1e-4)  # before: 1e5 each (std around the mean 1)


def test_mixed_levels_take_the_std_around_the_mean_levels_mean():
    x = np.array([[1.0], [3.0], [5.0], [7.0]], np.float32)
    # Batch mean 4; group std around it: group 0 sqrt((9 + 1) / 1).
    got = normalize(x, None, NormConfig("batch", "group", group_size=2, eps=0.0))
    np.testing.assert_allclose(got[:, 0], [-3 / np.sqrt(10), -1 / np.sqrt(10), 1 / np.sqrt(10), 3 / np.sqrt(10)],
                               rtol=1e-6)
    # Group means (2 and 6) with a batch std around them: sqrt(4 * 1 / 3).
    got = normalize(x, None, NormConfig("group", "batch", group_size=2, eps=0.0))
    np.testing.assert_allclose(got[:, 0], np.array([-1, 1, -1, 1]) / np.sqrt(4 / 3), rtol=1e-6)


def test_single_row_groups_decide_by_rows_not_tokens():
    rng = np.random.default_rng(94)
    rest = make_batch(rng, rows=2, width=5)
    batch = {k: np.concatenate([one_row()[k], rest[k]]) for k in one_row()}
    batch["group_sizes"] = np.array([1, 2], np.int32)
    cfg = AdvantageConfig(kl_ctl=0.0, adv_norm=NormConfig("group", "group", mean_leave1out=True))
    out = compute_advantages(batch, cfg)
    np.testing.assert_array_equal(np.asarray(out.advantages)[0], 0.0)  # before: [1.309, 0.327, -1.637]
    want = reference.compute_advantages(batch, dict(kl_ctl=0.0, adv_norm=dict(mean_level="group",
                                                                              std_level="group",
                                                                              mean_leave1out=True)))
    np.testing.assert_allclose(out.advantages, want["advantages"], rtol=2e-5, atol=2e-5)
    # A one-row group with an unbiased std has std 1: only its mean is removed.
    out = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, adv_norm=NormConfig("group", "group", eps=0.0)))
    np.testing.assert_allclose(np.asarray(out.advantages)[0, :3], np.array([0, -1, -3]) + 4 / 3, rtol=1e-6)


def test_group_member_counts_of_split_rollouts():
    rng = np.random.default_rng(95)
    x = rng.normal(size=(4, 6)).astype(np.float32)
    mask = rng.random((4, 6)) < 0.8
    norm = NormConfig("group", "group", mean_leave1out=True)
    # Group 0 is two rows of one logical rollout: it normalizes to 0; group 1 has two members.
    got = normalize(x, mask, norm, group_sizes=[2, 2], group_member_counts=[1, 2])
    np.testing.assert_array_equal(np.asarray(got)[:2], 0.0)
    want = reference.normalize(x, mask, mean_level="group", std_level="group", mean_leave1out=True,
                               group_sizes=[2, 2], group_member_counts=[1, 2])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Without member counts the rows decide.
    assert np.abs(np.asarray(normalize(x, mask, norm, group_sizes=[2, 2]))[:2]).max() > 0.1
    # Through the pipeline, as an optional [G] batch key.
    batch = make_batch(rng, rows=4, width=12)
    batch.update(group_sizes=np.array([3, 1], np.int32), group_member_counts=np.array([1, 1], np.int32))
    cfg = dict(reward_norm=dict(mean_level="group", std_level="group", mean_leave1out=True),
               adv_norm=dict(mean_level="group", std_level="group"))
    out = compute_advantages(batch, AdvantageConfig(**cfg))
    want = reference.compute_advantages(batch, cfg)
    for field in ("advantages", "returns"):
        np.testing.assert_allclose(getattr(out, field), want[field], rtol=2e-5, atol=3e-5)
    with pytest.raises(ValueError, match="group_member_counts"):
        normalize(x, mask, norm, group_sizes=[2, 2], group_member_counts=[0, 2])
    with pytest.raises(ValueError, match="group_member_counts"):
        normalize(x, mask, norm, group_sizes=[2, 2], group_member_counts=[1, 1, 1])


# --- 9.6-9.8 turn-level GAE --------------------------------------------------------------------------

def turn_batch(**overrides):
    """AReaL's unit-test row: values 0.1 .. 0.8 on timesteps, turns at timesteps 1-2 and 4-6."""
    return dict(attention_mask=np.ones((1, 8), np.int32), loss_mask=np.array([[0, 0, 1, 1, 0, 1, 1, 1]]),
                turn_ids=np.array([[-1, -1, 0, 0, -1, 1, 1, 1]], np.int32), logprobs=np.zeros((1, 8), np.float32),
                rewards=np.array([1.0], np.float32), values=np.arange(1, 9, dtype=np.float32)[None] / 10,
                is_truncated=np.array([False])) | overrides


def test_turn_level_timesteps_outside_turns_get_zero_advantage_and_value_return():
    out = compute_advantages(turn_batch(), AdvantageConfig(kl_ctl=0.0, gae_timestep_unit="turn"))
    np.testing.assert_allclose(out.advantages, [[0, .8, .8, 0, .5, .5, .5, 0]], atol=1e-6)
    # before: [.8, .8, .8, .5, .5, .5, .5, 0]
    np.testing.assert_allclose(out.returns, [[.1, 1, 1, .4, 1, 1, 1, .8]], atol=1e-6)


def test_turn_level_tot_rewards_include_kl():
    batch = turn_batch(ref_logprobs=np.full((1, 8), -0.5, np.float32))
    batch["logprobs"] = np.linspace(-1, -0.1, 8, dtype=np.float32)[None]
    out = compute_advantages(batch, AdvantageConfig(kl_ctl=0.3, gae_timestep_unit="turn"))
    assert np.abs(np.asarray(out.kl_rewards)).max() > 0
    task = np.zeros((1, 8), np.float32)
    task[0, 6] = 1.0  # seqlen - 2
    np.testing.assert_allclose(out.tot_rewards, task + np.asarray(out.kl_rewards), atol=1e-6)


@pytest.mark.parametrize("turn_ids,problem", [
    ([[-1, -1, 0, 0, -1, -1, 1, 1]], "turn id >= 0"),   # an active position without a turn
    ([[-1, -1, 1, 1, -1, 0, 0, 0]], "must not decrease"),
])
def test_turn_level_rejects_invalid_turn_ids(turn_ids, problem):
    batch = turn_batch(turn_ids=np.array(turn_ids, np.int32))
    with pytest.raises(ValueError, match=problem):
        compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, gae_timestep_unit="turn"))
    # Token-level GAE does not read turn ids, so it does not check them.
    compute_advantages(batch, AdvantageConfig(kl_ctl=0.0))


# --- 9.9-9.11 KL and alignment ------------------------------------------------------------------------

def kl_batch():
    logprobs = np.array([[0.0, -1.5, -0.4, -0.3, 0.0]], np.float32)
    return dict(attention_mask=np.ones((1, 5), np.int32), loss_mask=np.array([[0, 1, 1, 1, 0]]),
                logprobs=logprobs, rewards=np.array([0.0], np.float32), is_truncated=np.array([False]))


def test_reference_log_probs_are_on_timesteps():
    batch = kl_batch()
    # The reference model's output for the same policy: on timesteps, i.e. the shifted behaviour log-probs.
    batch["ref_logprobs"] = np.asarray(prm_jax.kernels.shift_to_next_token(batch["logprobs"]))
    out = compute_advantages(batch, AdvantageConfig(kl_ctl=0.1))
    np.testing.assert_array_equal(out.kl_rewards, 0.0)  # before: a KL one step off, nonzero


def test_no_reference_log_probs_means_a_zero_reference_with_a_warning():
    batch = kl_batch()
    batch["logprobs"] = batch["logprobs"] + np.float32(0)  # a fresh array: a fresh trace for the warning
    with pytest.warns(UserWarning, match="ref_logprobs"):
        out = compute_advantages(batch, AdvantageConfig(kl_ctl=0.2, discount=0.5))
    # k1 with ref 0: kl_rewards = -kl_ctl * logp on active timesteps, 0 at timestep seqlen - 1 = 4.
    np.testing.assert_allclose(out.kl_rewards, [[0.3, 0.08, 0.06, 0.0, 0.0]], rtol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, discount=0.5))  # no KL asked for: no warning


def test_recomputed_log_probs_replace_the_behaviour_log_probs():
    batch = kl_batch()
    prox = np.array([[-0.2, -0.7, -0.9, 5.0, 5.0]], np.float32)  # timesteps; the last two are inactive
    batch.update(prox_logprobs=prox, ref_logprobs=np.full((1, 5), -0.5, np.float32))
    out = compute_advantages(batch, AdvantageConfig(kl_ctl=1.0))
    np.testing.assert_allclose(out.logprobs, [[-0.2, -0.7, -0.9, 0.0, 0.0]])
    np.testing.assert_allclose(out.kl_rewards, [[-0.3, 0.2, 0.4, 0.0, 0.0]], rtol=1e-6)  # -(prox - ref)
    want = reference.compute_advantages(batch, dict(kl_ctl=1.0))
    np.testing.assert_allclose(out.advantages, want["advantages"], rtol=1e-6, atol=1e-6)


# --- 9.12 dynamic GAE lambda --------------------------------------------------------------------------

def context(lengths, turns=None):
    lengths = jnp.asarray(lengths, jnp.int32)
    turns = jnp.zeros_like(lengths) if turns is None else jnp.asarray(turns, jnp.int32)
    return lambda_fn.GAELambdaContext(effective_token_lengths=lengths, turn_counts=turns, timestep_lengths=lengths)


def test_builtin_lambda_functions():
    lengths = [0, 1, 2, 5, 100]
    np.testing.assert_allclose(lambda_fn.vapo_length_adaptive_gae(context(lengths), alpha=0.5),
                               [0, 0, 0, 1 - 1 / 2.5, 1 - 1 / 50], rtol=1e-6)
    np.testing.assert_allclose(lambda_fn.relative_position_gae_lambda(context(lengths), q=0.25),
                               [0, 1, 0.25, 0.25 ** 0.25, 0.25 ** (1 / 99)], rtol=1e-6)
    np.testing.assert_allclose(lambda_fn.constant_gae_lambda(context(lengths), value=0.9), 0.9, rtol=1e-7)
    for bad in (dict(alpha=0.0), dict(alpha=-1.0), dict(alpha=True)):
        with pytest.raises(ValueError, match="alpha"):
            AdvantageConfig(gae_lambda="areal.trainer.ppo.lambda_fn.vapo_length_adaptive_gae", gae_lambda_kwargs=bad)
    for q in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="q must"):
            AdvantageConfig(gae_lambda="prm_jax.kernels.lambda_fn.relative_position_gae_lambda",
                            gae_lambda_kwargs=dict(q=q))


@pytest.mark.parametrize("unit", ["token", "turn"])
@pytest.mark.parametrize("path,kwargs", [
    ("areal.trainer.ppo.lambda_fn.vapo_length_adaptive_gae", dict(alpha=0.3)),
    ("areal.trainer.ppo.lambda_fn.relative_position_gae_lambda", dict(q=0.5)),
    ("prm_jax.kernels.gae_lambda.constant_gae_lambda", dict(value=0.8)),
    ("prm_jax.kernels.lambda_fn.constant_gae_lambda", dict(value=0.7)),  # the name before issue 21
])
def test_lambda_functions_in_the_pipeline_match_the_reference(unit, path, kwargs):
    rng = np.random.default_rng(912)
    batch = make_batch(rng, rows=6, width=40)
    cfg = dict(gae_lambda=path, gae_lambda_kwargs=kwargs, gae_timestep_unit=unit, discount=0.97)
    out = compute_advantages(batch, AdvantageConfig(**cfg))
    want = reference.compute_advantages(batch, cfg)
    for field in ("advantages", "returns", "tot_rewards"):
        np.testing.assert_allclose(getattr(out, field), want[field], rtol=2e-5, atol=3e-5, err_msg=field)


def test_a_users_lambda_function_by_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "my_lambdas.py").write_text(
        "import jax.numpy as jnp\n"
        "def by_turns(context, *, base):\n"
        "    return jnp.where(context['turn_counts'] > 1, base, 1.0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rng = np.random.default_rng(913)
    batch = make_batch(rng, rows=5, width=30)
    cfg = AdvantageConfig(gae_lambda="my_lambdas.by_turns", gae_lambda_kwargs={"base": 0.7}, discount=0.9)
    assert hash(cfg) == hash(AdvantageConfig(gae_lambda="my_lambdas.by_turns", gae_lambda_kwargs={"base": 0.7},
                                             discount=0.9))
    shifted_mask = reference.shift(batch["loss_mask"]).astype(bool)
    shifted_ids = reference.shift(batch["turn_ids"], -1)
    turns = np.array([len({int(k) for a, k in zip(m, i) if a}) for m, i in zip(shifted_mask, shifted_ids)])
    per_row = dict(batch, gae_lambda=np.where(turns > 1, 0.7, 1.0).astype(np.float32))
    np.testing.assert_allclose(compute_advantages(batch, cfg).advantages,
                               compute_advantages(per_row, AdvantageConfig(discount=0.9)).advantages, rtol=1e-6)
    with pytest.raises(ValueError, match="gae_lambda_kwargs"):
        AdvantageConfig(gae_lambda="my_lambdas.by_turns", gae_lambda_kwargs={"bse": 0.7})
    with pytest.raises(ValueError, match="cannot be imported"):
        AdvantageConfig(gae_lambda="my_lambdas.missing")


def test_a_lambda_outside_the_unit_interval_is_refused():
    rng = np.random.default_rng(914)
    batch = make_batch(rng, rows=3, width=12)
    cfg = AdvantageConfig(gae_lambda="prm_jax.kernels.gae_lambda.constant_gae_lambda",
                          gae_lambda_kwargs=dict(value=1.5))
    with pytest.raises(ValueError, match=r"gae_lambda must be finite and in \[0, 1\]"):
        compute_advantages(batch, cfg)
    batch["gae_lambda"] = np.array([0.5, np.nan, 0.2], np.float32)
    with pytest.raises(ValueError, match="row 1"):
        compute_advantages(batch, AdvantageConfig())


def test_an_areal_config_with_dynamic_lambda_loads_unchanged(tmp_path):
    path = tmp_path / "areal.yaml"
    path.write_text(yaml.safe_dump({"actor": {
        "gae_lambda": "areal.trainer.ppo.lambda_fn.vapo_length_adaptive_gae",
        "gae_lambda_kwargs": {"alpha": 0.05}, "discount": 1.0}}))
    config = prm_jax.load_config(path)
    assert config.actor.gae_lambda.endswith("vapo_length_adaptive_gae")
    assert dict(config.actor.gae_lambda_kwargs) == {"alpha": 0.05}
    rng = np.random.default_rng(915)
    batch = make_batch(rng, rows=4, width=20)
    jitted = jax.jit(compute_advantages, static_argnums=1)
    np.testing.assert_allclose(jitted(batch, config.actor).advantages,
                               compute_advantages(batch, config.actor).advantages, rtol=1e-6, atol=1e-6)


# --- kept on purpose ------------------------------------------------------------------------------------

def test_a_generated_token_at_position_zero_does_not_wrap_onto_the_last_timestep():
    # AReaL's roll(-1) would put position 0's loss mask, log-prob and process reward on timestep T - 1.
    batch = dict(attention_mask=np.ones((1, 4), np.int32), loss_mask=np.array([[1, 0, 1, 1]]),
                 logprobs=np.array([[-9.0, 0, -0.5, -0.5]], np.float32), rewards=np.array([1.0], np.float32),
                 token_rewards=np.array([[-7.0, 0, 0, 0]], np.float32), is_truncated=np.array([False]))
    out = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0))
    np.testing.assert_array_equal(out.loss_mask, [[0, 1, 1, 0]])
    assert float(out.logprobs[0, -1]) == 0.0 and float(out.advantages[0, -1]) == 0.0
