"""Issue 20 at the command line's input: the reserved-looking ``__hitl__`` key (20.3), PRM disabled
(20.5), the two readers (20.9), tracebacks that become located errors (20.10, 20.14). The installed
``prm-jax`` runs in a subprocess, as a user runs it."""

import json

import numpy as np
from test_cli_faults import CONFIG, score, sessions, write_jsonl


def batch_of(out):
    return dict(np.load(out / "batch.npz"))


# --- 20.3 ---------------------------------------------------------------------------------------------------

def test_a_session_keyed_hitl_is_an_ordinary_session(tmp_path):
    # 3 ready trajectories in a session keyed "__hitl__": 3 rows out (the HITL rule exported only the oldest).
    items = sessions()
    group = [s for s in items if s["group"] == items[0]["group"]]
    key = group[0]["session_key"]
    hitl = dict(group[0], session_key="__hitl__")
    leaf = hitl["interactions"][-1]
    for j in range(2):  # two more ready leaves beside the first, siblings of its last turn
        hitl["interactions"].append(dict(leaf, id=f"{leaf['id']}-sib{j}", reward=float(j)))
    hitl.pop("ready", None)
    items = [hitl if s["session_key"] == key else s for s in items]
    proc = score(tmp_path, write_jsonl(tmp_path / "hitl.jsonl", items))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = batch_of(tmp_path / "out")["rewards"].shape[0]
    plain = score(tmp_path, write_jsonl(tmp_path / "plain.jsonl", [dict(hitl, session_key="plain-key")
                                                                   if s is hitl else s for s in items]), out="plain")
    assert plain.returncode == 0
    assert rows == batch_of(tmp_path / "plain")["rewards"].shape[0]
    assert rows == sum(len(s.get("ready") or [i["id"] for i in s["interactions"]
                                             if i["id"] not in {j.get("parent_id") for j in s["interactions"]}])
                       for s in items)


# --- 20.5 ---------------------------------------------------------------------------------------------------

def disabled_config(tmp_path, enabled):
    path = tmp_path / f"disabled-{enabled}.yaml"
    text = CONFIG.read_text()
    if enabled:
        text = text.replace("      scorers:\n        - path: prm_jax.scorers.LengthBudgetScorer\n"
                            "          weight: 1.0\n          kwargs:\n            max_output_tokens: 128\n",
                            "      scorers: []\n")
    else:
        text = text.replace("enabled: true", "enabled: false")
    assert text != CONFIG.read_text()
    path.write_text(text)
    return path


def test_with_prm_disabled_no_input_token_reward_reaches_the_advantages(tmp_path):
    items = sessions()
    rng = np.random.default_rng(5)
    with_rewards = json.loads(json.dumps(items))
    for s in with_rewards:
        for turn in s["interactions"]:
            turn["token_rewards"] = rng.uniform(-0.7, 0.7, size=len(turn["output_tokens"])).round(3).tolist()
    bare = write_jsonl(tmp_path / "bare.jsonl", items)
    rewarded = write_jsonl(tmp_path / "rewarded.jsonl", with_rewards)
    for enabled in (False, True):  # prm.enabled: false, and enabled with an empty scorer list
        config = disabled_config(tmp_path, enabled)
        a = score(tmp_path, bare, config=config, out=f"bare-{enabled}")
        b = score(tmp_path, rewarded, config=config, out=f"rewarded-{enabled}")
        assert a.returncode == 0 and b.returncode == 0, (a.stderr[-2000:], b.stderr[-2000:])
        got, want = batch_of(tmp_path / f"rewarded-{enabled}"), batch_of(tmp_path / f"bare-{enabled}")
        assert "token_rewards" not in got
        np.testing.assert_array_equal(got["timestep_advantages"], want["timestep_advantages"])
