"""Issue 20.7: the array API checks instead of reshaping: exact shapes, integer dtypes and ranges, each
error naming the argument."""

import re

import anyio
import numpy as np
import pytest

from prm_jax import PRMRunner, score_arrays
from prm_jax.kernels import turn_ids_from_spans
from prm_jax.runtime._arrays import chains_from_arrays


def arrays(rows=2, width=6):
    tokens = np.arange(rows * width, dtype=np.int32).reshape(rows, width)
    turn_ids = np.full((rows, width), -1, np.int32)
    turn_ids[:, 2:4] = 0
    return tokens, turn_ids


@pytest.mark.parametrize("name", ["attention_mask", "logprobs"])
def test_a_transposed_array_is_refused_not_reshaped(name):
    tokens, turn_ids = arrays(rows=2, width=6)
    transposed = np.zeros((6, 2), np.float32)  # [T, B]: reshaped into [B, T] before, scrambled silently
    with pytest.raises(ValueError, match=rf"{name} must have shape \(2, 6\)"):
        chains_from_arrays(tokens, turn_ids, **{name: transposed})


def test_rewards_must_be_one_per_row():
    tokens, turn_ids = arrays()
    with pytest.raises(ValueError, match=r"rewards must have shape \(2,\)"):
        chains_from_arrays(tokens, turn_ids, rewards=np.zeros((2, 1)))


def test_float_token_ids_and_turn_ids_are_refused():
    tokens, turn_ids = arrays()
    with pytest.raises(TypeError, match="input_ids must be an integer array, got dtype float64"):
        chains_from_arrays(tokens + 0.7, turn_ids)  # 7.7 became 7
    with pytest.raises(TypeError, match="turn_ids must be an integer array"):
        chains_from_arrays(tokens, turn_ids.astype(np.float32))
    with pytest.raises(ValueError, match=r"input_ids must hold token ids in \[0, 2147483647\], got -3"):
        chains_from_arrays(np.where(tokens == 0, -3, tokens), turn_ids)


def test_int64_spans_beyond_int32_do_not_wrap():
    # (2**32 + 1, 2**32 + 3) wrapped to (1, 3): turn 0 appeared on real positions.
    spans = np.array([[[2, 4], [2**32 + 1, 2**32 + 3]]], np.int64)
    np.testing.assert_array_equal(turn_ids_from_spans(spans, 6), [[-1, -1, 0, 0, -1, -1]])
    with pytest.raises(TypeError, match="spans must be an integer array"):
        turn_ids_from_spans(spans.astype(np.float32), 6)


def test_a_short_per_row_ctx_list_is_a_named_error():
    tokens, turn_ids = arrays(rows=3)

    async def main():
        async with PRMRunner() as runner:
            await score_arrays(runner, tokens, turn_ids, ctx=[{}, {}])
    with pytest.raises(ValueError, match=r"ctx must be one mapping, or one entry per row of input_ids \(3\), got 2"):
        anyio.run(main)


def _nan_case(name):
    """A batch, a config whose stages read ``name``, and where to put a NaN (a trained position or timestep,
    a real row, a used turn slot)."""
    from batches import make_batch

    from prm_jax.config import AdvantageConfig
    from prm_jax.kernels._schema import BATCH_SCHEMA

    rng = np.random.default_rng(41)
    batch = make_batch(rng, rows=4, width=24)
    batch["group_sizes"] = np.array([2, 2])
    config = AdvantageConfig(kl_ctl=0.0)
    if name == "ref_logprobs":
        config = AdvantageConfig(kl_ctl=0.1)
    if name == "prm_logprobs":
        batch["prm_logprobs"] = batch["ref_logprobs"].copy()
        batch = {k: v for k, v in batch.items() if k != "token_rewards"}
        config = AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "prime", "beta": 0.1})
    if name == "prox_logprobs":
        batch["prox_logprobs"] = batch["logprobs"].copy()
    if name == "gae_lambda":
        batch["gae_lambda"] = np.full(4, 0.9, np.float32)  # (read whenever the batch holds it)
    if name in ("sum_pi_squared", "rollout_is_weights"):  # OTB's model outputs
        batch["sum_pi_squared"] = np.full(batch["logprobs"].shape, 0.5, np.float32)
        batch["rollout_is_weights"] = np.ones(batch["logprobs"].shape, np.float32)
        config = AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "otb"})
    if name == "turn_rewards":
        batch["turn_rewards"] = np.zeros((4, 4), np.float32)
        batch["turn_reward_mask"] = np.ones((4, 4), bool)
        batch["anchor_ids"] = np.zeros((4, 4), np.int32)
        config = AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "gigpo"})
    if name == "reward_sources":
        batch["reward_sources"] = np.zeros((4, 2), np.float32)
        config = AdvantageConfig(kl_ctl=0.0, reward_norm={"mode": "decoupled", "weights": [1.0, 1.0]})
    key = BATCH_SCHEMA[name]
    array = np.array(batch[name], np.float32)
    if key.on == "positions":  # the first trained position after the first (read on the timestep before it)
        b, t = np.argwhere((batch["loss_mask"] > 0) & (batch["attention_mask"] > 0))[1]
    elif key.on == "timesteps":
        trained = (batch["loss_mask"] > 0) & (batch["attention_mask"] > 0)
        b, t = np.argwhere(trained[:, 1:])[0]
    else:
        b, t = 1, 0
    if array.ndim == 1:
        array[b] = np.nan
    else:
        array[b, t] = np.nan
    return dict(batch, **{name: array}), config


FINITE_KEYS = [name for name, key in __import__("prm_jax.kernels._schema", fromlist=["BATCH_SCHEMA"]).BATCH_SCHEMA.items()
               if key.finite in ("trained", "rows", "reader")]


@pytest.mark.parametrize("name", FINITE_KEYS)
def test_a_nan_in_every_key_with_a_finiteness_rule_is_refused_naming_the_key(name):
    # Issue 41.8: the finiteness checks read a hand-written dict, so a key added to the schema was never checked.
    # Every key with a rule ("trained", "rows", "reader" where a configured stage reads it) refuses a NaN where
    # it is used, naming itself.
    from prm_jax import compute_advantages

    batch, config = _nan_case(name)
    with pytest.raises(ValueError, match=re.escape(f"batch[{name!r}]")):
        compute_advantages(batch, config)


def test_a_key_added_to_the_schema_is_checked_with_no_other_change(monkeypatch):
    # Issue 41.8: a new per-token key ("entropy", trained, on positions) declared in the schema alone is checked
    # (a NaN on a trained timestep passed before), and is one of the float keys that choose the dtype.
    from batches import make_batch

    from prm_jax import compute_advantages
    from prm_jax.config import AdvantageConfig
    from prm_jax.kernels import _inputs as inputs
    from prm_jax.kernels._schema import BATCH_SCHEMA, BatchKey, float_keys

    schema = dict(BATCH_SCHEMA, entropy=BatchKey("entropy", "BT", "positions", "float", "trained", 0.0))
    monkeypatch.setattr(inputs, "BATCH_SCHEMA", schema)  # (as schema.py would declare it, and so its lists)
    monkeypatch.setattr(inputs, "READ_KEYS", (*inputs.READ_KEYS, "entropy"))
    assert "entropy" in float_keys(schema)
    batch = make_batch(np.random.default_rng(3), rows=2, width=16)
    entropy = np.ones(batch["logprobs"].shape, np.float32)
    b, t = np.argwhere((batch["loss_mask"] > 0) & (batch["attention_mask"] > 0))[1]
    entropy[b, t] = np.nan
    with pytest.raises(ValueError, match=re.escape("batch['entropy'] must be finite")):
        compute_advantages(dict(batch, entropy=entropy), AdvantageConfig(kl_ctl=0.0))


def test_nonfinite_rows_is_the_loop_for_every_input_and_mask():
    # Issue 56.5: the finite checks of compute_advantages' inputs are one variadic reduction over the inputs as
    # given (no masked copy each); against a plain loop, with two inputs sharing a mask, a float16 input, and
    # NaN and infinities both where used and where not (ignored there). A count has no gradient: a gradient
    # through the same inputs is the one without the check.
    import jax
    import jax.numpy as jnp

    from prm_jax.kernels._checks import nonfinite_rows

    rng = np.random.default_rng(7)
    rows, width = 6, 9
    xs = [rng.normal(size=(rows, width)).astype(dtype) for dtype in (np.float32, np.float16, np.float32)]
    used_a, used_b = rng.random((rows, width)) < 0.6, rng.random((rows, width)) < 0.4
    masks = [used_a, used_b, used_a]
    for x in xs:
        for _ in range(5):
            x[rng.integers(rows), rng.integers(width)] = rng.choice([np.nan, np.inf, -np.inf])
    expected = [[any(not np.isfinite(x[b, t]) and used[b, t] for t in range(width)) for b in range(rows)]
                for x, used in zip(xs, masks)]
    shared = jnp.asarray(used_a)
    got = jax.jit(lambda a, b, c, m1, m2: nonfinite_rows([(a, m1), (b, m2), (c, m1)]))(*xs, shared, used_b)
    assert [np.asarray(g).tolist() for g in got] == expected
    assert any(map(any, expected)) and not all(map(all, expected))  # (the case holds both answers)

    def loss(x):
        (bad,) = nonfinite_rows([(x, shared)])
        return jnp.sum(jnp.where(shared, x, 0.0) ** 2) + jnp.sum(bad.astype(jnp.float32))

    finite = np.nan_to_num(xs[0], nan=0.0, posinf=0.0, neginf=0.0)
    np.testing.assert_array_equal(np.asarray(jax.grad(loss)(finite)), 2 * np.where(used_a, finite, 0.0))


def test_a_key_on_positions_is_checked_where_the_timestep_before_it_is_trained():
    # Issue 56.5: a key on positions is probed in place with the timestep mask moved back one position (the
    # entries its shifted copy holds): a NaN at position 0, never read, passes; one at the position after the
    # row's last trained timestep passes; one read at a trained timestep is refused, naming that timestep.
    from batches import make_batch

    from prm_jax import compute_advantages
    from prm_jax.config import AdvantageConfig
    from prm_jax.kernels._alignment import shift_to_next_token

    batch = make_batch(np.random.default_rng(5), rows=3, width=16)
    trained = np.asarray(shift_to_next_token((batch["loss_mask"] > 0) & (batch["attention_mask"] > 0)))
    config = AdvantageConfig(kl_ctl=0.0)
    b = int(np.argwhere(trained.any(axis=1))[0, 0])
    first, last = np.flatnonzero(trained[b])[[0, -1]]
    for position, refused in ((0, False), (first + 1, True), (last + 1, True)):
        rewards = np.array(batch["token_rewards"], np.float32)
        rewards[b, position] = np.nan
        if refused:
            with pytest.raises(ValueError, match=re.escape(f"batch['token_rewards'] must be finite where it is "
                                                           f"used; row {b}, timestep {position - 1} is nan")):
                compute_advantages(dict(batch, token_rewards=rewards), config)
        else:
            out = compute_advantages(dict(batch, token_rewards=rewards), config)
            assert np.isfinite(np.asarray(out.advantages)).all()
    untrained = np.flatnonzero(~trained[b] & (np.arange(16) < 15))
    rewards = np.array(batch["token_rewards"], np.float32)
    rewards[b, untrained + 1] = np.nan  # (positions read only at untrained timesteps)
    assert np.isfinite(np.asarray(compute_advantages(dict(batch, token_rewards=rewards), config).advantages)).all()
