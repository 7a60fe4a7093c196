"""Issue 30, section 4: a JAX model as a scorer (ModelScorer): whole rows per forward, chunked and bucketed
(one compile per bucket), the array path without interactions, the same numbers as per-turn calls."""

import functools
import re
import threading

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prm_jax import BaseScorer, PRMRunner, SyncScorer, score_arrays
from prm_jax.config import PRMConfig, ScorerSpec
from prm_jax.runtime import _arrays as arrays_module
from prm_jax.runtime import chains_from_arrays
from prm_jax.scorers import ModelScorer

pytestmark = pytest.mark.anyio

VOCAB = 64
TABLE = np.random.default_rng(0).normal(size=(VOCAB, 4)).astype(np.float32)
HEAD = np.array([0.3, -0.2, 0.5, 0.1], np.float32)


def causal_prm(input_ids, attention_mask, turn_ids):
    """A tiny causal 'PRM': each token's score depends on the tokens up to it (a running sum)."""
    embedded = jnp.asarray(TABLE)[input_ids] * attention_mask[..., None].astype(jnp.float32)
    state = jnp.cumsum(embedded, axis=1)
    return jax.nn.sigmoid(state @ jnp.asarray(HEAD))


def per_turn_reference(prefix):
    """The model called on one turn alone: its prefix as one row, unpadded."""
    ids = np.asarray(prefix, np.int32)[None]
    return np.asarray(causal_prm(ids, np.ones_like(ids), np.zeros_like(ids)), np.float64)[0]


# One reference call at a time: each turn's prefix is a new shape, so the executor's threads would compile the
# model side by side, and XLA's CPU compiler aborted the process once doing so (a clean-clone run, 2026-12-06:
# "Fatal Python error: Aborted" with two threads in backend_compile_and_load). The reference needs no
# concurrency; the executors' own tests keep theirs.
_REFERENCE_LOCK = threading.Lock()


class PerTurnModel(SyncScorer):
    """The same model, one call per turn (what the issue measured: 1,024 forwards), in a worker thread."""

    name = "per_turn_model"

    def evaluate(self, interaction, ctx):
        prefix = np.concatenate([interaction.input_tokens, interaction.output_tokens])
        with _REFERENCE_LOCK:
            return per_turn_reference(prefix)[-interaction.output_len:]


def trainer_rows(rows=10, seed=1):
    """Right-padded rows of lengths 9..40 with 2-3 turns (prompt, turn, tool, turn, ...)."""
    rng = np.random.default_rng(seed)
    width = 48
    tokens = np.zeros((rows, width), np.int64)
    turn_ids = np.full((rows, width), -1, np.int64)
    attention = np.zeros((rows, width), np.int64)
    for b in range(rows):
        position = 2
        for k in range(2 + b % 2):
            length = int(rng.integers(2, 8))
            turn_ids[b, position:position + length] = k
            position += length + 2  # a 2-token tool answer
        length = min(position, width)
        tokens[b, :length] = rng.integers(1, VOCAB, length)
        attention[b, :length] = 1
        turn_ids[b, length:] = -1
    return tokens, turn_ids, attention


async def test_the_array_path_scores_whole_rows_once_per_chunk_and_equals_per_turn_calls(monkeypatch):
    tokens, turn_ids, attention = trainer_rows(10)
    traced = chex.assert_max_traces(causal_prm, n=1)  # every chunk fits one bucket: one compile
    model = ModelScorer(fn=traced, max_batch_size=4, bucket=64, weight=0.5)

    def no_chains(*args, **kwargs):
        raise AssertionError("the array path built interactions")

    monkeypatch.setattr(arrays_module, "chains_from_arrays", no_chains)
    out = await score_arrays(PRMRunner(scorers=(model,)), tokens, turn_ids, attention_mask=attention)
    assert model.forwards == 3  # 10 rows, 4 per forward
    monkeypatch.undo()
    reference = await score_arrays(PRMRunner(scorers=(PerTurnModel(weight=0.5),)), tokens, turn_ids,
                                   attention_mask=attention)
    np.testing.assert_allclose(out, reference, rtol=0, atol=1e-6)
    assert (out[turn_ids < 0] == 0).all() and (out[turn_ids >= 0] > 0).all()
    chex.clear_trace_counter()


async def test_compiles_are_the_width_buckets_used():
    tokens, turn_ids, attention = trainer_rows(12)
    order = np.argsort(attention.sum(axis=1), kind="stable")  # by length: chunks of similar rows
    tokens, turn_ids, attention = tokens[order], turn_ids[order], attention[order]
    lengths = attention.sum(axis=1)
    buckets = {-(-int(lengths[b:b + 3].max()) // 8) * 8 for b in range(0, 12, 3)}
    assert len(buckets) >= 2  # the test needs several widths
    model = ModelScorer(fn=chex.assert_max_traces(causal_prm, n=len(buckets)), max_batch_size=3, bucket=8)
    await score_arrays(PRMRunner(scorers=(model,)), tokens, turn_ids, attention_mask=attention)
    assert model.forwards == 4  # four chunks, compiled once per width bucket (chex counts the traces)
    again = ModelScorer(fn=chex.assert_max_traces(causal_prm, n=len(buckets) - 1), max_batch_size=3, bucket=8)
    with pytest.raises(AssertionError, match="traced"):  # the bound is tight: one compile fewer fails
        await score_arrays(PRMRunner(scorers=(again,)), tokens, turn_ids, attention_mask=attention)
    chex.clear_trace_counter()


async def test_sessions_batch_their_branches_into_forwards_with_the_same_numbers():
    tokens, turn_ids, attention = trainer_rows(10)
    chains = [c for c in chains_from_arrays(tokens, turn_ids, attention_mask=attention) if c]
    model = ModelScorer(fn=causal_prm, max_batch_size=4, max_wait=1.0)
    await PRMRunner(scorers=(model,)).run_many(chains, limit=None)
    assert model.forwards == 3
    by_arrays = await score_arrays(PRMRunner(scorers=(ModelScorer(fn=causal_prm),)), tokens, turn_ids,
                                   attention_mask=attention)
    for b, chain in enumerate(chains):
        positions = turn_ids[b] >= 0
        np.testing.assert_allclose(np.concatenate([t.token_rewards for t in chain]), by_arrays[b, positions],
                                   rtol=0, atol=1e-6)


def turn_model(input_ids, attention_mask, turn_ids):
    """Per-turn output [B, 4]: turn k scores k / 10 + the row's first token / 100."""
    return jnp.arange(4, dtype=jnp.float32)[None, :] / 10 + input_ids[:, :1].astype(jnp.float32) / 100


async def test_turn_output_is_broadcast_over_each_turns_tokens_and_per_turn_scores_are_the_means():
    tokens, turn_ids, attention = trainer_rows(5)
    model = ModelScorer(fn=turn_model, output="turns", max_turns=4, weight=2.0)
    out = await score_arrays(PRMRunner(scorers=(model,)), tokens, turn_ids, attention_mask=attention, per_turn=True)
    for b in range(5):
        for k in range(int(turn_ids[b].max()) + 1):
            expected = np.float32(2.0 * (np.float32(k / 10 + tokens[b, 0] / 100)))
            np.testing.assert_allclose(out.token_rewards[b, turn_ids[b] == k], expected, rtol=1e-6)
            np.testing.assert_allclose(out.turn_scores[b, k], expected, rtol=1e-6)
    assert out.turn_mask.sum() == sum(int(turn_ids[b].max()) + 1 for b in range(5))
    with pytest.raises(ValueError, match="more turns than max_turns=2"):
        await score_arrays(PRMRunner(scorers=(ModelScorer(fn=turn_model, output="turns", max_turns=2),)),
                           tokens, turn_ids, attention_mask=attention)


async def test_a_non_finite_score_fails_exactly_its_own_row_on_mask_and_names_it_on_raise():
    # Issue 41.21: row 5's NaN failed the whole chunk of four ("non-finite scores on row 5" on rows 4-7, whose
    # scores were finite); only the rows with non-finite scores fail, on both paths (arrays and branches).
    tokens, turn_ids, attention = trainer_rows(8)

    def poisoned(input_ids, attention_mask, turn_ids):
        scores = causal_prm(input_ids, attention_mask, turn_ids)
        return jnp.where(input_ids[:, :1] == int(tokens[5, 0]), jnp.nan, scores)

    model = ModelScorer(fn=poisoned, max_batch_size=4)
    clean = await score_arrays(PRMRunner(scorers=(ModelScorer(fn=causal_prm, max_batch_size=4),)), tokens,
                               turn_ids, attention_mask=attention)
    runner = PRMRunner(scorers=(model,))
    out = await score_arrays(runner, tokens, turn_ids, attention_mask=attention, on_error="mask")
    assert out.failed.tolist() == [False] * 5 + [True] + [False] * 2
    assert np.isnan(out.token_rewards[5][turn_ids[5] >= 0]).all()
    keep = np.arange(8) != 5
    np.testing.assert_array_equal(out.token_rewards[keep], clean[keep])  # the chunk's other rows, as scored alone
    assert "non-finite scores" in out.errors[5] and "row 5" in out.errors[5] and list(out.errors) == [5]
    assert runner.scorer_stats()[model.name]["failures"] == 1
    with pytest.raises(ValueError, match="on row 5: the model returned non-finite scores"):
        await score_arrays(PRMRunner(scorers=(model,)), tokens, turn_ids, attention_mask=attention)

    class Half(BaseScorer):  # beside another scorer the model runs on branches: the same rows fail
        name = "half"

        async def evaluate(self, interaction, ctx):
            return 0.5

    mixed = await score_arrays(PRMRunner(scorers=(model, Half())), tokens, turn_ids, attention_mask=attention,
                               on_error="mask")
    assert mixed.failed.tolist() == out.failed.tolist()


async def test_every_chunk_is_called_before_any_output_is_read_and_both_writes_give_the_same_numbers():
    # Issue 56.6: the row path calls the model on every chunk before it reads an output (a jitted model's outputs
    # are computed asynchronously: the device works while the host builds the next chunks), and writes float32
    # scores of weight 1 straight onto the turns' positions. The numbers are per-turn calls', and those of the
    # path that weights each chunk (a model returning float64, and per_turn=True).
    tokens, turn_ids, attention = trainer_rows(10)
    model = ModelScorer(fn=causal_prm, max_batch_size=4)
    events = []
    call, fetch = model._call, model._fetch

    def spy_call(*args):
        events.append("call")
        return call(*args)

    def spy_fetch(*args):
        events.append("fetch")
        return fetch(*args)
    model._call, model._fetch = spy_call, spy_fetch
    out = await score_arrays(PRMRunner(scorers=(model,)), tokens, turn_ids, attention_mask=attention)
    assert events == ["call"] * 3 + ["fetch"] * 3  # 10 rows, 4 a call
    for b in range(10):
        for k in range(int(turn_ids[b].max()) + 1):
            at = np.flatnonzero(turn_ids[b] == k)
            want = per_turn_reference(tokens[b, :at[-1] + 1])[at]
            np.testing.assert_allclose(out[b, at], want, rtol=1e-6, atol=1e-7)
    assert (out[turn_ids < 0] == 0).all()

    def in_float64(input_ids, attention_mask, turn_ids):
        return np.asarray(causal_prm(input_ids, attention_mask, turn_ids), np.float64)
    weighted = await score_arrays(PRMRunner(scorers=(ModelScorer(fn=in_float64, jit=False, max_batch_size=4),)),
                                  tokens, turn_ids, attention_mask=attention)
    np.testing.assert_array_equal(weighted, out)
    per_turn = await score_arrays(PRMRunner(scorers=(ModelScorer(fn=causal_prm, max_batch_size=4),)), tokens,
                                  turn_ids, attention_mask=attention, per_turn=True)
    np.testing.assert_array_equal(per_turn.token_rewards, out)


async def test_a_non_finite_row_before_a_failed_call_is_the_first_failure_and_mask_keeps_each_rows_own():
    # Issue 56.6: the scores written straight are checked for finiteness once for the batch; the first failure
    # is still the first in chunk order (row 1's NaN in the first call, before the second call's error), the
    # calls stop at a failed one under on_error="raise", and a NaN off the turns fails nothing.
    tokens, turn_ids, attention = trainer_rows(8)
    calls = []

    def flaky(input_ids, attention_mask, turn_ids):
        calls.append(input_ids.shape)
        if len(calls) % 3 == 2:
            raise RuntimeError("the second call fails")
        scores = np.array(causal_prm(input_ids, attention_mask, turn_ids))
        if len(calls) % 3 == 1:
            scores[1, 3] = np.nan  # row 1: position 3 is on its first turn
            scores[2, 0] = np.inf  # row 2: position 0 is its prompt
        return scores

    with pytest.raises(ValueError, match="on row 1: the model returned non-finite scores"):
        await score_arrays(PRMRunner(scorers=(ModelScorer(fn=flaky, jit=False, max_batch_size=3),)), tokens,
                           turn_ids, attention_mask=attention)
    assert len(calls) == 2  # the third chunk was not called
    calls.extend([None])  # (the next call is the first of three again)
    assert turn_ids[1, 3] == 0 and turn_ids[2, 0] == -1
    out = await score_arrays(PRMRunner(scorers=(ModelScorer(fn=flaky, jit=False, max_batch_size=3),)), tokens,
                             turn_ids, attention_mask=attention, on_error="mask")
    assert len(calls) == 6 and out.failed.tolist() == [False, True, False, True, True, True, False, False]
    assert "row 1: the model returned non-finite scores" in out.errors[1]
    assert all(out.errors[row] == "RuntimeError: the second call fails" for row in (3, 4, 5))
    clean = await score_arrays(PRMRunner(scorers=(ModelScorer(fn=causal_prm, max_batch_size=3),)), tokens,
                               turn_ids, attention_mask=attention)
    keep = ~out.failed
    np.testing.assert_array_equal(out.token_rewards[keep], clean[keep])
    assert np.isnan(out.token_rewards[~keep][turn_ids[~keep] >= 0]).all()
    assert (out.token_rewards[~keep][turn_ids[~keep] < 0] == 0).all()  # (NaN on the failed rows' turns only)


async def test_beside_another_scorer_the_model_runs_on_branches_with_the_same_numbers():
    tokens, turn_ids, attention = trainer_rows(6)

    class Half(BaseScorer):
        name = "half"

        async def evaluate(self, interaction, ctx):
            return 0.5

    alone = await score_arrays(PRMRunner(scorers=(ModelScorer(fn=causal_prm),)), tokens, turn_ids,
                               attention_mask=attention)
    mixed = await score_arrays(PRMRunner(scorers=(ModelScorer(fn=causal_prm), Half())), tokens, turn_ids,
                               attention_mask=attention)
    np.testing.assert_allclose(mixed, np.where(turn_ids >= 0, alone + np.float32(0.5), 0), rtol=0, atol=1e-6)


def make_causal_prm():
    """A factory, as a config names one: loads the model (here: returns it)."""
    return causal_prm


async def test_a_config_entry_names_a_factory_and_bad_settings_are_refused():
    config = PRMConfig(scorers=(ScorerSpec("prm_jax.scorers.ModelScorer",
                                           kwargs={"factory": f"{__name__}.make_causal_prm", "bucket": 32}),))
    runner = PRMRunner(config)
    tokens, turn_ids, attention = trainer_rows(3)
    out = await score_arrays(runner, tokens, turn_ids, attention_mask=attention)
    reference = await score_arrays(PRMRunner(scorers=(ModelScorer(fn=causal_prm),)), tokens, turn_ids,
                                   attention_mask=attention)
    np.testing.assert_array_equal(out, reference)
    for kwargs, needle in [({}, "exactly one of fn"), ({"factory": "nowhere.at_all"}, "cannot be imported"),
                           ({"fn": causal_prm, "output": "turns"}, "needs max_turns"),
                           ({"fn": causal_prm, "bucket": 0}, "bucket")]:
        with pytest.raises(ValueError, match=needle):
            ModelScorer(**kwargs)


async def test_rows_are_chunked_by_length_and_scored_back_in_their_own_order():
    # Issue 42.4: every chunk of score_arrays' model path was padded to its longest row in the rows' own order
    # (1.55-1.90x the hand loop that sorts). Rows of lengths 8 and 200 alternate: sorted, the short rows share
    # chunks padded to 128 and the long ones chunks padded to 256; the scores, per row, are the same.
    rows, width = 8, 256
    tokens = np.zeros((rows, width), np.int64)
    turn_ids = np.full((rows, width), -1, np.int64)
    attention = np.zeros((rows, width), np.int64)
    rng = np.random.default_rng(42)
    for b in range(rows):
        length = 8 if b % 2 == 0 else 200
        tokens[b, :length] = rng.integers(1, 50, length)
        attention[b, :length] = 1
        turn_ids[b, 1:length] = 0
    model = ModelScorer(fn=causal_prm, max_batch_size=2, bucket=128)
    widths = []
    forward = model._call

    def spy(ids, mask, turns):
        widths.append(ids.shape[1])
        return forward(ids, mask, turns)
    model._call = spy
    out = await score_arrays(PRMRunner(scorers=(model,)), tokens, turn_ids, attention_mask=attention)
    assert sorted(widths) == [128, 128, 256, 256]  # unsorted: four chunks of 256
    for b in range(rows):
        length = int(attention[b].sum())
        want = per_turn_reference(tokens[b, :length])[1:length]
        np.testing.assert_allclose(out[b, 1:length], want, rtol=1e-6, atol=1e-7)
    widths.clear()
    direct = model.score_rows(tokens, attention, turn_ids)  # the public call sorts the same way
    assert sorted(widths) == [128, 128, 256, 256]
    np.testing.assert_allclose(direct.astype(np.float32), out, rtol=1e-6, atol=1e-7)


def test_blocking_runner_scores_model_rows_in_the_callers_thread_with_the_same_numbers_and_errors(monkeypatch):
    # Issue 56.6: a synchronous trainer's BlockingRunner.score_arrays with ModelScorers runs the row path in the
    # trainer's own thread (no hop to the runner's loop and back: on a GPU the host path is all there is);
    # the numbers, the failed rows, their messages, the failure counts and the progress calls are the async
    # path's, and options only interaction scorers read still go through the loop.
    from prm_jax.runtime import BlockingRunner

    tokens, turn_ids, attention = trainer_rows(8)
    callers = []

    def watched(input_ids, attention_mask, turn_ids):
        callers.append(threading.get_ident())
        return causal_prm(input_ids, attention_mask, turn_ids)

    def poisoned(input_ids, attention_mask, turn_ids):
        scores = causal_prm(input_ids, attention_mask, turn_ids)
        return jnp.where(input_ids[:, :1] == int(tokens[5, 0]), jnp.nan, scores)

    async def async_path(model, **kwargs):
        return await score_arrays(PRMRunner(scorers=(model,)), tokens, turn_ids, attention_mask=attention, **kwargs)

    import anyio

    want = anyio.run(async_path, ModelScorer(fn=causal_prm, max_batch_size=3))
    want_masked = anyio.run(functools.partial(async_path, ModelScorer(fn=poisoned, max_batch_size=3),
                                              on_error="mask", per_turn=True))
    with BlockingRunner(scorers=(ModelScorer(fn=jax.jit(watched), max_batch_size=3),)) as runner:
        seen = []
        got = runner.score_arrays(tokens, turn_ids, attention_mask=attention, progress=lambda *a: seen.append(a))
        np.testing.assert_array_equal(got, want)
        assert set(callers) == {threading.get_ident()} and seen[-1] == (8, 8)
        # (a ctx, what tunix's learners pass, is for scorers of interactions and unread by model rows: the row
        # path here too; an unknown option goes through the runner's loop, whose score_arrays names it)
        from prm_jax.runtime import _blocking

        threads, original = [], _blocking.score_rows_now
        monkeypatch.setattr(_blocking, "score_rows_now", lambda *a: threads.append(threading.get_ident()) or original(*a))
        np.testing.assert_array_equal(runner.score_arrays(tokens, turn_ids, attention_mask=attention, ctx={"k": 1}),
                                      want)
        assert threads == [threading.get_ident()]
        with pytest.raises(TypeError, match="colour"):
            runner.score_arrays(tokens, turn_ids, colour="red")
        assert len(threads) == 1
        monkeypatch.undo()
    with BlockingRunner(scorers=(ModelScorer(fn=poisoned, max_batch_size=3),)) as runner:
        out = runner.score_arrays(tokens, turn_ids, attention_mask=attention, on_error="mask", per_turn=True)
        np.testing.assert_array_equal(out.token_rewards, want_masked.token_rewards)
        np.testing.assert_array_equal(out.turn_scores, want_masked.turn_scores)
        assert out.errors == want_masked.errors and out.failed.tolist() == [False] * 5 + [True] + [False] * 2
        assert runner.scorer_stats()["model"]["failures"] == 1
        with pytest.raises(ValueError, match="on row 5: the model returned non-finite scores"):
            runner.score_arrays(tokens, turn_ids, attention_mask=attention)
        with pytest.raises(ValueError, match="on_error must be 'raise' or 'mask'"):
            runner.score_arrays(tokens, turn_ids, on_error="skip")
        with pytest.raises(ValueError, match="metadata has 1 entries for 8 rows"):
            runner.score_arrays(tokens, turn_ids, metadata=[{}])
        with pytest.raises(ValueError, match="turn_ids of row 0 must number its turns"):
            runner.score_arrays(tokens, np.where(turn_ids == 0, 1, turn_ids))
    with pytest.raises(Exception, match="closed"):
        runner.score_arrays(tokens, turn_ids, attention_mask=attention)


# (the checks made as the rows are copied, the default with one scorer where the library is; the native survey
# first; numpy's passes)
@pytest.mark.parametrize("checks", ["fused", "survey", "numpy"])
@pytest.mark.parametrize("layout", ["one_bucket", "mixed"])
async def test_the_row_path_reads_turns_only_under_attention_in_either_chunk_order(layout, checks, monkeypatch):
    # Issue 56.6 (the host path without a masked copy of the turn ids): rows all in one width bucket are chunked
    # in their own order (consecutive rows copied as a slice), rows of mixed widths sorted by length; turn ids
    # that run past a row's attention are written -1 in the model's chunk (the model never sees a turn there),
    # and a row with attention but no turn, and an all-padding row, are not scored. Every layout equals the
    # per-turn loop on the turns cut at the attention, with a mask given as int64, int32 or bool.
    if checks != "fused":
        monkeypatch.setattr(arrays_module, "host_rows", lambda *args: None)
    if checks == "numpy":
        monkeypatch.setattr(arrays_module, "survey_rows", lambda *args: None)
    tokens, turn_ids, attention = trainer_rows(9, seed=3)  # lengths 9..40: one bucket of 64, several of 8
    bucket = 8 if layout == "mixed" else 64
    past = attention.sum(axis=1) < tokens.shape[1]
    cut = turn_ids.copy()
    for b in np.flatnonzero(past):  # the last turn runs on past the attention into the padding
        end = int(attention[b].sum())
        turn_ids[b, end:end + 3] = turn_ids[b, :end].max()
        cut[b, end:] = -1
    turn_ids[4], cut[4] = -1, -1  # attention, no turn
    tokens[7], attention[7], turn_ids[7], cut[7] = 0, 0, -1, -1  # padding
    seen = []

    def spy(input_ids, attention_mask, turn_ids):
        seen.append((np.asarray(attention_mask), np.asarray(turn_ids)))
        return causal_prm(input_ids, attention_mask, turn_ids)

    want = await score_arrays(PRMRunner(scorers=(PerTurnModel(weight=0.5),)), tokens, cut, attention_mask=attention)
    for mask in (attention, attention.astype(np.int32), attention.astype(bool)):
        seen.clear()
        model = ModelScorer(fn=spy, max_batch_size=4, bucket=bucket, weight=0.5, jit=False)
        got = await score_arrays(PRMRunner(scorers=(model,)), tokens, turn_ids, attention_mask=mask)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        assert (got[turn_ids < 0] == 0).all() and (got[cut >= 0] > 0).all() and (got[4] == 0).all()
        assert model.forwards == 2  # rows 4 and 7 are not sent: 7 rows, 4 per call
        assert all(((ids < 0) | (m != 0)).all() for m, ids in seen)  # never a turn without attention
    assert (len({ids.shape[1] for _, ids in seen}) > 1) == (layout == "mixed")


def test_the_batch_turn_counts_under_a_mask_are_turn_spans_counts():
    # Issue 56.6: turn_counts reads the turn ids where a caller's mask allows (valid), with no masked copy of
    # them; on random rows and masks its counts are turn_spans' on the masked ids, and it refuses the rows
    # turn_spans refuses, naming the first.
    from prm_jax.runtime._trajectory import turn_counts, turn_spans

    rng = np.random.default_rng(566)
    for _ in range(500):
        shape = (int(rng.integers(1, 5)), int(rng.integers(1, 8)))
        ids = rng.choice([-1, 0, 1, 2], size=shape, p=[0.3, 0.4, 0.2, 0.1])
        mask = rng.random(shape) < 0.8
        masked = np.where(mask, ids, -1)
        try:
            want = [len(turn_spans(row, b)) for b, row in enumerate(masked)]
        except ValueError as err:
            with pytest.raises(ValueError, match=re.escape(str(err))):
                turn_counts(ids, (ids >= 0) & mask)
        else:
            assert turn_counts(ids, (ids >= 0) & mask).tolist() == want, (ids, mask)
