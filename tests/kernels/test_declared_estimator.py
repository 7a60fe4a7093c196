"""Issue 31.1: a new estimator is one module (``tests/constant_estimator.py``) and one registry line. Its
config mode builds, its declared batch keys are asked for and checked, its value check runs, the shared
epilogue adds the KL rewards and forms the returns, the command line packs what it declares and its
summary prints its diagnostics: no other file changes."""

import json
from pathlib import Path

import chex
import jax
import numpy as np
import pytest
import reference
import yaml
from batches import make_batch
from constant_estimator import CONSTANT, ConstantCredit

from prm_jax import compute_advantages
from prm_jax.app._cli import main
from prm_jax.config import AdvantageConfig
from prm_jax.estimators import register_estimator, registered, unregister_estimator

DEMO = Path(__file__).resolve().parents[2] / "prm_jax" / "data"


@pytest.fixture
def constant():
    register_estimator(CONSTANT)  # the one registry line
    yield
    unregister_estimator(CONSTANT)


def _with_nodes(batch: dict) -> dict:
    rows = batch["attention_mask"].shape[0]
    return {**batch, "node_ids": np.tile(np.arange(3, dtype=np.int32), (rows, 1))}


@pytest.mark.parametrize("kl_ctl", [0.0, 0.1])
def test_the_toy_estimator_runs_from_its_config_mode_against_a_float64_loop(constant, kl_ctl):
    config = AdvantageConfig(credit_assignment={"mode": "constant", "value": 0.5}, kl_ctl=kl_ctl)
    assert config.credit_assignment == ConstantCredit(0.5)
    batch = _with_nodes(make_batch(np.random.default_rng(3), 6, 24, with_process=False))
    out = compute_advantages(batch, config)
    expected = reference.compute_advantages(batch, {"kl_ctl": kl_ctl})
    m = expected["loss_mask"]
    want = 0.5 * m + expected["kl_rewards"]  # the epilogue's KL rewards, added once
    np.testing.assert_allclose(out.advantages, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out.returns, want + batch["values"], rtol=1e-6, atol=1e-6)
    assert int(out.diagnostics["constant/trained"]) == int(m.sum())
    assert int(out.diagnostics["constant/nodes"]) == 3 * 6
    assert int(out.diagnostics["checks/constant_rows_without_nodes"]) == 0


def test_the_toy_estimator_asks_for_its_declared_keys_and_runs_its_check(constant):
    config = AdvantageConfig(credit_assignment={"mode": "constant"})
    batch = make_batch(np.random.default_rng(4), 4, 16, with_process=False)
    with pytest.raises(ValueError, match=r"credit_assignment 'constant' needs batch\['node_ids'\] \[B, K\]"):
        compute_advantages(batch, config)
    nameless = _with_nodes(batch)
    nameless["node_ids"][2] = -1
    with pytest.raises(ValueError, match="a real row names no node"):
        compute_advantages(nameless, config)
    traced = jax.jit(lambda b: compute_advantages(b, config).diagnostics)(nameless)  # no raise under jit: counted
    assert int(traced["checks/constant_rows_without_nodes"]) == 1


def test_the_toy_estimator_does_not_retrace(constant):
    config = AdvantageConfig(credit_assignment={"mode": "constant", "value": 2.0})
    batches = [_with_nodes(make_batch(np.random.default_rng(seed), 4, 16, with_process=False)) for seed in range(3)]

    @jax.jit
    @chex.assert_max_traces(n=1)
    def advantages(batch):
        return compute_advantages(batch, config).advantages

    for batch in batches:
        advantages(batch)


def test_an_unknown_mode_lists_the_registered_ones(constant):
    with pytest.raises(ValueError, match="constant") as info:
        AdvantageConfig(credit_assignment={"mode": "nope"})
    assert all(spec.mode in str(info.value) for spec in registered() if spec.mode)
    with pytest.raises(ValueError, match="already registered"):
        register_estimator(CONSTANT)


def test_the_cli_packs_what_the_toy_declares_and_prints_its_diagnostics(constant, tmp_path, capsys):
    config = yaml.safe_load((DEMO / "demo_config.yaml").read_text())
    config["actor"]["credit_assignment"] = {"mode": "constant", "value": 0.25}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert main(["score", "--config", str(path), "--input", str(DEMO / "demo_sessions.jsonl"),
                 "--output", str(out)]) == 0
    saved = dict(np.load(out / "batch.npz"))
    assert "node_ids" in saved and "node_parents" in saved  # packed because the toy reads node_ids
    credit = json.loads((out / "metrics.json").read_text())["summary"]["credit"]
    trained = int(saved["timestep_loss_mask"].sum())
    assert credit["constant/trained"] == trained > 0
    assert credit["constant/nodes"] == int((saved["node_ids"] >= 0).sum())
    assert "credit assignment: constant/nodes" in capsys.readouterr().out
