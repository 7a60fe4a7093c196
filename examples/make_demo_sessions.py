"""Writes prm_jax/data/demo_sessions.jsonl: the bundled example data set of ``prm-jax demo``.

Synthetic multi-turn agent sessions (token ids are arbitrary integers): 4 groups of 4 sessions, each a
chain of 2-4 turns with tool output between turns, some turns over the 128-token budget of the example
config, some sessions cut at the length limit, outcome rewards 0 or 1. One session branches (a retry of
its last turn), so the export clones a shared ancestor and group g1 is a tree (``credit_assignment: {mode:
tree}``). Every turn carries an implicit PRM's and the reference model's log-probs of its output tokens
(``output_prm_logprobs``, ``output_ref_logprobs``: PRIME), drawn from a second generator so that the rest
of the data does not depend on them.
"""

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "prm_jax" / "data" / "demo_sessions.jsonl"


def model_logprobs(extra, interaction):
    """The PRM scores a successful session's tokens a little higher than the reference does."""
    tilt = 0.05 if interaction.get("reward", 0.5) else -0.05
    ref = [round(lp - extra.expovariate(20.0), 4) for lp in interaction["output_logprobs"]]
    interaction["output_ref_logprobs"] = ref
    interaction["output_prm_logprobs"] = [round(min(r + tilt + extra.gauss(0, 0.02), 0.0), 4) for r in ref]


def session(rng, key, group, branching=False):
    tokens = [rng.randrange(1000) for _ in range(rng.randrange(8, 24))]
    messages = [{"role": "user", "content": f"task {key}"}]
    interactions, parent = [], None
    turns = rng.randrange(2, 5)
    for k in range(turns):
        out_len = rng.choice([rng.randrange(12, 100), rng.randrange(130, 220)])
        out = [rng.randrange(1000) for _ in range(out_len)]
        last = k == turns - 1
        interaction = {
            "id": f"{key}-t{k}", "parent_id": parent, "input_tokens": list(tokens), "output_tokens": out,
            "output_logprobs": [round(-rng.expovariate(3.0), 4) for _ in out],
            "messages": list(messages), "output_messages": [{"role": "assistant", "content": f"step {k}"}],
            "stop_reason": "length" if last and rng.random() < 0.2 else "stop",
        }
        if last:
            interaction["reward"] = float(rng.random() < 0.5)
        interactions.append(interaction)
        tool = [rng.randrange(1000) for _ in range(rng.randrange(4, 16))]
        messages = messages + [{"role": "assistant", "content": f"step {k}"}, {"role": "tool", "content": "ok"}]
        tokens = tokens + out + tool
        parent = interaction["id"]
    if branching:
        retry = dict(interactions[-1], id=f"{key}-retry", output_tokens=[1, 2, 3], output_logprobs=[-0.1] * 3,
                     stop_reason="stop", reward=1.0)
        interactions.append(retry)
    extra = random.Random(key)
    for interaction in interactions:
        model_logprobs(extra, interaction)
    return {"session_key": key, "group": group, "interactions": interactions}


def main():
    rng = random.Random(7)
    lines = [session(rng, f"g{g}-s{s}", f"g{g}", branching=(g, s) == (1, 2)) for g in range(4) for s in range(4)]
    OUT.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"wrote {len(lines)} sessions to {OUT}")


if __name__ == "__main__":
    main()
