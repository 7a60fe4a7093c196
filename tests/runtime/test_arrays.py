"""Issue 14.1-14.2: scoring a trainer's arrays, concurrently, from async or synchronous code."""

import re

import chex
import jax
import numpy as np
import pytest
import scorers_for_tests as st

from prm_jax import BaseScorer, BlockingRunner, Interaction, InteractionCache, PRMRunner, pack_branches, score_arrays
from prm_jax.kernels import turn_ids_from_spans
from prm_jax.runtime import chains_from_arrays


class TokenSum(BaseScorer):
    """Scores a turn by its tokens, its prefix length and its row's context: every input is visible."""

    name = "token_sum"

    async def evaluate(self, interaction, ctx):
        return float(interaction.output_tokens.sum() + len(interaction.input_tokens) + ctx.get("bonus", 0))


pytestmark = pytest.mark.anyio


def spans_reference(spans, width):
    out = np.full((spans.shape[0], width), -1, np.int32)
    for b in range(spans.shape[0]):
        for k, (start, end) in enumerate(spans[b]):
            out[b, max(start, 0):max(end, 0)] = k if end > start else out[b, max(start, 0):max(end, 0)]
    return out


def test_turn_ids_from_spans_against_a_loop():
    spans = np.array([[[1, 3], [4, 7], [0, 0]], [[0, 2], [2, 3], [5, 8]], [[0, 0], [0, 0], [0, 0]]], np.int32)
    step = jax.jit(chex.assert_max_traces(lambda s: turn_ids_from_spans(s, 8), n=1))
    np.testing.assert_array_equal(step(spans), spans_reference(spans, 8))
    np.testing.assert_array_equal(turn_ids_from_spans(spans[:, :2], 8), spans_reference(spans[:, :2], 8))
    with pytest.raises(ValueError, match="spans must be"):
        turn_ids_from_spans(spans[..., :1], 8)


def trainer_arrays():
    """Three rows of width 10: two real (2 and 3 turns, prompt and tool tokens between), one padding."""
    input_ids = np.array([[5, 6, 11, 12, 7, 13, 14, 0, 0, 0],
                          [5, 21, 22, 7, 23, 7, 24, 25, 0, 0],
                          [0] * 10], np.int32)
    spans = np.array([[[2, 4], [5, 7], [0, 0]], [[1, 3], [4, 5], [6, 8]], [[0, 0]] * 3], np.int32)
    attention = (np.arange(10)[None] < np.array([[7], [8], [0]])).astype(np.int32)
    return input_ids, np.asarray(turn_ids_from_spans(spans, 10)), attention


async def test_score_arrays_equals_the_session_path():
    # Issue 14.1: arrays in, token rewards out, the same numbers as building sessions and packing them.
    input_ids, turn_ids, attention = trainer_arrays()
    ctx = [{"bonus": 1}, {"bonus": 2}, {"bonus": 99}]
    runner = PRMRunner(scorers=[TokenSum(weight=0.5)])
    got = await score_arrays(runner, input_ids, turn_ids, attention_mask=attention, rewards=[1.0, 0.0, 0.0], ctx=ctx)
    sequences = []
    for b in range(2):
        chain, prefix = [], []
        for k in range(int(turn_ids[b].max()) + 1):
            where = np.flatnonzero(turn_ids[b] == k)
            prefix = input_ids[b, :where[0]].tolist()
            chain.append(Interaction(f"r{b}t{k}", prefix, input_ids[b, where].tolist(),
                                     parent_id=chain[-1].interaction_id if chain else None, reward=1.0))
        cache = InteractionCache(chain)
        await runner.run(cache, ctx[b])
        sequences.append(cache.to_sequence(chain[-1].interaction_id))
    want = pack_branches(sequences, width=10)["token_rewards"]
    np.testing.assert_array_equal(got[:2], want)
    np.testing.assert_array_equal(got[2], 0.0)
    # Spot check one turn by hand: row 1, turn 2 = tokens 24 + 25, a 6-token prefix, bonus 2, weight 0.5.
    np.testing.assert_array_equal(got[1, 6:8], 0.5 * (24 + 25 + 6 + 2))


def test_chains_share_one_buffer_per_row_and_name_bad_turn_ids():
    input_ids, turn_ids, attention = trainer_arrays()
    chains = chains_from_arrays(input_ids, turn_ids, attention_mask=attention, rewards=[1.0, 0.5, 0.0])
    assert chains[2] is None
    first, last = chains[1][0], chains[1][-1]
    assert np.shares_memory(first.output_tokens, last.input_tokens)  # prefixes are views, not copies
    assert [t.reward for t in chains[1]] == [None, None, 0.5] and last.parent_id == chains[1][1].interaction_id
    broken = turn_ids.copy()
    broken[1, 4] = 0  # turn 0 again after turn 1 started
    with pytest.raises(ValueError, match="row 1"):
        chains_from_arrays(input_ids, broken, attention_mask=attention)
    gap = turn_ids.copy()
    gap[0, 5] = 0  # turn 0 at positions 2, 3 and 5, with the tool token 4 between
    with pytest.raises(ValueError, match="turn 0 of row 0 is not contiguous"):
        chains_from_arrays(input_ids, gap, attention_mask=attention)


async def test_run_many_bounds_concurrency_and_keeps_order():
    # Issue 14.2: branches scored concurrently (64 sessions with a 5 ms judge: 378 ms serially).
    def chain(b, bad=False):
        return [Interaction(f"b{b}", [1], [99 if bad else 2 + b], reward=0.0)]
    scorer = st.InFlight()
    runner = PRMRunner(scorers=[scorer])
    results = await runner.run_many([chain(b) for b in range(64)], limit=8)
    assert scorer.most == 8 and len(results) == 64
    assert [r[0].interaction_id for r in results] == [f"b{b}" for b in range(64)]
    scorer.most = 0
    await runner.run_many([chain(b) for b in range(64)], limit=None)
    assert scorer.most == 64
    # A failed branch commits nothing; the others commit all (return_exceptions keeps every slot).
    branches = [chain(0), chain(1, bad=True), chain(2)]
    out = await runner.run_many(branches, return_exceptions=True)
    assert isinstance(out[1], RuntimeError) and branches[1][0].token_rewards is None
    assert branches[0][0].token_rewards.tolist() == [1.0] and branches[2][0].token_rewards.tolist() == [1.0]
    with pytest.raises(ExceptionGroup):
        await runner.run_many([chain(3), chain(4, bad=True)])
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="limit"):
            await runner.run_many([chain(5)], limit=bad)
    with pytest.raises(ValueError, match="ctx has 1 entries for 2 branches"):
        await runner.run_many([chain(6), chain(7)], [{}])


def test_blocking_runner_from_a_synchronous_loop():
    # Issue 14.2: a synchronous training loop calls the runner without becoming async.
    input_ids, turn_ids, attention = trainer_arrays()
    config = {"enabled": True, "scorers": [{"path": "scorers_for_tests.ClosingScorer", "kwargs": {"label": "owned"}}]}
    with BlockingRunner(config, scorers=[TokenSum()]) as runner:
        got = runner.score_arrays(input_ids, turn_ids, attention_mask=attention)
        again = runner.score_arrays(input_ids, turn_ids, attention_mask=attention)
    np.testing.assert_array_equal(got, again)
    # ClosingScorer gives 1.0 per token; TokenSum adds its own score: row 0, turn 0 = 11 + 12 + 2 prefix.
    np.testing.assert_array_equal(got[0, 2:4], 1.0 + (11 + 12 + 2))
    assert st.EVENTS == ["close:owned"]
    with pytest.raises(RuntimeError, match="closed"):
        runner.score_arrays(input_ids, turn_ids)
    runner.close()  # idempotent


async def test_score_arrays_warns_once_when_gvpo_gets_no_negative_score(monkeypatch):
    # Issue 14.9: host side, for a jitted trainer (its compute_advantages never runs eagerly).
    import warnings

    from prm_jax.kernels import _shaping as shaping

    input_ids, turn_ids, attention = trainer_arrays()
    config = {"rollout": {"agent": {"prm": {"enabled": True, "advantage_shaping": {"mode": "gvpo"}}}}}
    monkeypatch.setattr(shaping, "_warned", set())
    judge = PRMRunner(config, scorers=[st.ConstantScorer(1.0)])
    with pytest.warns(UserWarning, match="gvpo changes nothing"):
        await score_arrays(judge, input_ids, turn_ids, attention_mask=attention)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await score_arrays(judge, input_ids, turn_ids, attention_mask=attention)  # once per process
        monkeypatch.setattr(shaping, "_warned", set())
        await score_arrays(PRMRunner(config, scorers=[st.ConstantScorer(-1.0)]), input_ids, turn_ids,
                           attention_mask=attention)
        await score_arrays(PRMRunner({"enabled": True, "scorers": []}, scorers=[st.ConstantScorer(1.0)]),
                           input_ids, turn_ids, attention_mask=attention)  # additive: no warning


class FailsOnRow(BaseScorer):
    """Scores like TokenSum, except on rows whose ctx asks it to fail."""

    name = "fails_on_row"

    async def evaluate(self, interaction, ctx):
        if ctx.get("fail"):
            raise RuntimeError(f"judge down for {interaction.interaction_id}")
        return float(np.sum(interaction.output_tokens))


async def test_on_error_mask_returns_the_failed_rows_instead_of_raising():
    # Issue 23.1: one failing scorer call no longer throws away the whole batch's process rewards.
    input_ids, turn_ids, attention = trainer_arrays()
    runner = PRMRunner(scorers=[FailsOnRow()])
    ctx = [{"fail": False}, {"fail": True}, {}]
    # Issue 30: on_error="raise" raises the scorer's own error, row and turn named (it was a bare group).
    with pytest.raises(RuntimeError, match=r"judge down for row1/t\d") as info:
        await score_arrays(runner, input_ids, turn_ids, attention_mask=attention, ctx=ctx)
    assert not isinstance(info.value, ExceptionGroup)
    notes = "\n".join(info.value.__notes__)
    assert "raised by scorer 'fails_on_row' on interaction 'row1/t" in notes
    assert "score_arrays: row 1 of input_ids failed" in notes
    out = await score_arrays(runner, input_ids, turn_ids, attention_mask=attention, ctx=ctx, on_error="mask")
    assert out.failed.tolist() == [False, True, False]
    assert list(out.errors) == [1] and out.errors[1].startswith("RuntimeError: judge down for")
    # The failed row's turns hold NaN (never a silent 0), its other positions 0; the others scored as usual.
    np.testing.assert_array_equal(np.isnan(out.token_rewards[1]), turn_ids[1] >= 0)
    alone = await score_arrays(runner, input_ids[:1], turn_ids[:1], attention_mask=attention[:1])
    np.testing.assert_array_equal(out.token_rewards[0], alone[0])
    np.testing.assert_array_equal(out.token_rewards[2], 0.0)
    with BlockingRunner(scorers=[FailsOnRow()]) as blocking:
        again = blocking.score_arrays(input_ids, turn_ids, attention_mask=attention, ctx=ctx, on_error="mask")
    assert again.failed.tolist() == [False, True, False]
    with pytest.raises(ValueError, match="on_error must be"):
        await score_arrays(runner, input_ids, turn_ids, on_error="skip")


class Halves(BaseScorer):
    name = "halves"

    async def evaluate(self, interaction, ctx):
        return 0.5


async def test_per_turn_scores_and_the_per_scorer_breakdown():
    # Issue 23.3: [B, K] per-turn scores (GiGPO's turn_rewards) and each scorer's weighted contribution.
    input_ids, turn_ids, attention = trainer_arrays()
    runner = PRMRunner(scorers=[FailsOnRow(weight=0.5), Halves(weight=2.0)])
    out = await score_arrays(runner, input_ids, turn_ids, attention_mask=attention, per_turn=True)
    sums = 0.5 * np.array([[11 + 12, 13 + 14, 0], [21 + 22, 23, 24 + 25], [0, 0, 0]], np.float32)
    halves = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
    np.testing.assert_allclose(out.per_scorer["fails_on_row"], sums)
    np.testing.assert_allclose(out.per_scorer["halves"], halves)
    np.testing.assert_allclose(out.turn_scores, sums + halves)
    assert out.failed.tolist() == [False, False, False] and out.errors == {}
    # Issue 23.6: each scorer's mean turn reward over the 5 turns that exist, for the trainer's log.
    assert out.turn_mask.tolist() == [[True, True, False], [True, True, True], [False, False, False]]
    means = out.scorer_means()
    np.testing.assert_allclose(means["process/fails_on_row/mean"], sums[out.turn_mask].mean(), rtol=1e-6)
    np.testing.assert_allclose(means["process/halves/mean"], 1.0, rtol=1e-6)
    # The token rewards are the same as without per_turn; a failed row's turn scores are NaN.
    plain = await score_arrays(runner, input_ids, turn_ids, attention_mask=attention)
    np.testing.assert_array_equal(out.token_rewards, plain)
    failing = await score_arrays(runner, input_ids, turn_ids, attention_mask=attention, per_turn=True,
                                 on_error="mask", ctx=[{}, {"fail": True}, {}])
    assert np.isnan(failing.turn_scores[1]).all() and np.isnan(failing.per_scorer["halves"][1]).all()
    assert not failing.turn_mask[1].any() and np.isfinite(list(failing.scorer_means().values())).all()
    np.testing.assert_allclose(failing.turn_scores[0], (sums + halves)[0])


async def test_tokens_without_attention_are_never_scored_nor_rewarded():
    # Issue 29.15: score_arrays scored pad tokens past attention_mask when turn ids covered them, and wrote
    # rewards there. A turn is cut at the attention's end; a turn wholly past it is no turn.
    runner = PRMRunner(scorers=(TokenSum(),))
    tokens = np.array([[1, 2, 3, 4, 0, 0], [1, 5, 6, 7, 8, 9]])
    turn_ids = np.array([[-1, 0, 0, 1, 1, 1], [-1, 0, 0, 1, 1, 1]])  # row 0's turn 1 runs into its padding
    attention = np.array([[1, 1, 1, 1, 0, 0], [1] * 6])
    got = await score_arrays(runner, tokens, turn_ids, attention_mask=attention)
    # row 0: turn 0 = tokens (2, 3) after 1 token; turn 1 = token 4 alone after 3 tokens
    np.testing.assert_array_equal(got[0], [0, 6.0, 6.0, 7.0, 0, 0])
    np.testing.assert_array_equal(got[1], [0, 12.0, 12.0, 27.0, 27.0, 27.0])
    scored = await score_arrays(runner, tokens, turn_ids, attention_mask=attention, per_turn=True)
    np.testing.assert_array_equal(scored.turn_scores, [[6.0, 7.0], [12.0, 27.0]])
    wholly_past = np.array([[-1, 0, 0, 0, 1, 1], [-1, 0, 0, 1, 1, 1]])  # row 0's turn 1 is all padding
    scored = await score_arrays(runner, tokens, wholly_past, attention_mask=attention, on_error="mask")
    np.testing.assert_array_equal(scored.token_rewards[0], [0, 10.0, 10.0, 10.0, 0, 0])


async def test_a_failed_rows_turn_scores_are_never_read_as_derive_by_gigpo():
    # Issue 29.10: score_arrays(per_turn=True, on_error="mask") marks a failed row with NaN, which GiGPO's
    # turn_rewards read as "derive it": a kept failed row trained on derived rewards. NaN is refused now;
    # a dropped row (its loss mask cleared) or turn_reward_mask False (derive) are the two ways on.
    from prm_jax import AdvantageConfig, compute_advantages
    input_ids, turn_ids, attention = trainer_arrays()
    runner = PRMRunner(scorers=[FailsOnRow()])
    out = await score_arrays(runner, input_ids, turn_ids, attention_mask=attention,
                             ctx=[{"fail": False}, {"fail": True}, {}], on_error="mask", per_turn=True)
    batch = dict(attention_mask=attention, loss_mask=turn_ids >= 0, logprobs=np.zeros(input_ids.shape, np.float32),
                 rewards=np.array([1.0, 0.0, 0.0], np.float32), turn_ids=turn_ids, is_truncated=np.zeros(3, bool),
                 turn_rewards=out.turn_scores)
    config = AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "gigpo"})
    with pytest.raises(ValueError, match=r"batch\['turn_rewards'\] must be finite where it is used; row 1, turn 0 "
                                         r"is nan \(NaN is no step reward"):
        compute_advantages(batch, config)
    dropped = dict(batch, loss_mask=(turn_ids >= 0) & ~out.failed[:, None])
    assert np.isfinite(np.asarray(compute_advantages(dropped, config).advantages)).all()


class ReadsItsRow(BaseScorer):
    name = "reads_its_row"

    async def evaluate(self, interaction, ctx):
        assert interaction.interaction_id.startswith(f"row{ctx['row']}/t")
        return float(ctx.get("values", [10.0, 20.0, 30.0])[ctx["row"]])


@pytest.mark.parametrize("ctx", [None, {"values": [1.0, 2.0, 3.0]},
                                 [{"values": [1.0, 2.0, 3.0]}, None, {"values": [1.0, 2.0, 3.0]}]])
async def test_score_arrays_tells_each_rows_scorers_their_row(ctx):
    # Issue 30: a scorer found its row in a per-row ctx only by parsing "row{b}/t{k}" from a docstring.
    tokens = np.array([[1, 2, 3, 4], [0, 0, 0, 0], [5, 6, 7, 8]])
    turn_ids = np.array([[-1, 0, 0, 1], [-1, -1, -1, -1], [-1, 0, -1, 1]])
    out = await score_arrays(PRMRunner(scorers=(ReadsItsRow(),)), tokens, turn_ids, ctx=ctx)
    values = [10.0, 20.0, 30.0] if ctx is None else [1.0, 2.0, 3.0]
    expected = np.where(turn_ids >= 0, np.array(values, np.float32)[:, None], np.float32(0))
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("ctx", [{"row": 1}, [None, {"row": 0}]])
async def test_score_arrays_refuses_a_ctx_that_sets_row_itself(ctx):
    tokens = np.array([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match=r"\['row'\] is set by score_arrays"):
        await score_arrays(PRMRunner(scorers=(ReadsItsRow(),)), tokens, np.array([[-1, 0], [-1, 0]]), ctx=ctx)


class ClientScorer(BaseScorer):
    """Holds a 'client' bound to the loop it was first used on; records where it was closed."""

    name = "client_scorer"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.loop_thread = self.closed_on = None

    async def evaluate(self, interaction, ctx):
        import threading

        self.loop_thread = threading.get_ident()
        return 1.0

    async def aclose(self):
        import threading

        self.closed_on = threading.get_ident()


def test_a_blocking_runner_closes_lent_scorers_on_its_loop_when_asked():
    # Issue 30: a judge instance passed to a runner was never closed (its client lives on the runner's loop).
    tokens, turn_ids = np.array([[1, 2, 3]]), np.array([[-1, 0, 0]])
    kept, handed = ClientScorer(), type("Handed", (ClientScorer,), {"name": "handed"})()
    with BlockingRunner(scorers=[kept]) as runner:
        runner.score_arrays(tokens, turn_ids)
        runner.close_scorer(kept)  # on the loop, at the caller's word
    assert kept.closed_on == kept.loop_thread is not None
    with BlockingRunner(scorers=[handed], own_scorers=True) as runner:
        runner.score_arrays(tokens, turn_ids)
        assert handed.closed_on is None
    assert handed.closed_on == handed.loop_thread is not None  # closed by close(), on the loop


async def test_progress_is_reported_as_rows_finish_and_the_runner_counts_runs():
    input_ids, turn_ids, attention = trainer_arrays()
    seen = []
    runner = PRMRunner(scorers=[FailsOnRow()])
    out = await score_arrays(runner, input_ids, turn_ids, attention_mask=attention, on_error="mask",
                             ctx=[{}, {"fail": True}, {}], progress=lambda done, total: seen.append((done, total)))
    assert out.failed.tolist() == [False, True, False]  # (the third row is padding: never scored)
    assert seen == [(1, 2), (2, 2)]
    assert (runner.branches_scored, runner.branches_failed) == (1, 1)


def test_the_batch_turn_rule_is_turn_spans_rule_row_for_row():
    # Issue 56.6 (the host path): score_arrays checked each row's turns in a Python loop (80% of its host time
    # with a model that costs nothing); turn_counts checks the whole batch at once, by the same rule: on
    # random rows it raises exactly where turn_spans raises, with turn_spans' message, and finds the same rows.
    from prm_jax.runtime._trajectory import turn_counts, turn_spans

    def rows_with_turns(ids):  # (the rows holding a turn, as score_arrays reads them)
        return turn_counts(ids) > 0

    rng = np.random.default_rng(56)
    for _ in range(2000):
        row = rng.choice([-1, 0, 1, 2], size=int(rng.integers(1, 9)), p=[0.4, 0.3, 0.2, 0.1])
        try:
            want = bool(turn_spans(row, 3))
        except ValueError as err:
            with pytest.raises(ValueError, match=re.escape(str(err).replace("row 3", "row 0"))):
                rows_with_turns(row[None])
        else:
            assert bool(rows_with_turns(row[None])[0]) == want, row
    # Whole batches: the first row turn_spans refuses is the one named (the rows before and after it in the
    # sequence of valid ids must not leak into each other: rows without turns between, a bad row last).
    for _ in range(500):
        rows = rng.choice([-1, 0, 1, 2], size=(int(rng.integers(1, 6)), int(rng.integers(1, 7))),
                          p=[0.4, 0.3, 0.2, 0.1])
        first_bad, want_rows = None, []
        for b, row in enumerate(rows):
            try:
                want_rows.append(bool(turn_spans(row, b)))
            except ValueError as err:
                first_bad = first_bad or str(err)
                want_rows.append(None)
        if first_bad:
            with pytest.raises(ValueError, match=re.escape(first_bad)):
                rows_with_turns(rows)
        else:
            assert rows_with_turns(rows).tolist() == want_rows, rows
    batch = np.array([[-1, 0, 0, -1, 1], [-1, -1, -1, -1, -1], [0, 1, 1, 2, -1]])
    assert rows_with_turns(batch).tolist() == [True, False, True]
    assert rows_with_turns(np.zeros((0, 4), np.int32)).tolist() == []
    assert rows_with_turns(np.zeros((2, 0), np.int32)).tolist() == [False, False]
    with pytest.raises(ValueError, match="turn_ids of row 1 must number its turns 0, 1, 2"):
        rows_with_turns(np.array([[0, 1, -1], [1, -1, -1]]))


@pytest.mark.parametrize("dtype,bad,shown", [
    (np.int64, 2**31, "2147483648"), (np.int64, -2**40, "-1099511627776"), (np.int32, -1, "-1"), (np.int8, -5, "-5"),
    (np.uint64, 2**63, "9223372036854775808"), (np.int16, 7, None), (np.uint8, 255, None)])
def test_the_token_id_rule_in_one_pass_refuses_each_dtypes_strays(dtype, bad, shown):
    # Issue 56.6: the token-id check reads a signed batch once, unsigned (a negative id is then above any token
    # id); the stray it names is still the lowest negative, else the highest.
    from prm_jax.runtime._trajectory import stray_token_id

    ids = np.array([[1, 2, 3], [4, 5, 6]], dtype)
    ids[1, 1] = bad
    assert stray_token_id(ids) == (None if shown is None else int(shown))
    if shown is not None:
        ids[0, 0] = bad if bad < 0 else 0  # (a second stray: the lowest negative is named when there is one)
        assert stray_token_id(ids) == (int(ids.min()) if ids.min() < 0 else int(shown))
