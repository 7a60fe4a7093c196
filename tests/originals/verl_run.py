"""verl's own estimators and ``agg_loss`` on seeded inputs (issue 44: "the originals' outputs where their code
can be run"), for ``compare.py``. Not part of the suite: it needs torch (``/opt/wheels`` here) and a checkout of
verl-project/verl at 1dda039b (the commit the verl citations name)::

  VENV/bin/python tests/originals/verl_run.py VERL_CHECKOUT verl.npz   # a venv with torch and numpy
  .venv/bin/python tests/originals/compare.py verl.npz

verl's functions (``core_algos.py``: REINFORCE++, REINFORCE++-baseline, multi-turn OTB, ``agg_loss``; and the
``torch_functional.py`` helpers they call) are taken out of its files by name with ``ast`` (its package
imports far more than torch) and run as written; rows with tool-output holes, an empty row, three groups.
"""
import ast
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

VERL = Path(sys.argv[1])

def extract(path, names):
    tree = ast.parse(open(path).read())
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.decorator_list = []
            out.append(ast.unparse(node))
    return "\n\n".join(out)

F = types.SimpleNamespace()
ns_f = {"torch": torch, "np": np, "Optional": Optional, "Any": Any}
exec(extract(VERL / "verl/utils/torch_functional.py", {"masked_sum", "masked_mean", "masked_var", "masked_whiten"}), ns_f)
for k in ("masked_sum", "masked_mean", "masked_var", "masked_whiten"):
    setattr(F, k, ns_f[k])
ns = {"torch": torch, "np": np, "defaultdict": defaultdict, "Optional": Optional, "Any": Any, "verl_F": F,
      "AlgoConfig": Any, "ActorConfig": Any, "DictConfig": Any}
exec(extract(VERL / "verl/trainer/ppo/core_algos.py", {"compute_reinforce_plus_plus_outcome_advantage",
                                    "compute_reinforce_plus_plus_baseline_outcome_advantage",
                                    "compute_multi_turn_optimal_token_baseline_advantage", "agg_loss"}), ns)

rng = np.random.default_rng(44)
B, T = 12, 40
mask = np.ones((B, T), np.float32)
for b in range(B):  # each row: a generated span, a tool output (hole), another span, then padding
    n = int(rng.integers(6, T))
    mask[b, n:] = 0
    h = int(rng.integers(1, max(2, n - 3)))
    mask[b, h:h + int(rng.integers(0, 4))] = 0
mask[5] = 0  # an empty row
rewards = (rng.normal(size=(B, T)) * (rng.random((B, T)) < 0.15)).astype(np.float32)
index = np.repeat(np.arange(3), 4)
old = (-rng.exponential(0.8, (B, T))).astype(np.float32)
pi = np.exp(old.astype(np.float64))
spi = (pi ** 2 + (1 - pi) ** 2 * rng.uniform(0, 1, (B, T))).astype(np.float32)
rho = rng.uniform(0.7, 1.3, (B, T)).astype(np.float32)
loss_mat = rng.normal(size=(B, T)).astype(np.float32)
t = lambda x: torch.tensor(x)
out = {"mask": mask, "rewards": rewards, "index": index, "old": old, "spi": spi, "rho": rho, "loss_mat": loss_mat}
cfg = types.SimpleNamespace(gamma=0.9)
a, r = ns["compute_reinforce_plus_plus_outcome_advantage"](t(rewards), t(mask), config=cfg)
out["rpp_adv"], out["rpp_ret"] = a.numpy(), r.numpy()
a, r = ns["compute_reinforce_plus_plus_baseline_outcome_advantage"](t(rewards), t(mask), index, config=cfg)
out["rppb_adv"], out["rppb_ret"] = a.numpy(), r.numpy()
# Well-formed input (no reward on a masked token), where prm-jax's rules where verl's break (the credit-assignment guide states
# each) says the two agree exactly.
a, r = ns["compute_reinforce_plus_plus_baseline_outcome_advantage"](t(rewards * mask), t(mask), index, config=cfg)
out["rppb_wf_adv"], out["rppb_wf_ret"] = a.numpy(), r.numpy()
for weighted in (False, True):
    a, r = ns["compute_multi_turn_optimal_token_baseline_advantage"](
        t(rewards), t(mask), index, old_log_probs=t(old), sum_pi_squared=t(spi),
        rollout_is_weights=t(rho) if weighted else None)
    out[f"otb{int(weighted)}_adv"], out[f"otb{int(weighted)}_ret"] = a.numpy(), r.numpy()
for mode in ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
    info = {"dp_size": 2, "batch_num_tokens": int(mask.sum()), "global_batch_size": B}
    pieces = []
    for rows in ([0, 1, 2], [3, 4, 5], [6, 7, 8, 9], [10, 11]):
        idx = np.asarray(rows)
        pieces.append(float(ns["agg_loss"](t(loss_mat[idx]), t(mask[idx]), mode, loss_scale_factor=8.0, **info)))
    out[f"agg_{mode}"] = np.array(pieces, np.float64)
    out[f"agg_local_{mode}"] = np.array(float(ns["agg_loss"](t(loss_mat), t(mask), mode, loss_scale_factor=8.0)))
np.savez(sys.argv[2], **out)
print("verl outputs:", sorted(out))
