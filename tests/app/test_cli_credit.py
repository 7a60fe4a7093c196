"""Issue 22: ``prm-jax score`` runs every credit mode on the demo sessions (group g1 branches; every turn has
PRM and reference log-probs) and its summary prints the mode's diagnostics; the saved advantages are what
``compute_advantages`` gives on the saved batch."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import reference
import yaml

from prm_jax import compute_advantages, load_config
from prm_jax.app._cli import main
from prm_jax.estimators import STAGE_SPECS, registered

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "prm_jax" / "data"

MODES = {
    "tree": {"credit_assignment": {"mode": "tree", "weighting": "sqrt"}},
    "pure": {"credit_assignment": {"mode": "pure", "temperature": 0.1}},
    "prime": {"credit_assignment": {"mode": "prime"}},
    "decoupled": {"reward_norm": {"mode": "decoupled"}},
    "min_form": {"process_reward_transform": {"mode": "min_form", "temperature": 0.1}},
}
# Each mode's diagnostics prefix, as declared (issue 43.2: no hand list of prefixes).
PREFIX = {**{spec.mode: spec.diagnostics for spec in registered() if spec.mode is not None},
          **{spec.mode: spec.diagnostics for spec in STAGE_SPECS}}


def accepted_sessions(summary: dict) -> list[dict]:
    sessions = [json.loads(line) for line in (DEMO / "demo_sessions.jsonl").read_text().splitlines() if line.strip()]
    return [s for s in sessions if summary["group_status"][s.get("group", s["session_key"])] == "accepted"]


def ready_leaves(session: dict) -> list[str]:
    parents = {t["parent_id"] for t in session["interactions"] if t.get("parent_id")}
    return session.get("ready") or [t["id"] for t in session["interactions"] if t["id"] not in parents]


def expected_diagnostics(mode: str, summary: dict, saved: dict) -> dict[str, float]:
    """Issue 31.10: each mode's diagnostics derived from the data (the sessions, or the saved batch as the
    float64 loops of tests/reference.py read it), not written down."""
    on = saved["timestep_loss_mask"] > 0
    if mode == "tree":  # a node per interaction on an exported branch; a leaf per ready interaction
        sessions = accepted_sessions(summary)
        nodes = 0
        for session in sessions:
            parent = {t["id"]: t.get("parent_id") for t in session["interactions"]}
            on_branch: set[str] = set()
            for leaf in ready_leaves(session):
                node = leaf
                while node is not None:
                    on_branch.add(node)
                    node = parent[node]
            nodes += len(on_branch)
        return {"tree/nodes": nodes, "tree/leaves": sum(len(ready_leaves(s)) for s in sessions)}
    if mode == "pure":  # rows alone in their group
        return {"pure/groups_of_one": int(np.sum(saved["group_sizes"] == 1))}
    if mode == "prime":  # the implicit rewards after batch_norm, averaged over trained timesteps
        _, _, s = reference.prime(saved["prm_logprobs"], saved["ref_logprobs"], saved["rewards"], on,
                                  np.repeat(np.arange(len(saved["group_sizes"])), saved["group_sizes"]), beta=0.05)
        return {"prime/implicit_reward_mean": float(s.sum() / max(on.sum(), 1))}
    if mode == "decoupled":  # rows with every reward source missing (the outcome is always there)
        sources = np.concatenate([saved["rewards"][:, None], saved["reward_sources"]], axis=1)
        return {"decoupled/rows_without_rewards": int(np.sum(np.isnan(sources).all(axis=1))),
                "decoupled/missing_share": float(np.isnan(sources).mean())}
    # min_form: each row's turns (its trained timesteps by turn id), the min-form rewards of their scores (the
    # process reward at each turn's last trained timestep), summed per row and averaged over rows with turns
    turn_ids = reference.shift(saved["turn_ids"], fill=-1)
    process = reference.shift(saved["token_rewards"])
    turns = sorted({int(k) for k in turn_ids[on]})
    scores = np.zeros((on.shape[0], max(turns) + 1))
    steps = np.zeros(scores.shape, bool)
    for b in range(on.shape[0]):
        for k in set(turn_ids[b][on[b]].tolist()):
            last = np.flatnonzero(on[b] & (turn_ids[b] == k))[-1]
            scores[b, k], steps[b, k] = process[b, last], True
    rewards = reference.min_form(scores, steps, 0.1)
    with_turns = steps.any(axis=1)
    return {"min_form/turns": int(steps.sum()),
            "min_form/row_sum_mean": float(rewards.sum(axis=1)[with_turns].sum() / max(with_turns.sum(), 1))}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_mode_runs_on_the_demo_and_reports_its_diagnostics(mode, tmp_path, capsys):
    keys = MODES[mode]
    config = yaml.safe_load((DEMO / "demo_config.yaml").read_text())
    config["actor"].update(keys)
    if mode == "pure":  # PURE shapes nothing: the demo's process_weighted is refused with it (refused_pairs())
        config["rollout"]["agent"]["prm"]["advantage_shaping"]["mode"] = "additive"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert main(["score", "--config", str(path), "--input", str(DEMO / "demo_sessions.jsonl"),
                 "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "metrics.json").read_text())["summary"]
    credit = summary["credit"]
    assert credit and all(key.startswith(PREFIX[mode]) for key in credit)
    saved = dict(np.load(out / "batch.npz"))
    expected = expected_diagnostics(mode, summary, saved)
    assert sorted(expected) == sorted(credit)
    for key, value in expected.items():
        assert credit[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert "credit assignment: " + PREFIX[mode] in printed
    batch = {k: saved[k] for k in saved if not k.startswith("timestep_") and k not in ("original_rewards",
                                                                                       "input_ids", "group_ids")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = compute_advantages(batch, load_config(path).actor)
    np.testing.assert_allclose(saved["timestep_advantages"], again.advantages, rtol=1e-5, atol=1e-5)
    assert np.isfinite(saved["timestep_advantages"]).all() and np.abs(saved["timestep_advantages"]).max() > 0
