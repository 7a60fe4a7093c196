"""prm-jax's process rewards inside tunix's own GRPOLearner, end to end on CPU (issue 23.8).

Needs the `tunix` extra (`python3 dev.py tunix` makes its environment and runs these); skipped without it.
The model is tunix's own test transformer (randomly initialized, so it samples pad tokens mid-completion:
holes in `completion_mask`), the rollout engine tunix's pure-JAX `vanilla`, the tokenizer tunix's MockVocab.
"""

import jax
import numpy as np
import pytest

tunix = pytest.importorskip("tunix")

import reference  # noqa: E402
from flax import nnx  # noqa: E402 (after the skip: the tunix extra brings it)
from grain import python as grain  # noqa: E402
from tunix.rl import algo_core, common  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402
from tunix.tests import test_common as tc  # noqa: E402
from tunix_rules import tunix_promotion_rules  # noqa: E402, F401 (an autouse fixture)

import prm_jax  # noqa: E402
from examples.tunix_grpo.__main__ import make_cluster  # noqa: E402
from prm_jax.integrations import tunix as adapter  # noqa: E402
from prm_jax.integrations.tunix import _estimators as tunix_estimators  # noqa: E402

GROUP = 2
PROMPTS = ["input string", "hello world", "My name", "hello there"]


def cluster(steps=2):
    """The example's cluster (tunix's toy transformer, vanilla rollout, MockVocab), and its policy model."""
    rl_cluster = make_cluster(steps)
    return rl_cluster, rl_cluster.actor_trainer.model


def dataset():
    return grain.MapDataset.source(PROMPTS).batch(2).map(lambda x: {"prompts": x})


class PerTokenJudge(prm_jax.BaseScorer):
    """A process reward that differs at every token (0.01 x the token id), failing on one prompt."""

    name = "per_token"

    async def evaluate(self, interaction, ctx):
        if ctx["prompt"] == "My name":
            raise ConnectionError("judge unreachable")
        return np.asarray(interaction.output_tokens, np.float32) * 0.01


class Silent(prm_jax.BaseScorer):
    name = "silent"

    async def evaluate(self, interaction, ctx):
        return 0.0


def run(scorer, **grpo):
    """Two GRPO steps with prm-jax's learner; what each step fed tunix's loss, and the outcome rewards."""
    rl_cluster, model = cluster()
    before = jax.tree.map(np.array, nnx.state(model, nnx.Param))
    outcomes, examples = [], []

    def outcome(prompts, completions, **kwargs):
        rewards = [float(len(c) % 5) for c in completions]
        outcomes.append(np.asarray(rewards, np.float32))
        return rewards

    with prm_jax.BlockingRunner(scorers=[scorer]) as runner:
        learner = adapter.ProcessRewardGRPOLearner(
            rl_cluster=rl_cluster, algo_config=grpo_learner.GRPOConfig(num_generations=GROUP, beta=0.0, **grpo),
            reward_fns=outcome, scorers=runner)
        step = learner._generate_and_compute_advantage
        learner._generate_and_compute_advantage = lambda *a, **k: examples.append(step(*a, **k)) or examples[-1]
        learner.train(dataset())
    after = nnx.state(model, nnx.Param)
    changed = any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    return examples, outcomes, changed, learner


def test_process_rewards_reach_tunix_loss_on_the_right_tokens_and_failed_rows_are_dropped():
    examples, outcomes, changed, _ = run(PerTokenJudge())
    assert len(examples) == len(outcomes) == 2 and changed  # the hook ran once per step; the model trained
    seen_failed = seen_hole = False
    for example, rewards in zip(examples, outcomes):
        completion_ids, trained = np.asarray(example.completion_ids), np.asarray(example.completion_mask)
        advantages = np.asarray(example.advantages)
        assert advantages.shape == completion_ids.shape  # [B, C]: tunix's loss takes them per token
        failed = np.array([p == "My name" for p in example_prompts(example)])
        assert not trained[failed].any()  # the judge failed there: dropped from the loss
        seen_failed |= bool(failed.any())
        seen_hole |= bool((np.cumsum(trained[:, ::-1], axis=1)[:, ::-1] > 0)[~trained].any())  # untrained before a trained
        grpo = np.broadcast_to(grpo_reference(rewards)[:, None], trained.shape)
        want = grpo + 0.01 * completion_ids  # completion token j's own process reward, no off-by-one
        np.testing.assert_allclose(advantages[trained], want[trained], rtol=1e-5, atol=1e-5)
    assert seen_failed and seen_hole  # both traps were exercised


def test_without_process_rewards_tunix_gets_its_own_grpo_advantages():
    examples, outcomes, _, _ = run(Silent())
    for example, rewards in zip(examples, outcomes):
        trained = np.asarray(example.completion_mask)
        theirs = np.asarray(algo_core.compute_advantages(rewards, GROUP))  # tunix's registered `grpo`
        ours = np.asarray(example.advantages)
        np.testing.assert_allclose(ours[trained], np.broadcast_to(theirs[:, None], trained.shape)[trained],
                                   rtol=0, atol=1e-6)


def test_a_tunix_that_stops_calling_the_hooked_methods_fails_loudly(monkeypatch):
    rl_cluster, _ = cluster(steps=1)
    with prm_jax.BlockingRunner(scorers=[Silent()]) as runner:
        learner = adapter.ProcessRewardGRPOLearner(
            rl_cluster=rl_cluster, algo_config=grpo_learner.GRPOConfig(num_generations=GROUP, beta=0.0),
            reward_fns=lambda prompts, completions, **kw: [0.0] * len(completions), scorers=runner)
        monkeypatch.setattr(grpo_learner.GRPOLearner, "_generate_and_compute_advantage",
                            lambda self, training_input, mode=None: None)
        with pytest.raises(RuntimeError, match="called _compute_rewards 0 times"):
            learner._generate_and_compute_advantage({"prompts": PROMPTS[:2]})


@pytest.mark.parametrize("agg", ["token-mean", "sequence-mean-token-mean", "seq-mean-token-sum",
                                 "sequence-mean-token-scale", "sequence-mean-token-sum-norm"])
def test_areal_loss_in_tunix_equals_tunix_grpo_loss_where_they_agree(agg):
    # Issue 23.5/23.9: prm_jax.losses.ppo_clip_loss behind tunix's policy-loss interface. With beta = 0 and
    # symmetric clipping it computes what tunix's grpo loss does, at old log-probs that clip some tokens.
    # Issue 44.5: under each of tunix's five aggregations (Dr. GRPO's sequence-mean-token-scale included).
    examples, _, _, learner = run(Silent())
    config = grpo_learner.GRPOConfig(num_generations=GROUP, beta=0.0, loss_agg_mode=agg)
    config.temperature = learner.algo_config.temperature
    model = learner.rl_cluster.actor_trainer.model
    pad, eos = learner.rl_cluster.rollout.pad_id(), learner.rl_cluster.rollout.eos_id()
    graphdef, state = nnx.split(model)
    for example in examples:
        every_row_trains = np.eye(*example.completion_mask.shape, dtype=bool)  # seq-mean: no empty row
        example = example.replace(completion_mask=np.asarray(example.completion_mask) | every_row_trains)
        logps = common.compute_per_token_logps(graphdef, state, prompt_tokens=example.prompt_ids,
                                               completion_tokens=example.completion_ids, pad_id=pad, eos_id=eos,
                                               temperature=config.temperature)
        for shift in (0.0, 0.15, -0.4):
            noise = np.random.default_rng(3).normal(size=logps.shape).astype(np.float32) * shift
            shifted = example.replace(old_per_token_logps=logps + noise)
            ours, _ = adapter.tunix_ppo_loss(model, shifted, config, pad, eos)
            theirs, _ = algo_core.grpo_loss_fn(model, shifted, config, pad, eos)
            np.testing.assert_allclose(float(ours), float(theirs), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"set GRPOConfig\(beta=0.0\)"):
        adapter.tunix_ppo_loss(model, examples[0], grpo_learner.GRPOConfig(num_generations=GROUP), pad, eos)


def test_a_learner_on_areal_loss_trains():
    examples, _, changed, _ = run(PerTokenJudge(), policy_loss_fn=adapter.register_loss())
    assert len(examples) == 2 and changed


def test_every_loss_is_registered_in_tunix_by_name_and_computes_prm_jax_losses():
    # Issue 33.1/33.2: a tunix config names prm-jax's losses (GRPOConfig(policy_loss_fn="prm_jax_<mode>")).
    from tunix.rl import function_registry

    from prm_jax import losses
    names = adapter.register_losses(dro={"dro_beta": 2e-3})
    assert set(names) == {"ppo_clip", *losses.POLICY_LOSS_MODES}
    examples, _, _, learner = run(Silent())
    # tunix's "sequence-mean-token-mean" is verl's "seq-mean-token-mean" (the mapping is part of what is tested)
    config = grpo_learner.GRPOConfig(num_generations=GROUP, beta=0.0, loss_agg_mode="sequence-mean-token-mean")
    config.temperature = learner.algo_config.temperature
    model = learner.rl_cluster.actor_trainer.model
    pad, eos = learner.rl_cluster.rollout.pad_id(), learner.rl_cluster.rollout.eos_id()
    graphdef, state = nnx.split(model)
    example = examples[0]
    logps = common.compute_per_token_logps(graphdef, state, prompt_tokens=example.prompt_ids,
                                           completion_tokens=example.completion_ids, pad_id=pad, eos_id=eos,
                                           temperature=config.temperature)
    old = logps + np.random.default_rng(4).normal(size=logps.shape).astype(np.float32) * 0.2
    shifted = example.replace(old_per_token_logps=old)
    advantages = np.broadcast_to(np.asarray(example.advantages, np.float32)[:, None], logps.shape) \
        if np.ndim(example.advantages) == 1 else np.asarray(example.advantages, np.float32)
    options = {"dro": {"dro_beta": 2e-3}, "clip_cov": {"key": jax.random.key(0)}}
    for mode in losses.POLICY_LOSS_MODES:
        ours, aux = function_registry.get_policy_loss_fn(names[mode])(model, shifted, config, pad, eos)
        aggregation = {"loss_agg_mode": "seq-mean-token-mean"} if mode != "geo_mean" else {}  # (GMPO's own)
        want, _ = losses.policy_loss(logps, old, advantages, np.asarray(example.completion_mask, bool), mode=mode,
                                     **aggregation, **options.get(mode, {}))
        np.testing.assert_allclose(float(ours), float(want), rtol=1e-5, atol=1e-6, err_msg=mode)
        assert set(aux) >= {"pg_loss", "pg_clipfrac", "ppo_kl"}, mode
    with pytest.raises(ValueError, match="no policy loss named"):
        adapter.register_losses(ppo={})


def test_a_learner_trains_on_a_registered_verl_loss():
    adapter.register_losses()
    examples, _, changed, _ = run(PerTokenJudge(), policy_loss_fn="prm_jax_cispo")
    assert len(examples) == 2 and changed


def test_the_group_norm_estimator_is_registered_and_equals_areals_loop():
    from tunix.rl import function_registry
    name = adapter.register_estimators()["group_norm"]
    rewards = np.array([1.0, 0.0, 3.0, 3.0, 0.5, 2.0], np.float32)
    got = function_registry.get_advantage_estimator(name)(rewards=rewards, num_generations=2)
    r = rewards.astype(np.float64).reshape(-1, 2)
    want = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-5)  # AReaL: unbiased, eps 1e-5
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="num_generations"):
        function_registry.get_advantage_estimator(name)(rewards=rewards, num_generations=4)


def tunix_ppo_inputs():
    """What tunix's PPO learner passes its estimator: rewards in the token ids' int32 buffer (the score at
    the last token), the critic's values, a completion mask with a hole (a pad sampled mid-completion) and
    a short row."""
    rewards = np.zeros((3, 6), np.int32)
    rewards[[0, 1, 2], [5, 3, 5]] = [2, -1, 1]
    values = np.array([[0.5, -0.25, 0.75, 0.125, -0.5, 0.25], [0.1, 0.2, -0.3, 0.4, 9.0, -9.0],
                       [-0.6, 0.7, 0.05, -0.15, 0.35, 0.45]], np.float32)
    mask = np.array([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32)
    return {"rewards": rewards, "values": values, "completion_mask": mask, "gamma": 0.9, "gae_lambda": 0.8}


def test_the_gae_estimator_is_registered_and_equals_tunix_gae_and_the_float64_loop():
    from tunix.rl import function_registry
    estimator = function_registry.get_advantage_estimator(adapter.register_estimators()["gae"])
    inputs = tunix_ppo_inputs()
    mask = inputs["completion_mask"] > 0
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        advantages, returns = (np.asarray(x) for x in estimator(**inputs))
    loop, loop_returns = reference.gae(inputs["rewards"], inputs["values"], mask, 0.9, 0.8, np.zeros(3))
    np.testing.assert_allclose(advantages, reference.whiten(loop, mask), rtol=1e-5, atol=1e-6)  # 0 off the mask
    np.testing.assert_allclose(returns, loop_returns, rtol=1e-6, atol=1e-6)
    theirs, their_returns = (np.asarray(x) for x in algo_core.compute_gae_advantages(**inputs))
    np.testing.assert_allclose(advantages[mask], theirs[mask], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(returns, their_returns, rtol=1e-6, atol=1e-6)
    # A batch with one trained token: 0 here, NaN in tunix's (its n / (n - 1)); the docstring says so.
    one = dict(inputs, completion_mask=np.eye(3, 6, 2, dtype=np.int32)[:1].repeat(3, 0) * np.array([[1], [0], [0]]))
    assert np.asarray(estimator(**one)[0]).tolist() == np.zeros((3, 6)).tolist()
    assert np.isnan(np.asarray(algo_core.compute_gae_advantages(**one)[0])[0, 2])
    # Finite float32 rewards whose discounted sum overflows: refused, not returned.
    big = dict(inputs, rewards=np.full((3, 6), 3e38, np.float32), gamma=1.0, gae_lambda=1.0)
    with pytest.raises(ValueError, match="prm_jax_gae: the advantages or the returns are not finite"):
        estimator(**big)
    # One program for a shape: a second call does not trace the whitening again.
    before = tunix_estimators._whiten_jit._cache_size()
    estimator(**dict(inputs, gamma=0.5))
    assert tunix_estimators._whiten_jit._cache_size() == before


def test_tunix_ppo_learner_trains_on_the_registered_gae_with_tunix_gae_advantages():
    from tunix.rl import function_registry
    from tunix.rl.ppo import ppo_learner

    name = adapter.register_estimators()["gae"]
    registered = function_registry.get_advantage_estimator(name)
    calls = []

    def recording(**inputs):  # what the learner passed and got, to check against tunix's own gae
        out = registered(**inputs)
        calls.append(({k: np.asarray(v) for k, v in inputs.items()}, [np.asarray(x) for x in out]))
        return out

    function_registry.register_advantage_estimator(name)(recording)
    try:
        rl_cluster = make_cluster(2, critic=True)
        before = jax.tree.map(np.array, nnx.state(rl_cluster.actor_trainer.model, nnx.Param))
        learner = ppo_learner.PPOLearner(
            rl_cluster=rl_cluster, reward_fns=lambda prompts, completions, **kw: [float(len(c) % 5) for c in completions],
            ppo_config=ppo_learner.PPOConfig(advantage_estimator=name, beta=0.0, gamma=0.9, gae_lambda=0.8))
        learner.train(dataset())
    finally:
        function_registry.register_advantage_estimator(name)(registered)
    after = nnx.state(rl_cluster.actor_trainer.model, nnx.Param)
    assert len(calls) == 2
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    for inputs, (advantages, returns) in calls:
        mask = inputs["completion_mask"] > 0
        theirs, their_returns = (np.asarray(x) for x in algo_core.compute_gae_advantages(**inputs))
        np.testing.assert_allclose(advantages[mask], theirs[mask], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(returns, their_returns, rtol=1e-6, atol=1e-6)


def example_prompts(example):
    """The prompt text of each row, decoded from tunix's left-padded prompt ids."""
    vocab = tc.MockVocab()
    return [vocab.DecodeIds([int(t) for t, m in zip(ids, mask) if m][1:])  # drop BOS
            for ids, mask in zip(np.asarray(example.prompt_ids), np.asarray(example.prompt_mask))]


def grpo_reference(rewards):
    r = np.asarray(rewards, np.float64).reshape(-1, GROUP)
    return ((r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)


def test_the_tunix_example_runs(capsys):
    from examples.tunix_grpo.__main__ import main

    seen = main(["--steps", "3"])
    assert len(seen["outcome"]) == len(seen["tunix_tokens"]) == 3
    assert all(0.0 <= v <= 1.0 for v in seen["outcome"]) and '"outcome"' in capsys.readouterr().out


def test_the_tunix_benchmark_runs_at_a_toy_size():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_tunix.py"), "--shapes", "4x32",
                           "--repeats", "1"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tunix / prm-jax =" in proc.stdout
