"""prm-jax against verl's own outputs on the same seeded inputs (``verl_run.py``'s .npz; its docstring says how
to run both). Prints each comparison and the count that agree within float32 rounding; the two differences
prm-jax's rules where verl's break (the credit-assignment guide states each) decides are checked as differences (OTB's returns
compared at trained tokens: verl's hold G in
holes too; REINFORCE++-baseline with rewards on masked tokens: verl sums them into a row's score)."""
import sys

import jax.numpy as jnp
import numpy as np

from prm_jax import credit
from prm_jax.kernels._policy_loss import GlobalBatch, aggregate

v = dict(np.load(sys.argv[1]))
mask, rewards, index = v["mask"] > 0, v["rewards"], v["index"].astype(np.int32)
report = []

def check(name, got, want, tol=2e-5):
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want))) if np.size(want) else 0.0
    report.append((name, err, err <= tol * max(1.0, float(np.max(np.abs(want))))))

out = credit.reinforce_pp(rewards, mask, gamma=0.9)
check("reinforce_pp advantages", out.advantages, v["rpp_adv"])
check("reinforce_pp returns", out.returns, v["rpp_ret"])
out = credit.reinforce_pp(rewards * mask, mask, baseline=True, group_ids=index)
check("reinforce_pp_baseline advantages", out.advantages, v["rppb_wf_adv"])
check("reinforce_pp_baseline returns", out.returns, v["rppb_wf_ret"])
# With rewards on masked tokens verl sums them into a row's score, prm-jax does not (prm-jax's rules where verl's break (the
# credit-assignment guide states each)): they
# differ there, by design.
out = credit.reinforce_pp(rewards, mask, baseline=True, group_ids=index)
differs = float(np.max(np.abs(np.asarray(out.advantages) - v["rppb_adv"])))
report.append(("reinforce_pp_baseline, rewards on masked tokens (5.2: differs)", differs, differs > 1e-3))
for weighted in (0, 1):
    for alignment in ("native", "scatter"):
        out = credit.optimal_token_baseline(rewards, mask, v["old"], v["spi"], group_ids=index,
                                            rollout_is_weights=v["rho"] if weighted else None, alignment=alignment)
        check(f"otb advantages ({'rho' if weighted else 'no rho'}, {alignment})", out.advantages, v[f"otb{weighted}_adv"])
        # (verl's returns hold G inside holes too; prm-jax's are 0 off the trained tokens: prm-jax's rules where verl's break
        # (the credit-assignment guide states each))
        check(f"otb returns at trained tokens ({'rho' if weighted else 'no rho'}, {alignment})",
              np.asarray(out.returns)[mask], v[f"otb{weighted}_ret"][mask])
rows_of = ([0, 1, 2], [3, 4, 5], [6, 7, 8, 9], [10, 11])
for mode in ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
    batch = GlobalBatch(2, int(mask.sum()), mask.shape[0])
    pieces = [float(aggregate(jnp.asarray(v["loss_mat"][np.asarray(r)]), jnp.asarray(mask[np.asarray(r)]), mode, 8.0, batch))
              for r in rows_of]
    check(f"agg_loss {mode}, 4 micro-batches, dp 2", pieces, v[f"agg_{mode}"])
    check(f"agg_loss {mode}, local", float(aggregate(jnp.asarray(v["loss_mat"]), jnp.asarray(mask), mode, 8.0)),
          v[f"agg_local_{mode}"])
width = max(len(n) for n, _, _ in report)
for name, err, ok in report:
    print(f"{name:<{width}}  max |diff| {err:.2e}  {'ok' if ok else 'DIFFERS'}")
print(f"{sum(ok for *_, ok in report)}/{len(report)} agree within float32 rounding")
