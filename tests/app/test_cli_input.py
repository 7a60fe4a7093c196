"""Issue 20 at the command line's input: the reserved-looking ``__hitl__`` key (20.3), PRM disabled
(20.5), the two readers (20.9), tracebacks that become located errors (20.10, 20.14). The installed
``prm-jax`` runs in a subprocess, as a user runs it."""

import json

import numpy as np
from app_helpers import CONFIG, assert_input_error, score, sessions, write_jsonl


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


# --- 20.9, 20.10, 20.14: located errors before any scoring ---------------------------------------------------

def slow_config(tmp_path):
    """A scorer that marks when it is first called: a refused input must cost no scorer call."""
    from app_helpers import config_with
    marker = tmp_path / "scored"
    path = config_with(tmp_path, f"        - {{path: scorers_for_tests.SlowScorer, kwargs: {{marker: '{marker}', "
                                 "seconds: 0.0}}", shaping="additive")
    return path, marker


def chain_session(key="s0", group="g"):
    return {"session_key": key, "group": group, "interactions": [
        {"id": "a", "input_tokens": [1], "output_tokens": [2, 3]},
        {"id": "b", "parent_id": "a", "input_tokens": [1, 2, 3, 9], "output_tokens": [4]},
        {"id": "c", "parent_id": "b", "input_tokens": [1, 2, 3, 9, 4, 8], "output_tokens": [5], "reward": 1.0}]}


def bad_lines():
    """name -> (the line's text, the error's located needle)."""
    cases = {}
    short = chain_session()
    short["interactions"][1]["input_tokens"] = [1, 2]  # b's inputs end inside a's outputs; all prefixes of c's
    cases["child shorter than its parent"] = (json.dumps(short), "bad.jsonl:2: interactions")
    selfish = chain_session()
    selfish["interactions"][0]["parent_id"] = "a"
    cases["self-parent"] = (json.dumps(selfish), "bad.jsonl:2: interactions[0]: interaction 'a' is its own parent")
    cycle = chain_session()
    cycle["interactions"] += [{"id": "x", "parent_id": "y", "input_tokens": [1], "output_tokens": [2]},
                              {"id": "y", "parent_id": "x", "input_tokens": [1], "output_tokens": [2]}]
    cases["cycle off every branch"] = (json.dumps(cycle), "bad.jsonl:2: interactions: interactions ['x', 'y'] are on a "
                                                          "parent cycle")
    twice = dict(chain_session(), ready=["c", "c"])
    cases["leaf ready twice"] = (json.dumps(twice), "bad.jsonl:2: ready: names 'c' twice")
    huge = json.dumps(chain_session()).replace('"reward": 1.0', '"reward": 1' + "0" * 400)
    cases["400-digit reward"] = (huge, "bad.jsonl:2: interactions[2].reward: must be finite")
    deep = json.dumps(chain_session()).replace('"output_tokens": [5]', '"output_tokens": [5], "messages": '
                                               + "[" * 3000 + "]" * 3000)
    cases["deeply nested"] = (deep, "bad.jsonl:2: json: nested too deeply")
    utf8 = json.dumps(chain_session()).replace('"output_tokens": [5]', '"output_tokens": [5], "output_messages": '
                                               '[{"role": "assistant", "content": "@@"}]')
    cases["invalid UTF-8"] = (utf8, "bad.jsonl:2: json: invalid UTF-8 at byte")
    return cases


def test_bad_lines_are_located_errors_before_any_scoring(tmp_path):
    config, marker = slow_config(tmp_path)
    good = json.dumps(chain_session("ok", "g0"))
    for name, (line, needle) in bad_lines().items():
        raw = (good + "\n" + line + "\n").encode().replace(b"@@", b"\xff\xfe")
        path = tmp_path / "bad.jsonl"
        path.write_bytes(raw)
        proc = score(tmp_path, path, config=config)
        assert_input_error(proc, needle, tmp_path / "out")
        assert not marker.exists(), name  # no judge call spent


def test_a_huge_scorer_weight_is_a_located_config_error(tmp_path):
    config = tmp_path / "w.yaml"
    config.write_text(CONFIG.read_text().replace("weight: 1.0", "weight: 1.0e38"))
    proc = score(tmp_path, tmp_path / "missing.jsonl", config=config)
    assert_input_error(proc, "rollout.agent.prm.scorers[0].weight must be in [-1000000.0, 1000000.0], got 1e+38",
                       tmp_path / "out")


def test_gzip_and_standard_input_read_like_the_plain_file(tmp_path):
    import gzip
    import os
    import subprocess

    from app_helpers import DEMO, PRM_JAX, SUBPROCESS_PATH
    assert score(tmp_path, DEMO, out="plain").returncode == 0
    packed = tmp_path / "sessions.jsonl.gz"
    packed.write_bytes(gzip.compress(DEMO.read_bytes()))
    assert score(tmp_path, packed, out="gz").returncode == 0
    env = dict(os.environ, PYTHONPATH=SUBPROCESS_PATH, JAX_PLATFORMS="cpu")
    proc = subprocess.run([str(PRM_JAX), "score", "--config", str(CONFIG), "--input", "-", "--output",
                           str(tmp_path / "stdin")], input=DEMO.read_bytes(), capture_output=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = batch_of(tmp_path / "plain")
    for out in ("gz", "stdin"):
        got = batch_of(tmp_path / out)
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{out}: {key}")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_key": 1}\n')
    proc = subprocess.run([str(PRM_JAX), "score", "--config", str(CONFIG), "--input", "-", "--output",
                           str(tmp_path / "x")], stdin=bad.open("rb"), capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and "<stdin>:1: " in proc.stderr, proc.stderr[-2000:]


# --- 20.11: a scorer's own argument checks run before anything is scored ------------------------------------

def scorer_config(tmp_path, entry):
    path = tmp_path / "scorer.yaml"
    path.write_text(CONFIG.read_text().split("      scorers:")[0] + "      scorers:\n" + entry + "actor:\n"
                    "  token_rewards_as_adv: true\n")
    return path


BAD_SCORERS = {
    "negative budget": ("        - {path: prm_jax.scorers.LengthBudgetScorer, kwargs: {max_output_tokens: -5}}\n",
                        "rollout.agent.prm.scorers[0].kwargs: prm_jax.scorers.LengthBudgetScorer: max_output_tokens "
                        "must be an integer >= 1, got -5"),
    "budget as text": ("        - {path: prm_jax.scorers.LengthBudgetScorer, kwargs: {max_output_tokens: '6'}}\n",
                       "max_output_tokens must be an integer >= 1, got '6'"),
    "unexpanded url": ("        - {path: prm_jax.scorers.HTTPJudgeScorer, kwargs: {url: '${JUDGE_URL}'}}\n",
                       "rollout.agent.prm.scorers[0].kwargs: prm_jax.scorers.HTTPJudgeScorer: url '${JUDGE_URL}' "
                       "holds an unexpanded variable"),
}


def test_validate_config_and_score_run_the_scorers_own_checks(tmp_path):
    from app_helpers import prm_jax
    for name, (entry, needle) in BAD_SCORERS.items():
        config = scorer_config(tmp_path, entry)
        checked = prm_jax("validate-config", config)
        assert checked.returncode == 2 and needle in checked.stderr, (name, checked.stdout, checked.stderr)
        proc = score(tmp_path, tmp_path / "missing.jsonl", config=config)  # refused before the input is read
        assert_input_error(proc, needle, tmp_path / "out")


def test_a_scorer_whose_constructor_raises_is_exit_2_naming_it(tmp_path):
    from app_helpers import DEMO
    config = scorer_config(tmp_path, "        - {path: prm_jax.scorers.LengthBudgetScorer}\n"
                                     "        - {path: scorers_for_tests.BrokenConstructor}\n")
    proc = score(tmp_path, DEMO, config=config)
    assert_input_error(proc, "rollout.agent.prm.scorers[1] (scorers_for_tests.BrokenConstructor) could not be "
                             "built: RuntimeError: constructor failed", tmp_path / "out")


# --- 20.15: error_policy in prm-jax score -----------------------------------------------------------------

def test_score_honours_keep_original(tmp_path):
    from app_helpers import DEMO, config_with
    path = config_with(tmp_path, "        - {path: scorers_for_tests.FailOnGroup, kwargs: {prefix: g1}}",
                       shaping="additive")
    path.write_text(path.read_text().replace("      scorers:", "      error_policy: keep_original\n      scorers:"))
    proc = score(tmp_path, DEMO, config=path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = json.loads((tmp_path / "out" / "metrics.json").read_text())
    fallbacks = saved["summary"]["prm_fallbacks"]
    assert sorted(fallbacks) == ["g1-s0", "g1-s1", "g1-s2", "g1-s3"]
    assert all("judge unavailable" in why for why in fallbacks.values())
    assert saved["metrics"]["rollout/prm_fallback"] == 4.0 and saved["summary"]["groups"]["rejected"] == 0
    rejected = score(tmp_path, DEMO, config=config_with(tmp_path, "        - {path: scorers_for_tests.FailOnGroup, "
                                                                    "kwargs: {prefix: g1}}"), out="reject")
    assert rejected.returncode == 0
    assert json.loads((tmp_path / "reject" / "metrics.json").read_text())["summary"]["groups"]["rejected"] == 1


# --- 20.6 at the command line ------------------------------------------------------------------------------

def test_unsigned_64_bit_anchor_ids_work_end_to_end_and_larger_ones_are_refused_first(tmp_path):
    from app_helpers import ROOT
    items = sessions()
    for s in items:
        for k, turn in enumerate(s["interactions"]):
            turn["anchor_id"] = 2**63 + 5 + (k % 2) * 2**32  # the old path: OverflowError after scoring
    config = tmp_path / "gigpo.yaml"
    config.write_text((ROOT / "prm_jax" / "data" / "demo_config.yaml").read_text()
                      + "  credit_assignment: {mode: gigpo}\n")
    proc = score(tmp_path, write_jsonl(tmp_path / "anchored.jsonl", items), config=config)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(np.unique(batch_of(tmp_path / "out")["anchor_ids"])) == {-1, 0, 1}
    marker_config, marker = slow_config(tmp_path)
    items[1]["interactions"][0]["anchor_id"] = 2**64
    proc = score(tmp_path, write_jsonl(tmp_path / "too_big.jsonl", items), config=marker_config, out="big")
    assert_input_error(proc, "too_big.jsonl:2: interactions[0].anchor_id: must be a 64-bit integer", tmp_path / "big")
    assert not marker.exists()


def test_a_scorer_in_the_users_own_module_needs_no_pythonpath(tmp_path):
    # Issue 23.11: `path: mypkg.MyScorer` next to the config failed with "No module named ..." unless
    # PYTHONPATH=. was set; the command now imports scorer paths with the current folder on the path.
    import os
    import subprocess

    from app_helpers import DEMO, PRM_JAX
    (tmp_path / "myscorers.py").write_text(
        "from prm_jax import BaseScorer\n\n\nclass Brevity(BaseScorer):\n    name = 'brevity'\n\n"
        "    async def evaluate(self, interaction, ctx):\n        return 1.0 if interaction.output_len < 50 else 0.0\n")
    (tmp_path / "config.yaml").write_text(
        "rollout:\n  agent:\n    prm:\n      enabled: true\n      scorers:\n        - path: myscorers.Brevity\n"
        "actor:\n  kl_ctl: 0.0\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([str(PRM_JAX), "score", "--config", "config.yaml", "--input", str(DEMO), "--output", "out"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "brevity" in proc.stdout
