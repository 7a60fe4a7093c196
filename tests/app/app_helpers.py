"""Helpers the application tests share (one home, imported by the test modules; no test module imports
another)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from prm_jax.app import _cli as cli

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
DEMO = ROOT / "prm_jax" / "data" / "demo_sessions.jsonl"
CONFIG = ROOT / "examples" / "prm_config.yaml"
PRM_JAX = Path(sys.executable).with_name("prm-jax")
# A subprocess imports the prm_jax these tests import (the checkout's, before an installed one) and the helpers.
SUBPROCESS_PATH = os.pathsep.join([str(Path(cli.__file__).resolve().parents[2]), str(TESTS)])


def sessions():
    return [json.loads(line) for line in DEMO.read_text().splitlines()]


def write_jsonl(path, items, raw=None):
    path.write_text(raw if raw is not None else "".join(json.dumps(s) + "\n" for s in items))
    return path


def prm_jax(*args, umask=None):
    env = dict(os.environ, PYTHONPATH=SUBPROCESS_PATH, JAX_PLATFORMS="cpu")
    command = [str(PRM_JAX), *map(str, args)]
    if umask is not None:
        command = ["sh", "-c", f"umask {umask:03o} && exec \"$@\"", "sh", *command]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def score(tmp_path, input_path, *extra, config=CONFIG, out="out"):
    return prm_jax("score", "--config", config, "--input", input_path, "--output", tmp_path / out, *extra)


def assert_input_error(proc, needle, out):
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert needle in err, err
    assert "Traceback" not in err and len(err) < 2000
    assert not out.exists()


def config_with(tmp_path, scorers_yaml, shaping="process_weighted"):
    path = tmp_path / "config.yaml"
    path.write_text(f"""
rollout:
  agent:
    prm:
      advantage_shaping: {{mode: {shaping}}}
      scorers:
{scorers_yaml}
actor:
  token_rewards_as_adv: true
""")
    return path


def equal_records(a, b) -> None:
    """Every field of every interaction equal, of the same type (arrays: same dtype and values)."""
    assert (a.key, a.group, a.ready) == (b.key, b.group, b.ready)
    assert json.dumps(a.metadata) == json.dumps(b.metadata)  # (1 and 1.0 and True differ here)
    for x, y in zip(a.cache, b.cache, strict=True):
        for name in ("interaction_id", "parent_id", "stop_reason", "reward", "anchor_id", "step_reward",
                     "messages", "output_messages"):
            assert getattr(x, name) == getattr(y, name), name
            assert type(getattr(x, name)) is type(getattr(y, name)), name
        for name in ("input_tokens", "output_tokens", "output_logprobs", "token_rewards"):
            u, v = getattr(x, name), getattr(y, name)
            assert (u is None) == (v is None), name
            if u is not None:
                assert u.dtype == v.dtype, name
                np.testing.assert_array_equal(u, v, err_msg=name)
