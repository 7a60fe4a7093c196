"""Issue 56.6: the row path's checks of a trainer's arrays in one native pass (``survey_rows``, rows_cpu.cc)
instead of numpy's dozen: on random batches of every dtype it takes, its turn counts, row lengths and flags
are those of plain loops over AReaL's turn rule (``turn_spans``); through ``score_arrays`` its numbers and
errors are numpy's path's, which still serves where it does not apply (no library, a float or strided mask,
other dtypes)."""

import numpy as np
import pytest

from prm_jax import BlockingRunner
from prm_jax.native import _ffi as ffi
from prm_jax.runtime import _arrays as arrays_module
from prm_jax.runtime._trajectory import MAX_TOKEN_ID, turn_spans
from prm_jax.scorers import ModelScorer


@pytest.fixture
def library():
    """The native library's host functions (built from the sources on first use), or a skip saying why not."""
    if ffi._host_library() is None:
        pytest.skip("no native library (PRM_JAX_NATIVE=0, or no C++ compiler to build it): numpy checks the rows")


def reference(tokens, turn_ids, attention):
    """``(flags, counts, lengths)`` by plain loops: a row's turns by turn_spans (-1 where it refuses the row)
    over its turn tokens (turn id >= 0 with attention), its last attended position + 1, and the flags."""
    rows, width = tokens.shape
    flags, counts, lengths = 0, [], []
    for b in range(rows):
        attends = [True] * width if attention is None else [int(attention[b, t]) != 0 for t in range(width)]
        ids = [int(turn_ids[b, t]) if attends[t] else -1 for t in range(width)]
        try:
            counts.append(len(turn_spans(np.array(ids, np.int64), b)))
        except ValueError:
            counts.append(-1)
        lengths.append(max((t + 1 for t in range(width) if attends[t]), default=0))
        for t in range(width):
            if not 0 <= int(tokens[b, t]) <= MAX_TOKEN_ID:
                flags |= ffi.SURVEY_STRAY
            if int(turn_ids[b, t]) >= 0 and not attends[t]:
                flags |= ffi.SURVEY_OUTSIDE
            if attention is not None and int(attention[b, t]) not in (0, 1):
                flags |= ffi.SURVEY_NOT_BINARY
    return flags, counts, lengths


def random_batch(rng):
    """Rows of turns (stretches of one id, some gaps) across the survey's blocks of 16, sometimes broken, with a
    mask of holes; every dtype the survey takes."""
    rows, width = int(rng.integers(1, 6)), int(rng.integers(1, 70))
    turn_ids = np.full((rows, width), -1, np.int64)
    for b in range(rows):
        position, turn = int(rng.integers(0, 4)), 0
        while position < width:
            length = int(rng.integers(1, 40))
            turn_ids[b, position:position + length] = turn
            position += length + int(rng.integers(0, 3))
            turn += 1
    if rng.random() < 0.4:  # a broken row: a stray id, a turn split, one repeated or out of order
        turn_ids[rng.integers(rows), rng.integers(width)] = rng.integers(-1, 4)
    attention = (rng.random((rows, width)) > rng.choice([0.0, 0.05, 0.5])).astype(np.int64)
    if rng.random() < 0.1:
        attention[rng.integers(rows), rng.integers(width)] = rng.choice([2, -1])
    tokens = rng.integers(0, 50_000, (rows, width))
    if rng.random() < 0.1:
        tokens[rng.integers(rows), rng.integers(width)] = rng.choice([-1, MAX_TOKEN_ID, MAX_TOKEN_ID + 1])
    mask_dtype = rng.choice(["none", "bool", "int8", "uint8", "int32", "uint32", "int64", "uint64"])
    mask = None if mask_dtype == "none" else attention.astype(mask_dtype) if mask_dtype != "bool" else attention != 0
    token_dtype = np.int32 if rng.random() < 0.5 and tokens.min() >= -2**31 and tokens.max() < 2**31 else np.int64
    return tokens.astype(token_dtype), turn_ids.astype(rng.choice([np.int32, np.int64])), mask


def test_the_survey_is_the_plain_loops_on_random_batches_of_every_dtype(library):
    rng = np.random.default_rng(566)
    seen = {"broken": 0, "stray": 0, "outside": 0, "not_binary": 0}
    for _ in range(1500):
        tokens, turn_ids, mask = random_batch(rng)
        got = ffi.survey_rows(tokens, turn_ids, mask)
        assert got is not None
        flags, counts, lengths = reference(tokens, turn_ids, mask)
        assert got[0] == flags and got[1].tolist() == counts and got[2].tolist() == lengths
        seen["broken"] += -1 in counts
        seen["stray"] += bool(flags & ffi.SURVEY_STRAY)
        seen["outside"] += bool(flags & ffi.SURVEY_OUTSIDE)
        seen["not_binary"] += bool(flags & ffi.SURVEY_NOT_BINARY)
    assert min(seen.values()) >= 20, seen  # every verdict was exercised


def test_the_survey_declines_what_it_does_not_take(library):
    tokens = np.arange(12).reshape(3, 4)
    turn_ids = np.full((3, 4), -1)
    assert ffi.survey_rows(tokens, turn_ids, None) is not None
    assert ffi.survey_rows(tokens, turn_ids, np.ones((3, 4), np.float32)) is None  # a float mask
    assert ffi.survey_rows(np.arange(24).reshape(3, 8)[:, :4], turn_ids, None) is None  # strided
    assert ffi.survey_rows(tokens.astype(np.int16), turn_ids, None) is None
    assert ffi.survey_rows(tokens.astype(np.uint32), turn_ids, None) is None
    assert ffi.survey_rows(tokens, turn_ids, np.ones((3, 5), bool)) is None  # (shapes: the numpy path names it)


def numpy_only(monkeypatch):
    monkeypatch.setattr(arrays_module, "survey_rows", lambda *args: None)


def rows(seed=1):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 60, (6, 40))
    turn_ids = np.full((6, 40), -1)
    attention = np.zeros((6, 40), np.int64)
    for b in range(6):
        length = 12 + 4 * b
        attention[b, :length] = 1
        turn_ids[b, 2:6], turn_ids[b, 8:length] = 0, 1
    turn_ids[3] = -1  # attention, no turn: not scored
    return tokens, turn_ids, attention


def model(input_ids, attention_mask, turn_ids):
    """A score per token from what the model is given (so a wrong mask or turn id shows)."""
    return (input_ids * 0.01 + attention_mask * 0.1 + (turn_ids + 1) * 0.001).astype(np.float32)


@pytest.mark.parametrize("variant", ["as_given", "int32", "bool", "float_mask", "strided", "mask_of_twos",
                                     "no_mask"])
def test_score_arrays_gives_numpys_numbers_and_errors_with_the_survey(library, monkeypatch, variant):
    tokens, turn_ids, attention = rows()
    mask = {"int32": attention.astype(np.int32), "bool": attention != 0, "float_mask": attention.astype(np.float32),
            "mask_of_twos": attention * 2, "no_mask": None}.get(variant, attention)
    if variant == "strided":
        wide = np.zeros((6, 80), np.int64)
        wide[:, :40] = tokens
        tokens = wide[:, :40]
    seen = []

    def spy(input_ids, attention_mask, turn_ids):
        seen.append(np.asarray(attention_mask).copy())
        return model(input_ids, attention_mask, turn_ids)

    def score(ids=turn_ids, toks=tokens):
        with BlockingRunner(scorers=[ModelScorer(fn=spy, jit=False, max_batch_size=2, bucket=16)]) as runner:
            return runner.score_arrays(toks, ids, attention_mask=mask, on_error="mask", per_turn=True)

    native = score()
    assert all(set(np.unique(m).tolist()) <= {0, 1} for m in seen)  # a mask of 2s is given to the model as 1s
    broken = turn_ids.copy()
    broken[4, 20] = 0  # turn 0 again after turn 1
    stray = tokens.copy()
    stray[5, 39] = -3  # in the padding: still refused
    errors = []
    for ids, toks in ((broken, tokens), (turn_ids, stray)):
        with pytest.raises(ValueError) as caught:
            score(ids, toks)
        errors.append(str(caught.value))
    with monkeypatch.context() as patch:
        numpy_only(patch)
        seen.clear()
        want = score()
        assert all(set(np.unique(m).tolist()) <= {0, 1} for m in seen)
        for (ids, toks), message in zip(((broken, tokens), (turn_ids, stray)), errors):
            with pytest.raises(ValueError) as caught:
                score(ids, toks)
            assert str(caught.value) == message
    np.testing.assert_array_equal(native.token_rewards, want.token_rewards)
    np.testing.assert_array_equal(native.turn_scores, want.turn_scores)
    assert native.failed.tolist() == want.failed.tolist() == [False] * 6
    assert (native.token_rewards[3] == 0).all() and (native.token_rewards[turn_ids >= 0] > 0).all()
    assert "row 4" in errors[0] and "got -3" in errors[1]
