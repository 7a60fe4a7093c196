"""Issue 42.3: ``MathVerifyScorer`` on HuggingFace's math-verify: 50 answer pairs with known verdicts
(fractions, boxed LaTeX, intervals, units, sets, matrices, wrong answers), the reference from
``ctx["metadata"]``, ``scope``, configurable values, and a pathological expression that times out on the
process executor without hanging the run."""

import time
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("math_verify")

from prm_jax import Interaction, InteractionCache, PRMRunner
from prm_jax.errors import NoTextError
from prm_jax.scorers import MathVerifyScorer
from prm_jax.scorers._math_verifier import gold_text, last_boxed, reference_text

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


# Issue 55.1: a numeric reference (a JSON number) is the number it is. Before, ``str(1e-05)`` was wrapped as
# ``$1e-05$``, which math-verify reads as ``-5 + e``: the right reply ``\boxed{0.00001}`` scored 0 and
# ``\boxed{e-5}`` scored 1. References from 1e-12 to 1e20, negative, integer-valued floats and ints.
NUMERIC_REFERENCES = [1e-12, 3.5e-9, 1.2345e-7, 1e-5, -1e-5, 0.1, 2.5, 3.0, -7.0, 1e16, 1.5e17, 1e20, -2.5e18,
                      7, -42, 10**20]


def decimal(value):
    return format(Decimal(repr(value)) if isinstance(value, float) else Decimal(value), "f")


@pytest.mark.parametrize("answer", NUMERIC_REFERENCES, ids=[repr(a) for a in NUMERIC_REFERENCES])
def test_a_numeric_reference_scores_its_right_reply_1_and_a_wrong_one_0(answer):
    scorer = MathVerifyScorer()
    right, wrong = decimal(answer), decimal(answer * 2)
    assert scorer.evaluate_trajectory([one_turn(rf"So \boxed{{{right}}}.")], {"metadata": {"answer": answer}}) == {"t0": 1.0}
    assert scorer.evaluate_trajectory([one_turn(rf"So \boxed{{{wrong}}}.")], {"metadata": {"answer": answer}}) == {"t0": 0.0}
    if isinstance(answer, float) and "e" in repr(answer):  # the misreading: 1e-05 as e - 5
        misread = repr(answer).replace("1e", "e")
        assert scorer.evaluate_trajectory([one_turn(rf"\boxed{{{misread}}}")],
                                          {"metadata": {"answer": answer}}) == {"t0": 0.0}


def test_the_issues_reference_1e_05_is_one_hundred_thousandth():
    scorer, ctx = MathVerifyScorer(), {"metadata": {"answer": 1e-05}}
    assert reference_text(1e-05) == "0.00001" and reference_text(1e20) == "100000000000000000000"
    assert reference_text("1e-05") == "0.00001" and reference_text(-42) == "-42" and reference_text("e-5") == "e-5"
    assert scorer.evaluate_trajectory([one_turn(r"\boxed{0.00001}")], ctx) == {"t0": 1.0}
    assert scorer.evaluate_trajectory([one_turn(r"\boxed{e-5}")], ctx) == {"t0": 0.0}
    assert scorer.evaluate_trajectory([one_turn(r"\boxed{10^{-5}}")], ctx) == {"t0": 1.0}
    # A string in exponent notation is read as the same number.
    assert scorer.evaluate_trajectory([one_turn(r"\boxed{0.00001}")], {"metadata": {"answer": "1e-05"}}) == {"t0": 1.0}
    # Six significant digits for a small reference: 1e-12 is not 2e-12 (six decimal places would make both 0).
    assert scorer.evaluate_trajectory([one_turn(r"\boxed{2 \times 10^{-12}}")],
                                      {"metadata": {"answer": 1e-12}}) == {"t0": 0.0}


# Issue 55.2: math-verify's parser hands text it cannot read back as a string; that is no reference. Before,
# these five came back as their raw string, passed the "cannot parse" check and every reply scored 0.
@pytest.mark.parametrize("answer", [r"\frac{", "x=", "???", "}{", r"\sqrt"])
def test_an_unreadable_reference_fails_its_rows_naming_the_key(answer):
    with pytest.raises(ValueError, match=r"could not parse the reference answer metadata\['answer'\] = .* into a "
                                         r"mathematical object"):
        MathVerifyScorer().evaluate_trajectory([one_turn(r"\boxed{1}")], {"metadata": {"answer": answer}})
    with pytest.raises(ValueError, match=r"scorer 'math_verify': math-verify could not parse"):
        MathVerifyScorer().validate_metadata({"answer": answer})


JUNK = st.text(alphabet="?!{}=#@~;:^_&|<>`'", min_size=1, max_size=8) | st.sampled_from(
    [r"\frac{", "x=", "}{", r"\sqrt", r"\frac{}{", "=", r"\left(", r"\begin{", "$$", r"\boxed{"])


@settings(max_examples=60, deadline=None)
@given(JUNK)
def test_a_verifier_that_cannot_read_its_reference_never_hands_out_zeros(junk):
    scorer = MathVerifyScorer()
    with pytest.raises(ValueError, match="could not parse the reference answer"):
        scorer.evaluate_trajectory([one_turn(r"\boxed{1}")], {"metadata": {"answer": junk}})


def test_bare_braces_are_an_empty_reference_but_the_empty_set_written_as_one_is_read():
    # (hypothesis found "{}": math-verify reads "${}$" as the empty set, so a reference of bare braces, an empty
    # answer, was accepted and every reply scored 0 against it; the empty set named on purpose still is one)
    scorer = MathVerifyScorer()
    for junk in ("{}", "{ }"):
        with pytest.raises(ValueError, match="could not parse the reference answer"):
            scorer.evaluate_trajectory([one_turn(r"\boxed{1}")], {"metadata": {"answer": junk}})
    for named in (r"\emptyset", r"\{\}"):  # (math-verify reads \varnothing as a symbol, not the set)
        assert scorer.evaluate_trajectory([one_turn(r"\boxed{\emptyset}")], {"metadata": {"answer": named}}) == {
            "t0": 1.0}, named


# Issue 55.3: a reply is judged by its last boxed answer by default (before, every boxed answer was read as
# one set: "\boxed{3} then \boxed{5}" scored 0 against 5 and against 3); boxed="all" keeps math-verify's set.
def test_a_reply_is_judged_by_its_last_boxed_answer():
    reply = r"First \boxed{3}, then I checked again: the final answer is \boxed{5}"
    last, every = MathVerifyScorer(), MathVerifyScorer(boxed="all")
    assert last.evaluate_trajectory([one_turn(reply)], {"metadata": {"answer": 5}}) == {"t0": 1.0}
    assert last.evaluate_trajectory([one_turn(reply)], {"metadata": {"answer": 3}}) == {"t0": 0.0}
    assert every.evaluate_trajectory([one_turn(reply)], {"metadata": {"answer": 5}}) == {"t0": 0.0}
    assert every.evaluate_trajectory([one_turn(reply)], {"metadata": {"answer": "3, 5"}}) == {"t0": 1.0}
    assert last_boxed(r"a \boxed{\frac{1}{2}} b \fbox{x^{2}} c") == r"\fbox{x^{2}}"
    assert last_boxed(r"\boxed{\{1, 2\}}") == r"\boxed{\{1, 2\}}" and last_boxed("no box") is None
    assert last_boxed(r"\boxed{1} \boxed{2") == r"\boxed{1}"  # an unclosed last box: the last closed one
    with pytest.raises(ValueError, match="boxed must be one of"):
        MathVerifyScorer(boxed="first")


def test_the_command_line_refuses_an_unreadable_reference_before_scoring(tmp_path, capsys):
    """Issue 55.2: every session's reference is read up front (``validate_metadata``): exit 2 naming the file,
    the line, the key and the session, nothing written."""
    import json

    from prm_jax.app._cli import main

    config = tmp_path / "config.yaml"
    config.write_text("rollout:\n  agent:\n    prm:\n      enabled: true\n"
                      "      scorers: [{path: prm_jax.scorers.MathVerifyScorer}]\nactor: {kl_ctl: 0.0}\n")
    lines = [{"session_key": key, "group": "q1", "metadata": {"answer": answer}, "interactions": [
        {"id": f"{key}0", "input_tokens": [1, 2], "output_tokens": [3, 4],
         "output_messages": [{"role": "assistant", "content": r"\boxed{0.00001}"}], "reward": 1.0}]}
        for key, answer in (("a", 1e-05), ("b", "x="))]
    sessions = tmp_path / "s.jsonl"
    sessions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    assert main(["score", "--config", str(config), "--input", str(sessions), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{sessions}:2: metadata:" in err and "metadata['answer'] = 'x='" in err and "(session 'b')" in err
    assert len(err.splitlines()) == 1 and not out.exists()
    lines[1]["metadata"]["answer"] = "1e-05"  # readable: both right replies score 1
    sessions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["score", "--config", str(config), "--input", str(sessions), "--output", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    assert metrics["rollout/prm_turn_reward/math_verify"] == 1.0


@pytest.mark.parametrize("boxed", ["last", "all"])
def test_boxed_meets_scope_every_turn(boxed):
    # Where options meet: every turn's own reply is read by the boxed rule (turn 0 boxes 3 then 5; turn 1 boxes 5).
    turns = list(branch([r"\boxed{3} or rather \boxed{5}", r"\boxed{5}"]))
    got = MathVerifyScorer(scope="every_turn", boxed=boxed).evaluate_trajectory(turns, {"metadata": {"answer": 5}})
    assert got == {"bt0": 1.0 if boxed == "last" else 0.0, "bt1": 1.0}
