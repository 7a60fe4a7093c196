"""Issue 42.1: steps inside a turn. A step-tag PRM (Qwen2.5-Math-PRM: the scorer inserts the tag after each
separator and at each turn's end; math-shepherd: the tag stands in the text) scores every step, and
``spread`` places each step's score (``step``, ``step_end``, ``turn``, ``tokens``); the same rule on
``ModelScorer``; and a served PRM's step scores into ``compute_advantages`` with PURE's min-form give
PURE's authors' code (CJReinforce/PURE, branch verl @ 83f9869c): its numbers."""

import sys
from pathlib import Path

import numpy as np
import pytest

from prm_jax import Interaction, PRMRunner, score_arrays
from prm_jax.runtime._steps import StepRule, step_turn_ids
from prm_jax.runtime._trajectory import stitch
from prm_jax.scorers import ModelScorer, PoolingPRMScorer
from prm_jax.scorers._pooling_prm import branch_tokens

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference
from stub_servers import PoolingServer

pytestmark = pytest.mark.anyio

TAG, SEP, NL = 99, 271, 198
SPREADS = ("step", "step_end", "turn", "tokens")


def last_word(prefix):
    """The stub PRM: a step's probability of being good is its last word's last digit / 10, the word being
    the last token before the tag that is neither a separator nor the tag."""
    word = next(t for t in reversed(prefix) if t not in (TAG, SEP, NL))
    return (word % 10) / 10


# --- the step rule, against worked splits --------------------------------------------------------------------

@pytest.mark.parametrize("output, separators, ends", [
    # 8 steps in one turn, the last one ended by the turn's end
    ([11, SEP, 12, SEP, 13, SEP, 14, SEP, 15, SEP, 16, SEP, 17, SEP, 18], [[SEP]],
     [2, 4, 6, 8, 10, 12, 14, 15]),
    ([11, SEP, SEP, 12], [[SEP]], [2, 3, 4]),                       # an empty step between two separators
    ([11, 12, SEP], [[SEP]], [3]),                                  # a separator at the very end: one end
    ([11, NL, NL, 12, NL, 13, SEP, 14], [[NL, NL], [SEP]], [3, 7, 8]),  # [198, 198]: a lone 198 is no separator
    ([11, NL, NL, NL, 12], [[NL, NL], [NL]], [3, 4, 5]),            # the longest first, no overlap
    ([11, 12], [[SEP]], [2]),                                       # no separator: the turn is one step
    ([11, 12], None, [2]),                                          # steps: turn
])
def test_a_turns_steps_end_after_each_separator_and_at_the_turns_end(output, separators, ends):
    assert StepRule.parse(separators).ends(output) == ends


def test_the_tag_in_the_text_ends_every_step_and_nothing_else_does():
    rule = StepRule.parse([[TAG]], TAG)
    assert rule.tag_in_text
    assert rule.ends([11, TAG, 12, 13, TAG]) == [2, 5]
    assert rule.ends([11, TAG, 12]) == [2]        # the tokens after the last tag belong to no step
    assert rule.ends([11, 12]) == []


@pytest.mark.parametrize("separators, match", [
    ([SEP], r"\[\[271\]\], not \[271\]"), ([[]], "non-empty"), ([], "list of separators"), ("\n\n", "list"),
    ([[-1]], ">= 0"), ([[True]], ">= 0"), ([[TAG], [SEP]], "cannot be combined"),
])
def test_a_bad_step_separator_is_refused_naming_it(separators, match):
    with pytest.raises(ValueError, match="step_separator") as err:
        StepRule.parse(separators, TAG)
    assert err.match(match)
    with pytest.raises(ValueError, match="step_separator"):
        PoolingPRMScorer("http://127.0.0.1:1", "prm", step_tag_id=TAG, step_separator=separators)


def test_configuration_refuses_what_cannot_meet():
    with pytest.raises(ValueError, match="spread must be one of"):
        PoolingPRMScorer("http://127.0.0.1:1", "prm", spread="steps")
    with pytest.raises(ValueError, match="good_index must be 0 or 1"):
        PoolingPRMScorer("http://127.0.0.1:1", "prm", step_score="good_minus_bad", good_index=2)
    with pytest.raises(ValueError, match="output 'turns' gives one score per turn"):
        ModelScorer(fn=lambda *a: a[0], output="turns", max_turns=2, spread="step")
    with pytest.raises(ValueError, match="output 'turns' gives one score per turn"):
        ModelScorer(fn=lambda *a: a[0], output="turns", max_turns=2, step_separator=[[SEP]])


# --- the served PRM against a direct computation ------------------------------------------------------------

def branch(outputs, prompt=(1, 2), tool=(3, 4), prefix="b"):
    """One branch of turns with these outputs, a tool answer between turns."""
    chain, tokens = [], list(prompt)
    for k, output in enumerate(outputs):
        chain.append(Interaction(f"{prefix}t{k}", list(tokens), list(output),
                                 parent_id=chain[-1].interaction_id if chain else None))
        tokens = tokens + list(output) + list(tool)
    return chain


def expected_rewards(output, ends, spread, tag_in_text=False):
    """The direct computation, a plain loop: step k spans [ends[k-1], ends[k]); its score is the stub's."""
    scores, start, word = [], 0, None
    for end in ends:
        words = [t for t in output[start:end] if t not in (TAG, SEP, NL)]
        word = words[-1] if words else word  # an empty step: the stub reads the word before it
        scores.append((word % 10) / 10)
        start = end
    out = np.zeros(len(output))
    last = scores[-1] if scores else 0.0
    start = 0
    for score, end in zip(scores, ends):
        for t in range(start, end):
            if spread == "step":
                out[t] = score
            elif spread == "step_end" and t == end - 1:
                out[t] = score
        start = end
    if spread == "turn":
        out[:] = last
    elif spread == "tokens":
        out[:] = last / len(output)
    return out


# Turn outputs and their hand-counted step ends (Qwen layout, separator [[271]]).
EIGHT_STEPS = ([21, SEP, 22, SEP, 23, SEP, 24, SEP, 25, SEP, 26, SEP, 27, SEP, 28], [2, 4, 6, 8, 10, 12, 14, 15])
ACROSS_TURNS = [([31, SEP, 32], [2, 3]), ([33, SEP, SEP, 34], [2, 3, 4]), ([35, 36, SEP], [3])]


@pytest.mark.parametrize("spread", SPREADS)
async def test_qwen_layout_scores_every_step_of_every_turn_in_one_request(spread):
    chains = [branch([EIGHT_STEPS[0]], prefix="one"), branch([o for o, _ in ACROSS_TURNS], prefix="three")]
    with PoolingServer(last_word, step_tag_id=TAG) as server:
        scorer = PoolingPRMScorer(server.url, "prm", step_tag_id=TAG, step_separator=[[SEP]], spread=spread,
                                  max_batch_size=2, max_wait=1.0)
        await PRMRunner(scorers=(scorer,)).run_many(chains, limit=None)
        await scorer.aclose()
    assert len(server.requests) == 1
    # The tag after each separator and at each turn's end, never twice in a row; the prompt and tools as is
    # (the batch goes sorted by length: the shorter branch first).
    three, one = server.requests[0]["input"]
    assert one == [1, 2, 21, SEP, TAG, 22, SEP, TAG, 23, SEP, TAG, 24, SEP, TAG, 25, SEP, TAG, 26, SEP, TAG,
                       27, SEP, TAG, 28, TAG]
    assert three == [1, 2, 31, SEP, TAG, 32, TAG, 3, 4, 33, SEP, TAG, SEP, TAG, 34, TAG, 3, 4, 35, 36, SEP, TAG]
    for chain, layout in zip(chains, [[EIGHT_STEPS], ACROSS_TURNS]):
        for turn, (output, ends) in zip(chain, layout):
            want = expected_rewards(output, ends, spread).astype(np.float32)
            np.testing.assert_allclose(turn.token_rewards, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("spread", SPREADS)
async def test_math_shepherd_layout_reads_the_tags_in_the_text_and_skips_the_prompts(spread):
    # The tag stands in the text: nothing is inserted; a tag in the prompt gets a row the scorer skips;
    # tokens after a turn's last tag belong to no step (0 under step and step_end).
    outputs = [([41, TAG, 42, 43, TAG], [2, 5]), ([44, TAG, 45], [2]), ([46, 47, TAG], [3])]
    chain = branch([o for o, _ in outputs], prompt=(1, TAG, 2))
    with PoolingServer(last_word, step_tag_id=TAG) as server:
        scorer = PoolingPRMScorer(server.url, "prm", step_tag_id=TAG, step_separator=[[TAG]], spread=spread,
                                  max_wait=0.01)
        await PRMRunner(scorers=(scorer,)).run(chain)
        await scorer.aclose()
    leaf = chain[-1]
    assert server.requests[0]["input"] == [np.concatenate([leaf.input_tokens, leaf.output_tokens]).tolist()]
    for turn, (output, ends) in zip(chain, outputs):
        want = expected_rewards(output, ends, spread, tag_in_text=True).astype(np.float32)
        np.testing.assert_allclose(turn.token_rewards, want, rtol=1e-6, atol=0)


def test_the_tagged_branch_maps_each_turns_steps_to_their_rows():
    chain = branch([[31, SEP, 32], [33]], prompt=(1, TAG))
    tagged = branch_tokens(chain, TAG, StepRule.parse([[SEP]], TAG))
    assert tagged.ids == [1, TAG, 31, SEP, TAG, 32, TAG, 3, 4, 33, TAG]
    assert tagged.tags == 4 and tagged.rows == [[1, 2], [3]] and tagged.ends == [[2, 3], [1]]
    with pytest.raises(ValueError, match="the output of turn 'bt0' holds step_tag_id 99 1 time"):
        branch_tokens(branch([[31, TAG]]), TAG, StepRule.parse([[SEP]], TAG))


async def test_good_minus_bad_is_pures_step_score():
    chain = branch([[21, SEP, 27]])
    with PoolingServer(last_word, step_tag_id=TAG) as server:
        scorer = PoolingPRMScorer(server.url, "prm", step_tag_id=TAG, step_separator=[[SEP]], spread="step_end",
                                  step_score="good_minus_bad", max_wait=0.01)
        await PRMRunner(scorers=(scorer,)).run(chain)
        await scorer.aclose()
    np.testing.assert_allclose(chain[0].token_rewards, [0, 2 * 0.1 - 1, 2 * 0.7 - 1], rtol=1e-6, atol=1e-7)


# --- ModelScorer: the model's token score at each step's last token -----------------------------------------

def token_model(input_ids, attention_mask, turn_ids):
    """A 'PRM' whose score on a token is the token id / 100 (the step's score: its last token's)."""
    return input_ids.astype(np.float32) / 100


@pytest.mark.parametrize("spread", SPREADS)
async def test_model_scorer_places_step_scores_on_both_paths(spread):
    outputs = [[21, SEP, 22, SEP, SEP, 23], [24, 25, SEP]]
    chain = branch(outputs)
    scorer = ModelScorer(fn=token_model, jit=False, spread=spread, step_separator=[[SEP]], bucket=8)
    await PRMRunner(scorers=(scorer,)).run(chain)
    ends = [[2, 4, 5, 6], [3]]
    for turn, output, turn_ends in zip(chain, outputs, ends):
        steps = [output[end - 1] / 100 for end in turn_ends]  # the model's score at each step's last token
        want = np.zeros(len(output))
        start = 0
        for score, end in zip(steps, turn_ends):
            if spread == "step":
                want[start:end] = score
            elif spread == "step_end":
                want[end - 1] = score
            start = end
        if spread in ("turn", "tokens"):
            want[:] = steps[-1] / (len(output) if spread == "tokens" else 1)
        np.testing.assert_allclose(turn.token_rewards, want.astype(np.float32), rtol=1e-6)
    # The array path: the same rows as arrays give the same rewards.
    exported = stitch(chain)
    rows = await score_arrays(PRMRunner(scorers=(ModelScorer(fn=token_model, jit=False, spread=spread,
                                                             step_separator=[[SEP]], bucket=8),)),
                              exported.input_ids[None], exported.turn_ids[None])
    np.testing.assert_allclose(rows[0], exported.token_rewards, rtol=1e-6)


async def test_model_scorer_without_a_spread_keeps_its_token_scores():
    chain = branch([[21, SEP, 22]])
    await PRMRunner(scorers=(ModelScorer(fn=token_model, jit=False, bucket=8),)).run(chain)
    np.testing.assert_allclose(chain[0].token_rewards, [0.21, 2.71, 0.22], rtol=1e-6)
    steps = ModelScorer(fn=token_model, jit=False, bucket=8, step_separator=[[SEP]])
    assert steps.spread == "step"  # a step rule without a spread: each step's tokens get its score


# --- end to end: a served PRM's step scores into PURE --------------------------------------------------------

def stacked(chains):
    """The exported rows, right-padded into a batch for ``compute_advantages``."""
    rows = [stitch(chain) for chain in chains]
    width = max(row.input_ids.shape[0] for row in rows) + 1
    batch = {key: np.zeros((len(rows), width), dtype) for key, dtype in (
        ("input_ids", np.int32), ("attention_mask", np.int32), ("loss_mask", np.int32),
        ("token_rewards", np.float32), ("logprobs", np.float32))}
    batch["turn_ids"] = np.full((len(rows), width), -1, np.int32)
    for b, row in enumerate(rows):
        n = row.input_ids.shape[0]
        batch["input_ids"][b, :n], batch["attention_mask"][b, :n] = row.input_ids, 1
        batch["loss_mask"][b, :n], batch["turn_ids"][b, :n] = row.loss_mask, row.turn_ids
        batch["token_rewards"][b, :n] = row.token_rewards
    batch["rewards"], batch["is_truncated"] = np.zeros(len(rows), np.float32), np.zeros(len(rows), bool)
    return batch


async def test_a_served_prms_step_scores_give_pures_worked_numbers():
    # PURE's authors' code (CJReinforce/PURE, branch verl @ 83f9869c): step scores -0.9, 0.5, 0.8 at tau = 0.1 give
    # returns-to-go -0.9, 4.5e-7, 3.3e-8. One
    # turn of three steps; PURE's step score p_good - p_bad: p = 0.05, 0.75, 0.9. The other row of the group
    # scores 0 everywhere (p = 0.5), so the RLOO baseline is 0 and the unwhitened advantages are the returns.
    from prm_jax import compute_advantages
    from prm_jax.config import AdvantageConfig

    probability = {51: 0.05, 52: 0.75, 53: 0.9, 55: 0.5}

    def prm(prefix):
        return probability[next(t for t in reversed(prefix) if t not in (TAG, SEP))]

    chains = [branch([[61, 51, SEP, 62, 52, SEP, 63, 53]], prefix="r0"), branch([[55, SEP, 55, 55]], prefix="r1")]
    with PoolingServer(prm, step_tag_id=TAG) as server:
        scorer = PoolingPRMScorer(server.url, "prm", step_tag_id=TAG, step_separator=[[SEP]], spread="step_end",
                                  step_score="good_minus_bad", max_batch_size=2, max_wait=1.0)
        await PRMRunner(scorers=(scorer,)).run_many(chains, limit=None)
        await scorer.aclose()
    batch = stacked(chains)
    batch["turn_ids"] = step_turn_ids(batch["input_ids"], batch["turn_ids"], [[SEP]])
    assert batch["turn_ids"][0, 2:10].tolist() == [0, 0, 0, 1, 1, 1, 2, 2]  # each step a turn of its own
    out = compute_advantages({k: v for k, v in batch.items() if k != "input_ids"}, AdvantageConfig(
        kl_ctl=0.0, credit_assignment={"mode": "pure", "temperature": 0.1, "whiten": False}))
    advantages = np.asarray(out.advantages, np.float64)
    # Timestep t predicts token t + 1: the steps' tokens 2-4, 5-7, 8-9 are timesteps 1-3, 4-6, 7-8.
    np.testing.assert_allclose(advantages[0, [1, 4, 7]], [-0.9, 4.5e-7, 3.3e-8], rtol=0.03)
    active = reference.shift(batch["loss_mask"] > 0, fill=False)
    ids = reference.shift(batch["turn_ids"], fill=-1)
    process = np.where(active, reference.shift(batch["token_rewards"]), 0.0)
    outcome_step = (batch["attention_mask"].sum(axis=1) - 2).tolist()
    _, want = reference.pure(process, batch["rewards"], active, ids, outcome_step, [0, 0], 0.1, 1.0, False)
    np.testing.assert_allclose(advantages, want, rtol=1e-5, atol=1e-7)


def test_step_turn_ids_numbers_every_step_and_refuses_bad_shapes():
    ids = np.array([[1, 21, SEP, 22, 3, 23, 0], [1, 41, TAG, 42, 0, 0, 0]])
    turns = np.array([[-1, 0, 0, 0, -1, 1, -1], [-1, 0, 0, 0, -1, -1, -1]])
    assert step_turn_ids(ids, turns, [[SEP]]).tolist() == [[-1, 0, 0, 1, -1, 2, -1], [-1, 0, 0, 0, -1, -1, -1]]
    # The tag in the text: the tail after the last tag is a turn of its own.
    assert step_turn_ids(ids[1:], turns[1:], [[TAG]], TAG).tolist() == [[-1, 0, 0, 1, -1, -1, -1]]
    with pytest.raises(ValueError, match=r"must be \[B, T\] of one shape"):
        step_turn_ids(ids[0], turns[0], [[SEP]])
