"""Issue 56.6: the row path's checks of a trainer's arrays in one native pass (``survey_rows``, rows_cpu.cc)
instead of numpy's dozen: on random batches of every dtype it takes, its turn counts, row lengths and flags
are those of plain loops over AReaL's turn rule (``turn_spans``); through ``score_arrays`` its numbers and
errors are numpy's path's, which still serves where it does not apply (no library, a float or strided mask,
other dtypes)."""

import types

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


def random_batch(rng, widest=69):
    """Rows of turns (stretches of one id, some gaps) across the survey's blocks of 16, sometimes broken, with a
    mask of holes; every dtype the survey takes; at most ``widest`` positions a row."""
    rows, width = int(rng.integers(1, 6)), int(rng.integers(1, widest + 1))
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


# -- the fused path: the checks made as the rows are copied into the model's chunks (plan_rows, chunk_rows,
# place_scores), for one ModelScorer ------------------------------------------------------------------------


def test_plan_rows_is_the_plain_loops_on_random_batches_of_every_dtype(library):
    # Each row's length (last attended position + 1, the mask read back from the row's end) and a stray token
    # flagged only in a row of length 0 (a row with attention has its tokens checked when it is copied). Rows
    # up to 300 wide in a quarter of the batches: padding read back 64 positions at a time, then 16, then one.
    rng = np.random.default_rng(5661)
    strays = empties = long_padding = 0
    for _ in range(1500):
        tokens, turn_ids, mask = random_batch(rng, widest=300 if rng.random() < 0.25 else 69)
        if rng.random() < 0.4 and mask is not None:  # long runs of padding (blocks of 16 and 64), whole rows of it
            mask = mask.copy()
            row = rng.integers(mask.shape[0])
            mask[row, int(rng.integers(mask.shape[1])) if rng.random() < 0.5 else 0:] = 0
            if rng.random() < 0.3:  # a stray token in that row
                tokens = tokens.copy()
                tokens[row, rng.integers(tokens.shape[1])] = -5
        host = ffi.host_rows(tokens, turn_ids, mask)
        assert host is not None
        plan = ffi.plan_rows(host)
        _, _, want_lengths = reference(tokens, turn_ids, mask)
        empty_stray = any(want_lengths[b] == 0 and not ((tokens[b] >= 0) & (tokens[b] <= MAX_TOKEN_ID)).all()
                          for b in range(tokens.shape[0]))
        assert plan.lengths.tolist() == want_lengths and plan.flags == (ffi.SURVEY_STRAY if empty_stray else 0)
        positive = [length for length in want_lengths if length > 0]  # (the span of the scored rows' lengths)
        assert (plan.longest, plan.shortest, plan.scored) == (max(positive, default=0), min(positive, default=0),
                                                              len(positive))
        strays += empty_stray
        empties += not positive
        long_padding += any(tokens.shape[1] - length >= 64 + 16 for length in want_lengths)
    assert strays >= 5 and empties >= 5 and long_padding >= 50


def copied_reference(tokens, turn_ids, attention, members, sizes, widths, size):
    """``chunk_rows``' blocks by plain loops: each member's token ids, mask (1 where it attends) and turn ids on
    its turn tokens (-1 elsewhere) up to ``min(width, T)``, 0 / 0 / -1 past it and in a block's empty rows; each
    member's turn count (``reference``'s) and whether a member's row holds a stray token."""
    _, counts, _ = reference(tokens, turn_ids, attention)
    blocks, stray, at = [], 0, 0
    for count, padded in zip(sizes, widths):
        ids, mask, turns = np.zeros((size, padded), np.int64), np.zeros((size, padded), np.int64), np.full((size, padded), -1)
        for i in range(count):
            b = int(members[at + i])
            for t in range(min(padded, tokens.shape[1])):
                attends = attention is None or int(attention[b, t]) != 0
                ids[i, t] = int(np.int64(tokens[b, t]).astype(np.int32))
                mask[i, t] = int(attends)
                turns[i, t] = min(int(turn_ids[b, t]), 2**31 - 1) if attends and int(turn_ids[b, t]) >= 0 else -1
            stray |= not all(0 <= int(v) <= MAX_TOKEN_ID for v in tokens[b])
        blocks.append((ids, mask, turns))
        at += count
    return (ffi.SURVEY_STRAY if stray else 0), blocks, [counts[int(b)] for b in members]


def test_chunk_rows_is_the_plain_loops_on_random_batches_of_every_dtype(library):
    # Random members (any order) in chunks of random sizes and widths (each at least its members' lengths, as
    # chunk_slots makes them; past T too): the copies, the padding, the turn counts and the stray flag (a token
    # anywhere in a member's row, past the copied columns too) are the plain loops'.
    rng = np.random.default_rng(5662)
    seen = {"broken": 0, "stray": 0, "stray_past_the_copies": 0, "narrower": 0, "wider": 0, "partial": 0}
    for _ in range(1500):
        tokens, turn_ids, mask = random_batch(rng)
        if mask is not None and rng.random() < 0.5:  # right padding: rows shorter than T
            mask = mask.copy()
            mask[:, int(rng.integers(mask.shape[1])):] = 0
        host = ffi.host_rows(tokens, turn_ids, mask)
        lengths = ffi.plan_rows(host).lengths
        rows, width = tokens.shape
        members = rng.permutation(rows)[:int(rng.integers(1, rows + 1))].astype(np.int64)
        size = int(rng.integers(1, 4))
        sizes, at = [], 0
        while at < members.size:
            sizes.append(int(rng.integers(1, min(size, members.size - at) + 1)))
            at += sizes[-1]
        starts = np.cumsum([0] + sizes[:-1])
        widths = [max(1, int(lengths[members[s:s + n]].max()) + int(rng.integers(0, 20))) for s, n in zip(starts, sizes)]
        if rng.random() < 0.3 and widths[0] < width:  # a stray token past the copied columns (the padding)
            tokens = tokens.copy()
            tokens[members[0], int(rng.integers(widths[0], width))] = -3
            host = ffi.host_rows(tokens, turn_ids, mask)
            seen["stray_past_the_copies"] += 1
        flags, ids, mask_out, turns, counts = ffi.chunk_rows(host, members, sizes, widths, size)
        want_flags, blocks, want_counts = copied_reference(tokens, turn_ids, mask, members, sizes, widths, size)
        assert flags == want_flags and counts.tolist() == want_counts
        offset = 0
        for (want_ids, want_mask, want_turns), padded in zip(blocks, widths):
            block = slice(offset, offset + size * padded)
            np.testing.assert_array_equal(ids[block].reshape(size, padded), want_ids)
            np.testing.assert_array_equal(mask_out[block].reshape(size, padded), want_mask)
            np.testing.assert_array_equal(turns[block].reshape(size, padded), want_turns)
            offset += size * padded
        assert offset == ids.size == mask_out.size == turns.size
        seen["broken"] += -1 in want_counts
        seen["stray"] += bool(want_flags)
        seen["narrower"] += min(widths) < width
        seen["wider"] += max(widths) > width
        seen["partial"] += min(sizes) < size
    assert min(seen.values()) >= 20, seen


def test_place_scores_is_the_plain_loop_and_flags_only_non_finite_scores_on_turns(library):
    rng = np.random.default_rng(5663)
    flagged = 0
    for _ in range(800):
        batch, width = int(rng.integers(1, 7)), int(rng.integers(1, 60))
        size, padded = int(rng.integers(1, 5)), int(rng.integers(1, 70))
        count = int(rng.integers(1, min(size, batch) + 1))
        rows = rng.permutation(batch)[:count].astype(np.int64)
        cut = int(rng.integers(0, min(padded, width) + 1))
        scores = rng.normal(size=(size, padded)).astype(np.float32)
        for _ in range(int(rng.integers(0, 3))):  # non-finite scores, on a turn or off the turns
            scores[rng.integers(size), rng.integers(padded)] = rng.choice([np.nan, np.inf, -np.inf])
        turns = np.where(rng.random((size, padded)) < 0.6, rng.integers(0, 3, (size, padded)), -1).astype(np.int32)
        out = np.full((batch, width), 7.0, np.float32)
        want = out.copy()
        non_finite = False
        for i, b in enumerate(rows.tolist()):
            for t in range(cut):
                want[b, t] = scores[i, t] if turns[i, t] >= 0 else 0.0
                non_finite |= bool(turns[i, t] >= 0 and not np.isfinite(scores[i, t]))
        assert ffi.place_scores(scores, turns, rows, cut, out) is non_finite
        np.testing.assert_array_equal(out, want)  # (NaN == NaN here; the rest of out untouched)
        flagged += non_finite
    assert flagged >= 50
    scores, turns, out = np.zeros((2, 4), np.float32), np.zeros((2, 4), np.int32), np.zeros((2, 4), np.float32)
    rows = np.arange(2)
    assert ffi.place_scores(scores, turns, rows, 4, out) is False
    assert ffi.place_scores(scores.astype(np.float64), turns, rows, 4, out) is None  # (numpy writes these)
    assert ffi.place_scores(np.zeros((2, 8), np.float32)[:, ::2], turns, rows, 4, out) is None
    assert ffi.place_scores(scores, turns, rows, 4, np.zeros((4, 2), np.float32).T) is None
    assert ffi.place_scores(scores, turns, rows, 5, out) is None  # (cut past the buffers)
    assert ffi.place_scores(scores, turns, np.arange(3), 4, np.zeros((3, 4), np.float32)) is None  # (more rows)


def test_place_scores_places_a_batch_of_calls_in_one_pass_as_the_plain_loop(library):
    # The calls a ScoresPlacer holds are written together at place() (one native call a batch): the same out as
    # each call placed alone, the flag said once for them all, nothing written before place().
    rng = np.random.default_rng(5664)
    for _ in range(200):
        batch, width = int(rng.integers(2, 12)), int(rng.integers(1, 40))
        out, want = np.zeros((batch, width), np.float32), np.zeros((batch, width), np.float32)
        placer = ffi.scores_placer(out)
        non_finite = False
        for rows in np.array_split(rng.permutation(batch).astype(np.int64), int(rng.integers(1, batch + 1))):
            size, padded = rows.size + int(rng.integers(0, 3)), int(rng.integers(1, 45))
            cut = int(rng.integers(0, min(padded, width) + 1))
            scores = rng.normal(size=(size, padded)).astype(np.float32)
            if rng.random() < 0.1:
                scores[0, 0] = np.inf
            turns = np.where(rng.random((size, padded)) < 0.6, 0, -1).astype(np.int32)
            non_finite |= ffi.place_scores(scores, turns, rows.copy(), cut, want) is True
            assert placer.add(scores, turns, rows.copy(), cut)
        assert not out.any()  # (held until place)
        assert placer.place() is non_finite and placer.place() is False
        np.testing.assert_array_equal(out, want)


def test_a_library_of_another_host_interface_is_refused_not_called():
    # A library built from older sources (a checkout's stale build) whose functions take other arguments: its
    # version says so and the loader builds the sources again (_load_host catches the AttributeError).
    def older():
        return ffi.HOST_API - 1
    with pytest.raises(AttributeError, match="interface"):
        ffi._host_functions(types.SimpleNamespace(PrmJaxHostApi=older))
    with pytest.raises(AttributeError):  # (older still: no version at all)
        ffi._host_functions(types.SimpleNamespace())


PATHS = ("fused", "survey", "numpy")


def force_path(monkeypatch, path):
    """The row path's checks made as the rows are copied (``fused``: the default with one ModelScorer), by the
    native survey first (``survey``), or by numpy's passes (``numpy``)."""
    if path != "fused":
        monkeypatch.setattr(arrays_module, "host_rows", lambda *args: None)
    if path == "numpy":
        monkeypatch.setattr(arrays_module, "survey_rows", lambda *args: None)


def fused_batch(rng):
    """A trainer's batch for the three paths: rows of turns with prompts and gaps, padding rows, rows with
    attention and no turn (some chunks hold only those), turn ids past the attention and below -1, a mask of
    holes given in several dtypes."""
    rows, width = int(rng.integers(1, 14)), int(rng.integers(8, 90))
    tokens = rng.integers(0, 900, (rows, width))
    turn_ids = np.full((rows, width), -1, np.int64)
    attention = np.zeros((rows, width), np.int64)
    for b in range(rows):
        length = int(rng.integers(0, width + 1))
        attention[b, :length] = 1
        kind = rng.random()
        if kind < 0.15 or length == 0:
            continue  # (padding, or attention and no turn)
        position, turn = int(rng.integers(0, max(1, length // 3))), 0
        while position < length:
            run = int(rng.integers(1, 12))
            turn_ids[b, position:position + run] = turn
            position += run + int(rng.integers(0, 4))
            turn += 1
        if rng.random() < 0.03:
            attention[b, int(rng.integers(length))] = 0  # a hole (may split a turn: then the row is refused)
    turn_ids[turn_ids == -1] = rng.choice([-1, -1, -7])  # (ids below -1 off the turns)
    if rng.random() < 0.4:
        tokens[rng.integers(rows), rng.integers(width)] = 999  # (path_model: that row's scores are NaN)
    if rng.random() < 0.1:
        tokens[rng.integers(rows), width - 1] = -3  # (a stray token, in the padding where the row has one)
    mask = {0: attention, 1: attention.astype(np.int32), 2: attention != 0, 3: attention * 2}[int(rng.integers(4))]
    return tokens, turn_ids, mask


def path_model(max_turns=None):
    """Scores from everything the model is given (a wrong id, mask or turn id shows), row by row (the same on any
    chunking): per token, or per turn (``max_turns``); NaN on a row holding token 999 (that row fails alone)."""
    def model(input_ids, attention_mask, turn_ids):
        ids, mask, turns = (np.asarray(a, np.float64) for a in (input_ids, attention_mask, turn_ids))
        scores = np.cumsum(ids * mask, axis=1) * 1e-3 + mask * 0.1 + (turns + 1) * 0.01
        if max_turns is not None:
            scores = np.stack([(scores * (turns == k)).sum(axis=1) for k in range(max_turns)], axis=1)
        return np.where((ids == 999).any(axis=1, keepdims=True), np.nan, scores).astype(np.float32)
    return model


@pytest.mark.parametrize("options", [{}, {"weight": 2.5}, {"output": "turns", "max_turns": 4},
                                     {"step_separator": [[7]], "spread": "step_end"}, {"bucket": 1}, {"bucket": 128}])
def test_the_three_paths_give_the_same_numbers_inputs_and_errors(library, monkeypatch, options):
    # Issue 56.6: one ModelScorer's rows checked as they are copied (fused) give the numbers, the model's inputs
    # (row by row: chunks differ where a row without a turn is dropped after its chunk was planned) and the
    # errors of the survey's path and numpy's, with each option that meets the row path: weight, per-turn
    # output (max_turns: a row past it is refused), spread over steps, buckets of 1 and 128; on_error both
    # ways, a row of non-finite scores failing alone.
    rng = np.random.default_rng(5664 + len(str(options)))
    kinds = set()
    for _ in range(40):
        tokens, turn_ids, mask = fused_batch(rng)
        size = int(rng.integers(1, 5))
        results = {}
        for path in PATHS:
            given: dict = {}
            calls: list = []

            def spy(input_ids, attention_mask, turn_ids_given, calls=calls):
                calls.append((np.asarray(input_ids).copy(), np.asarray(attention_mask).copy(),
                              np.asarray(turn_ids_given).copy()))
                return path_model(options.get("max_turns"))(input_ids, attention_mask, turn_ids_given)

            with monkeypatch.context() as patch:
                force_path(patch, path)
                model = ModelScorer(fn=spy, jit=False, max_batch_size=size, **{"bucket": 8, **options})
                with BlockingRunner(scorers=[model]) as runner:
                    outcome = {}
                    for on_error in ("raise", "mask"):
                        try:
                            outcome[on_error] = runner.score_arrays(tokens, turn_ids, attention_mask=mask,
                                                                    on_error=on_error)
                        except ValueError as err:
                            outcome[on_error] = f"ValueError: {err}"
            for ids, m, turns in calls:  # each row the model saw, by its tokens' content: trimmed of its padding
                for k in range(ids.shape[0]):
                    if m[k].any() or (turns[k] >= 0).any():
                        end = int(np.flatnonzero(m[k]).max()) + 1
                        given.setdefault(tuple(ids[k, :end]), []).append((m[k, :end].tolist(), turns[k, :end].tolist()))
                        assert (ids[k, end:] == ids[k, end:]).all() and (turns[k, end:] == -1).all()
            results[path] = outcome, given
        for path in ("survey", "numpy"):
            for on_error in ("raise", "mask"):
                want, got = results[path][0][on_error], results["fused"][0][on_error]
                if isinstance(want, str):
                    assert got == want
                    kinds.add("error")
                elif isinstance(want, np.ndarray):
                    np.testing.assert_array_equal(got, want)
                    kinds.add("scored")
                else:
                    np.testing.assert_array_equal(got.token_rewards, want.token_rewards)
                    assert got.failed.tolist() == want.failed.tolist() and got.errors == want.errors
                    kinds.add("failed rows" if want.failed.any() else "masked")
            if not isinstance(results[path][0]["raise"], str):
                assert {k: sorted(v) for k, v in results["fused"][1].items()} == {
                    k: sorted(v) for k, v in results[path][1].items()}
    assert {"error", "scored", "failed rows", "masked"} <= kinds, kinds


@pytest.mark.anyio
@pytest.mark.parametrize("mask_kind", ["none", "given", "read_only"])
async def test_the_fused_path_with_a_jitted_model_no_mask_read_only_arrays_and_progress(library, monkeypatch,
                                                                                        mask_kind):
    # The options the three-paths test does not meet: a jitted model (its outputs read-only arrays), the async
    # score_arrays, no attention mask (every position attends: each row's length is T), read-only arrays from the
    # trainer, and progress; the numbers and the progress calls equal the survey path's.
    import jax.numpy as jnp

    from prm_jax import PRMRunner
    from prm_jax.runtime import score_arrays

    rng = np.random.default_rng(5665)
    tokens, turn_ids, mask = fused_batch(rng)
    while not (turn_ids >= 0).any():
        tokens, turn_ids, mask = fused_batch(rng)
    tokens[tokens == 999] = 1
    attends = np.asarray(mask) != 0
    ends = np.where(attends.any(axis=1), attends.shape[1] - np.argmax(attends[:, ::-1], axis=1), 0)
    mask = None if mask_kind == "none" else np.arange(attends.shape[1]) < ends[:, None]  # (no holes)
    if mask_kind == "read_only":
        for array in (tokens, turn_ids, mask):
            array.flags.writeable = False

    def jitted(input_ids, attention_mask, turn_ids_given):
        ids, attends, turns = (a.astype(jnp.float32) for a in (input_ids, attention_mask, turn_ids_given))
        return jnp.cumsum(ids * attends, axis=1) * jnp.float32(1e-3) + (turns + 1) * jnp.float32(0.01)

    results = {}
    for path in ("fused", "survey"):
        calls: list = []
        with monkeypatch.context() as patch:
            force_path(patch, path)
            runner = PRMRunner(scorers=(ModelScorer(fn=jitted, max_batch_size=3, bucket=8),))
            got = await score_arrays(runner, tokens, turn_ids, attention_mask=mask,
                                     progress=lambda done, total, calls=calls: calls.append((done, total)))
        results[path] = got, calls
    (fused, fused_calls), (survey, survey_calls) = results["fused"], results["survey"]
    np.testing.assert_array_equal(fused, survey)
    assert fused_calls == survey_calls and fused_calls[-1][0] == fused_calls[-1][1] > 0
    assert (fused[turn_ids < 0] == 0).all() and (fused[(turn_ids >= 0) & (mask is None or mask != 0)] > 0).all()
