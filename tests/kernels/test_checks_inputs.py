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


def _nan_case(name, schema=None):
    """A batch, a config whose stages read ``name``, and where to put a NaN (a trained position or timestep,
    a real row, a used turn slot), all from the declarations (issue 57.5): the option matrix's batch, which
    holds every optional input, or else an array of the key's declared shape and fill; the config of the
    first estimator or stage that declares reading the key (its declared ``example``, or ``{kind: {mode}}``),
    or the default one for a key every run reads (``trained``, ``rows``). A key with a finiteness rule that no
    declaration reads gets a message naming what to declare."""
    from matrix_cases import make_batch

    from prm_jax.config import AdvantageConfig
    from prm_jax.estimators import STAGE_SPECS, registered
    from prm_jax.kernels._schema import BATCH_SCHEMA

    key = (schema or BATCH_SCHEMA)[name]
    batch = make_batch(np.random.default_rng(41))
    rows, width = batch["loss_mask"].shape
    if name not in batch:  # (a key the matrix's batch does not hold: its declared shape, filled as declared)
        shape = {"B": (rows,), "BT": (rows, width), "BK": (rows, 4)}.get(key.shape)
        if shape is None:
            return None, (f"batch key {name!r} has a finiteness rule on shape {key.shape!r}, which this test cannot "
                          "build: give the option matrix's batch (tests/matrix_cases.py) an entry for it")
        batch[name] = np.full(shape, key.fill, np.float32)
    readers = [dict(spec.example) for spec in registered() if name in (*spec.reads, *spec.may_read)]
    readers += [{spec.kind: {"mode": spec.mode}} for spec in STAGE_SPECS if name in spec.reads]
    if key.finite == "reader" and not readers and name not in AdvantageConfig(kl_ctl=0.1).plan.reads:
        return None, (f"batch key {name!r} is checked where a stage reads it (finite='reader'), but no estimator "
                      "or stage declares reading it: add it to the reads (or may_read) of the EstimatorSpec or "
                      "StageSpec that reads it")
    config = AdvantageConfig(kl_ctl=0.1 if name == "ref_logprobs" and not readers else 0.0,
                             **(readers[0] if readers else {}))
    array = np.array(batch[name], np.float32)
    trained = (batch["loss_mask"] > 0) & (batch["attention_mask"] > 0)
    if key.on == "positions":  # the first trained position after the first (read on the timestep before it)
        b, t = np.argwhere(trained)[1]
    elif key.on == "timesteps":
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
    assert batch is not None, config  # (the message: what to declare)
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
    # Issue 57.5: the schema-driven NaN case of a new key comes from its declaration alone (its shape and fill;
    # the matrix's batch does not hold it), and is refused; a new key checked where a stage reads it, which no
    # stage declares reading, gets a message naming what to declare, never a bare KeyError.
    case, config = _nan_case("entropy", schema)
    assert np.isnan(case["entropy"]).sum() == 1
    with pytest.raises(ValueError, match=re.escape("batch['entropy'] must be finite")):
        compute_advantages(case, config)
    unread = dict(schema, judge_logprobs=BatchKey("judge_logprobs", "BT", "timesteps", "float", "reader", 0.0))
    case, message = _nan_case("judge_logprobs", unread)
    assert case is None and "no estimator or stage declares reading it" in message and "'judge_logprobs'" in message


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


def test_range_probes_share_the_finite_probes_pass_and_are_the_loop():
    # Issue 56.5: a model output's declared range is probed in the finite probes' own reduction (no flags of
    # its own written: 6 bytes an element on the CPU); against a plain loop for each declared Bounds (log-probs
    # <= slack, probabilities in [0, 1 + slack], weights >= 0), in float32 and float16, values outside the
    # range and NaN (the finite probe's, never the range's) both where used and where not, next to a finite
    # probe of the same array and mask.
    import jax

    from prm_jax.kernels._checks import Probe, probed_rows
    from prm_jax.kernels._schema import LOGPROB, PROBABILITY, WEIGHT

    rng = np.random.default_rng(565)
    rows, width = 7, 11
    for dtype in (np.float32, np.float16):
        for bounds in (LOGPROB, PROBABILITY, WEIGHT):
            x = rng.uniform(max(bounds.low, -5.0), min(bounds.high, 5.0), size=(rows, width)).astype(dtype)
            used = rng.random((rows, width)) < 0.6
            far = bounds.high + 3.0 if np.isfinite(bounds.high) else bounds.low - 3.0
            used[:3, 0], used[:3, 1] = True, False
            x[0, 0], x[1, 1], x[2, 0] = far, far, np.nan  # outside and used, outside and unused, NaN and used
            for _ in range(4):
                x[rng.integers(rows), rng.integers(width)] = rng.choice([np.nan, far])
            outside = [[bool(used[b, t] and bounds.outside(np.float64(x[b, t]))) for t in range(width)]
                       for b in range(rows)]
            nonfinite = [[bool(used[b, t] and not np.isfinite(x[b, t])) for t in range(width)] for b in range(rows)]
            finite_rows, range_rows = jax.jit(lambda a, m, bounds=bounds: probed_rows(
                [Probe(a, m), Probe(a, m, "bounds", bounds)]))(x, used)
            assert np.asarray(range_rows).tolist() == [any(r) for r in outside], (dtype, bounds.text)
            assert np.asarray(finite_rows).tolist() == [any(r) for r in nonfinite], (dtype, bounds.text)
            assert any(map(any, outside)) and not all(map(any, outside))  # (the case holds both answers)


def test_the_masks_0_1_counts_are_one_pass_and_count_each_bad_entry():
    # Issue 56.5: compute_advantages sums the bad entries of its [B, T] masks in one variadic reduction (no
    # int32 flags written: 8 bytes an element a mask on the CPU); each mask's count is still its bad entries
    # (NaN, 0.5, 2, -1), as a plain loop counts them, and the message names the first.
    import jax

    from prm_jax.kernels._checks import bad_entries, mask_check

    rng = np.random.default_rng(56)
    int_mask = rng.integers(0, 2, (5, 9)).astype(np.int32)
    float_mask = rng.integers(0, 2, (5, 9)).astype(np.float32)
    int_mask[1, 3], int_mask[1, 5], int_mask[4, 0] = 2, -1, 7
    float_mask[0, 8], float_mask[3, 2] = np.nan, 0.5
    counts = jax.jit(bad_entries)([int_mask, float_mask])
    for mask, count in zip((int_mask, float_mask), counts):
        want = [sum(1 for v in row if not (v == 0 or v == 1)) for row in mask.tolist()]
        assert np.asarray(count).tolist() == want
    (check,) = mask_check("batch['loss_mask']", int_mask, counts=counts[0])
    assert int(check.count) == 3
    with pytest.raises(ValueError, match=re.escape("batch['loss_mask'] must be bool or hold only 0 and 1; row 1, "
                                                   "position 3 holds 2")):
        from prm_jax.kernels._checks import raise_value_checks
        raise_value_checks([check])


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


def test_the_checks_reductions_compile_once_a_layout_also_op_by_op():
    # The checks' variadic reductions took a fresh reducer at every call, and JAX keys its caches by the reducer:
    # op by op (outside jit, as the option matrix runs the pipeline) each call compiled its reduction again,
    # the matrix's time went from 91 s to 163 s when two more were added. The same layout is the same reducer,
    # and a second eager call of each compiles nothing.
    import jax
    import jax.numpy as jnp
    from batches import compile_log

    from prm_jax.kernels._checks import Probe, bad_entries, probed_rows
    from prm_jax.kernels._schema import LOGPROB

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(3, 8)).astype(np.float32))
    used = jnp.asarray(rng.random((3, 8)) < 0.5)
    mask = jnp.asarray(rng.integers(0, 2, (3, 8)).astype(np.int32))

    def calls():
        probed_rows([Probe(x, used), Probe(x, used, "bounds", LOGPROB)])
        bad_entries([mask, mask + 0])

    with jax.disable_jit():
        calls()  # (compiles each primitive once)
        with compile_log() as compiled:
            calls()
    assert [m for m in compiled if "reduce" in m] == []
