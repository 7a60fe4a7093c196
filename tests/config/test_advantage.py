"""``AdvantageConfig`` resolves into the kernels' ``AdvantagePlan`` (issue 21): the stages are chosen once,
from AReaL's keys, and running the plan is running the config."""

import dataclasses

import chex
import jax
import numpy as np
import pytest
from batches import make_batch

from prm_jax.config import AdvantageConfig, GiGPOConfig, NormConfig, ShapingConfig
from prm_jax.kernels import AdvantagePlan, compute_advantages
from prm_jax.kernels import _plan as kernel_advantages
from prm_jax.kernels._token_gae import TokenGAE
from prm_jax.kernels._turns import TurnGAE
from prm_jax.kernels.gae_lambda import relative_position_gae_lambda


def test_the_default_config_is_the_default_plan():
    assert AdvantageConfig().plan == AdvantagePlan()


@pytest.mark.parametrize("keys,estimator", [
    ({}, TokenGAE()),
    ({"gae_block_size": 8}, TokenGAE(8)),
    ({"gae_timestep_unit": "turn"}, TurnGAE()),
    ({"credit_assignment": {"mode": "gigpo", "step_weight": 0.5}}, GiGPOConfig(step_weight=0.5)),
    ({"credit_assignment": {"mode": "gigpo"}, "gae_timestep_unit": "turn"}, GiGPOConfig()),
])
def test_the_estimator_is_chosen_once_from_the_keys(keys, estimator):
    assert AdvantageConfig(**keys).plan.estimator == estimator


def test_every_key_lands_in_its_stage():
    config = AdvantageConfig(discount=0.9, gae_lambda=0.8, kl_ctl=0.05, kl_estimator="k3", reward_bias=-0.5,
                             reward_scaling=2.0, reward_clip=3.0, mask_no_eos_with_zero=True,
                             token_rewards_as_adv=False, reward_norm={"mean_level": "group"},
                             adv_norm=NormConfig("batch", None), overlong_reward_penalty=True, overlong_tokens=4,
                             overlong_penalty_factor=0.5, max_new_tokens=16, gae_method="blocked", max_turns=6,
                             check_values=False, diagnostics=True)
    plan = config.plan
    assert plan.outcome == kernel_advantages.OutcomeStage(-0.5, 2.0, 3.0, NormConfig(mean_level="group"),
                                                          kernel_advantages.OverlongPenalty(16, 4, 0.5))
    assert plan.kl == kernel_advantages.KLStage(0.05, "k3")
    assert plan.task == kernel_advantages.TaskRewardStage(mask_truncated=True, fold_process=True)
    assert (plan.discount, plan.lam, plan.adv_norm, plan.shaping) == (0.9, 0.8, NormConfig("batch", None), None)
    assert (plan.gae_method, plan.max_turns, plan.check_values, plan.diagnostics) == ("blocked", 6, False, True)
    assert not plan.check_turn_ids


def test_a_lambda_path_resolves_to_the_function_when_the_config_is_built():
    config = AdvantageConfig(gae_lambda="areal.trainer.ppo.lambda_fn.relative_position_gae_lambda",
                             gae_lambda_kwargs={"q": 0.5}, gae_timestep_unit="turn")
    lam = config.plan.lam
    assert isinstance(lam, kernel_advantages.LambdaFunction)
    assert (lam.fn, lam.kwargs, lam.unit) == (relative_position_gae_lambda, (("q", 0.5),), "turn")
    assert config.plan.check_turn_ids


def test_equal_configs_give_equal_plans_and_one_compile():
    batch = make_batch(np.random.default_rng(5), rows=3, width=12, unit_interval=True)
    batch = {k: jax.numpy.asarray(v) for k, v in batch.items()}
    first = AdvantageConfig(discount=0.97, advantage_shaping={"mode": "gvpo"})
    second = AdvantageConfig(discount=0.97, advantage_shaping=ShapingConfig("gvpo"))
    assert first.plan == second.plan and hash(first.plan) == hash(second.plan) and first.plan is not second.plan
    run = chex.assert_max_traces(n=1)(lambda b, config: compute_advantages(b, config).advantages)
    jitted = jax.jit(run, static_argnames="config")
    np.testing.assert_array_equal(jitted(batch, config=first.plan), jitted(batch, config=second.plan))


def test_running_the_plan_is_running_the_config():
    batch = make_batch(np.random.default_rng(6), rows=4, width=16, unit_interval=True)
    config = AdvantageConfig(discount=0.9, gae_lambda=0.7, adv_norm=NormConfig(),
                             advantage_shaping=ShapingConfig("process_weighted"))
    by_config, by_plan = compute_advantages(batch, config), compute_advantages(batch, config.plan)
    for field in ("advantages", "returns", "kl_rewards", "tot_rewards"):
        np.testing.assert_array_equal(getattr(by_config, field), getattr(by_plan, field))


def test_anything_else_is_refused_by_name():
    with pytest.raises(TypeError, match="config must be an AdvantageConfig or an AdvantagePlan, got dict"):
        compute_advantages({}, {"discount": 1.0})  # type: ignore[arg-type]


def test_a_replaced_config_has_its_own_plan():
    config = AdvantageConfig(discount=0.9)
    assert dataclasses.replace(config, discount=0.8).plan.discount == 0.8 and config.plan.discount == 0.9
