"""A synthetic AReaL-style rollout dump (each turn's ``input_tokens`` repeats the whole prefix), the input
of ``benchmarks/bench_cli.py`` and of the host-path tests.

  generate(path, sessions=2000, turns=8, tokens=300, group=8)  # ~228 MB
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def generate(path: Path, sessions: int, turns: int, tokens: int, group: int, seed: int = 0) -> int:
    """Writes the sessions; returns the file's size in bytes."""
    rng = random.Random(seed)
    with open(path, "w") as out:
        for s in range(sessions):
            prefix = [rng.randrange(50_000) for _ in range(rng.randrange(100, 400))]
            interactions, parent = [], None
            for k in range(turns):
                n_out = max(1, int(rng.gauss(tokens, tokens / 4)))
                output = [rng.randrange(50_000) for _ in range(n_out)]
                item = {"id": f"s{s}-t{k}", "parent_id": parent, "input_tokens": prefix,
                        "output_tokens": output,
                        "output_logprobs": [round(-rng.random() * 3, 4) for _ in range(n_out)],
                        "messages": [{"role": "user", "content": f"step {k} of task {s // group}"}],
                        "output_messages": [{"role": "assistant", "content": "..."}],
                        "stop_reason": "stop"}
                if k == turns - 1:
                    item["reward"] = float(rng.random() < 0.5)
                interactions.append(item)
                tool = [rng.randrange(50_000) for _ in range(rng.randrange(5, 40))]
                prefix = prefix + output + tool
                parent = item["id"]
            out.write(json.dumps({"session_key": f"s{s}", "group": f"g{s // group}",
                                  "interactions": interactions}) + "\n")
    return path.stat().st_size
