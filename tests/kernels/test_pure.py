"""PURE's min-form transform and recipe (issue 22.3) against the float64 loops of ``tests/reference.py``."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference

from prm_jax.credit import min_form
from prm_jax.kernels._pure import _pure_core
from prm_jax.kernels._turns import turn_steps


def test_the_worked_example():
    # PURE's authors' code (CJReinforce/PURE, branch verl @ 83f9869c): scores -0.9, 0.5, 0.8 at tau = 0.1; returns-to-go -0.9,
    # 4.5e-7, 3.3e-8.
    r = np.asarray(min_form(np.array([[-0.9, 0.5, 0.8]], np.float32), temperature=0.1), np.float64)[0]
    to_go = np.cumsum(r[::-1])[::-1]
    np.testing.assert_allclose(to_go, [-0.9, 4.5e-7, 3.3e-8], rtol=0.03)
    np.testing.assert_allclose(r, reference.min_form([[-0.9, 0.5, 0.8]], [[1, 1, 1]], 0.1)[0], rtol=1e-5)


@pytest.mark.parametrize("temperature", [1e-3, 0.1, 1.0, 1e4])
def test_min_form_matches_the_loop(temperature):
    rng = np.random.default_rng(int(temperature * 1000) + 1)
    scores = rng.uniform(-1, 1, size=(6, 9)).astype(np.float32)
    steps = rng.random((6, 9)) < 0.7
    steps[0] = False  # a row without steps gives 0
    got = np.asarray(min_form(scores, steps, temperature))
    np.testing.assert_allclose(got, reference.min_form(scores, steps, temperature), rtol=2e-5, atol=1e-6)
    assert np.all(got[0] == 0) and np.all(got[~steps] == 0)


def test_limits_and_ties():
    scores = np.array([[0.3, -0.2, 0.9, -0.2]], np.float32)
    np.testing.assert_allclose(np.sum(min_form(scores, temperature=1e-4)), -0.2, rtol=1e-6)   # -> min
    np.testing.assert_allclose(np.sum(min_form(scores, temperature=1e6)), np.mean(scores), rtol=1e-4)  # -> mean
    tied = np.asarray(min_form(scores, temperature=1e-4))[0]
    assert tied[1] == tied[3]  # ties share the weight equally


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        min_form(np.zeros((1, 2), np.float32), temperature=0.0)
    with pytest.raises(ValueError, match="step_scores must be finite"):
        min_form(np.array([[np.nan, 1.0]], np.float32))
    min_form(np.array([[np.nan, 1.0]], np.float32), np.array([[False, True]]))  # a masked NaN is fine


def test_jit_vmap_bfloat16_no_retrace():
    from prm_jax.kernels._pure import _min_form_core
    fn = jax.jit(chex.assert_max_traces(lambda s, m: jax.vmap(lambda a, b: _min_form_core(a, b, 0.1))(s, m), n=1))
    rng = np.random.default_rng(3)
    for _ in range(2):
        scores = rng.normal(size=(4, 5)).astype(np.float32)
        np.testing.assert_allclose(fn(scores, np.ones((4, 5), bool)), reference.min_form(scores, np.ones((4, 5)), 0.1),
                                   rtol=2e-5, atol=1e-7)
    low = jnp.asarray(scores, jnp.bfloat16)
    out = min_form(low)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, reference.min_form(np.asarray(low, np.float32), np.ones((4, 5)), 0.1), rtol=2e-5,
                               atol=1e-7)


def recipe_batch(rng, rows, width, group_size):
    mask = np.zeros((rows, width), bool)
    turn_ids = np.full((rows, width), -1, np.int32)
    outcome_step = np.zeros(rows, int)
    for b in range(rows):
        t, k = int(rng.integers(0, 3)), 0
        while t < width - 2 and k < 4:
            n = int(rng.integers(1, 5))
            end = min(t + n, width - 1)
            mask[b, t:end], turn_ids[b, t:end] = True, k
            t, k = end + int(rng.integers(0, 3)), k + 1
        outcome_step[b] = int(np.flatnonzero(mask[b])[-1]) if mask[b].any() else 0
    # A turn's process score is its reward at its last timestep: uniform per turn, as a scalar scorer's.
    process = np.where(mask, rng.uniform(-1, 1, (rows, 1)) * (turn_ids + 1) / 4, 0).astype(np.float32)
    outcome = rng.integers(0, 2, rows).astype(np.float32)
    groups = np.arange(rows) // group_size
    return process, outcome, mask, turn_ids, outcome_step, groups


@pytest.mark.parametrize("whitened", [True, False])
@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_the_recipe_matches_the_loop(whitened, group_size):
    rng = np.random.default_rng(group_size * 2 + whitened)
    process, outcome, mask, turn_ids, outcome_step, groups = recipe_batch(rng, 8, 24, group_size)
    active, ids = jnp.asarray(mask), jnp.asarray(turn_ids)
    outcome_at = jnp.asarray(np.arange(24)[None, :] == outcome_step[:, None])
    got = _pure_core(jnp.asarray(process), jnp.asarray(outcome), active, turn_steps(active, ids, "scan").ends, outcome_at,
                    jnp.ones(8, bool), jnp.asarray(groups, jnp.int32), 8, 0.1, 1.0, whitened, "lax")
    want_adv, want_ret = reference.pure(process, outcome, mask, turn_ids, outcome_step, groups, 0.1, 1.0, whitened)
    np.testing.assert_allclose(got.returns, want_ret, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got.advantages, want_adv, rtol=2e-4, atol=2e-4)
    assert bool(np.all(np.asarray(got.alone) == (group_size == 1)))
    if group_size == 1:  # a group of one has no baseline: 0 everywhere
        assert np.all(np.asarray(got.advantages) == 0)


def turn_score_batch(per_turn_scores, *, per_token_row=None):
    """Rows of two-token turns whose process reward is uniform per turn (a scalar scorer's), no outcome, no
    values, no KL: ``compute_advantages`` under min-form returns exactly the transformed process rewards.
    ``per_token_row`` appends a row whose first turn's reward changes inside the turn."""
    scores = [list(map(float, row)) for row in per_turn_scores]
    if per_token_row is not None:
        scores.append([0.0] * len(scores[0]))
    rows, turns = len(scores), len(scores[0])
    width = 1 + 3 * turns
    loss = np.zeros((rows, width), np.int32)
    turn_ids = np.full((rows, width), -1, np.int32)
    token_rewards = np.zeros((rows, width), np.float32)
    for b in range(rows):
        for k in range(turns):
            span = slice(1 + 3 * k, 3 + 3 * k)
            loss[b, span], turn_ids[b, span], token_rewards[b, span] = 1, k, scores[b][k]
    if per_token_row is not None:
        token_rewards[-1, 1:3] = per_token_row
    return dict(attention_mask=np.ones((rows, width), np.int32), loss_mask=loss, turn_ids=turn_ids,
                token_rewards=token_rewards, logprobs=np.zeros((rows, width), np.float32),
                rewards=np.zeros(rows, np.float32), is_truncated=np.zeros(rows, bool))


def min_form_config(temperature):
    from prm_jax.config import AdvantageConfig
    return AdvantageConfig(kl_ctl=0.0, process_reward_transform={"mode": "min_form", "temperature": temperature})


def per_turn(out, batch, b):
    """Each turn's transformed reward: the advantage at its first trained timestep."""
    ids = batch["turn_ids"][b]
    return [float(np.asarray(out.advantages)[b, np.flatnonzero(ids == k)[0] - 1]) for k in range(ids.max() + 1)]


@pytest.mark.parametrize("scores, temperature", [((50.0, 50.01), 1e-3), ((1e5, 99999.99), 0.1),
                                                 ((7e29, -3e29), 0.1), ((1e38, -1e38), 0.1)])
def test_min_form_in_the_pipeline_gives_the_kernel_numbers_for_any_scores(scores, temperature):
    # Issue 29.8: (50, 50.01) at 0.001 gave (49.955, 0.00227), sum 49.957 (float64: 49.99773, 0.002274161,
    # sum 50); (1e5, 99999.99) at 0.1 summed to 100,812; 7e29 gave inf; 29.9: +-1e38 were refused as not
    # finite. Weights from differences to the row's minimum: float32 rounding of the float64 loop.
    from prm_jax import compute_advantages
    batch = turn_score_batch([scores])
    out = compute_advantages(batch, min_form_config(temperature))
    scores32 = np.asarray([scores], np.float32)
    want = reference.min_form(scores32, np.ones((1, 2)), temperature)[0]
    np.testing.assert_allclose(per_turn(out, batch, 0), want, rtol=1e-5, atol=1e-6 * np.abs(scores32).max() * 1e-6)
    np.testing.assert_allclose(np.asarray(min_form(scores32, temperature=temperature))[0], want, rtol=1e-5)
    assert np.isfinite(np.asarray(out.advantages)).all()
    if scores == (50.0, 50.01):
        np.testing.assert_allclose(per_turn(out, batch, 0), [49.99773, 0.002274161], rtol=1e-5)


def test_a_rows_min_form_does_not_depend_on_its_neighbours():
    # Issue 29.8: lax.cond picked one path for the whole batch, so a row's numbers changed when another row
    # had per-token rewards. Both paths compute the same per-row weights: bit for bit the same row.
    from prm_jax import compute_advantages
    rows = [(0.3, -0.2, 0.9), (50.0, 50.01, 49.99)]
    alone = compute_advantages(turn_score_batch(rows), min_form_config(1e-3))
    beside = compute_advantages(turn_score_batch(rows, per_token_row=[0.5, -0.5]), min_form_config(1e-3))
    np.testing.assert_array_equal(np.asarray(beside.advantages)[:2], np.asarray(alone.advantages))


def test_the_pure_recipe_at_a_low_temperature_matches_its_authors_numbers():
    # Issue 29.8: the recipe's own min-form (its turn ends) at temperature 0.001, close scores, against the
    # authors' rule in float64 (the transform path is pinned above).
    from prm_jax import compute_advantages
    from prm_jax.config import AdvantageConfig
    batch = turn_score_batch([(0.2, 0.2005, 0.3), (0.1, 0.4, 0.1002)])
    batch["rewards"] = np.array([1.0, 0.0], np.float32)
    out = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, credit_assignment={
        "mode": "pure", "temperature": 1e-3, "whiten": False}))
    active = reference.shift(batch["loss_mask"] > 0, fill=False)
    ids = reference.shift(batch["turn_ids"], fill=-1)
    process = np.where(active, reference.shift(batch["token_rewards"]), 0.0)
    outcome_step = np.full(2, batch["attention_mask"].shape[1] - 2)
    _, want = reference.pure(process, batch["rewards"], active, ids, outcome_step, [0, 0], 1e-3, 1.0, False)
    np.testing.assert_allclose(out.advantages, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("temperature", [1e-39, 0.0, -1.0, 3.5e38, float("inf")])
def test_temperatures_that_make_min_form_meaningless_are_refused_at_configuration(temperature):
    # Issue 29.9: 1e-39 passed validate-config, then zeroed every process reward (a float32 subnormal is
    # flushed to 0 on the CPU); 3.5e38 is not a float32.
    from prm_jax.config import AdvantageConfig, ConfigError
    for key in ("process_reward_transform", "credit_assignment"):
        mode = "min_form" if key == "process_reward_transform" else "pure"
        with pytest.raises(ConfigError, match=f"{key}.temperature must"):
            AdvantageConfig(**{key: {"mode": mode, "temperature": temperature}})
    assert AdvantageConfig(process_reward_transform={"mode": "min_form", "temperature": 1.2e-38}).plan
