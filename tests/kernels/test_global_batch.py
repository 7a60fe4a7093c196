"""Issue 44.4: loss normalization over the global batch (verl's ``dp_size``, ``batch_num_tokens``,
``global_batch_size``; verl's agg_loss with global batch info (verl-project/verl @ 1dda039b, core_algos.py agg_loss); prm-jax's
rules where verl's break (the credit-assignment guide states each)). A mini-batch split into micro-batches on data-parallel
ranks,
each piece's loss computed with the mini-batch's counts, summed over micro-batches and averaged over ranks,
is the mini-batch's loss, in every ``loss_agg_mode`` of every policy loss, with the same gradient.
``kl_cov`` and ``clip_cov`` are left out: they pick their tokens from the statistics of the batch they see,
so a split picks others (as in verl)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prm_jax import losses

# (loss, its aggregation modes): AReaL's PPO loss, and each of verl's losses that aggregate by loss_agg_mode.
LOSSES = [("ppo_clip", losses.LOSS_AGG_MODES)] + [
    (mode, losses.VERL_AGG_MODES) for mode in losses.POLICY_LOSS_MODES
    if "loss_agg_mode" in losses.policy_loss_options(mode) and mode not in ("kl_cov", "clip_cov")]
CASES = [(name, agg) for name, modes in LOSSES for agg in modes]
# Two ranks, each two micro-batches of uneven sizes (rows of an 8-row mini-batch).
SPLIT = [[[0, 1, 2], [3]], [[4, 5], [6, 7]]]


def loss_of(name, arrays, **keywords):
    logprobs, proximal, advantages, mask = arrays
    if name == "ppo_clip":
        return losses.ppo_clip_loss(logprobs, proximal, advantages, mask, **keywords)[0]
    return losses.policy_loss(logprobs, proximal, advantages, mask, mode=name, **OPTIONS.get(name, {}), **keywords)[0]


OPTIONS = {"dro": {"dro_beta": 1e-3}}  # (the options a loss requires)


def batch(seed, empty_rows=()):
    rng = np.random.default_rng(seed)
    logprobs = (-rng.exponential(0.7, (8, 12))).astype(np.float32)
    proximal = (logprobs + rng.normal(0, 0.15, logprobs.shape)).astype(np.float32)
    advantages = rng.normal(size=logprobs.shape).astype(np.float32)
    mask = rng.random(logprobs.shape) < 0.7
    mask[:, 0] = True  # no empty row unless asked for
    for row in empty_rows:
        mask[row] = False
    return logprobs, proximal, advantages, mask


def split_loss(name, agg, arrays, info):
    """The optimizer's objective: each rank's micro-batch losses summed, averaged over the ranks."""
    logprobs, proximal, advantages, mask = arrays
    total = 0.0
    for rank in SPLIT:
        for rows in rank:
            index = np.asarray(rows)
            piece = (logprobs[index], proximal[index], advantages[index], mask[index])
            total = total + loss_of(name, piece, loss_agg_mode=agg, **info)
    return total / len(SPLIT)


@pytest.mark.parametrize("name,agg", CASES)
def test_the_pieces_of_a_split_batch_sum_to_the_whole_batchs_loss_and_gradient(name, agg):
    arrays = batch(hash((name, agg)) % 1000)
    info = losses.global_batch_info(arrays[3], dp_size=len(SPLIT))
    whole = loss_of(name, arrays, loss_agg_mode=agg)
    np.testing.assert_allclose(float(split_loss(name, agg, arrays, info)), float(whole), rtol=2e-5, atol=1e-6)

    def whole_of(logprobs):
        return loss_of(name, (logprobs, *arrays[1:]), loss_agg_mode=agg)

    def split_of(logprobs):
        return split_loss(name, agg, (logprobs, *arrays[1:]), info)

    logprobs = jnp.asarray(arrays[0])
    np.testing.assert_allclose(np.asarray(jax.grad(split_of)(logprobs)), np.asarray(jax.grad(whole_of)(logprobs)),
                               rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("agg", ["seq-mean-token-sum", "seq-mean-token-mean", "token-mean"])
def test_with_empty_rows_the_sequence_modes_divide_by_every_row_of_the_mini_batch(agg):
    # verl's agg_loss with global batch info (verl-project/verl @ 1dda039b, core_algos.py agg_loss): G counts the empty rows
    # (verl's trainer: ppo_mini_batch_size x rollout.n); the local
    # fallback counts the non-empty ones, so the two differ on such a batch. A float64 loop of J.
    logprobs, proximal, advantages, mask = batch(7, empty_rows=(1, 6))
    info = losses.global_batch_info(mask, dp_size=2)
    got = float(split_loss("vanilla", agg, (logprobs, proximal, advantages, mask), info))
    per_token = np.zeros(mask.shape)
    for b in range(8):  # verl's vanilla loss per token: -A * clip(ratio) (no dual clip binds here), as float64
        for t in range(12):
            if mask[b, t]:
                ratio = math.exp(float(logprobs[b, t]) - float(proximal[b, t]))
                a = float(advantages[b, t])
                pg = max(-a * ratio, -a * min(max(ratio, 0.8), 1.2))
                per_token[b, t] = min(pg, -a * 3.0) if a < 0 else pg
    sums = [math.fsum(per_token[b]) for b in range(8)]
    counts = mask.sum(axis=1)
    if agg == "token-mean":
        want = math.fsum(sums) / mask.sum()
    elif agg == "seq-mean-token-sum":
        want = math.fsum(s for s, n in zip(sums, counts) if n) / 8
    else:
        want = math.fsum(s / n for s, n in zip(sums, counts) if n) / 8
    assert got == pytest.approx(want, rel=2e-5, abs=1e-6)
    local = float(losses.vanilla_ppo_loss(logprobs, proximal, advantages, mask, loss_agg_mode=agg)[0])
    assert (local == pytest.approx(want, rel=1e-5)) == (agg == "token-mean")


def test_a_data_parallel_loss_without_the_mini_batchs_count_is_refused_naming_it():
    logprobs, proximal, advantages, mask = batch(3)
    with pytest.raises(ValueError, match="batch_num_tokens"):
        losses.ppo_clip_loss(logprobs, proximal, advantages, mask, dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        losses.gspo_loss(logprobs, proximal, advantages, mask, loss_agg_mode="seq-mean-token-mean", dp_size=2)
    with pytest.raises(ValueError, match="dp_size"):
        losses.cispo_loss(logprobs, proximal, advantages, mask, dp_size=0)
    with pytest.raises(ValueError, match="batch_num_tokens must be a count"):
        losses.dro_loss(logprobs, proximal, advantages, mask, dro_beta=1e-3, batch_num_tokens=-1)


def test_the_counts_may_be_traced_as_a_train_step_all_reduces_them():
    logprobs, proximal, advantages, mask = batch(4)
    step = jax.jit(lambda n, g: losses.cispo_loss(logprobs, proximal, advantages, mask, dp_size=2,
                                                  batch_num_tokens=n, global_batch_size=g)[0])
    tokens = 2 * int(np.count_nonzero(mask))  # (this piece and another as large: a count it can be part of)
    eager = losses.cispo_loss(logprobs, proximal, advantages, mask, dp_size=2, batch_num_tokens=tokens,
                              global_batch_size=16)[0]
    assert float(step(jnp.int32(tokens), jnp.int32(16))) == pytest.approx(float(eager), rel=1e-6)


def test_credit2s_pair_under_seq_mean_token_sum_global_against_local():
    # verl's agg_loss with global batch info (verl-project/verl @ 1dda039b, core_algos.py agg_loss): on a batch with an empty
    # row, seq-mean-token-sum is 0.1264 with the global batch size (every
    # row of the mini-batch, the empty one too: G = 4) and 0.1685 with the local fallback (the 3 non-empty
    # rows). On-policy (ratio 1) vanilla's per-token loss is -A; the rows' sums add up to 0.5056.
    advantages = np.array([[-0.2, -0.1, 0.0], [-0.1056, 0.0, 0.0], [-0.1, 0.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0]], bool)
    logprobs = np.full(mask.shape, -1.0, np.float32)
    info = losses.global_batch_info(mask)
    assert info["global_batch_size"] == 4
    both = (logprobs, logprobs, advantages, mask)
    global_ = float(losses.vanilla_ppo_loss(*both, loss_agg_mode="seq-mean-token-sum", **info)[0])
    local = float(losses.vanilla_ppo_loss(*both, loss_agg_mode="seq-mean-token-sum")[0])
    assert round(global_, 4) == 0.1264 and round(local, 4) == 0.1685


# Issue 55.5: the counts are used as given no more. Before: batch_num_tokens=inf gave a loss of -0.0 (no
# gradient), True counted as 1, a count below the piece's own trained tokens (or global_batch_size below its
# rows) tripled the loss, and a traced NaN count gave a NaN loss with no check.
@pytest.mark.parametrize("value", [float("inf"), float("nan"), True, np.True_, 40.0, np.float32(40), [40]],
                         ids=["inf", "nan", "True", "np.True_", "40.0", "float32", "list"])
@pytest.mark.parametrize("name", ["ppo_clip", "cispo"])
def test_a_count_that_is_not_an_integer_is_refused_naming_it(value, name):
    with pytest.raises(TypeError, match="batch_num_tokens must be an integer count"):
        loss_of(name, batch(5), batch_num_tokens=value)
    with pytest.raises(TypeError, match="global_batch_size must be an integer count"):
        loss_of(name, batch(5), global_batch_size=value, loss_agg_mode="seq-mean-token-mean")
    with pytest.raises(TypeError, match="batch_num_tokens must be an integer count"):
        losses.supervised_distillation_loss(batch(5)[0], batch(5)[1], batch(5)[3], batch_num_tokens=value)


@pytest.mark.parametrize("name", ["ppo_clip", "cispo", "distillation"])
def test_a_count_below_what_the_piece_holds_is_refused_eagerly_and_counted_under_jit(name):
    logprobs, proximal, advantages, mask = batch(6)
    held = int(np.count_nonzero(mask))

    def run(**keywords):
        if name == "distillation":
            return losses.supervised_distillation_loss(logprobs, proximal, mask, **keywords)
        return loss_of(name, (logprobs, proximal, advantages, mask), **keywords)

    with pytest.raises(ValueError, match=rf"batch_num_tokens \(of the whole mini-batch\) must be at least the piece's "
                                         rf"own trained tokens, {held}; got {held // 3}"):
        run(batch_num_tokens=held // 3)
    with pytest.raises(ValueError, match=r"global_batch_size .* must be at least the piece's own rows, 8; got 2"):
        run(global_batch_size=2, loss_agg_mode="seq-mean-token-mean")
    # The piece's own counts, and a mini-batch's larger ones, are taken (a float64 loop's sum / N).
    assert float(run(batch_num_tokens=held)) == pytest.approx(float(run()), rel=1e-6)
    assert float(run(batch_num_tokens=2 * held)) == pytest.approx(float(run()) / 2, rel=1e-5, abs=1e-7)
    if name != "distillation":  # (its statistics carry no counts: a host callback raises under jit)
        stats = jax.jit(lambda n: losses.ppo_clip_loss(logprobs, proximal, advantages, mask, batch_num_tokens=n)[1]
                        if name == "ppo_clip" else losses.cispo_loss(logprobs, proximal, advantages, mask,
                                                                     batch_num_tokens=n)[1])
        assert int(stats(jnp.int32(held // 3)).checks["checks/batch_num_tokens_below_piece"]) == 1
        assert int(stats(jnp.int32(held)).checks["checks/batch_num_tokens_below_piece"]) == 0
    with pytest.raises(TypeError, match="batch_num_tokens must be an integer count"):  # a traced float: NaN possible
        jax.jit(lambda n: run(batch_num_tokens=n))(jnp.float32(np.nan))
