import dataclasses
import zlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from batches import compile_log, make_batch
from native_where import skip_without_native

import prm_jax
from prm_jax import AdvantageConfig, NormConfig, ShapingConfig, compute_advantages

PIPELINE_METHODS = ["scan", "associative", "blocked", "native", "pallas"]  # native skipped at run time where it does not build

FIELDS = ("advantages", "returns", "kl_rewards", "tot_rewards", "loss_mask", "logprobs")


def spec_example(**overrides):
    batch = dict(
        attention_mask=np.ones((1, 8), np.int32),
        loss_mask=np.array([[0, 0, 1, 1, 0, 1, 1, 1]]),
        turn_ids=np.array([[-1, -1, 0, 0, -1, 1, 1, 1]]),
        logprobs=np.zeros((1, 8), np.float32),
        rewards=np.array([1.0], np.float32),
        token_rewards=np.array([[0, 0, 0, 0, 0, -0.2, -0.2, -0.2]], np.float32),
        is_truncated=np.array([False]),
    )
    batch.update(overrides)
    return batch


ACTIVE = [1, 2, 4, 5, 6]


@pytest.mark.parametrize("method", PIPELINE_METHODS + ["auto", "cumsum"])
def test_spec_worked_example(method):
    batch = spec_example()
    additive = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, gae_method=method))
    np.testing.assert_allclose(np.asarray(additive.advantages)[0, ACTIVE], [1, 1, 0.8, 0.8, 0.8], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(additive.returns)[0, ACTIVE], 1.0, rtol=1e-6)
    fold = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, token_rewards_as_adv=False, gae_method=method))
    np.testing.assert_allclose(np.asarray(fold.advantages)[0, ACTIVE], 0.8, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(fold.returns)[0, ACTIVE], 0.8, rtol=1e-6)
    gvpo = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, advantage_shaping=ShapingConfig("gvpo"),
                                                     gae_method=method))
    np.testing.assert_allclose(np.asarray(gvpo.advantages)[0, ACTIVE], [1, 1, 0, 0, 0], atol=1e-7)
    np.testing.assert_allclose(gvpo.returns, additive.returns)
    np.testing.assert_array_equal(additive.loss_mask[0], [0, 1, 1, 0, 1, 1, 1, 0])


CONFIGS = {
    "defaults": {},
    "discounted": dict(discount=0.97, gae_lambda=0.9, kl_ctl=0.05, kl_estimator="k3"),
    "gvpo_k2_advnorm": dict(kl_estimator="k2", adv_norm=dict(mean_level="batch", std_level="batch"),
                            shaping=dict(mode="gvpo", negative_scale=0.3, zero_penalty=0.5, zero_eps=1e-3)),
    "group_norm": dict(reward_norm=dict(mean_level="group", std_level="group", group_size=2),
                       adv_norm=dict(mean_level="group", std_level="batch", mean_leave1out=True, group_size=2),
                       reward_bias=-0.5, reward_scaling=2.0, reward_clip=1.5),
    "mask_no_eos": dict(mask_no_eos_with_zero=True, discount=0.9, gae_lambda=0.95),
    "overlong": dict(overlong_reward_penalty=True, overlong_tokens=4, overlong_penalty_factor=0.5,
                     max_new_tokens=10),
    "turn_level": dict(gae_timestep_unit="turn", discount=0.9, gae_lambda=0.8, kl_ctl=0.2),
    "mixed_levels": dict(reward_norm=dict(mean_level=None, std_level="group", group_size=2),
                         adv_norm=dict(mean_level="batch", std_level="group", mean_leave1out=True, group_size=3,
                                       std_unbiased=False)),
    "lambda_vapo": dict(gae_lambda="areal.trainer.ppo.lambda_fn.vapo_length_adaptive_gae",
                        gae_lambda_kwargs=dict(alpha=0.4), discount=0.98),
    "lambda_turn": dict(gae_timestep_unit="turn", gae_lambda="areal.trainer.ppo.lambda_fn.relative_position_gae_lambda",
                        gae_lambda_kwargs=dict(q=0.3), discount=0.95),
}


def to_config(cfg, method):
    cfg = dict(cfg)
    shaping = cfg.pop("shaping", None)
    if shaping is not None:
        cfg["advantage_shaping"] = shaping
    return AdvantageConfig(gae_method=method, **cfg)


def check_against_reference(batch, cfg, method="auto", rtol=2e-5, atol=3e-5):
    out = compute_advantages(batch, to_config(cfg, method))
    want = reference.compute_advantages(batch, cfg)
    for field in FIELDS:
        np.testing.assert_allclose(getattr(out, field), want[field], rtol=rtol, atol=atol, err_msg=field)
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("method", PIPELINE_METHODS)
def test_pipeline_matches_float64_reference(name, method):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    batch = make_batch(rng, rows=6, width=48)
    check_against_reference(batch, CONFIGS[name], method)


@pytest.mark.parametrize("unit_interval", [False, True])
def test_fold_and_process_weighted_match_reference(unit_interval):
    rng = np.random.default_rng(31)
    batch = make_batch(rng, rows=6, width=40, uniform=True, unit_interval=unit_interval)
    check_against_reference(batch, dict(token_rewards_as_adv=False, discount=0.95))
    if unit_interval:
        check_against_reference(batch, dict(shaping=dict(mode="process_weighted")))


def test_per_row_lambda_and_variable_groups():
    rng = np.random.default_rng(32)
    batch = make_batch(rng, rows=6, width=30)
    batch["gae_lambda"] = np.array([0.0, 0.5, 0.9, 1.0, 0.7, 0.95], np.float32)
    batch["group_sizes"] = np.array([1, 3, 2], np.int32)
    check_against_reference(batch, dict(discount=0.99, reward_norm=dict(mean_level="group", std_level="group"),
                                        adv_norm=dict(mean_level="group", std_level="group")))


def test_truncation_fallback_warns_and_matches_reference():
    rng = np.random.default_rng(33)
    batch = make_batch(rng, rows=5, width=20, explicit_truncation=False)
    with pytest.warns(UserWarning, match="is_truncated"):
        check_against_reference(batch, dict(discount=0.9, mask_no_eos_with_zero=True))


def test_shaping_never_changes_returns_or_tot_rewards():
    rng = np.random.default_rng(34)
    batch = make_batch(rng, rows=6, width=32, unit_interval=True)
    outs = [compute_advantages(batch, AdvantageConfig(advantage_shaping=ShapingConfig(mode)))
            for mode in prm_jax.kernels.SHAPING_MODES]
    without = compute_advantages({k: v for k, v in batch.items() if k != "token_rewards"}, AdvantageConfig())
    for out in outs:
        np.testing.assert_array_equal(out.returns, without.returns)
        np.testing.assert_array_equal(out.tot_rewards, without.tot_rewards)
    assert not np.array_equal(outs[0].advantages, without.advantages)


def test_masked_positions_do_not_change_active_outputs():
    rng = np.random.default_rng(35)
    batch = make_batch(rng, rows=5, width=30)
    cfg = AdvantageConfig(discount=0.9, gae_lambda=0.9, adv_norm=NormConfig())
    base = compute_advantages(batch, cfg)
    noisy = dict(batch)
    junk = rng.normal(size=batch["logprobs"].shape).astype(np.float32) * 100
    # Positions whose token is not generated: their log-probs and process rewards are unused; so are the
    # reference log-probs (on timesteps) of inactive timesteps.
    for key in ("logprobs", "token_rewards"):
        noisy[key] = np.where(batch["loss_mask"] == 1, batch[key], junk)
    noisy["ref_logprobs"] = np.where(reference.shift(batch["loss_mask"]) == 1, batch["ref_logprobs"], junk)
    noisy["logprobs"] = np.where(batch["loss_mask"] == 1, batch["logprobs"], np.nan).astype(np.float32)
    out = compute_advantages(noisy, cfg)
    active = np.asarray(base.loss_mask) == 1
    for field in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(out, field))[active],
                                      np.asarray(getattr(base, field))[active], err_msg=field)
    assert np.isfinite(np.asarray(out.advantages)).all()


def test_right_padding_changes_nothing():
    rng = np.random.default_rng(36)
    batch = make_batch(rng, rows=4, width=24)
    cfg = AdvantageConfig(discount=0.95, gae_lambda=0.9, adv_norm=NormConfig())
    base = compute_advantages(batch, cfg)
    padded = {}
    for key, value in batch.items():
        if np.ndim(value) == 2:
            fill = -1 if key == "turn_ids" else 0
            padded[key] = np.concatenate([value, np.full((4, 9), fill, value.dtype)], axis=1)
        else:
            padded[key] = value
    out = compute_advantages(padded, cfg)
    for field in FIELDS:
        np.testing.assert_allclose(np.asarray(getattr(out, field))[:, :24], getattr(base, field), rtol=1e-6,
                                   atol=1e-6, err_msg=field)


def test_process_weighted_range_is_checked():
    batch = spec_example(token_rewards=np.array([[0, 0, 0, 0, 0, 1.5, 1.5, 1.5]], np.float32))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        compute_advantages(batch, AdvantageConfig(advantage_shaping=ShapingConfig("process_weighted")))
    # Out-of-range values on prompt/gap tokens are not active and are ignored.
    ok = spec_example(token_rewards=np.array([[9, 9, 0, 0, 9, 0.5, 0.5, 0.5]], np.float32))
    compute_advantages(ok, AdvantageConfig(advantage_shaping=ShapingConfig("process_weighted")))
    # The documented opt-out skips the check.
    compute_advantages(batch, AdvantageConfig(advantage_shaping=ShapingConfig("process_weighted"),
                                              check_values=False))


def count_host_callbacks(config, batch):
    """Value checks under an outer jit with check_values='callback' travel to one host callback (issue 56.1:
    a ``pure_callback`` under a cond, its first operand the checks' counts): the number of checks it carries,
    0 where there is none; two callbacks fail."""
    callbacks = host_callbacks(jax.make_jaxpr(lambda b: compute_advantages(b, config))(batch).jaxpr)
    assert len(callbacks) <= 1, callbacks
    return callbacks[0].invars[0].aval.shape[0] if callbacks else 0


def host_callbacks(jaxpr):
    """Every host callback of ``jaxpr``, its sub-jaxprs (cond branches, inner jits) included."""
    found = []
    for eqn in jaxpr.eqns:
        if "callback" in eqn.primitive.name:
            found.append(eqn)
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # (a ClosedJaxpr's, or a Jaxpr)
                if hasattr(sub, "eqns"):
                    found += host_callbacks(sub)
    return found


def test_value_checks_under_jit_cost_no_host_callback_unless_asked():
    # Issue 14.7: under an outer jit the default checks are data, not host callbacks; the raising
    # callback is opt-in, and check_values=False compiles the checks out.
    batch = {k: jnp.asarray(v) for k, v in spec_example(group_sizes=np.array([1], np.int32)).items()}
    for cfg in (AdvantageConfig(advantage_shaping=ShapingConfig("process_weighted")),
                AdvantageConfig(token_rewards_as_adv=False)):
        assert count_host_callbacks(cfg, batch) == 0
        # the two integer masks' 0/1 rule, finite rewards, group sizes, the mode's own check, (issue 20.4)
        # finite values, bootstrap values, log-probs and token rewards where they are used, (issue 29.9) the
        # outputs' finiteness, and (29.14) where folding reads turns, AReaL's turn-id rules
        folds = not cfg.token_rewards_as_adv
        assert count_host_callbacks(dataclasses.replace(cfg, check_values="callback"), batch) == 10 + folds
        assert count_host_callbacks(dataclasses.replace(cfg, check_values=False), batch) == 0
        out = jax.jit(lambda b, cfg=cfg: compute_advantages(b, cfg))(batch)
        # spec_example's process rewards are -0.2 on the three timesteps of turn 1: outside [0, 1].
        mode_check = ({"checks/process_reward_out_of_range": 3} if cfg.advantage_shaping.mode == "process_weighted"
                      else {"checks/turn_rewards_not_uniform": 0})
        assert {k: int(v) for k, v in out.diagnostics.items() if k.startswith("checks/")} == {
            "checks/attention_mask_not_binary": 0, "checks/loss_mask_not_binary": 0, "checks/rewards_not_finite": 0,
            "checks/group_sizes_invalid": 0, "checks/values_not_finite": 0, "checks/values_bootstrap_not_finite": 0,
            "checks/logprobs_not_finite": 0, "checks/token_rewards_not_finite": 0, "checks/outputs_not_finite": 0,
            **({"checks/turn_ids_invalid": 0} if folds else {}), **mode_check}
        off = jax.jit(lambda b, cfg=cfg: compute_advantages(b, dataclasses.replace(cfg, check_values=False)))(batch)
        assert not any(k.startswith("checks/") for k in off.diagnostics)


def test_fold_uniformity_is_checked():
    batch = spec_example(token_rewards=np.array([[0, 0, 0, 0, 0, -0.2, -0.3, -0.2]], np.float32))
    with pytest.raises(ValueError, match="uniform"):
        compute_advantages(batch, AdvantageConfig(token_rewards_as_adv=False))


def test_value_check_violations_are_counted_under_jit_and_raise_with_the_callback():
    batch = spec_example(token_rewards=np.array([[0, 0, 0, 0, 0, 2.0, 2.0, 2.0]], np.float32))
    cfg = AdvantageConfig(advantage_shaping=ShapingConfig("process_weighted"))
    out = jax.jit(lambda b: compute_advantages(b, cfg))(batch)
    # Every active timestep whose (shifted) process reward is outside [0, 1] counts.
    shifted = np.concatenate([batch["token_rewards"][:, 1:], np.zeros((1, 1), np.float32)], axis=1)
    expected = int(np.sum((np.asarray(out.loss_mask) > 0) & ((shifted < 0) | (shifted > 1))))
    assert expected > 0
    assert int(out.diagnostics["checks/process_reward_out_of_range"]) == expected
    with pytest.raises(ValueError, match=r"\[0, 1\]"):  # eager calls still raise
        compute_advantages(batch, cfg)
    step = jax.jit(lambda b: compute_advantages(b, dataclasses.replace(cfg, check_values="callback")).advantages)
    with pytest.raises(Exception, match=r"\[0, 1\]"):
        jax.block_until_ready(step(batch))


def test_group_sizes_are_checked():
    batch = make_batch(np.random.default_rng(1), rows=4, width=10)
    cfg = AdvantageConfig(adv_norm=NormConfig(mean_level="group", std_level="group"))
    with pytest.raises(ValueError, match="group_sizes"):
        compute_advantages(dict(batch, group_sizes=np.array([2, 1], np.int32)), cfg)
    with pytest.raises(ValueError, match="group_sizes"):
        compute_advantages(dict(batch, group_sizes=np.array([5, -1], np.int32)), cfg)
    with pytest.raises(ValueError, match="does not divide"):
        compute_advantages(batch, AdvantageConfig(adv_norm=NormConfig("group", "group", group_size=3)))


def test_bad_batches_name_the_key():
    batch = spec_example()
    with pytest.raises(ValueError, match="missing required keys \\['rewards'\\]"):
        compute_advantages({k: v for k, v in batch.items() if k != "rewards"})
    with pytest.raises(ValueError, match="'loss_mask'"):
        compute_advantages(dict(batch, loss_mask=np.ones((1, 7))))
    with pytest.raises(ValueError, match="'rewards'"):
        compute_advantages(dict(batch, rewards=np.ones((2,), np.float32)))
    with pytest.raises(TypeError, match="'turn_ids'"):
        compute_advantages(dict(batch, turn_ids=np.zeros((1, 8), np.float32)))
    with pytest.raises(ValueError, match="turn_ids"):
        compute_advantages({k: v for k, v in batch.items() if k != "turn_ids"},
                           AdvantageConfig(gae_timestep_unit="turn"))


@pytest.mark.parametrize("kwargs,key", [
    (dict(discount=1.5), "discount"), (dict(gae_lambda=float("nan")), "gae_lambda"),
    (dict(kl_estimator="k4"), "kl_estimator"), (dict(gae_timestep_unit="episode"), "gae_timestep_unit"),
    (dict(advantage_shaping=dict(mode="multiply")), "advantage_shaping.mode"),
    (dict(advantage_shaping=dict(negative_scale=-1)), "advantage_shaping.negative_scale"),
    (dict(advantage_shaping=dict(zero_penalty=float("inf"))), "advantage_shaping.zero_penalty"),
    (dict(advantage_shaping=dict(zero_eps=-1e-9)), "advantage_shaping.zero_eps"),
    (dict(advantage_shaping=dict(mode="gvpo"), token_rewards_as_adv=False), "token_rewards_as_adv"),
    (dict(advantage_shaping=dict(mode="process_weighted"), token_rewards_as_adv=False), "token_rewards_as_adv"),
    (dict(advantage_shaping=dict(mode="process_weighted"), mask_no_eos_with_zero=True), "mask_no_eos_with_zero"),
    (dict(advantage_shaping=dict(mode="additive", scale=1)), "unknown keys"),
    (dict(adv_norm=dict(mean_level="global")), "adv_norm.mean_level"),
    (dict(reward_norm=dict(eps=-1)), "reward_norm.eps"),
    (dict(gae_method="cumsum", discount=0.9), "cumsum"),
    (dict(overlong_reward_penalty=True, overlong_tokens=0), "overlong_tokens"),
])
def test_config_validation_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", "\\.")):
        AdvantageConfig(**kwargs)


def test_the_pipeline_compiles_check_counts_only_and_a_failed_check_is_located_by_a_second_trace():
    # The searches for a failed check's first bad entry were a fifth of the program's trace-and-compile time
    # (benchmarks/bench_compile.py): the first program holds the counts only, and an eager call whose
    # check fails traces the plan again with the searches, so the message still names the entry.
    from prm_jax.kernels import _advantages as pipeline
    from prm_jax.kernels import _inputs as inputs
    rng = np.random.default_rng(21)
    batch = make_batch(rng, rows=4, width=16)
    arrays = inputs.batch_arrays(batch)
    plan = AdvantageConfig().plan.with_strategy(arrays)
    counts_only = pipeline._pipeline_jit.lower(arrays, plan=plan, locate=False).as_text()
    assert "stablehlo.case" not in counts_only
    assert "stablehlo.case" in pipeline._pipeline_jit.lower(arrays, plan=plan, locate=True).as_text()
    bad = {**batch, "group_ids": np.array([0, 0, 7, 1], np.int32)}
    config = AdvantageConfig(discount=0.93, reward_norm=dict(mean_level="group", std_level="group"))
    with compile_log() as compiled:
        compute_advantages({**batch, "group_ids": np.array([0, 0, 1, 1], np.int32)}, config)
        assert sum("Compiling jit(_pipeline_jit)" in m for m in compiled) == 1
        with pytest.raises(ValueError, match=r"entry 2 is 7"):
            compute_advantages(bad, config)
        assert sum("Compiling jit(_pipeline_jit)" in m for m in compiled) == 2  # the located trace only
    # Under an outer jit the counts come back as data, from the counts-only program.
    out = jax.jit(lambda b: compute_advantages(b, config).diagnostics["checks/group_ids_invalid"])(bad)
    assert int(out) == 1


def test_one_compile_per_shape_and_config():
    rng = np.random.default_rng(2)
    with compile_log() as compiled:
        for _ in range(3):
            batch = make_batch(rng, rows=4, width=16)
            # A fresh but equal config object each call: configs hash by value.
            compute_advantages(batch, AdvantageConfig(discount=0.9, adv_norm=dict(mean_level="batch")))
    assert sum("Compiling jit(_pipeline_jit)" in m for m in compiled) == 1
    # ... and an outer jitted step that calls it traces once.
    step = jax.jit(chex.assert_max_traces(lambda b: compute_advantages(b, AdvantageConfig(discount=0.9)), n=1))
    for _ in range(3):
        step(make_batch(rng, rows=4, width=16))




def test_under_jit_and_vmap():
    rng = np.random.default_rng(3)
    batch = make_batch(rng, rows=4, width=16)
    cfg = AdvantageConfig(discount=0.9, gae_lambda=0.95)
    want = compute_advantages(batch, cfg)
    jitted = jax.jit(lambda b: compute_advantages(b, cfg))(batch)
    for field in FIELDS:
        np.testing.assert_allclose(getattr(jitted, field), getattr(want, field), rtol=1e-6, atol=1e-6)
    rows = jax.vmap(lambda b: compute_advantages(jax.tree.map(lambda x: x[None], b), cfg).advantages[0])(batch)
    np.testing.assert_allclose(rows, want.advantages, rtol=1e-5, atol=1e-5)


def test_outputs_are_float32_for_bf16_inputs():
    rng = np.random.default_rng(4)
    batch = make_batch(rng, rows=3, width=20)
    low = {k: (jnp.asarray(v, jnp.bfloat16) if np.asarray(v).dtype == np.float32 else v) for k, v in batch.items()}
    out = compute_advantages(low, AdvantageConfig(discount=0.9))
    for field in FIELDS:
        assert getattr(out, field).dtype == jnp.float32, field
    want = reference.compute_advantages({k: np.asarray(v, np.float64) if np.asarray(v).dtype != bool else v
                                         for k, v in low.items()}, dict(discount=0.9))
    np.testing.assert_allclose(out.advantages, want["advantages"], rtol=1e-5, atol=1e-5)


def test_advantage_config_is_hashable_and_static():
    a = AdvantageConfig(adv_norm=dict(mean_level="group", group_size=2))
    b = AdvantageConfig(adv_norm=NormConfig(mean_level="group", group_size=2))
    assert a == b and hash(a) == hash(b)
    assert dataclasses.replace(a, discount=0.5) != a
    chex.assert_trees_all_equal(a.advantage_shaping, ShapingConfig())


@pytest.mark.parametrize("method", ["auto", "native", "associative", "blocked", "cumsum", "pallas"])
def test_grad_through_compute_advantages_matches_scan(method):
    # Issue 11.1: the native kernel (what 'auto' picks on a CPU with a compiler) is differentiable too.
    skip_without_native(method)
    rng = np.random.default_rng(111)
    batch = make_batch(rng, rows=4, width=24)
    discount, lam = (1.0, 1.0) if method == "cumsum" else (0.95, 0.9)
    weights = jnp.asarray(rng.normal(size=(4, 24)), jnp.float32)

    def loss(values, rewards, method):
        out = compute_advantages(dict(batch, values=values, rewards=rewards),
                                 AdvantageConfig(discount=discount, gae_lambda=lam, gae_method=method))
        return jnp.sum(out.advantages * weights) + jnp.sum(out.returns * weights) / 2

    args = (jnp.asarray(batch["values"]), jnp.asarray(batch["rewards"]))
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)  # one program each (eagerly: several)
    want = grad(*args, "scan")
    got = grad(*args, method)
    for g, w in zip(got, want):
        assert np.abs(np.asarray(w)).max() > 0
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_shaping_variants_share_one_gae_and_equal_separate_runs():
    # Issue 12: the CLI's five advantage passes become one GAE shaped four ways.
    from prm_jax.kernels._advantages import compute_advantage_variants
    rng = np.random.default_rng(120)
    batch = make_batch(rng, rows=6, width=32, unit_interval=True)
    config = AdvantageConfig(discount=0.95, gae_lambda=0.9, adv_norm=NormConfig())
    shapings, refused = config.shaping_variants(["additive", "gvpo", "process_weighted"])
    assert refused == {}
    configured, variants = compute_advantage_variants(batch, config, shapings)
    np.testing.assert_array_equal(configured.advantages, compute_advantages(batch, config).advantages)
    unshaped = compute_advantages({k: v for k, v in batch.items() if k != "token_rewards"}, config)
    np.testing.assert_allclose(variants["none"].advantages, unshaped.advantages, rtol=1e-6, atol=1e-6)
    for mode in ("additive", "gvpo", "process_weighted"):
        alone = compute_advantages(batch, dataclasses.replace(config, advantage_shaping=ShapingConfig(mode)))
        np.testing.assert_allclose(variants[mode].advantages, alone.advantages, rtol=1e-6, atol=1e-6, err_msg=mode)
    # Issue 43: each variant carries its advantages' statistics, computed in the kernel (the report reads them):
    # population statistics over the trained timesteps, against float64.
    active = np.asarray(configured.loss_mask) > 0
    for mode, variant in variants.items():
        values = np.asarray(variant.advantages, np.float64)[active]
        want = {"mean": values.mean(), "std": values.std(), "min": values.min(), "max": values.max()}
        assert sorted(variant.diagnostics) == sorted(f"advantages/{name}" for name in want), mode
        for name, value in want.items():
            assert float(variant.diagnostics[f"advantages/{name}"]) == pytest.approx(value, rel=1e-5, abs=1e-6), (
                mode, name)
    # A mode the batch rules out is reported, not raised.
    batch["token_rewards"] = batch["token_rewards"] * 3
    _, variants = compute_advantage_variants(batch, config, config.shaping_variants(["additive", "process_weighted"])[0])
    assert variants["process_weighted"].startswith("n/a") and not isinstance(variants["additive"], str)
    # A mode the config rules out is named with the reason, never computed.
    masked = dataclasses.replace(config, mask_no_eos_with_zero=True)
    shapings, refused = masked.shaping_variants(["additive", "process_weighted"])
    assert [s.mode for s in shapings] == ["additive"]
    assert refused == {"process_weighted": "n/a: mask_no_eos_with_zero true cannot be combined with "
                                           "advantage_shaping.mode 'process_weighted': AReaL refuses it: the zeroed "
                                           "process rewards of a truncated row would zero its positive advantages"}
