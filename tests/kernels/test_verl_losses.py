"""Issue 33.2 (a first part): verl's gpg, dro, cispo and sapo losses and its five loss_agg_modes, values and
gradients against float64 loops written from verl's policy losses (verl-project/verl @ 1dda039b, verl/trainer/ppo/core_algos.py)
and TRL's (huggingface/trl @ f2cd5771) (tests/reference.py), with verl's
conventions at the edges: the ±20 clamp of the log ratio passes no gradient at exactly ±20 (torch.clamp),
CISPO keeps the gradient of clipped tokens, seq-mean-token-mean's n + 1e-8, and prm-jax's own empty-batch
rule (loss 0, gradient 0; verl: NaN)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from batches import enable_x64

from prm_jax.kernels._verl_losses import (
    TRL_LOSS_TYPES,
    VERL_AGG_MODES,
    cispo_loss,
    clip_cov_loss,
    dppo_kl_loss,
    dppo_tv_loss,
    dro_loss,
    geo_mean_loss,
    gpg_loss,
    gspo_loss,
    gspo_sequence_loss,
    kl_cov_loss,
    policy_loss,
    sapo_loss,
    vanilla_ppo_loss,
)

LOSSES = {"gpg": (gpg_loss, {}), "dro": (dro_loss, {"dro_beta": 0.3}),
          "cispo": (cispo_loss, {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}),
          "sapo": (sapo_loss, {"tau_pos": 1.0, "tau_neg": 1.05}),
          "gspo": (gspo_loss, {"clip_ratio_low": 0.05, "clip_ratio_high": 0.08}),
          "dppo_tv": (dppo_tv_loss, {"clip_ratio_low": 0.05, "clip_ratio_high": 0.04, "clip_ratio_c": 1.5}),
          "dppo_kl": (dppo_kl_loss, {"clip_ratio_low": 0.02, "clip_ratio_high": 0.01, "clip_ratio_c": 1.5}),
          "vanilla": (vanilla_ppo_loss, {"clip_ratio_low": 0.1, "clip_ratio_high": 0.15, "clip_ratio_c": 1.3})}
REFERENCE_PARAMS = {"gpg": {}, "dro": {"beta": 0.3}, "cispo": {"low": 0.2, "high": 0.28},
                    "sapo": {"tau_pos": 1.0, "tau_neg": 1.05}, "gspo": {"low": 0.05, "high": 0.08},
                    "dppo_tv": {"low": 0.05, "high": 0.04, "cap": 1.5}, "dppo_kl": {"low": 0.02, "high": 0.01, "cap": 1.5},
                    "vanilla": {"low": 0.1, "high": 0.15, "cap": 1.3}}


def batch(rng, rows=4, width=9):
    logp = (-rng.exponential(1.0, (rows, width))).astype(np.float32)
    old = (logp + rng.normal(0, 0.4, (rows, width))).astype(np.float32)
    adv = rng.normal(0, 1, (rows, width)).astype(np.float32)
    mask = rng.random((rows, width)) < 0.7
    mask[2] = False  # an empty row
    return logp, old, adv, mask


def value_and_grad(fn, params, mode, logp, old, adv, mask, weights=None):
    def loss(lp):
        return fn(lp, old, adv, mask, loss_agg_mode=mode, rollout_is_weights=weights, **params)[0]
    return jax.jit(jax.value_and_grad(loss))(jnp.asarray(logp))  # one program (eagerly: six)


@pytest.mark.parametrize("mode", VERL_AGG_MODES)
@pytest.mark.parametrize("kind", sorted(LOSSES))
def test_each_loss_and_its_gradient_equal_the_float64_loop(kind, mode):
    rng = np.random.default_rng(len(kind) + VERL_AGG_MODES.index(mode))
    logp, old, adv, mask = batch(rng)
    weights = rng.uniform(0.5, 1.5, logp.shape).astype(np.float32)
    fn, params = LOSSES[kind]
    for w in (None, weights):
        value, grad = value_and_grad(fn, params, mode, logp, old, adv, mask, w)
        want, want_grad = reference.verl_loss(kind, logp, old, adv, mask, mode, weights=w, **REFERENCE_PARAMS[kind])
        np.testing.assert_allclose(float(value), want, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=2e-5, atol=1e-7)


def test_the_log_ratio_clamp_passes_no_gradient_at_exactly_twenty():
    # torch's gradient rules, as verl's and AReaL's losses get them (torch.clamp: 1 strictly inside, 0 at a bound and beyond;
    # torch.min/max: 1/2 each at a tie): torch.clamp gives 0 at a bound; jnp.clip would give 1/2. SAPO's gradient there is 0.
    logp = np.array([[0.0, 0.0, 0.0]], np.float32)
    old = np.array([[-20.0, -19.5, 20.0]], np.float32)  # d = 20 (a bound), 19.5 (inside), -20 (a bound)
    adv = np.array([[1.0, 1.0, -1.0]], np.float32)
    mask = np.ones((1, 3), bool)
    _, grad = value_and_grad(sapo_loss, {}, "token-sum", logp, old, adv, mask)
    _, want = reference.verl_loss("sapo", logp, old, adv, mask, "token-sum")
    assert np.asarray(grad)[0, 0] == 0.0 and np.asarray(grad)[0, 2] == 0.0 and want[0, 0] == 0.0
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-5, atol=1e-30)


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # verl's compute_policy_loss_cispo (verl-project/verl @ 1dda039b, core_algos.py:2047-2104): the point of CISPO: a token
    # whose ratio is clipped still trains, with the clipped weight.
    logp = np.array([[0.0, 0.0, 0.0]], np.float32)
    old = np.array([[-1.0, 0.0, 1.0]], np.float32)  # r = e, 1, 1/e: clipped above, inside, clipped below
    adv = np.ones((1, 3), np.float32)
    mask = np.ones((1, 3), bool)
    _, grad = value_and_grad(cispo_loss, {}, "token-sum", logp, old, adv, mask)
    np.testing.assert_allclose(np.asarray(grad)[0], [-1.2, -1.0, -0.8], rtol=1e-6)
    _, stats = cispo_loss(logp, old, adv, mask, loss_agg_mode="token-sum")
    np.testing.assert_allclose(float(stats.pg_clipfrac), 2 / (3 + 1e-8), rtol=1e-6)


def test_seq_mean_token_mean_divides_rows_by_n_plus_1e_8():
    # verl's agg_loss (verl-project/verl @ 1dda039b, core_algos.py:1140-1206): verl's row mean is S_b / (n_b + 1e-8): one token
    # of loss 1 gives 1 / (1 + 1e-8).
    logp = np.array([[-1.0, 0.0]], np.float64)
    with enable_x64():
        value, _ = gpg_loss(logp, logp, np.array([[1.0, 0.0]]), np.array([[True, False]]),
                            loss_agg_mode="seq-mean-token-mean")
        assert float(value) == 1.0 / (1.0 + 1e-8) != 1.0


@pytest.mark.parametrize("kind", sorted(LOSSES))
@pytest.mark.parametrize("mode", VERL_AGG_MODES)
def test_an_empty_batch_gives_zero_loss_and_zero_gradient(kind, mode):
    # prm-jax's rule, for every loss (verl: NaN for token-mean and the sequence modes).
    rng = np.random.default_rng(0)
    logp, old, adv, _ = batch(rng)
    fn, params = LOSSES[kind]
    value, grad = value_and_grad(fn, params, mode, logp, old, adv, np.zeros(logp.shape, bool))
    assert float(value) == 0.0 and not np.asarray(grad).any()


@pytest.mark.parametrize("kind", sorted(LOSSES))
def test_finite_inputs_give_a_finite_gradient_bf16_included(kind):
    # The float32 range: huge log ratios (the clamp at ±20 holds exp finite), huge advantages; bf16 inputs
    # are taken in float32.
    logp = np.array([[-1e4, 0.0, -3.0, -0.5]], np.float32)
    old = np.array([[0.0, -1e4, -3.0, -0.5]], np.float32)
    adv = np.array([[1e30, -1e30, 0.0, 2.0]], np.float32)
    mask = np.ones((1, 4), bool)
    fn, params = LOSSES[kind]
    for dtype in (jnp.float32, jnp.bfloat16):
        value, grad = value_and_grad(fn, params, "token-mean", jnp.asarray(logp, dtype), jnp.asarray(old, dtype),
                                     jnp.asarray(adv, dtype), mask)
        assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad, np.float32)).all(), (kind, dtype)


def test_jit_does_not_retrace_and_bad_arguments_are_named():
    rng = np.random.default_rng(1)
    logp, old, adv, mask = batch(rng)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(lp, o, a, m):
        return cispo_loss(lp, o, a, m)[0]

    for _ in range(3):
        step(logp, old, adv, mask)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        gpg_loss(logp, old, adv, mask, loss_agg_mode="token-max")
    with pytest.raises(ValueError, match="dro_beta"):
        dro_loss(logp, old, adv, mask, dro_beta=0.0)
    with pytest.raises(ValueError, match="advantages"):
        sapo_loss(logp, old, adv[:, :3], mask)
    with pytest.raises(ValueError, match="loss_mask"):
        gpg_loss(logp, old, adv, mask.astype(np.float32) * 2)


def test_gspo_at_an_exact_bound_halves_and_past_the_cap_of_ten_stops_the_gradient():
    # verl's compute_policy_loss_gspo (verl-project/verl @ 1dda039b, core_algos.py:1546-1618); torch's gradient rules, as verl's
    # and AReaL's losses get them (torch.clamp: 1 strictly inside, 0 at a bound and beyond; torch.min/max: 1/2 each at a tie):
    # rho exactly on a clip bound (eps 0: an on-policy step) gives half the gradient;
    # a row whose mean log ratio is 10 or more gives none. Row 0 on-policy, row 1 at s = 12.
    logp = np.array([[-1.0, -2.0], [0.0, 0.0]], np.float32)
    old = np.array([[-1.0, -2.0], [-12.0, -12.0]], np.float32)
    adv = np.array([[1.0, -1.0], [1.0, 1.0]], np.float32)
    mask = np.ones((2, 2), bool)
    _, grad = value_and_grad(gspo_loss, {"clip_ratio_low": 0.0, "clip_ratio_high": 0.0}, "token-sum",
                             logp, old, adv, mask)
    _, want = reference.verl_loss("gspo", logp, old, adv, mask, "token-sum", low=0.0, high=0.0)
    np.testing.assert_allclose(np.asarray(grad), [[-0.5, 0.5], [0.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-6)


def test_gspo_with_row_constant_advantages_is_the_sequence_ratios_clip():
    # One ratio per row: every token of a row is clipped or not together.
    rng = np.random.default_rng(5)
    logp, old, _, mask = batch(rng)
    adv = np.repeat(rng.normal(size=(logp.shape[0], 1)), logp.shape[1], axis=1).astype(np.float32)
    _, stats = gspo_loss(logp, old, adv, mask, clip_ratio_low=0.01, clip_ratio_high=0.01)
    _, grad = value_and_grad(gspo_loss, {"clip_ratio_low": 0.01, "clip_ratio_high": 0.01}, "seq-mean-token-mean",
                             logp, old, adv, mask)
    for b in range(logp.shape[0]):
        live = np.asarray(grad)[b][mask[b]] != 0
        assert live.all() or not live.any(), b
    assert 0 <= float(stats.pg_clipfrac) <= 1


@pytest.mark.parametrize("weighted", [False, True])
def test_geo_mean_and_its_gradient_equal_the_float64_loop(weighted):
    rng = np.random.default_rng(11)
    logp, old, adv, mask = batch(rng)
    adv[0, :3] = 0.0  # zero advantages: m = 0, no gradient
    logp[1, :2], old[1, :2] = -1.0, -1.25  # d exactly the upper bound 0.25 (a tie: half the gradient)
    adv[1, :2] = 1.0
    mask[1, :2] = True
    assert (logp[1, :2] - old[1, :2] == np.float32(0.25)).all()
    weights = rng.uniform(0.5, 1.5, logp.shape).astype(np.float32) if weighted else None

    def loss(lp):
        return geo_mean_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.25, rollout_is_weights=weights)[0]

    value, grad = jax.jit(jax.value_and_grad(loss))(jnp.asarray(logp))
    want, want_grad = reference.geo_mean_loss(logp, old, adv, mask, low=0.2, high=0.25, weights=weights)
    np.testing.assert_allclose(float(value), want, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=2e-5, atol=1e-8)


def test_geo_mean_counts_a_ratio_that_overflows_and_refuses_it_eagerly():
    # verl's compute_policy_loss_geo_mean (verl-project/verl @ 1dda039b, core_algos.py:1928-2010): a negative advantage with a
    # large positive log ratio is not capped: R = exp(mean d).
    logp, old = np.zeros((2, 2), np.float32), np.array([[-100.0, -100.0], [0.0, 0.0]], np.float32)
    adv, mask = -np.ones((2, 2), np.float32), np.ones((2, 2), bool)
    with pytest.raises(ValueError, match="row 0's geometric-mean ratio overflows"):
        geo_mean_loss(logp, old, adv, mask)
    _, stats = jax.jit(lambda *a: geo_mean_loss(*a))(logp, old, adv, mask)
    assert int(stats.checks["checks/geo_mean_ratio_overflow"]) == 1
    value, grad = jax.jit(jax.value_and_grad(lambda lp: geo_mean_loss(lp, old, adv, mask[::-1] & False)[0]))(jnp.asarray(logp))
    assert float(value) == 0.0 and not np.asarray(grad).any()  # the empty batch: 0


def test_dppo_masks_tokens_outside_the_region_truncates_the_weight_and_reads_p_above_one_as_verl():
    # verl's DPPO losses (verl-project/verl @ 1dda039b, core_algos.py:1380-1542): REINFORCE with a truncated weight min(r, C),
    # masked by the trust region; a log-prob above 0
    # (not a probability) makes the KL's log NaN: the comparison is False and p <= p_old decides.
    logp = np.array([[-0.1, -3.0, -0.2, 0.5]], np.float32)
    old = np.array([[-2.0, -3.0, -0.25, -0.25]], np.float32)  # token 3: p = 1.65 > 1 > p_old: the KL is NaN
    adv = np.array([[1.0, 1.0, -1.0, -1.0]], np.float32)
    mask = np.ones((1, 4), bool)
    for fn, kind in ((dppo_tv_loss, "dppo_tv"), (dppo_kl_loss, "dppo_kl")):
        value, grad = value_and_grad(fn, {"clip_ratio_c": 1.5}, "token-sum", logp, old, adv, mask)
        want, want_grad = reference.verl_loss(kind, logp, old, adv, mask, "token-sum", cap=1.5)
        np.testing.assert_allclose(float(value), want, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-5, atol=1e-8)
        assert np.asarray(grad)[0, 0] == 0.0  # p - p_old = 0.77 > 0.2: outside the region, masked out
        assert np.asarray(grad)[0, 3] != 0.0  # kept: p >= p_old for A < 0 (the KL's NaN compares False)
    _, stats = dppo_tv_loss(logp, old, adv, mask, clip_ratio_c=1.5)
    assert float(stats.pg_clipfrac) == pytest.approx(1 / (4 + 1e-8))


@pytest.mark.parametrize("mode", VERL_AGG_MODES)
def test_kl_cov_equals_the_float64_loop_and_adds_no_penalty_gradient_on_policy(mode):
    rng = np.random.default_rng(21)
    logp, old, adv, mask = batch(rng)
    old[0, :] = logp[0, :]  # on-policy tokens: d = 0 exactly, sign(0) = 0
    params = {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.7}
    value, grad = value_and_grad(kl_cov_loss, params, mode, logp, old, adv, mask)
    want, want_grad = reference.kl_cov_loss(logp, old, adv, mask, mode, ratio=0.2, coef=0.7)
    np.testing.assert_allclose(float(value), want, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=2e-5, atol=1e-8)


@pytest.mark.parametrize("mode", VERL_AGG_MODES)
def test_clip_cov_with_a_fixed_choice_equals_the_float64_loop(mode):
    rng = np.random.default_rng(22)
    logp, old, adv, mask = batch(rng)
    chosen = np.zeros(logp.shape, bool)
    chosen[0, 1], chosen[3, 4] = True, True
    params = {"chosen": chosen, "clip_ratio_low": 0.1, "clip_ratio_high": 0.15}
    value, grad = value_and_grad(clip_cov_loss, params, mode, logp, old, adv, mask)
    want, want_grad = reference.clip_cov_loss(logp, old, adv, mask, chosen & mask, mode, low=0.1, high=0.15)
    np.testing.assert_allclose(float(value), want, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=2e-5, atol=1e-8)


def test_clip_cov_draws_its_tokens_among_the_candidates_from_the_key():
    # verl's compute_policy_loss_clip_cov (verl-project/verl @ 1dda039b, core_algos.py:1743-1844): min(max(floor(N ratio), 1),
    # #candidates) tokens, uniformly among the candidates (trained,
    # not clipped, covariance strictly inside (lb, ub)); the same key, the same choice.
    rng = np.random.default_rng(23)
    logp, old, adv, mask = batch(rng, rows=6, width=16)
    adv = (adv * 3).astype(np.float32)
    kw = {"clip_cov_ratio": 0.1, "clip_cov_lb": 0.05, "clip_cov_ub": 50.0, "clip_ratio_low": 0.5,
          "clip_ratio_high": 0.5}
    key = jax.random.key(0)
    _, stats = clip_cov_loss(logp, old, adv, mask, key=key, **kw)
    n = int(mask.sum())
    frac = float(stats.pg_clipfrac) * (n + 1e-8)
    a, lp = adv.astype(np.float64), logp.astype(np.float64)
    cov = (a - a[mask].sum() / (n + 1e-8)) * (lp - lp[mask].sum() / (n + 1e-8))
    r = np.exp(lp - old.astype(np.float64))
    clipped = -a * np.clip(r, 0.5, 1.5) > -a * r
    candidates = mask & ~clipped & (cov > 0.05) & (cov < 50.0)
    assert round(frac) == min(max(int(n * 0.1), 1), int(candidates.sum())) and candidates.sum() > 1
    # The chosen ones, read from the gradient (a dropped token has none; every other trained token here is on
    # the unclipped side with a nonzero advantage), are candidates, and dropping them reproduces the loss.
    value, grad = value_and_grad(clip_cov_loss, {"key": key, **kw}, "token-mean", logp, old, adv, mask)
    live = mask & ~clipped & (a != 0)
    chosen = live & (np.asarray(grad) == 0)
    assert chosen.sum() == round(frac) and not (chosen & ~candidates).any()
    assert float(value) == pytest.approx(float(clip_cov_loss(logp, old, adv, mask, chosen=chosen, **kw)[0]), rel=1e-6)
    assert float(clip_cov_loss(logp, old, adv, mask, key=jax.random.key(0), **kw)[0]) == float(value)
    with pytest.raises(ValueError, match="exactly one of key"):
        clip_cov_loss(logp, old, adv, mask, **kw)


def test_kl_cov_on_policy_penalty_adds_no_gradient():
    # verl's compute_policy_loss_kl_cov (verl-project/verl @ 1dda039b, core_algos.py:1848-1924): d = 0 exactly (the common first
    # step): torch's abs has gradient 0 there (jnp.abs: 1).
    logp = np.array([[-1.0, -2.0, -0.5]], np.float32)
    adv = np.array([[1.0, -2.0, 0.5]], np.float32)
    _, grad = value_and_grad(kl_cov_loss, {"kl_cov_ratio": 1.0, "ppo_kl_coef": 5.0}, "token-sum", logp, logp, adv,
                             np.ones((1, 3), bool))
    np.testing.assert_array_equal(np.asarray(grad), -adv)  # every token selected, r = 1, no penalty slope


def test_vanilla_cuts_at_the_dual_clip_and_passes_nothing_at_the_clamp_of_twenty():
    # verl's compute_policy_loss_vanilla (verl-project/verl @ 1dda039b, core_algos.py:1286-1376): with A < 0 and r beyond
    # clip_ratio_c the loss is the constant -A c (no gradient); a log
    # ratio at exactly ±20 has none either; inside, the unclipped side trains.
    logp = np.array([[float(np.log(np.float32(3.0))), 0.0, 0.0, -0.5]], np.float32)
    old = np.array([[0.0, -20.0, -19.0, -0.5]], np.float32)
    adv = np.array([[-1.0, -1.0, 1.0, 2.0]], np.float32)
    mask = np.ones((1, 4), bool)
    _, grad = value_and_grad(vanilla_ppo_loss, {"clip_ratio_c": 2.5}, "token-sum", logp, old, adv, mask)
    _, want = reference.verl_loss("vanilla", logp, old, adv, mask, "token-sum", cap=2.5)
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-6, atol=1e-30)
    assert np.asarray(grad)[0, 0] == 0.0 and np.asarray(grad)[0, 1] == 0.0 and np.asarray(grad)[0, 3] == -2.0


def test_policy_loss_selects_by_verls_loss_mode_and_names_a_bad_option():
    rng = np.random.default_rng(30)
    logp, old, adv, mask = batch(rng)
    for mode, (fn, params) in LOSSES.items():
        got = policy_loss(logp, old, adv, mask, mode=mode, **params)[0]
        assert float(got) == float(fn(logp, old, adv, mask, **params)[0]), mode
    assert float(policy_loss(logp, old, adv, mask, mode="geo_mean")[0]) == float(geo_mean_loss(logp, old, adv, mask)[0])
    with pytest.raises(ValueError, match="mode"):
        policy_loss(logp, old, adv, mask, mode="ppo")
    with pytest.raises(TypeError, match=r"takes no option \['dro_beta'\]"):
        policy_loss(logp, old, adv, mask, mode="gpg", dro_beta=1.0)


@pytest.mark.parametrize("loss_type", TRL_LOSS_TYPES)
@pytest.mark.parametrize("delta", [None, 1.05])
def test_gspo_sequence_and_its_gradient_equal_the_float64_loop(loss_type, delta):
    # TRL's sequence-level GSPO (huggingface/trl @ f2cd5771, trl/trainer/grpo_trainer.py): one ratio per row, the gradient
    # through the row's mean log
    # ratio; empty rows count in B (grpo, dr_grpo, luspo).
    rng = np.random.default_rng(40 + TRL_LOSS_TYPES.index(loss_type))
    logp, old, _, mask = batch(rng)
    old = (logp + rng.normal(0, 0.05, logp.shape)).astype(np.float32)
    adv = rng.normal(0, 1, logp.shape[0]).astype(np.float32)

    def loss(lp):
        return gspo_sequence_loss(lp, old, adv, mask, epsilon=0.02, epsilon_high=0.03, delta=delta,
                                  loss_type=loss_type, max_completion_length=16)[0]

    value, grad = jax.jit(jax.value_and_grad(loss))(jnp.asarray(logp))
    want, want_grad = reference.gspo_sequence_loss(logp, old, adv, mask, eps=0.02, eps_high=0.03, delta=delta,
                                                   loss_type=loss_type, max_len=16)
    np.testing.assert_allclose(float(value), want, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=2e-5, atol=1e-8)


def test_gspo_sequence_on_policy_with_no_clip_range_halves_the_gradient():
    # eps 0 and an on-policy step: c = 1 sits on both bounds: the min's tie halves, the clamp passes nothing.
    logp = np.array([[-1.0, -2.0, 0.0]], np.float32)
    mask = np.array([[True, True, False]])
    _, grad = jax.jit(jax.value_and_grad(lambda lp: gspo_sequence_loss(lp, logp, np.array([2.0], np.float32), mask,
                                                               epsilon=0.0, loss_type="luspo")[0]))(jnp.asarray(logp))
    # luspo: n_b * row loss / B; d row loss / d mean = -A / 2; d mean / d logp_t = 1 / n_b: -2 / 2 * 2 / 2
    np.testing.assert_allclose(np.asarray(grad), [[-1.0, -1.0, 0.0]], rtol=1e-6)
    _, stats = gspo_sequence_loss(logp, logp, np.array([2.0], np.float32), mask, epsilon=0.0)
    assert float(stats.region_mean) == 0.0


def test_gspo_sequence_dapo_divides_by_num_items_in_batch_when_given():
    # TRL's dapo: sum n_b l_b / max(num_items_in_batch, 1) (one process); absent, the batch's N (= bnpo).
    rng = np.random.default_rng(44)
    logp, old, _, mask = batch(rng)
    adv = rng.normal(0, 1, logp.shape[0]).astype(np.float32)
    n = int(mask.sum())
    bnpo = float(gspo_sequence_loss(logp, old, adv, mask, loss_type="bnpo")[0])
    assert float(gspo_sequence_loss(logp, old, adv, mask, loss_type="dapo")[0]) == pytest.approx(bnpo, rel=1e-6)
    assert float(gspo_sequence_loss(logp, old, adv, mask, loss_type="dapo", num_items_in_batch=n)[0]) == pytest.approx(
        bnpo, rel=1e-6)
    assert float(gspo_sequence_loss(logp, old, adv, mask, loss_type="dapo", num_items_in_batch=2 * n)[0]) == pytest.approx(
        bnpo / 2, rel=1e-6)


def test_policy_loss_options_are_what_each_mode_takes():
    # One declaration: policy_loss refuses exactly the options policy_loss_options does not list (the tunix
    # adapter reads it: geo_mean, GMPO, aggregates each sequence itself and takes no loss_agg_mode).
    from prm_jax.losses import POLICY_LOSS_MODES, policy_loss, policy_loss_options
    for mode in POLICY_LOSS_MODES:
        options = policy_loss_options(mode)
        assert ("loss_agg_mode" in options) == (mode != "geo_mean"), mode
        assert "rollout_is_weights" in options, mode
    assert "dro_beta" in policy_loss_options("dro") and "key" in policy_loss_options("clip_cov")
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match="takes no option"):
        policy_loss(x, x, x, np.ones((2, 3), bool), mode="geo_mean", loss_agg_mode="token-mean")
    with pytest.raises(ValueError, match="mode"):
        policy_loss_options("ppo")


@pytest.mark.parametrize("log_ratio", [88.0, 88.8, 90.0, 300.0])
def test_clip_cov_keeps_a_float64_gradient_past_float32s_exp_range(log_ratio):
    # Issue 41.9: the gradient was zeroed where the log ratio is at or above 88.7 even for float64 inputs (the
    # issue's case: want 1.41e37, got 0): the bound follows the input's dtype. A negative advantage takes the
    # unclipped side, so the gradient is -A * exp(log ratio), against the float64 loop (88.0: below the bound).
    logp = np.array([[log_ratio - 1.0, -0.5]], np.float64)
    old = np.array([[-1.0, -0.5]], np.float64)
    adv = np.array([[-1.0, 0.5]], np.float64)
    mask = np.ones((1, 2), bool)
    chosen = np.zeros((1, 2), bool)
    with enable_x64():
        value, grad = value_and_grad(clip_cov_loss, {"chosen": chosen}, "token-sum", logp, old, adv, mask)
        assert np.asarray(grad).dtype == np.float64
    want, want_grad = reference.clip_cov_loss(logp, old, adv, mask, chosen, "token-sum", low=0.2, high=0.2)
    assert want_grad[0, 0] == pytest.approx(np.exp(log_ratio), rel=1e-12)
    np.testing.assert_allclose(float(value), want, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-12)
