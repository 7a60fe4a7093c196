"""Issue 42.3: ``MathVerifyScorer`` on HuggingFace's math-verify: 50 answer pairs with known verdicts
(fractions, boxed LaTeX, intervals, units, sets, matrices, wrong answers), the reference from
``ctx["metadata"]``, ``scope``, configurable values, and a pathological expression that times out on the
process executor without hanging the run."""

import time

import pytest

pytest.importorskip("math_verify")

from prm_jax import Interaction, InteractionCache, PRMRunner
from prm_jax.scorers import MathVerifyScorer
from prm_jax.scorers._math_verifier import gold_text
from prm_jax.scorers._openai_judge import NoTextError

pytestmark = pytest.mark.anyio

# (reference answer, reply, verdict). The verdicts are the mathematics' (equal or not), on the replies a
# policy writes: boxed answers, LaTeX after an anchor ("the final answer is"), plain numbers.
PAIRS = [
    ("42", r"The answer is \boxed{42}.", 1), ("42", "So we get $42$.", 1), ("42", "The answer is 42", 1),
    ("42", r"\boxed{41}", 0), (r"\frac{1}{2}", r"\boxed{0.5}", 1), ("1/2", r"The final answer is $\frac{1}{2}$", 1),
    ("0.5", r"\boxed{\frac{2}{4}}", 1), (r"\frac{3}{4}", r"\boxed{\frac{4}{3}}", 0),
    (r"\boxed{7}", r"Final answer: \boxed{7}", 1), ("[1, 3)", r"\boxed{[1,3)}", 1), ("[1, 3)", r"\boxed{[1,3]}", 0),
    (r"(0, \infty)", r"\boxed{(0,\infty)}", 1), ("x^2+2x+1", r"\boxed{(x+1)^2}", 1),
    (r"\sqrt{2}", r"\boxed{\frac{2}{\sqrt{2}}}", 1), (r"\pi", r"\boxed{3.14}", 0), (r"10\%", r"\boxed{10\%}", 1),
    (r"5 \text{ cm}", r"\boxed{5}", 1), ("5", r"\boxed{5\text{ meters}}", 1), ("-3", r"\boxed{-3}", 1),
    ("-3", r"\boxed{3}", 0), ("2, 3", r"\boxed{3, 2}", 1), (r"\{1,2\}", r"\boxed{\{2,1\}}", 1),
    ("1000", r"\boxed{1,000}", 1), ("1000", r"\boxed{1000.0}", 1), ("3", "no answer here", 0),
    ("x=2", r"\boxed{2}", 1), ("2", r"\boxed{x=2}", 1), (r"\frac{\sqrt{3}}{2}", r"\boxed{\sin(\pi/3)}", 1),
    ("e", r"\boxed{2.718}", 0), ("12", r"I think it's 13. \boxed{12}", 1),
    ("12", r"\boxed{12} wait, no: \boxed{13}", 0),  # the last boxed answer is the final one
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}", 1),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\boxed{\begin{pmatrix} 2 \\ 1 \end{pmatrix}}", 0),
    ("1.5", r"\boxed{\frac{3}{2}}", 1), ("1.5", r"\boxed{1.50}", 1), ("0.333333", r"\boxed{\frac{1}{3}}", 1),
    (r"2\sqrt{3}", r"\boxed{\sqrt{12}}", 1), (r"2\sqrt{3}", r"\boxed{\sqrt{13}}", 0), (r"90^\circ", r"\boxed{90}", 1),
    (r"\$5", r"\boxed{5}", 1),  # an escaped dollar is a currency sign, not a delimiter: the gold is wrapped
    ("(1, 2)", r"\boxed{(1,2)}", 1), ("(1, 2)", r"\boxed{(2,1)}", 0), (r"\infty", r"\boxed{\infty}", 1),
    ("a+b", r"\boxed{b+a}", 1), (r"\log_2 8", r"\boxed{3}", 1), ("0", r"\boxed{0}", 1), ("0", r"\boxed{}", 0),
    ("100", "The final answer is $100$", 1), ("7", "The final answer is $8$", 0),
    (r"x \le 3", r"\boxed{x \leq 3}", 1), (r"(-\infty, 2]", r"\boxed{(-\infty, 2]}", 1),
    ("[1, 3)", r"\boxed{(1,3)}", 0), ("x^2+2x+1", r"\boxed{(x-1)^2}", 0), (r"5 \text{ cm}", r"\boxed{6}", 0),
]


def test_the_pairs_are_fifty_of_both_verdicts():
    assert len(PAIRS) >= 50 and {v for _, _, v in PAIRS} == {0, 1}
    assert sum(v == 0 for _, _, v in PAIRS) >= 15


@pytest.mark.parametrize("gold, reply, verdict", PAIRS, ids=[f"{i}" for i in range(len(PAIRS))])
def test_each_pair_gets_its_known_verdict(gold, reply, verdict):
    scorer = MathVerifyScorer(correct=1.0, wrong=0.0)
    turn = one_turn(reply)
    assert scorer.evaluate_trajectory([turn], {"metadata": {"answer": gold}}) == {turn.interaction_id: float(verdict)}


def test_a_gold_answer_without_delimiters_is_wrapped_as_open_r1_does():
    assert gold_text(r"\frac{1}{2}") == r"$\frac{1}{2}$" and gold_text("42") == "$42$"
    assert gold_text(r"$\frac{1}{2}$") == r"$\frac{1}{2}$" and gold_text(r"\boxed{3}") == r"\boxed{3}"
    assert gold_text(r"\(x\)") == r"\(x\)" and gold_text(r"\$5") == r"$\$5$"


def one_turn(reply, iid="t0", parent=None, tokens=(1, 2)):
    return Interaction(iid, list(tokens), [5], parent_id=parent,
                       output_messages=[{"role": "assistant", "content": reply}])


def branch(replies, prefix="b"):
    turns, tokens = [], [1, 2]
    for k, reply in enumerate(replies):
        turns.append(one_turn(reply, f"{prefix}t{k}", f"{prefix}t{k - 1}" if k else None, tokens))
        tokens = tokens + [5, 3]
    return InteractionCache(turns)


def test_scope_values_and_the_reference_are_read_as_configured():
    replies = [r"\boxed{1}", r"\boxed{2}", r"\boxed{3}"]
    turns = list(branch(replies))
    ctx = {"metadata": {"answer": "2", "ref": 3}}
    # last_turn: only the branch's final answer, on its last turn (3 != 2).
    assert MathVerifyScorer().evaluate_trajectory(turns, ctx) == {"bt2": 0.0}
    assert MathVerifyScorer(answer_key="ref").evaluate_trajectory(turns, ctx) == {"bt2": 1.0}
    every = MathVerifyScorer(scope="every_turn", correct=2.0, wrong=-1.0)
    assert every.evaluate_trajectory(turns, ctx) == {"bt0": -1.0, "bt1": 2.0, "bt2": -1.0}


@pytest.mark.parametrize("ctx, match", [
    ({"metadata": {}}, r"the session's metadata has no 'answer' .*it has \[\]"),
    ({}, "the session's metadata has no 'answer'"),
    ({"metadata": {"answer": [1]}}, r"metadata\['answer'\] must be a string or a number"),
    ({"metadata": {"answer": "\\boxed{"}}, r"could not parse the reference answer metadata\['answer'\]"),
])
def test_a_missing_or_unreadable_reference_fails_naming_it(ctx, match):
    with pytest.raises(ValueError, match=match):
        MathVerifyScorer().evaluate_trajectory([one_turn("1")], ctx)


def test_a_turn_without_text_fails_and_bad_settings_are_refused():
    with pytest.raises(NoTextError, match="has no output text to check"):
        MathVerifyScorer().evaluate_trajectory([Interaction("t0", [1], [2])], {"metadata": {"answer": "1"}})
    for kwargs, match in (({"scope": "all"}, "scope must be"), ({"answer_key": ""}, "answer_key must be"),
                          ({"correct": float("nan")}, "correct must be a finite number")):
        with pytest.raises(ValueError, match=match):
            MathVerifyScorer(**kwargs)
    assert MathVerifyScorer().executor == "process" and MathVerifyScorer().timeout == 10.0


async def test_a_pathological_expression_times_out_in_its_worker_and_the_run_goes_on():
    # 9^(9^9) has 369 million digits: math-verify's sympy would compute it for minutes. The executor's
    # deadline ends that worker; the other branches score; the run returns.
    scorer = MathVerifyScorer(timeout=3.0, max_workers=2)
    runner = PRMRunner(scorers=(scorer,))
    caches = [branch([r"\boxed{9^{9^{9}}}"], "slow"), branch([r"\boxed{2}"], "ok"), branch([r"\boxed{3}"], "no")]
    started = time.monotonic()
    try:
        results = await runner.run_many(caches, [{"metadata": {"answer": "2"}}] * 3, return_exceptions=True)
    finally:
        await runner.aclose()
    assert time.monotonic() - started < 60
    assert isinstance(results[0], TimeoutError)
    assert "'slowt0' took longer than its timeout of 3.0 s in its worker process" in str(results[0])
    assert [c.get(f"{p}t0").token_rewards.tolist() for c, p in zip(caches[1:], ("ok", "no"))] == [[1.0], [0.0]]
    assert scorer_stats_timeouts(runner) == 1


def scorer_stats_timeouts(runner):
    return runner.scorer_stats()["math_verify"]["timeouts"]
