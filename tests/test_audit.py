"""Issue 59: the credit auditor's suite, verdicts, report and command, and the unbiased per-turn baseline it
proves (``credit_assignment: {mode: turn_rloo}``). The findings are pinned with their sign and size: Dr. GRPO's
length bias (a per-sequence token mean) and question-difficulty bias (std normalization), verl RFC #7244's
per-turn-index baseline under variable turn counts, against a plain float64 loop of its closed form; the
return carried across a tool's output (verl #7278/#7300) against a planted form that cuts it; a process
reward's misassignment per shaping mode; trees of sampled turns (TreeRL, a group baseline over rows that share
prefixes, the per-tree discount)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os

import numpy as np
import pytest

import prm_jax
from prm_jax import audit
from prm_jax.audit import SUITE, log_prob_grads, responses, true_gradient

SUM = "seq-mean-token-sum"  # verl's loss_agg_mode: 1 / G a row (the REINFORCE sum)
RLOO = {"mean_level": "group", "std_level": None, "mean_leave1out": True}
GRPO = {"mean_level": "group", "std_level": "group"}
PROBLEMS = {p.name: p for p in SUITE}


def config(**overrides):
    """No KL, no adv_norm, process rewards folded into the rewards (the truth's J = E[R + sum_k r_k])."""
    return prm_jax.AdvantageConfig(**{"kl_ctl": 0.0, "reward_norm": None, "adv_norm": None,
                                      "token_rewards_as_adv": False, **overrides})


def verdicts(report):
    return {r.problem: r.verdict for r in report.results}


def test_rloo_with_the_token_sum_passes_every_problem_of_independent_rows_with_scale_one():
    # (on the trees problem its rows share prefixes, and it fails there: the trees test below)
    report = audit.audit(config(reward_norm=RLOO), SUM)
    for result in report.results:
        if result.problem == "trees":
            assert result.verdict == "fail"
            continue
        assert result.verdict == "pass", result
        assert result.across < 1e-6 and result.scale == pytest.approx(1.0, rel=1e-6), result
        assert result.relative_bias < 1e-6 and result.variance > 0
    assert len(report.results) == 7 and {r.problem for r in report.results} == set(PROBLEMS)


def test_grpo_is_flagged_for_length_and_difficulty_with_the_papers_sign_and_size():
    # Dr. GRPO ("Understanding R1-Zero-Like Training", Liu et al. 2025): the per-sequence token mean tilts the
    # update towards short correct responses (here 20.3 degrees off, cosine 0.938), std normalization weighs
    # questions by one over their spread (0.7 degrees on two questions of reward std 0.118 and 0.331).
    report = audit.audit(config(reward_norm=GRPO), "seq-mean-token-mean", problems=[PROBLEMS["control"],
                                                                                   PROBLEMS["length"],
                                                                                   PROBLEMS["difficulty"]])
    control, length, difficulty = report.results
    assert control.verdict == "pass" and control.across < 1e-6
    assert length.verdict == "fail" and 0.93 < length.cosine < 0.945, length
    assert "Dr. GRPO's length bias" in length.reason and "degrees" in length.reason
    assert difficulty.verdict == "fail" and 0.9995 < difficulty.cosine < 0.99999, difficulty
    # The sign of the length bias: the estimate pushes the EOS token at the second position (ending a correct
    # response early) up by more than the true gradient does.
    problem, _ = PROBLEMS["length"].questions[0]
    assert (length.estimate / length.scale - length.truth)[1 * problem.vocab + problem.eos] > 0
    # Dr. GRPO's fix (the group mean without std, a constant normalizer) passes both, up to a step-size factor.
    fixed = audit.audit(config(reward_norm={"mean_level": "group", "std_level": None}), "seq-mean-token-sum-norm",
                        problems=[PROBLEMS["length"], PROBLEMS["difficulty"]])
    assert verdicts(fixed) == {"length": "pass", "difficulty": "pass"}
    assert all("step-size factor" in r.reason for r in fixed.results)


def _per_turn(problem, seq):
    """Each turn's reward: its process reward, plus the outcome on the last turn."""
    rewards = list(problem.turn_rewards(seq))
    rewards[-1] += problem.reward(seq)
    return rewards


def _closed_form_bias(problem, theta, group_size):
    """verl RFC #7244's closed form, in a plain float64 loop: the per-turn-index form subtracts, at turn k of a
    row that stops after K turns, sum_{k'=k}^{K-1} b_k', each b_k' the mean reward at index k' of the other rows
    reaching it (0 where none does); its expectation beta_k' does not depend on the row, so the bias is
    -E[sum_k grad log pi(a_k) sum_{k'=k}^{K-1} beta_k'], a hidden cost on every turn taken."""
    seqs = responses(problem)
    prob = [math.exp(log_prob_grads(theta, s)[0]) for s in seqs]
    beta = np.zeros(problem.max_len)
    for others in itertools.product(range(len(seqs)), repeat=group_size - 1):
        weight = math.prod(prob[o] for o in others)
        for k in range(problem.max_len):
            reach = [_per_turn(problem, seqs[o])[k] for o in others if len(seqs[o]) > k]
            if reach:
                beta[k] += weight * math.fsum(reach) / len(reach)
    bias = np.zeros(theta.shape)
    for p, seq in zip(prob, seqs, strict=True):
        grads = log_prob_grads(theta, seq)[1]
        for k in range(len(seq)):
            bias -= p * grads[k] * math.fsum(beta[k:len(seq)])
    return bias, beta


def test_the_per_turn_index_baseline_is_biased_by_rfc_7244s_closed_form_and_turn_rloo_is_not():
    problem, theta = PROBLEMS["variable_turns"].questions[0]
    truth = true_gradient(problem, theta)
    with audit.known_forms():
        biased = audit.expected_estimate(problem, theta, config(credit_assignment={"mode": "turn_index_baseline"}),
                                         3, SUM)
    fixed = audit.expected_estimate(problem, theta, config(credit_assignment={"mode": "turn_rloo"}), 3, SUM)
    bias, beta = _closed_form_bias(problem, theta, 3)
    np.testing.assert_allclose(biased - truth, bias, atol=1e-6 * np.linalg.norm(truth))
    np.testing.assert_allclose(fixed, truth, atol=1e-6 * np.linalg.norm(truth))
    # Its sign and size: every turn taken costs beta (0.294, 0.398, 0.512 here: the others' mean reward at each
    # index, the outcome included at the last), so the biased update pushes EOS up at the first turn (+0.186).
    np.testing.assert_allclose(beta, [0.294, 0.398, 0.512], atol=5e-4)
    eos = problem.eos
    assert bias[0, eos] == pytest.approx(0.1857, abs=5e-4) and np.linalg.norm(bias) / np.linalg.norm(truth) > 0.3
    report = audit.audit(config(credit_assignment={"mode": "turn_rloo"}), SUM, problems=[PROBLEMS["variable_turns"]])
    with audit.known_forms():
        before = audit.audit(config(credit_assignment={"mode": "turn_index_baseline"}), SUM,
                             problems=[PROBLEMS["variable_turns"]])
    assert verdicts(report) == {"variable_turns": "pass"} and verdicts(before) == {"variable_turns": "fail"}
    assert "RFC #7244" in before.results[0].reason


def test_the_known_forms_are_registered_only_inside_their_block():
    assert "turn_index_baseline" not in prm_jax.estimators.credit_modes()
    with audit.known_forms():
        assert "turn_index_baseline" in prm_jax.estimators.credit_modes()
    assert "turn_index_baseline" not in prm_jax.estimators.credit_modes()
    with pytest.raises(prm_jax.errors.ConfigError, match="turn_index_baseline"):
        prm_jax.AdvantageConfig(credit_assignment={"mode": "turn_index_baseline"})


@dataclasses.dataclass(frozen=True)
class CutAtHoles:
    """A planted mistake: REINFORCE++'s return before verl #7300, reset at every untrained timestep."""


def _cut_at_holes(stage, rewards, active, dtype):
    import jax.numpy as jnp

    from prm_jax.estimators import StageResult

    running = jnp.zeros(rewards.shape[:1], dtype)
    out = []
    for t in reversed(range(rewards.shape[1])):  # (a few timesteps: a test's planted form)
        running = jnp.where(active[:, t], rewards[:, t] + running, jnp.zeros((), dtype))
        out.append(running)
    return StageResult(jnp.stack(out[::-1], axis=1))


def test_the_return_is_carried_across_a_tools_output_and_a_form_that_cuts_it_is_caught():
    from prm_jax.estimators import EstimatorSpec, register_estimator, unregister_estimator

    tools = [PROBLEMS["tool_outputs"]]
    carried = audit.audit(config(credit_assignment={"mode": "reinforce_pp"}, adv_norm=None), SUM, problems=tools)
    planted = register_estimator(EstimatorSpec(CutAtHoles, _cut_at_holes, "credit_assignment 'cut'", mode="cut",
                                               kl="rewards", units=("token",)))
    try:
        cut = audit.audit(config(credit_assignment={"mode": "cut"}), SUM, problems=tools)
    finally:
        unregister_estimator(planted)
    plain = audit.audit(config(), SUM, problems=tools)
    assert verdicts(plain) == {"tool_outputs": "pass"} and plain.results[0].scale == pytest.approx(1.0, rel=1e-6)
    # REINFORCE++ whitens over the batch (a group here), which is not a baseline: a scale, and what it turns
    # is reported as measured.
    assert carried.results[0].cosine > 0.9
    assert verdicts(cut) == {"tool_outputs": "fail"} and cut.results[0].cosine < 0.9, cut.results[0]
    assert "#7278" in cut.results[0].reason


@pytest.mark.parametrize("overrides, verdict, share", [
    ({"reward_norm": RLOO}, "pass", 0.377),                                               # reward-to-go: noise on earlier turns
    ({"credit_assignment": {"mode": "turn_rloo"}}, "pass", 0.261),                        # a per-turn baseline: less
    ({"reward_norm": RLOO, "token_rewards_as_adv": True}, "pass", 0.0),                   # additive: its own turn only
    ({"reward_norm": RLOO, "token_rewards_as_adv": True, "advantage_shaping": {"mode": "gvpo"}}, "fail", None),
    ({"reward_norm": RLOO, "token_rewards_as_adv": True,
      "advantage_shaping": {"mode": "process_weighted"}}, "fail", None),
], ids=["folded", "turn_rloo", "additive", "gvpo", "process_weighted"])
def test_a_process_rewards_misassignment_is_measured_per_shaping_and_credit_mode(overrides, verdict, share):
    result = audit.audit(config(**overrides), SUM, problems=[PROBLEMS["process"]]).results[0]
    assert result.verdict == verdict, result
    if share is not None:
        assert result.misassignment == pytest.approx(share, abs=5e-4)
    else:  # gvpo and process_weighted reweight the outcome's advantages: no outcome reward, no update
        assert abs(result.scale) < 1e-6 and "no component along" in result.reason


def test_sampling_takes_over_beyond_max_groups_with_an_interval_and_a_fixed_seed():
    problem = PROBLEMS["length"]
    exact = audit.audit(config(reward_norm=RLOO), "seq-mean-token-mean", problems=[problem]).results[0]
    sampled = audit.audit(config(reward_norm=RLOO), "seq-mean-token-mean", problems=[problem], max_groups=100,
                          samples=3000, seed=3).results[0]
    again = audit.audit(config(reward_norm=RLOO), "seq-mean-token-mean", problems=[problem], max_groups=100,
                        samples=3000, seed=3).results[0]
    assert exact.method == "exact (3375 groups)" and exact.interval == 0.0
    assert sampled.method == "sampled (3000 groups, seed 3)" and sampled.interval > 0
    assert sampled.cosine == again.cosine and sampled.verdict == "fail"  # (the bias is far outside the interval)
    assert abs(sampled.cosine - exact.cosine) < 0.02


def test_an_estimator_that_needs_inputs_the_problems_lack_is_not_audited_and_says_why():
    report = audit.audit(config(credit_assignment={"mode": "tree"}), SUM, problems=SUITE[:1])
    assert report.results[0].verdict == "not audited" and "node_ids" in report.results[0].reason
    assert report.failed(["all"]) == []
    assert json.loads(report.as_json())["results"][0]["cosine"] is None  # (strict JSON: no NaN)


def test_the_report_table_json_and_required_problems():
    report = audit.audit(config(reward_norm=GRPO), "seq-mean-token-mean", problems=SUITE[:2])
    table = report.table()
    assert table.splitlines()[0].startswith("audit of token_gae, reward_norm {mean_level: group, std_level: group")
    assert "advantage_shaping" not in table.splitlines()[0]  # (process rewards folded: no shaping applies)
    assert "control" in table.splitlines()[3] and "length" in table.splitlines()[4] and "fail" in table
    data = json.loads(report.as_json())
    assert [r["problem"] for r in data["results"]] == ["control", "length"]
    assert data["results"][1]["verdict"] == "fail" and len(data["results"][1]["truth"]) == 9
    assert report.failed(["control"]) == [] and report.failed(["length"]) == ["length"]
    assert report.failed(["all"]) == ["length"]
    with pytest.raises(ValueError, match="loss_agg_mode"):
        audit.audit(config(), "sum")


def test_the_command_prints_the_report_writes_json_and_a_plot_and_exits_3_on_a_required_failure(tmp_path, capsys):
    from prm_jax.app._cli import main

    path = tmp_path / "config.yaml"
    path.write_text("actor:\n  kl_ctl: 0.0\n  adv_norm: null\n  reward_norm: {mean_level: group, std_level: group}\n")
    common = ["audit", "--config", str(path), "--problems", "control,length", "--loss-agg-mode", "seq-mean-token-mean"]
    assert main([*common, "--require", "control", "--json", str(tmp_path / "a.json"),
                 "--plot", str(tmp_path / "a.png")]) == 0
    out = capsys.readouterr().out
    assert "length          fail" in out and "Dr. GRPO's length bias" in out
    assert json.loads((tmp_path / "a.json").read_text())["aggregation"] == "seq-mean-token-mean"
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~umask  # (the mode open gives)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # (no temporary left)
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    assert main([*common, "--require", "length"]) == 3
    assert "required problems failed: length" in capsys.readouterr().err
    assert main(["audit", "--config", str(path), "--require", "lenght"]) == 2
    assert "unknown problem 'lenght'" in capsys.readouterr().err
    assert main(["audit", "--config", str(path), "--json", str(tmp_path / "no" / "a.json")]) == 2
    assert "--json" in capsys.readouterr().err and not (tmp_path / "no").exists()
    assert main(["audit", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_the_guides_command_runs_as_written(tmp_path):
    # The auditor's guide's command block (a config with turn_rloo, two problems required): it passes every problem
    # of independent rows, and fails the trees (a baseline over rows that share prefixes), which is not required.
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "auditor.md").read_text()
    body = re.search(r"```bash\n(.*?)```", page, re.S).group(1)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-e", "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "audit.json").read_text())
    assert [r["verdict"] for r in data["results"]] == ["pass"] * 6 + ["fail"]
    assert [r["problem"] for r in data["results"]][-1] == "trees"


def test_trees_are_enumerated_and_a_baseline_over_sibling_rows_is_biased_where_none_is_not():
    # Issue 59.2's trees: a group is a tree (two first turns, each continued twice; the rows the four leaves'
    # paths). Every tree is enumerated (2 ** 6 = 64, probabilities summing to 1); the plain return (no baseline)
    # is exact, while a group baseline over the tree's rows takes siblings that share the row's first turn, so it
    # depends on that turn's action. RLOO here: of a row's three others one shares its first turn, so a third of
    # that turn's credit cancels (its block at 2/3 of its truth) while the second turn's is exact (its baseline
    # depends only on the shared first turn, its state); cosine 0.9865. TreeRL's node values are audited as they
    # are (cosine 0.964).
    problem = PROBLEMS["trees"]
    (question, theta), = problem.questions
    groups, probabilities = audit.tree_groups(question, theta, problem.tree)
    assert groups.shape == (64, 4) and probabilities.sum() == pytest.approx(1.0, abs=1e-12)
    plain = audit.audit(config(), SUM, problems=[problem]).results[0]
    rloo = audit.audit(config(reward_norm=RLOO), SUM, problems=[problem]).results[0]
    tree = audit.audit(config(credit_assignment={"mode": "tree"}), SUM, problems=[problem]).results[0]
    assert plain.verdict == "pass" and plain.scale == pytest.approx(1.0, rel=1e-6)
    assert rloo.verdict == "fail" and rloo.cosine == pytest.approx(0.9865, abs=5e-4), rloo
    first, second = (float(rloo.estimate[k * 2:(k + 1) * 2] @ rloo.truth[k * 2:(k + 1) * 2]
                           / (rloo.truth[k * 2:(k + 1) * 2] @ rloo.truth[k * 2:(k + 1) * 2])) for k in (0, 1))
    assert first == pytest.approx(2 / 3, abs=1e-6) and second == pytest.approx(1.0, abs=1e-6), (first, second)
    assert tree.verdict == "fail" and tree.method == "exact (64 groups)" and 0.95 < tree.cosine < 0.98, tree


def test_the_tree_discount_gives_every_leaf_its_own_reward_so_the_trees_audit_is_unchanged():
    # AReaL's per-tree turn discount (turn_discount, applied at export: prm_jax.credit.tree_discount) discounts
    # only trajectories that end at a turn with children; on the trees problem every row ends at a leaf, so each
    # keeps its reward and the audit is the undiscounted one.
    problem = PROBLEMS["trees"]
    (question, theta), = problem.questions
    parents, _, paths = audit.tree_layout(problem.tree)
    seqs = responses(question)
    groups, _ = audit.tree_groups(question, theta, problem.tree)
    for group in groups:
        raw = np.zeros(parents.size)
        raw[paths[:, -1]] = [question.reward(seqs[i]) for i in group]
        discounted = np.asarray(prm_jax.credit.tree_discount(parents, raw, 0.9))
        np.testing.assert_allclose(discounted[paths[:, -1]], raw[paths[:, -1]], rtol=1e-6)
        # (the discount is on: a first turn gets 0.9 times the mean of its two leaves, the rule for a turn with
        # children)
        leaves = raw[paths[:, -1]].reshape(2, 2)
        np.testing.assert_allclose(discounted[[0, 1]], 0.9 * leaves.mean(axis=1), rtol=1e-6, atol=1e-7)


def test_the_guides_table_audits_every_built_in_credit_mode_and_shaping():
    # Issue 59.5: the guide's table (rendered from BUILT_IN at every docs build) has a row for each of the
    # library's credit modes and shaping modes, and for #7244's form beside turn_rloo.
    from prm_jax.estimators import registered

    own = {spec.mode for spec in registered() if spec.mode and spec.stage.__module__.startswith("prm_jax.")}
    audited = {dict(settings).get("credit_assignment", {}).get("mode") for _, settings, _ in audit.BUILT_IN}
    shapings = {dict(settings).get("advantage_shaping", {"mode": "additive"})["mode"]
                for _, settings, _ in audit.BUILT_IN if dict(settings).get("token_rewards_as_adv")}
    assert own <= audited and "turn_index_baseline" in audited, own - audited
    assert shapings == {"additive", "gvpo", "process_weighted"}
    assert any(dict(s).get("gae_timestep_unit") == "turn" for _, s, _ in audit.BUILT_IN)
