"""Issue 33.3: potential-based progress shaping, ``process_reward_transform: {mode: progress, gamma, initial,
terminal, level}``, against the float64 loop (``reference.progress``, inside ``reference.compute_advantages``),
the worked row of the guide, the telescoping identity, and the optional ``token_reward_mask`` absent,
present, and present with some rows wholly unscored. Both levels also meet every estimator, norm and
shaping, and the other optional inputs, in ``test_matrix.py``."""

from __future__ import annotations

import warnings

import chex
import jax
import numpy as np
import pytest
import reference
from batches import make_batch
from native_where import runs_native

from prm_jax import compute_advantages
from prm_jax.config import AdvantageConfig, ConfigError, ProgressTransform

TOL = dict(rtol=2e-5, atol=2e-5)


def unscored(rng: np.random.Generator, batch: dict, state: str) -> dict:
    """``token_reward_mask`` absent; present (False on about a third of the turns); or present with rows 0
    and 1 wholly unscored (every step carries ``initial``) and the rest scored."""
    batch = dict(batch)
    if state == "absent":
        return batch
    ids = batch["turn_ids"]
    if state == "present":
        keep = rng.random((ids.shape[0], ids.max() + 2)) < 0.65
        mask = np.where(ids >= 0, keep[np.arange(ids.shape[0])[:, None], np.maximum(ids, 0)], rng.random(ids.shape) < 0.5)
    else:
        mask = np.ones(ids.shape, bool)
        mask[:2] = False
    batch["token_reward_mask"] = mask
    return batch


def progress_config(level: str, terminal: str, gamma: float, initial: float, **fields) -> dict:
    return dict(kl_ctl=0.0, **fields, process_reward_transform=dict(mode="progress", gamma=gamma, initial=initial,
                                                                    terminal=terminal, level=level))


def check_against_loop(batch: dict, fields: dict) -> None:
    out = compute_advantages(batch, AdvantageConfig(**fields))
    want = reference.compute_advantages(batch, fields)
    for name in ("advantages", "returns", "tot_rewards"):
        np.testing.assert_allclose(np.asarray(getattr(out, name)), want[name], **TOL, err_msg=f"{name} {fields}")


def test_the_guides_worked_row_turn_by_turn():  # (compiled: one program per setting)
    # Turns scored 0.2, (unscored), 0.9; initial 0.1; outcome 1 on the last turn's end.
    loss = np.array([[0, 1, 1, 0, 1, 1, 0, 1, 1]], np.int32)
    batch = dict(attention_mask=np.ones((1, 9), np.int32), loss_mask=loss,
                 turn_ids=np.array([[-1, 0, 0, -1, 1, 1, -1, 2, 2]], np.int32), logprobs=np.zeros((1, 9), np.float32),
                 rewards=np.ones(1, np.float32), is_truncated=np.zeros(1, bool),
                 token_rewards=np.array([[0, .2, .2, 0, .7, .7, 0, .9, .9]], np.float32),
                 token_reward_mask=np.array([[1, 1, 1, 1, 0, 0, 1, 1, 1]], bool))
    fold = dict(kl_ctl=0.0, token_rewards_as_adv=False)
    ends = [1, 4, 7]  # each turn's last trained timestep
    for transform, want in (
            ({"initial": 0.1}, [0.2 - 0.1, 0.0, 0.0 - 0.2 + 1.0]),                       # terminal: zero
            ({"initial": 0.1, "terminal": "outcome"}, [0.1, 0.0, 1.0 - 0.2 + 1.0]),       # Phi(s_n) = R = 1
            ({"initial": 0.1, "gamma": 0.9}, [0.9 * 0.2 - 0.1, 0.9 * 0.2 - 0.2, -0.2 + 1.0]),  # the carry decays
    ):
        out = compute_advantages(batch, AdvantageConfig(**fold, process_reward_transform={"mode": "progress",
                                                                                         **transform}))
        np.testing.assert_allclose(np.asarray(out.tot_rewards)[0, ends], want, rtol=1e-6, atol=1e-7)
        # Uniform over each turn: the turn's first timestep holds what its end holds (folded there only).
        shaped = compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, process_reward_transform={
            "mode": "progress", **transform}))
        process = np.asarray(shaped.advantages) - np.asarray(compute_advantages(
            {k: v for k, v in batch.items() if k not in ("token_rewards", "token_reward_mask")},
            AdvantageConfig(kl_ctl=0.0)).advantages)
        outcome_free = np.array(want) - np.array([0.0, 0.0, 1.0])
        np.testing.assert_allclose(process[0, [0, 1, 3, 4, 6, 7]], np.repeat(outcome_free, 2), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("level", ["turn", "token"])
@pytest.mark.parametrize("state", ["absent", "present", "rows_unscored"])
def test_matches_the_float64_loop(level, state):
    rng = np.random.default_rng(331 + len(state) + len(level))
    cases = [(terminal, gamma, initial) for terminal in ("zero", "outcome") for gamma in (1.0, 0.9, 0.0)
             for initial in (0.0, 0.3)]
    with jax.disable_jit(), warnings.catch_warnings():  # op by op: 12 settings, one compile each otherwise
        warnings.simplefilter("ignore")
        for terminal, gamma, initial in cases:
            batch = unscored(rng, make_batch(rng, rows=6, width=20, max_turns=4), state)
            check_against_loop(batch, progress_config(level, terminal, gamma, initial, discount=0.95, gae_lambda=0.9))


@pytest.mark.parametrize("level", ["turn", "token"])
def test_the_compiled_pipeline_equals_the_loop_for_each_scan_method_without_retracing(level):
    rng = np.random.default_rng(17)
    fields = progress_config(level, "outcome", 0.9, 0.25, discount=0.9, gae_lambda=0.95)
    batches = [unscored(rng, make_batch(rng, rows=6, width=20, max_turns=4), "present") for _ in range(2)]
    methods = ("scan", "associative", "blocked", *(("native",) if runs_native() else ())) if level == "turn" else (
        "scan",)  # (native where it runs: issue 56.1, this test asked for it on a GPU)
    for method in methods:
        config = AdvantageConfig(**fields, gae_method=method)
        chex.clear_trace_counter()  # (the counter is per lambda's code location: one per method here)
        step = jax.jit(chex.assert_max_traces(lambda b, c=config: compute_advantages(b, c).advantages, n=1))
        for batch in batches:  # the same shapes: one trace
            want = reference.compute_advantages(batch, fields)
            np.testing.assert_allclose(np.asarray(step(batch)), want["advantages"], **TOL, err_msg=method)


@pytest.mark.parametrize("terminal", ["zero", "outcome"])
def test_the_shaped_returns_telescope_to_minus_the_initial_potential_at_gamma_one(terminal):
    # Ng's identity: at gamma = 1 a row's shaped rewards sum to Phi(s_n) - Phi(s_0), so folded into GAE
    # (gamma = lam = 1) each row's return at its first trained timestep is the outcome-only return minus
    # initial (terminal: zero), or plus R - initial (terminal: outcome, Phi(s_n) = R), whatever the scores
    # and whichever turns were scored.
    rng = np.random.default_rng(99)
    batch = unscored(rng, make_batch(rng, rows=8, width=24, max_turns=5, uniform=True), "present")
    batch["values"] = np.zeros_like(batch["values"])
    initial = 0.375
    fields = dict(kl_ctl=0.0, token_rewards_as_adv=False, process_reward_transform={
        "mode": "progress", "initial": initial, "terminal": terminal})
    shaped = compute_advantages(batch, AdvantageConfig(**fields))
    plain = compute_advantages({k: v for k, v in batch.items() if k not in ("token_rewards", "token_reward_mask")},
                               AdvantageConfig(kl_ctl=0.0, token_rewards_as_adv=False))
    active = np.asarray(shaped.loss_mask) > 0
    rows = np.flatnonzero(active.any(1))
    assert len(rows) >= 6
    first = active[rows].argmax(1)
    outcome = batch["rewards"][rows].astype(np.float64)
    offset = -initial + (outcome if terminal == "outcome" else 0.0)
    np.testing.assert_allclose(np.asarray(shaped.returns)[rows, first] - np.asarray(plain.returns)[rows, first],
                               offset, rtol=1e-5, atol=1e-5)


def test_settings_are_validated_and_named():
    assert AdvantageConfig(process_reward_transform={"mode": "progress"}).process_reward_transform == \
        ProgressTransform(gamma=1.0, initial=0.0, terminal="zero", level="turn")
    for fields, name in (({"gamma": 1.5}, "gamma"), ({"gamma": -0.1}, "gamma"), ({"terminal": "last"}, "terminal"),
                         ({"level": "sentence"}, "level"), ({"initial": float("nan")}, "initial"),
                         ({"initial": 1e39}, "initial"), ({"potential": 1.0}, "potential")):
        with pytest.raises(ConfigError, match=name):
            AdvantageConfig(process_reward_transform={"mode": "progress", **fields})


def test_refused_pairs_name_both_keys():
    for fields, keys in (
            ({"credit_assignment": {"mode": "pure"}}, ("credit_assignment.mode", "process_reward_transform.mode")),
            ({"advantage_shaping": {"mode": "process_weighted"}},
             ("process_reward_transform.mode", "advantage_shaping.mode")),
            ({"token_rewards_as_adv": False, "level": "token"},
             ("process_reward_transform.level", "token_rewards_as_adv"))):
        level = fields.pop("level", "turn")
        with pytest.raises(ConfigError) as caught:
            AdvantageConfig(**fields, process_reward_transform={"mode": "progress", "level": level})
        assert all(key in str(caught.value) for key in keys), str(caught.value)


def test_a_bad_token_reward_mask_is_refused_naming_it():
    rng = np.random.default_rng(5)
    batch = make_batch(rng, rows=4, width=12)
    config = AdvantageConfig(kl_ctl=0.0, process_reward_transform={"mode": "progress"})
    with pytest.raises(ValueError, match="token_reward_mask"):
        compute_advantages({**batch, "token_reward_mask": np.full((4, 12), 2, np.int32)}, config)
    with pytest.raises(ValueError, match="token_reward_mask"):
        compute_advantages({**batch, "token_reward_mask": np.ones((4, 11), bool)}, config)
    without = {k: v for k, v in batch.items() if k != "token_rewards"}
    with pytest.raises(ValueError, match="token_reward_mask"):
        compute_advantages({**without, "token_reward_mask": np.ones((4, 12), bool)}, config)


def test_an_overflowing_difference_is_counted_not_returned():
    # Scores within float32 (3e38 and -3e38 on alternate turns) whose difference is not: the outputs' check
    # names the overflow; nothing non-finite is returned.
    rng = np.random.default_rng(8)
    batch = make_batch(rng, rows=4, width=16, max_turns=4)
    ids = batch["turn_ids"]
    batch["token_rewards"] = np.where(ids % 2 == 0, 3e38, -3e38).astype(np.float32)
    with pytest.raises(ValueError, match="non-finite"):
        compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, process_reward_transform={"mode": "progress"}))


def test_padding_and_untrained_junk_change_nothing():
    rng = np.random.default_rng(12)
    batch = unscored(rng, make_batch(rng, rows=5, width=18), "present")
    config = AdvantageConfig(kl_ctl=0.0, process_reward_transform={"mode": "progress", "gamma": 0.9, "initial": 0.2})
    base = compute_advantages(batch, config)
    junk = dict(batch)
    untrained = ~((batch["loss_mask"] > 0) & (batch["attention_mask"] > 0))
    junk["token_rewards"] = np.where(untrained, rng.normal(0, 50, untrained.shape), batch["token_rewards"]).astype(
        np.float32)
    junk["token_reward_mask"] = np.where(untrained, ~batch["token_reward_mask"], batch["token_reward_mask"])
    again = compute_advantages(junk, config)
    np.testing.assert_array_equal(np.asarray(again.advantages), np.asarray(base.advantages))
