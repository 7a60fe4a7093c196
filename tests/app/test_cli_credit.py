"""Issue 22: ``prm-jax score`` runs every credit mode on the demo sessions (group g1 branches; every turn has
PRM and reference log-probs) and its summary prints the mode's diagnostics; the saved advantages are what
``compute_advantages`` gives on the saved batch."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from prm_jax import compute_advantages, load_config
from prm_jax.app.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "prm_jax" / "data"

MODES = {
    "tree": ({"credit_assignment": {"mode": "tree", "weighting": "sqrt"}}, {"tree/leaves": 17, "tree/nodes": 49}),
    "pure": ({"credit_assignment": {"mode": "pure", "temperature": 0.1}}, {"pure/groups_of_one": 0}),
    "prime": ({"credit_assignment": {"mode": "prime"}}, {}),
    "decoupled": ({"reward_norm": {"mode": "decoupled"}}, {"decoupled/rows_without_rewards": 0}),
    "min_form": ({"process_reward_transform": {"mode": "min_form", "temperature": 0.1}}, {}),
}
PREFIX = {"tree": "tree/", "pure": "pure/", "prime": "prime/", "decoupled": "decoupled/", "min_form": "min_form/"}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_mode_runs_on_the_demo_and_reports_its_diagnostics(mode, tmp_path, capsys):
    keys, expected = MODES[mode]
    config = yaml.safe_load((DEMO / "demo_config.yaml").read_text())
    config["actor"].update(keys)
    if mode == "pure":  # PURE shapes nothing: the demo's process_weighted is refused with it (REFUSED_PAIRS)
        config["rollout"]["agent"]["prm"]["advantage_shaping"]["mode"] = "additive"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert main(["score", "--config", str(path), "--input", str(DEMO / "demo_sessions.jsonl"),
                 "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    credit = json.loads((out / "metrics.json").read_text())["summary"]["credit"]
    assert credit and all(key.startswith(PREFIX[mode]) for key in credit)
    assert {key: credit[key] for key in expected} == expected
    assert "credit assignment: " + PREFIX[mode] in printed
    saved = dict(np.load(out / "batch.npz"))
    batch = {k: saved[k] for k in saved if not k.startswith("timestep_") and k not in ("original_rewards",
                                                                                       "input_ids", "group_ids")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = compute_advantages(batch, load_config(path).actor)
    np.testing.assert_allclose(saved["timestep_advantages"], again.advantages, rtol=1e-5, atol=1e-5)
    assert np.isfinite(saved["timestep_advantages"]).all() and np.abs(saved["timestep_advantages"]).max() > 0
