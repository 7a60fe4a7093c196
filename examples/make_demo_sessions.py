"""Writes synthetic sessions in the JSONL session format: ``--sessions N --output PATH`` (default 16 to
``demo_sessions.jsonl`` here). With the defaults it writes the data set bundled as ``prm-jax demo``'s
(``--output prm_jax/data/demo_sessions.jsonl`` regenerates that file; it never writes into the package by
itself)::

  python examples/make_demo_sessions.py --sessions 2000 --output big.jsonl

Synthetic multi-turn agent sessions (token ids are arbitrary integers): 4 groups of 4 sessions, each a
chain of 2-4 turns with tool output between turns, some turns over the 128-token budget of the example
config, some sessions cut at the length limit, outcome rewards 0 or 1. One session branches (a retry of
its last turn), so the export clones a shared ancestor and group g1 is a tree (``credit_assignment: {mode:
tree}``). Every turn carries an implicit PRM's and the reference model's log-probs of its output tokens
(``output_prm_logprobs``, ``output_ref_logprobs``: PRIME), drawn from a second generator so that the rest
of the data does not depend on them.
"""

import argparse
import json
import random
from pathlib import Path

GROUP = 4  # sessions per group


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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=16, help="how many (groups of 4; default 16)")
    parser.add_argument("--output", type=Path, default=Path("demo_sessions.jsonl"), help="the JSONL file to write")
    args = parser.parse_args(argv)
    if args.sessions < 1:
        parser.error(f"--sessions must be at least 1, got {args.sessions}")
    rng = random.Random(7)
    lines = [session(rng, f"g{n // GROUP}-s{n % GROUP}", f"g{n // GROUP}", branching=n == GROUP + 2)
             for n in range(args.sessions)]
    args.output.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"wrote {len(lines)} sessions to {args.output}")


if __name__ == "__main__":
    main()
