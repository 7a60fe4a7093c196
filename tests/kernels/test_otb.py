"""Issue 44.1 (its kernel): the optimal token baseline, ``credit.optimal_token_baseline`` (verl's multi-turn
variant, with prm-jax's rules where verl's break (the credit-assignment guide states each)) and ``credit.sum_pi_squared``,
against verl's multi-turn OTB (verl-project/verl @ 1dda039b, core_algos.py compute_multi_turn_optimal_token_baseline_advantage;
arXiv 2602.07078)'s worked numbers and
float64 loops; ``credit_assignment: {mode: otb}`` in the pipeline against tests/reference.py's loop."""

import dataclasses
import warnings

import chex
import jax
import numpy as np
import pytest
import reference
from matrix_cases import make_batch as matrix_batch
from native_where import runs_native, skip_without_native

import prm_jax
from prm_jax.config import AdvantageConfig, ConfigError
from prm_jax.credit import optimal_token_baseline, sum_pi_squared
from prm_jax.kernels._recurrence import resolve_strategy
from prm_jax.native import _ffi as ffi


def test_the_worked_example_with_and_without_the_zero_tail():
    # verl's multi-turn OTB (verl-project/verl @ 1dda039b, core_algos.py compute_multi_turn_optimal_token_baseline_advantage;
    # arXiv 2602.07078): W_0 = (.5, .7, 1), W_1 = (.4, 1), G_0 = 1, G_1 = 0: A_0 = (.4444, .5882, 1.0),
    # A_1 = (-.5556, -.4118); without the zero tail A_0[2] = 1 - 1 / (1 + eps), about 0.
    w = np.array([[.5, .2, .3], [.4, .6, 0.0]], np.float32)
    args = (np.array([[0, 0, 1.0], [0, 0, 0]], np.float32), np.array([[1, 1, 1], [1, 1, 0]], bool),
            np.log(np.full((2, 3), 0.5, np.float32)), w)  # pi = 0.5: sum_pi_squared = w
    out = optimal_token_baseline(*args)
    np.testing.assert_allclose(np.asarray(out.advantages), [[5 / 9 * 0.8, 1 - 0.7 / 1.7, 1], [-5 / 9, -0.7 / 1.7, 0]],
                               rtol=1e-5)
    assert abs(float(optimal_token_baseline(*args, handle_zero_tail=False).advantages[0, 2])) < 1e-6


# OTB's two alignments by generated-token index (the CPU's native kernels, and XLA's scatter on every backend)
# and sum_pi_squared's two methods; a native case skips itself where the kernels are not built (asked when it
# runs: collecting the suite builds nothing).
ALIGNMENTS = ["scatter", "native"]
METHODS = ["xla", "native"]




@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("with_weights", [False, True])
@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_groups_with_holes_empty_rows_ties_and_a_group_of_one_match_a_float64_loop(zero_tail, with_weights,
                                                                                   alignment):
    skip_without_native(alignment)
    rng = np.random.default_rng(int(zero_tail) + 2 * int(with_weights))
    rows, width = 9, 14
    mask = rng.random((rows, width)) < 0.6
    mask[2] = False                      # an empty row, dropped from its group
    mask[4] = mask[5]                    # a tie for the longest in their group
    rewards = rng.normal(size=(rows, width)).astype(np.float32)
    logprobs = (-rng.exponential(1.0, (rows, width))).astype(np.float32)
    pi = np.exp(logprobs.astype(np.float64))
    pi2 = (pi ** 2 + rng.uniform(0, 1, (rows, width)) * (1 - pi) ** 2).astype(np.float32)
    weights = rng.uniform(0.5, 1.5, (rows, width)).astype(np.float32) if with_weights else None
    rewards[~mask] = np.nan              # untrained positions may hold anything
    sizes = np.array([4, 4, 1], np.int32)
    out = optimal_token_baseline(rewards, mask, logprobs, pi2, group_sizes=sizes, rollout_is_weights=weights,
                                 handle_zero_tail=zero_tail, alignment=alignment)
    want_a, want_r = reference.optimal_token_baseline(np.nan_to_num(rewards), mask, logprobs, pi2,
                                                      np.repeat(np.arange(3), sizes), weights, zero_tail)
    np.testing.assert_allclose(np.asarray(out.advantages), want_a, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(out.returns), want_r, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_a_deterministic_policy_and_an_empty_batch(alignment):
    skip_without_native(alignment)
    # w = 0 everywhere: B = 0 / eps = 0 and A = G; no trained token: zeros.
    mask = np.array([[1, 1, 0], [1, 0, 1]], bool)
    rewards = np.array([[0.0, 1.0, 0], [2.0, 0, 1.0]], np.float32)
    out = optimal_token_baseline(rewards, mask, np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32),
                                 alignment=alignment)
    np.testing.assert_allclose(np.asarray(out.advantages), [[1, 1, 0], [3, 0, 1]])
    empty = optimal_token_baseline(rewards, np.zeros((2, 3), bool), np.zeros((2, 3), np.float32),
                                   np.ones((2, 3), np.float32), alignment=alignment)
    assert not np.asarray(empty.advantages).any()


@pytest.mark.parametrize("method", METHODS)
def test_sum_pi_squared_matches_float64_in_one_pass_or_in_chunks(method):
    skip_without_native(method)
    # (The native kernel's exponential is a polynomial: within float32 rounding of the float64 sums.)
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(2, 5, 1003)) * 4).astype(np.float32)
    for temperature in (1.0, 0.7):
        z = logits.astype(np.float64) / temperature
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        want = (p * p).sum(-1)
        for chunk in (None, 128, 1003, 4096):
            got = np.asarray(sum_pi_squared(logits, temperature=temperature, chunk=chunk, method=method))
            np.testing.assert_allclose(got, want, rtol=2e-5, err_msg=str((temperature, chunk)))


@pytest.mark.parametrize("method", METHODS)
def test_sum_pi_squared_of_masked_logits_and_of_rows_without_a_distribution(method):
    skip_without_native(method)
    # -inf logits (a masked vocabulary) weigh nothing; a row of -inf only, or holding NaN, has no
    # distribution: NaN (verl's multi-turn OTB (verl-project/verl @ 1dda039b, core_algos.py
    # compute_multi_turn_optimal_token_baseline_advantage; arXiv 2602.07078)), on both paths; a vocabulary shorter than the
    # kernel's lanes.
    z = np.array([[0.0, -np.inf, np.log(3.0)], [-np.inf, -np.inf, -np.inf], [0.0, np.nan, 1.0]], np.float32)
    got = np.asarray(sum_pi_squared(z, method=method))
    assert got[0] == pytest.approx(0.25 ** 2 + 0.75 ** 2, rel=1e-6) and np.isnan(got[1:]).all()
    wide = np.full((1, 70), -np.inf, np.float32)
    wide[0, [3, 40, 69]] = 0.0
    assert float(np.asarray(sum_pi_squared(wide, method=method))[0]) == pytest.approx(1 / 3, rel=1e-6)


def test_bad_input_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="sum_pi_squared must be finite"):
        optimal_token_baseline(np.zeros((1, 2), np.float32), np.ones((1, 2), bool), np.zeros((1, 2), np.float32),
                               np.array([[np.nan, 1.0]], np.float32))
    with pytest.raises(ValueError, match="temperature"):
        sum_pi_squared(np.zeros((2, 3), np.float32), temperature=0.0)
    with pytest.raises(ValueError, match="method"):
        sum_pi_squared(np.zeros((2, 3), np.float32), method="gpu")


def test_groups_that_do_not_cover_the_batch_are_refused():
    args = (np.zeros((4, 2), np.float32), np.ones((4, 2), bool), np.zeros((4, 2), np.float32), np.ones((4, 2), np.float32))
    for alignment in ("scatter", *(("native",) if runs_native() else ())):
        with pytest.raises(ValueError, match="group_sizes"):
            optimal_token_baseline(*args, group_sizes=np.array([3, 3], np.int32), alignment=alignment)
        with pytest.raises(ValueError, match=r"group_ids must be -1 \(padding\) or in \[0, 4\); entry 1 is 9"):
            optimal_token_baseline(*args, group_ids=np.array([0, 9, 1, 1], np.int32), alignment=alignment)


def test_the_worked_example_through_the_pipeline():
    # verl's multi-turn OTB (verl-project/verl @ 1dda039b, core_algos.py compute_multi_turn_optimal_token_baseline_advantage;
    # arXiv 2602.07078) as a batch: two rows of one group (prompt token, then 3 and 2 trained tokens), pi = 0.5, the
    # outcome 1 on row 0; on timesteps the advantages are A_0 = (.4444, .5882, 1.0), A_1 = (-.5556, -.4118).
    batch = {"attention_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.int32),
             "loss_mask": np.array([[0, 1, 1, 1], [0, 1, 1, 0]], np.int32),
             "logprobs": np.log(np.full((2, 4), 0.5, np.float32)), "rewards": np.array([1.0, 0.0], np.float32),
             "is_truncated": np.zeros(2, bool),
             "sum_pi_squared": np.array([[.5, .2, .3, 0], [.4, .6, 0, 0]], np.float32)}
    out = prm_jax.compute_advantages(batch, AdvantageConfig(credit_assignment={"mode": "otb"}, kl_ctl=0.0))
    np.testing.assert_allclose(np.asarray(out.advantages), [[5 / 9 * 0.8, 1 - 0.7 / 1.7, 1, 0],
                                                            [-5 / 9, -0.7 / 1.7, 0, 0]], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(out.returns), [[1, 1, 1, 0], [0, 0, 0, 0]])


def otb_batch(seed: int) -> dict:
    """The option matrix's batch (two groups of three, multi-turn rows with holes, process rewards, model
    outputs on timesteps), without the keys OTB's neighbours read."""
    batch = matrix_batch(np.random.default_rng(seed))
    for key in ("turn_rewards", "turn_reward_mask", "anchor_ids", "node_ids", "node_parents", "reward_sources",
                "gae_lambda", "prm_logprobs"):
        batch.pop(key, None)
    batch["group_sizes"] = np.array([3, 3], np.int32)
    return batch


SETTINGS = {
    "outcome only": {"kl_ctl": 0.0},
    "kl rewards, no zero tail": {"kl_ctl": 0.1, "credit_assignment": {"mode": "otb", "handle_zero_tail": False}},
    "process rewards folded": {"token_rewards_as_adv": False, "kl_ctl": 0.0},
    "process rewards shaped (gvpo)": {"advantage_shaping": {"mode": "gvpo"}, "kl_ctl": 0.05},
    "min-form transform, process_weighted": {"process_reward_transform": {"mode": "min_form", "temperature": 0.3},
                                             "advantage_shaping": {"mode": "process_weighted"}, "kl_ctl": 0.0},
    "progress transform, group norm, adv norm": {
        "process_reward_transform": {"mode": "progress", "gamma": 0.9, "initial": 0.2},
        "reward_norm": {"mean_level": "group", "std_level": "group"},
        "adv_norm": {"mean_level": "batch", "std_level": "batch"}, "kl_ctl": 0.0},
    "epsilon 0.1, mask_no_eos_with_zero": {"credit_assignment": {"mode": "otb", "epsilon": 0.1},
                                           "mask_no_eos_with_zero": True, "kl_ctl": 0.0},
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("weights", ["absent", "present"])
@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_the_mode_meets_the_shaping_modes_and_transforms_as_the_float64_pipeline(name, weights, alignment):
    skip_without_native(alignment)
    # Issue 44.1: with token_rewards_as_adv false the process rewards enter G; with it true the shaping applies
    # after; the KL rewards are in G; the rollout weights optional.
    fields = {"credit_assignment": {"mode": "otb"}, "discount": 0.9, **SETTINGS[name]}
    batch = otb_batch(sorted(SETTINGS).index(name))
    if weights == "absent":
        del batch["rollout_is_weights"]
    strategy = dataclasses.replace(resolve_strategy("auto", unit_discount=False), alignment=alignment)
    plan = dataclasses.replace(AdvantageConfig(**fields).plan, strategy=strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = jax.jit(lambda b: prm_jax.compute_advantages(b, plan)).lower(batch).as_text()
        assert (ffi.OTB_COMPACT_TARGET in text) == (alignment == "native")
        out = prm_jax.compute_advantages(batch, plan)
    want = reference.compute_advantages(batch, fields)
    for field in ("advantages", "returns", "tot_rewards", "kl_rewards"):
        np.testing.assert_allclose(np.asarray(getattr(out, field)), want[field], rtol=3e-5, atol=3e-5, err_msg=field)


@pytest.mark.parametrize("key", ["sum_pi_squared", "rollout_is_weights"])
def test_a_model_output_missing_on_some_turns_is_refused_naming_it(key):
    # Present on some rows only (NaN on a turn without it, as pack_branches writes it): refused, never read as 0.
    batch = otb_batch(3)
    active = reference.shift((batch["loss_mask"] > 0) & (batch["attention_mask"] > 0), fill=False)
    batch[key] = np.where(np.arange(6)[:, None] == 4, np.where(active, np.nan, 0), batch[key]).astype(np.float32)
    with pytest.raises(ValueError, match=rf"batch\['{key}'\].*row 4"):
        prm_jax.compute_advantages(batch, AdvantageConfig(credit_assignment={"mode": "otb"}, kl_ctl=0.0))
    # Where no stage reads it, it may hold anything.
    out = prm_jax.compute_advantages(batch, AdvantageConfig(kl_ctl=0.0))
    assert np.isfinite(np.asarray(out.advantages)).all()


def test_without_sum_pi_squared_the_mode_says_where_it_comes_from():
    batch = otb_batch(4)
    del batch["sum_pi_squared"]
    with pytest.raises(ValueError, match=r"credit_assignment 'otb' needs batch\['sum_pi_squared'\].*credit.sum_pi"):
        prm_jax.compute_advantages(batch, AdvantageConfig(credit_assignment={"mode": "otb"}))


def test_the_mode_runs_jitted_once_and_refuses_bad_settings_naming_them():
    batch = otb_batch(5)
    config = AdvantageConfig(credit_assignment={"mode": "otb"}, kl_ctl=0.0)
    chex.clear_trace_counter()
    jitted = jax.jit(chex.assert_max_traces(lambda b: prm_jax.compute_advantages(b, config), n=1))
    jitted(batch)
    out = jitted(dict(batch, rewards=np.asarray(batch["rewards"]) + 1))
    want = reference.compute_advantages(dict(batch, rewards=np.asarray(batch["rewards"]) + 1),
                                        {"credit_assignment": {"mode": "otb"}, "kl_ctl": 0.0})
    np.testing.assert_allclose(np.asarray(out.advantages), want["advantages"], rtol=3e-5, atol=3e-5)
    with pytest.raises(ConfigError, match=r"credit_assignment\.epsilon"):
        AdvantageConfig(credit_assignment={"mode": "otb", "epsilon": -1.0})
    with pytest.raises(ConfigError, match=r"credit_assignment\.handle_zero_tail"):
        AdvantageConfig(credit_assignment={"mode": "otb", "handle_zero_tail": "yes"})
    with pytest.raises(ConfigError, match="gae_timestep_unit"):
        AdvantageConfig(credit_assignment={"mode": "otb"}, gae_timestep_unit="turn")


def test_the_native_alignment_splits_rows_over_threads_and_equals_the_scatter():
    skip_without_native("native")
    # 64 x 2048 timesteps: the native kernels' rows run as several tasks on XLA's pool (one per 2^16 entries);
    # masks of random spans (tool outputs), groups given by ids out of order, one group of one.
    rng = np.random.default_rng(44)
    rows, width = 64, 2048
    mask = np.cumsum(rng.random((rows, width)) < 0.02, axis=1) % 2 == 0
    mask[:, :int(rng.integers(1, 50))] = False
    logprobs = (-rng.exponential(1.0, (rows, width))).astype(np.float32)
    pi = np.exp(logprobs.astype(np.float64))
    pi2 = (pi ** 2 + rng.uniform(0, 1, (rows, width)) * (1 - pi) ** 2).astype(np.float32)
    rewards = rng.normal(size=(rows, width)).astype(np.float32) * (rng.random((rows, width)) < 0.01)
    ids = rng.permutation(np.repeat(np.arange(10), 7)[:rows]).astype(np.int32)
    ids[0] = 60  # alone
    args = (rewards, mask, logprobs, pi2)
    native = optimal_token_baseline(*args, group_ids=ids, alignment="native")
    scatter = optimal_token_baseline(*args, group_ids=ids, alignment="scatter")
    np.testing.assert_allclose(np.asarray(native.advantages), np.asarray(scatter.advantages), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(native.returns), np.asarray(scatter.returns), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(native.advantages) != 0, mask & (np.asarray(native.advantages) != 0))


# Issue 55.4: OTB's model outputs outside their declared ranges (BATCH_SCHEMA's bounds: sum_pi_squared in
# [0, 1], log-probs <= 0, weights >= 0) are refused on the array paths as the session reader refuses them.
# Before, each changed the worked example's advantages without a word (0.4444/0.5556 became 0.5693/0.4293).
IN_01 = r"sum_pi_squared must be probabilities in \[0, 1\]; row 0, timestep 0 is "
OUT_OF_RANGE = {  # (the log of sum pi^2 by mistake: log 0.5 at row 0, timestep 0)
    "sum_pi_squared below 0": (lambda w, lp: (lp, np.log(w + 1e-3), None), IN_01 + "-0.69"),
    "sum_pi_squared above 1": (lambda w, lp: (lp, w + 1, None), IN_01 + "1.5"),
    "old log-probs above 0": (lambda w, lp: (-lp, w, None),
                              r"logprobs must be log-probabilities \(<= 0\); row 0, timestep 0 is 0.69"),
    "negative rollout weights": (lambda w, lp: (lp, w, np.where(w > .45, -1.0, 1.0)),
                                 r"rollout_is_weights must be weights \(>= 0\); row 0, timestep 0 is -1.0"),
}


def worked_example_arrays():
    w = np.array([[.5, .2, .3], [.4, .6, 0.0]], np.float32)
    return (np.array([[0, 0, 1.0], [0, 0, 0]], np.float32), np.array([[1, 1, 1], [1, 1, 0]], bool),
            np.log(np.full((2, 3), 0.5, np.float32)), w)


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_model_outputs_out_of_range_are_refused_by_the_kernel_naming_key_row_and_timestep(case):
    make, message = OUT_OF_RANGE[case]
    rewards, mask, lp, w = worked_example_arrays()
    logprobs, pi_squared, weights = make(w, lp)
    with pytest.raises(ValueError, match=message):
        optimal_token_baseline(rewards, mask, logprobs.astype(np.float32), pi_squared.astype(np.float32),
                               rollout_is_weights=None if weights is None else weights.astype(np.float32))


def worked_example_batch():
    return {"attention_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.int32),
            "loss_mask": np.array([[0, 1, 1, 1], [0, 1, 1, 0]], np.int32),
            "logprobs": np.log(np.full((2, 4), 0.5, np.float32)), "rewards": np.array([1.0, 0.0], np.float32),
            "is_truncated": np.zeros(2, bool),
            "sum_pi_squared": np.array([[.5, .2, .3, 0], [.4, .6, 0, 0]], np.float32)}


OLD = r"the old log-probs \(batch\['prox_logprobs'\] when given, else batch\['logprobs'\] shifted to timesteps\) must"
PIPELINE_OUT_OF_RANGE = {
    "sum_pi_squared below 0": (lambda b: b.update(sum_pi_squared=np.log(b["sum_pi_squared"] + 1e-3)),
                               "sum_pi_squared_out_of_range", r"batch\['sum_pi_squared'\] must be probabilities"),
    "sum_pi_squared above 1": (lambda b: b.update(sum_pi_squared=b["sum_pi_squared"] + 1),
                               "sum_pi_squared_out_of_range", r"batch\['sum_pi_squared'\] must be probabilities"),
    "old log-probs above 0": (lambda b: b.update(logprobs=-b["logprobs"]), "otb_logprobs_out_of_range",
                              OLD),
    "old prox log-probs above 0": (lambda b: b.update(prox_logprobs=np.full((2, 4), 0.5, np.float32)),
                                   "otb_logprobs_out_of_range", OLD),
    "negative rollout weights": (lambda b: b.update(rollout_is_weights=np.full((2, 4), -1.0, np.float32)),
                                 "rollout_is_weights_out_of_range", r"batch\['rollout_is_weights'\] must be weights"),
}


@pytest.mark.parametrize("case", sorted(PIPELINE_OUT_OF_RANGE))
def test_model_outputs_out_of_range_are_refused_by_compute_advantages_and_counted_under_jit(case):
    edit, check, message = PIPELINE_OUT_OF_RANGE[case]
    batch = worked_example_batch()
    edit(batch)
    config = AdvantageConfig(credit_assignment={"mode": "otb"}, kl_ctl=0.0)
    with pytest.raises(ValueError, match=message + r".*row 0, timestep \d"):
        prm_jax.compute_advantages(batch, config)
    out = jax.jit(lambda b: prm_jax.compute_advantages(b, config))(batch)
    assert int(out.diagnostics[f"checks/{check}"]) >= 1
    # In range (the worked example itself), every range check counts 0.
    clean = jax.jit(lambda b: prm_jax.compute_advantages(b, config))(worked_example_batch())
    assert all(int(v) == 0 for k, v in clean.diagnostics.items() if k.endswith("_out_of_range"))


def test_zero_weights_under_epsilon_0_give_no_baseline_not_nan():
    # Deterministic tokens (pi = 1, sum pi^2 = 1: w = 0) and epsilon 0: the group's baseline is 0/0. Before,
    # the advantages were NaN; a group with no weight has no baseline, so A = G.
    rewards, mask, _, _ = worked_example_arrays()
    out = optimal_token_baseline(rewards, mask, np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32), epsilon=0.0,
                                 handle_zero_tail=False)
    np.testing.assert_array_equal(np.asarray(out.advantages), [[1, 1, 1], [0, 0, 0]])
    batch = worked_example_batch()
    batch.update(logprobs=np.zeros((2, 4), np.float32), sum_pi_squared=np.ones((2, 4), np.float32))
    out = prm_jax.compute_advantages(batch, AdvantageConfig(credit_assignment={"mode": "otb", "epsilon": 0.0},
                                                            kl_ctl=0.0))
    assert np.isfinite(np.asarray(out.advantages)).all()
