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


EVERY_LOSS = """
import json
from examples.flax_grpo.train import LOSSES, train
print(json.dumps({loss: train("gvpo", steps=2, progress=False, loss=loss)["loss"] for loss in LOSSES}))
"""


def test_every_policy_loss_trains_the_example():
    # Issue 33.2: the example can pick any of prm_jax.losses (--loss): AReaL's PPO clip, verl's eleven
    # loss modes, TRL's sequence GSPO. Two steps each, one process.
    from prm_jax.losses import POLICY_LOSS_MODES
    proc = subprocess.run([sys.executable, "-c", EVERY_LOSS], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {"ppo_clip", "gspo_sequence", *POLICY_LOSS_MODES}
    for loss, values in out.items():
        assert len(values) == 2 and all(math.isfinite(x) for x in values), loss
    assert len({round(values[1], 6) for values in out.values()}) > 3  # the losses differ after a step


@pytest.mark.parametrize("mode", ["gvpo", "process_weighted"])
def test_the_model_judge_from_its_config_scores_as_the_python_judge(mode):
    # Issue 30.4: the example's judge as a JAX ModelScorer named in a config (a factory) gives CueJudge's
    # numbers, from one forward per batch.
    import prm_jax
    from examples.flax_grpo.env import ANSWER0, CUE0, WIDTH
    from examples.flax_grpo.train import SPANS, load

    rng = np.random.default_rng(0)
    rows = 32
    tokens = np.zeros((rows, WIDTH), np.int32)
    tokens[:, 0] = 1
    tokens[:, [1, 3, 5]] = CUE0 + rng.integers(0, 4, (rows, 3))
    tokens[:, [2, 4, 6]] = ANSWER0 + rng.integers(0, 4, (rows, 3))
    turn_ids = np.tile(np.asarray(prm_jax.kernels.turn_ids_from_spans(SPANS, WIDTH)), (rows, 1))
    scores = {}
    for judge in ("python", "model"):
        with prm_jax.BlockingRunner(load(mode, judge)) as runner:
            scores[judge] = runner.score_arrays(tokens, turn_ids)
            model = runner.runner.scorers[0]
    np.testing.assert_array_equal(scores["model"], scores["python"])
    assert model.forwards == 1 and len({*scores["python"][turn_ids >= 0].tolist()}) == 2


DISTILL = """
import json
from examples.flax_distill.train import MODES, train
print(json.dumps({mode: train(mode, steps=4) for mode in MODES}))
"""


def test_the_distillation_example_trains_each_way_and_the_teacher_gives_one_update_either_way():
    # Issue 44.3: the student distilled from a fixed teacher (examples/flax_distill): at the loss (AReaL's
    # rl + opd) and as a scorer (the k1 reward through the additive shaping). On-policy, one step per batch,
    # the two are the same update (prm-jax's rules where verl's break (the credit-assignment guide states each): PG distillation
    # is the reward passed as the advantage):
    # equal losses and rollouts, step after step; the outcome alone is another.
    proc = subprocess.run([sys.executable, "-c", DISTILL], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for mode, history in out.items():
        assert len(history["loss"]) == 4 and all(math.isfinite(x) for x in history["loss"]), mode
    np.testing.assert_allclose(out["loss"]["loss"], out["reward"]["loss"], rtol=1e-5)
    assert out["loss"]["success"] == out["reward"]["success"]
    assert not np.allclose(out["loss"]["loss"], out["outcome"]["loss"], rtol=1e-3)
