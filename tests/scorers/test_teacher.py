"""Issue 44.3 (its teachers): on-policy distillation's teacher as a scorer, served (``TeacherLogprobScorer``:
vLLM's /v1/completions with ``prompt_logprobs``, SGLang's /generate with ``return_logprob``, against stub
servers on 127.0.0.1 that follow the published schemas: tests/stub_servers.py) or a JAX model on the
trainer's device (``TeacherModelScorer``). Each output token's reward is ``log pi_T(y_t) - log pi_S(y_t)``
(on-policy distillation as verl computes it (verl-project/verl @ 1dda039b, verl/trainer/distillation/losses.py) and AReaL's MOPD
(areal/trainer/mopd/loss.py): the k1 reward), checked against a float64 loop; several teachers with weights give AReaL's
raw-weights sum; one request per batch of branches."""

import math
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from prm_jax import Interaction, PRMRunner, score_arrays
from prm_jax.errors import ServiceError
from prm_jax.scorers import TeacherLogprobScorer, TeacherModelScorer, token_logprobs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stub_servers import PromptLogprobServer, teacher_logprob

pytestmark = pytest.mark.anyio


def branches(n, turns=3, prefix="d"):
    """``n`` branches of ``turns`` turns each (a tool's output between turns), with the student's log-probs."""
    out = []
    for i in range(n):
        tokens, chain = [1, 2 + i], []
        for k in range(turns):
            output = [10 + i, 20 + k, (i + k) % 7 + 30, 40 + i % 3][: 2 + (i + k) % 3]
            student = [-0.1 * (j + 1) - 0.05 * k for j in range(len(output))]
            chain.append(Interaction(f"{prefix}{i}t{k}", list(tokens), output, output_logprobs=student,
                                     parent_id=chain[-1].interaction_id if chain else None))
            tokens = tokens + output + [3, 4 + k]
        out.append(chain)
    return out


def loop_rewards(chain, logprob=teacher_logprob, weights=(1.0,), low=None, high=None):
    """Each turn's reward per output token in float64, one token at a time: sum_j w_j (log pi_Tj of the token
    given the leaf's tokens before it) - W log pi_S, clipped where a bound is set; then in float32 as the
    runner stores it (each scorer's weighted reward rounded, then summed)."""
    leaf = chain[-1]
    ids = list(leaf.input_tokens) + list(leaf.output_tokens)
    out = {}
    for turn in chain:
        start = len(turn.input_tokens)
        total = [0.0] * turn.output_len
        for w in weights:
            for j in range(turn.output_len):
                t = start + j
                r = logprob(ids[:t], ids[t]) - float(turn.output_logprobs[j])
                if low is not None:
                    r = max(r, low)
                if high is not None:
                    r = min(r, high)
                total[j] += float(np.float32(w * r))
        out[turn.interaction_id] = total
    return out


@pytest.mark.parametrize("server", ["vllm", "sglang"])
async def test_a_served_teacher_rewards_each_output_token_in_one_request_per_batch(server):
    chains = branches(12)
    with PromptLogprobServer(teacher_logprob) as stub:
        scorer = TeacherLogprobScorer(stub.url, "teacher", server=server, max_batch_size=6, max_wait=1.0)
        await PRMRunner(scorers=(scorer,)).run_many(chains, limit=None)
        await scorer.aclose()
    assert len(stub.requests) == 2  # 12 branches, 6 per request: each branch's context sent once
    key = "prompt" if server == "vllm" else "input_ids"
    assert [len(r[key]) for r in stub.requests] == [6, 6]
    assert stub.tokens_received == sum(len(c[-1].input_tokens) + c[-1].output_len for c in chains)
    for chain in chains:
        want = loop_rewards(chain)
        for turn in chain:
            np.testing.assert_allclose(turn.token_rewards, want[turn.interaction_id], rtol=1e-6, atol=1e-7)


async def test_several_teachers_with_weights_give_areals_raw_weights_sum_and_clip_at_valid_tokens():
    # on-policy distillation as verl computes it (verl-project/verl @ 1dda039b, verl/trainer/distillation/losses.py) and AReaL's
    # MOPD (areal/trainer/mopd/loss.py): S_T - W log pi_S with raw weights, W = 0.3 + 0.7 (two teachers: two scorers, one weight
    # each).
    chains = branches(4)
    other = ScaledTeacher(2.0)
    with PromptLogprobServer(teacher_logprob) as first, PromptLogprobServer(other) as second:
        a = TeacherLogprobScorer(first.url, "teacher", weight=0.3, max_wait=0.01)
        b = TeacherLogprobScorer(second.url, "teacher", server="sglang", weight=0.7, max_wait=0.01,
                                 reward_min=-1.5, reward_max=0.5)
        b.name = "teacher_two"
        await PRMRunner(scorers=(a, b)).run_many(chains, limit=None)
        await a.aclose()
        await b.aclose()
    for chain in chains:
        one, two = loop_rewards(chain, weights=(0.3,)), loop_rewards(chain, other, weights=(0.7,), low=-1.5, high=0.5)
        for turn in chain:
            want = np.float32(one[turn.interaction_id]) + np.float32(two[turn.interaction_id])
            np.testing.assert_allclose(turn.token_rewards, want, rtol=1e-6, atol=1e-7)


class ScaledTeacher:
    """A second teacher: the first's log-probs times ``scale`` (picklable)."""

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, prefix, token):
        return self.scale * teacher_logprob(prefix, token)


async def test_a_turn_without_the_students_logprobs_fails_naming_it():
    chain = [Interaction("bare", [1, 2], [5, 6])]
    with PromptLogprobServer(teacher_logprob) as stub:
        scorer = TeacherLogprobScorer(stub.url, "teacher", max_wait=0.01)
        with pytest.raises(ValueError, match="turn 'bare' has no output_logprobs"):
            await PRMRunner(scorers=(scorer,)).run(chain)
        await scorer.aclose()


@pytest.mark.parametrize("server", ["vllm", "sglang"])
async def test_a_first_turn_without_a_prompt_token_says_the_teacher_has_no_logprob_of_its_first_token(server):
    # Issue 55.11: it failed with "returned non-finite rewards" (the branch's first token has no context, so
    # its teacher log-prob is NaN); now the error says why and what to do, for the served and the JAX teacher.
    chain = [Interaction("noprompt", [], [5, 6], output_logprobs=[-0.5, -0.5])]
    message = (r"turn 'noprompt' has no prompt token, so its first generated token is the branch's first token "
               r"and the teacher has no log-prob of it .*give the turn's input_tokens at least one token")
    with PromptLogprobServer(teacher_logprob) as stub:
        scorer = TeacherLogprobScorer(stub.url, "teacher", server=server, max_wait=0.01)
        with pytest.raises(ValueError, match=message):
            await PRMRunner(scorers=(scorer,)).run(chain)
        await scorer.aclose()
    model = TeacherModelScorer(fn=lambda ids, mask, turns: jnp.zeros(ids.shape, jnp.float32))
    with pytest.raises(ValueError, match=message):
        await PRMRunner(scorers=(model,)).run(chain)


@pytest.mark.parametrize("answer, message", [
    ({"choices": [{"index": 0, "prompt_logprobs": [None, {"7": {"logprob": -1.0}}, None]}]},
     r"prompt_logprobs\[1\] has no entry for token 5"),
    ({"choices": [{"index": 0, "prompt_logprobs": [None, {"5": {"logprob": 0.5}}, {"6": {"logprob": -1.0}}]}]},
     r"prompt_logprobs\[1\] must be a log-probability"),
    ({"choices": [{"index": 0, "prompt_logprobs": None}]}, "one entry per prompt token"),
    ({"choices": []}, "answered 0 of 1 inputs"),
])
async def test_a_malformed_vllm_answer_fails_the_batch_naming_the_entry(answer, message):
    from stub_servers import ReplayServer

    with ReplayServer("/v1/completions", answer) as stub:
        scorer = TeacherLogprobScorer(stub.url, "teacher", max_wait=0.01, attempts=1)
        with pytest.raises(ServiceError, match=message):
            await PRMRunner(scorers=(scorer,)).run([Interaction("t", [1], [5, 6], output_logprobs=[-1.0, -1.0])])
        await scorer.aclose()


def test_bad_settings_are_refused_naming_them():
    with pytest.raises(ValueError, match="server"):
        TeacherLogprobScorer("http://127.0.0.1:1", "teacher", server="tgi")
    with pytest.raises(ValueError, match=r"reward_min \(1.0\) must not exceed reward_max \(0.0\)"):
        TeacherLogprobScorer("http://127.0.0.1:1", "teacher", reward_min=1.0, reward_max=0.0)
    with pytest.raises(ValueError, match=r"\['spread'\] are not settings of a teacher"):
        TeacherModelScorer(lambda i, m, t: i, spread="turn")


# --- a JAX teacher on the trainer's device ------------------------------------------------------------------

VOCAB = 64


def teacher_logits(input_ids):
    """A toy causal teacher: position t's logits depend on its token and position (no look-ahead)."""
    ids = jnp.asarray(input_ids)
    grid = jnp.arange(VOCAB, dtype=jnp.float32)[None, None, :]
    t = jnp.arange(ids.shape[1], dtype=jnp.float32)[None, :, None]
    return jnp.sin(0.3 * grid * (ids[..., None].astype(jnp.float32) + 1.0) + 0.1 * t)


def teacher_fn(input_ids, attention_mask, turn_ids):
    return token_logprobs(teacher_logits(input_ids), input_ids)


def model_logprob(prefix, token):
    """The toy teacher's log-prob of ``token`` after ``prefix``, in float64, one vocabulary entry at a time."""
    t = len(prefix) - 1
    z = [math.sin(0.3 * v * (prefix[-1] + 1.0) + 0.1 * t) for v in range(VOCAB)]
    top = max(z)
    return z[token] - top - math.log(math.fsum(math.exp(x - top) for x in z))


def test_token_logprobs_are_each_tokens_logprob_given_the_ones_before():
    ids = np.array([[1, 5, 9, 2, 60], [3, 3, 0, 0, 0]], np.int32)
    got = np.asarray(token_logprobs(teacher_logits(ids), ids))
    assert (got[:, 0] == 0).all()
    want = [[model_logprob(list(row[:t]), int(row[t])) for t in range(1, 5)] for row in ids]
    np.testing.assert_allclose(got[:, 1:], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="logits"):
        token_logprobs(np.zeros((2, 5)), ids)


async def test_a_jax_teacher_scores_branches_and_arrays_like_the_served_one():
    chains = branches(5)
    scorer = TeacherModelScorer(teacher_fn, max_batch_size=4, bucket=16, max_wait=0.01)
    await PRMRunner(scorers=(scorer,)).run_many(chains, limit=None)
    for chain in chains:
        want = loop_rewards(chain, model_logprob)
        for turn in chain:
            np.testing.assert_allclose(turn.token_rewards, want[turn.interaction_id], rtol=2e-5, atol=2e-5)
    # score_arrays goes through interactions (their output_logprobs from its logprobs): the rows path has none.
    ids = np.array([[1, 7, 8, 9, 3, 11, 12, 0]], np.int32)
    turn_ids = np.array([[-1, 0, 0, 0, -1, 1, 1, -1]], np.int32)
    student = np.where(turn_ids >= 0, -0.25, 0.0).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1, 1, 1, 0]], np.int32)
    rewards = await score_arrays(PRMRunner(scorers=(TeacherModelScorer(teacher_fn, bucket=16, max_wait=0.01),)),
                                 ids, turn_ids, attention_mask=mask, logprobs=student)
    want = [model_logprob(list(ids[0, :t]), int(ids[0, t])) + 0.25 if turn_ids[0, t] >= 0 else 0.0 for t in range(8)]
    np.testing.assert_allclose(np.asarray(rewards)[0], want, rtol=2e-5, atol=2e-5)
