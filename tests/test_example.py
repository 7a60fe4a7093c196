"""Issue 14: the flax GRPO example runs from a clean clone (a few steps, as CI runs it)."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("flax") is None or importlib.util.find_spec("optax") is None,
                                reason="the example needs the 'example' extra (flax, optax)")


def run_example(tmp_path, *args):
    summary = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, "-m", "examples.flax_grpo", *args, "--summary", str(summary)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(summary.read_text())


def test_the_example_trains_on_nonzero_advantages_where_the_scorer_scored(tmp_path):
    out = run_example(tmp_path, "--mode", "additive", "--steps", "3")
    assert len(out["loss"]) == 3 and all(math.isfinite(x) for x in out["loss"])
    active = np.asarray(out["loss_mask"]) > 0
    process = np.asarray(out["process_rewards_on_timesteps"])
    scored = active & (process != 0)
    assert scored.sum() == active.sum() > 0  # the judge scores every turn (+0.5 or -0.5)
    assert (np.asarray(out["advantages"])[scored] != 0).all()
    assert all(v == 0 for k, v in out["diagnostics"].items() if k.startswith("checks/"))


EVERY_MODE = """
import json, math, sys
from examples.flax_grpo.train import MODES, train
out = {}
for mode in MODES:
    history = train(mode, steps=2, progress=False)
    out[mode] = {"loss": history["loss"], "scored": "token_rewards" in history["batch"],
                 "diagnostics": sorted(history["diagnostics"])}
print(json.dumps(out))
"""


def test_every_mode_runs():
    # One process for every mode (each compiles its own update): the suite's time budget.
    proc = subprocess.run([sys.executable, "-c", EVERY_MODE], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {"outcome", "additive", "gvpo", "process_weighted", "tree", "pure", "decoupled"}
    credit = {"tree": "tree/nodes", "pure": "pure/groups_of_one", "decoupled": "decoupled/rows_without_rewards"}
    for mode, run in out.items():
        assert all(math.isfinite(x) for x in run["loss"]), mode
        # The judge shapes (its token rewards are in the batch) except outcome-only and GDPO's source.
        assert run["scored"] == (mode not in ("outcome", "decoupled")), mode
        if mode in credit:
            assert credit[mode] in run["diagnostics"], mode
