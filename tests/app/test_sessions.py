"""Issue 20.9: the fast reader and the checked reader accept exactly the same lines, and build the same
sessions from them. A differential fuzz over every field of the session schema (the keys the module
declares, not a hand-picked list), with structural flaws (the concat rule between a child and its parent,
cycles, duplicate and unknown ready leaves) and hostile values (huge integers, NaN, deep nesting, bad UTF-8)."""

import json

import numpy as np
from app_helpers import equal_records

from prm_jax.app.sessions import INTERACTION_KEYS, SESSION_KEYS, InputError, _fast_session, _slow_session

HOSTILE = ["@null", "@true", "@0", "@-1", "@1.5", "@-0.25", "@2147483648", "@9223372036854775808",
           "@18446744073709551616", "@-9223372036854775809", "@1" + "0" * 400, "@NaN", "@1e400", "@\"\"",
           "@\"x\"", "@\"stop\"", "@\"length\"", "@[]", "@[1]", "@[-0.5]", "@[0.5,0.25]", "@[1,2,3]", "@{}",
           "@[{\"role\":\"user\",\"content\":\"x\"}]", "@[\"s\"]", "@[[1]]", "@" + "[" * 3000 + "]" * 3000,
           "@\"\xff\"", "@[true]", "@[1e400]", "@\"t0\"", "@\"t1\"", "@[\"t0\",\"t0\"]", "@[\"t0\"]",
           "@" + "{\"a\":" * 32 + "1" + "}" * 32, "@" + "{\"a\":" * 33 + "1" + "}" * 33,  # metadata's depth limit
           "@{\"s\":\"" + "x" * 65_530 + "\"}", "@{\"s\":[1,NaN]}", "@{\"n\":1e400}"]  # its size, its numbers


def base_session(rng):
    """A valid session: a chain of 1-4 turns, sometimes a second leaf off the root, every optional field."""
    turns, items, prefix, parent = int(rng.integers(1, 5)), [], [int(t) for t in rng.integers(0, 50, 2)], None
    for k in range(turns):
        outputs = [int(t) for t in rng.integers(0, 50, int(rng.integers(1, 4)))]
        items.append({"id": f"t{k}", "parent_id": parent, "input_tokens": list(prefix), "output_tokens": outputs,
                      "output_logprobs": [-0.25] * len(outputs), "token_rewards": [0.5] * len(outputs),
                      "messages": [{"role": "user", "content": f"q{k}"}],
                      "output_messages": [{"role": "assistant", "content": f"a{k}"}],
                      "stop_reason": "stop", "anchor_id": int(rng.integers(-1, 3)), "step_reward": 0.25})
        prefix = prefix + outputs + [int(t) for t in rng.integers(0, 50, int(rng.integers(0, 3)))]
        parent = f"t{k}"
    items[-1]["reward"] = 1.0
    if turns > 1 and rng.random() < 0.3:
        root = items[0]
        items.append({"id": "b", "parent_id": "t0", "input_tokens": root["input_tokens"] + root["output_tokens"],
                      "output_tokens": [7], "reward": 0.0})
    session = {"session_key": "s", "group": "g", "interactions": items, "ready": [items[-1]["id"]]}
    if rng.random() < 0.5:
        session["metadata"] = {"answer": "42", "n": [1, 2.5, {"x": None}], "ok": True, "big": 2 ** 70}
    return session


def structural(rng, session):
    """A flaw of the tree or of the concat rule (or none)."""
    items = session["interactions"]
    kind = int(rng.integers(0, 8))
    chain = [i for i in items if i["id"].startswith("t")]
    if kind == 0 and len(chain) >= 3:  # a middle turn's inputs end inside its parent's outputs, yet both
        mid, parent = chain[1], chain[0]  # are prefixes of the leaf (the fast path took this)
        full = parent["input_tokens"] + parent["output_tokens"]
        mid["input_tokens"] = full[:-1]
    elif kind == 1 and len(items) >= 2:  # a cycle off every leaf's branch
        items.append({"id": "c1", "parent_id": "c2", "input_tokens": [1], "output_tokens": [2]})
        items.append({"id": "c2", "parent_id": "c1", "input_tokens": [1], "output_tokens": [2]})
    elif kind == 2:  # a leaf listed twice
        session["ready"] = session["ready"] * 2
    elif kind == 3:  # a self-parent
        items[-1]["parent_id"] = items[-1]["id"]
    elif kind == 4 and len(chain) >= 2:  # a parent that is not there
        chain[-1]["parent_id"] = "zz"
    elif kind == 5:  # ready by default: every leaf needs a reward
        del session["ready"]


def mutate(rng, session):
    """A hostile value for one field of the schema (or its removal, or an unknown key)."""
    turns = session.get("interactions")
    usable = isinstance(turns, list) and turns and all(isinstance(t, dict) for t in turns)
    if rng.random() < 0.35 or not usable:
        target, keys = session, sorted(SESSION_KEYS)
    else:
        target, keys = session["interactions"][int(rng.integers(0, len(session["interactions"])))], sorted(INTERACTION_KEYS)
    choice = rng.random()
    if choice < 0.1:
        target["unknown_key"] = 1
        return "unknown"
    key = keys[int(rng.integers(0, len(keys)))]
    if choice < 0.25:
        target.pop(key, None)
    else:
        target[key] = HOSTILE[int(rng.integers(0, len(HOSTILE)))]
    return key


def line_of(session, spacing):
    text = json.dumps(session, separators=("," + spacing, ":"), ensure_ascii=False)
    for value in HOSTILE:  # "@..." placeholders become raw JSON (NaN, huge numbers, deep nesting, bad UTF-8)
        text = text.replace(json.dumps(value, ensure_ascii=False), value[1:])
    return text.encode("utf-8", errors="surrogateescape").replace("\xff".encode(), b"\xff")


def test_the_two_readers_accept_exactly_the_same_lines_over_every_field(tmp_path):
    rng = np.random.default_rng(20)
    path = tmp_path / "fuzz.jsonl"
    touched, outcomes = set(), {"fast": 0, "checked_only": 0, "refused": 0}
    for case in range(4000):
        session = base_session(rng)
        if rng.random() < 0.4:
            structural(rng, session)
        for _ in range(int(rng.integers(0, 3))):
            touched.add(mutate(rng, session))
        line = line_of(session, ["", " "][case % 2])
        try:
            slow, _ = _slow_session(line, path, 1)
        except InputError:
            slow = None
        try:
            fast, _ = _fast_session(line, path, 1)
        except (ValueError, TypeError, RecursionError):  # msgspec's DecodeError is a ValueError
            fast = None
        if fast is not None:
            assert slow is not None, f"only the fast reader accepts: {line[:500]!r}"
            equal_records(fast, slow)
            outcomes["fast"] += 1
        else:
            outcomes["refused" if slow is None else "checked_only"] += 1
    assert touched >= SESSION_KEYS | INTERACTION_KEYS | {"unknown"}, sorted(touched)
    assert outcomes["fast"] > 500 and outcomes["refused"] > 500, outcomes
