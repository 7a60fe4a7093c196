"""The report of a scored run: the summary, the per-turn table and the plot of a few rows."""

from __future__ import annotations

import io
import sys
import textwrap

import numpy as np

from prm_jax.app._score import ScoreRun, ScoreSummary, failure_causes, listed, stats_text
from prm_jax.kernels._alignment import shift_to_next_token
from prm_jax.kernels._estimator_registry import registered
from prm_jax.kernels._shaping import SHAPING_MODES

# Each shaping mode's rule in one line (``prm_jax.kernels._shaping``'s docstring states them in full; A is the
# advantage without process rewards, P the turn's process reward on the timesteps that predict its tokens).
MODE_RULES = {
    "none": "no process rewards: the outcome's advantages alone (the baseline the others change)",
    "additive": "A + P on every trained timestep",
    "gvpo": "reads only P's sign: where P < 0, A < 0 grows by negative_scale, A = 0 becomes -zero_penalty, "
            "A > 0 becomes 0; P >= 0 leaves A (a 1/0 judge changes nothing)",
    "process_weighted": "P in [0, 1] weighs A: A >= 0 becomes A * P; A < 0 becomes P where P > 0 (a well-scored "
                        "turn of a failed row turns positive, AReaL's rule) and stays A where P = 0",
}
# The per-turn table's columns.
# The per-mode table's columns (its legend, as the per-turn table has TURN_COLUMNS).
MODE_COLUMNS = (("mode", "the shaping mode (none: the outcome's advantages alone)"),
                ("mean", "the mean advantage over every trained timestep of the batch, under the mode"),
                ("std", "their standard deviation (population: divided by their count)"),
                ("min, max", "the smallest and the largest of them"))
TURN_COLUMNS = (("turn", "the turn's index in its row"),
                ("tokens", "the trained timesteps of the turn (those that predict its tokens)"),
                ("P", "the turn's process reward (the scorers' weighted sum), on those timesteps"),
                ("none ... process_weighted", "the mean advantage of those timesteps under each shaping mode"))


def _process_rewards(run: ScoreRun, rows: list[int] | None = None) -> np.ndarray:
    """The process rewards on timesteps (0 where the shifted loss mask is 0, or without token rewards), of
    ``rows`` only where given (the report's few rows: one shape per bucket, so no program per run's size)."""
    pick = slice(None) if rows is None else rows
    mask = np.asarray(run.configured.loss_mask)[pick]
    if "token_rewards" not in run.batch:
        return np.zeros_like(mask)
    return np.asarray(shift_to_next_token(np.asarray(run.batch["token_rewards"])[pick])) * mask


def plot(run: ScoreRun, handle: io.BufferedWriter, rows: int = 4) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = min(rows, np.asarray(run.configured.loss_mask).shape[0])
    mask = np.asarray(run.configured.loss_mask)[:rows]
    process = _process_rewards(run, list(range(rows)))
    fig, axes = plt.subplots(rows, 1, figsize=(10, 2.6 * rows), squeeze=False)
    for b in range(rows):
        ax = axes[b, 0]
        steps = np.arange(int(run.batch["attention_mask"][b].sum()))
        ax.plot(steps, process[b, steps], label="process reward P", color="tab:green", drawstyle="steps-mid")
        ax.plot(steps, np.asarray(run.outputs["none"].advantages)[b, steps], label="advantage, unshaped",
                color="tab:gray")
        ax.plot(steps, np.asarray(run.configured.advantages)[b, steps],
                label=f"advantage, {run.summary.shaping_mode}", color="tab:blue")
        ax.fill_between(steps, 0, 1, where=mask[b, steps] > 0, color="tab:blue", alpha=0.06,
                        transform=ax.get_xaxis_transform(), label="trained timesteps")
        ax.set_ylabel(f"row {b}")
    axes[0, 0].legend(loc="upper right", fontsize=8, ncol=2)
    axes[-1, 0].set_xlabel("timestep")
    fig.suptitle("per-token process rewards and advantages before and after shaping")
    fig.tight_layout()
    try:
        fig.savefig(handle, format="png", dpi=90)
    finally:
        plt.close(fig)


def print_summary(run: ScoreRun, stream=None) -> None:
    out = stream or sys.stdout
    s = run.summary
    g = s.groups
    print(f"groups: {g.total} total, {g.accepted} accepted, {g.rejected} rejected, {g.filtered} filtered;"
          f" {s.trajectories} trajectories in the batch{trajectories_why(s)}", file=out)
    shown = list(s.rejected_groups.items())
    for group, rejection in shown[:10]:
        why = f": {rejection.reason}" if isinstance(rejection.reason, str) else ""
        print(f"  {rejection.status} group {group} (sessions {', '.join(rejection.sessions)}){why}", file=out)
    if len(shown) > 10:
        print(f"  ... and {len(shown) - 10} more (metrics.json lists every one)", file=out)
    causes = failure_causes(s.rejected_groups)
    if causes:  # each cause once, with the sessions it hit (a judge that is down: one line)
        print("why sessions were rejected (each cause once):", file=out)
        for cause, keys in causes[:10]:
            print(f"  {len(keys)} session(s) ({listed(keys)}): {cause}", file=out)
    fallbacks = s.prm_fallbacks or {}
    if fallbacks:  # error_policy: keep_original exported these unscored: said here, not only in metrics.json
        print(f"{len(fallbacks)} session(s) exported unscored after a scorer failed (error_policy: keep_original):",
              file=out)
        for key, why in list(fallbacks.items())[:10]:
            print(f"  {key}: {why}", file=out)
        if len(fallbacks) > 10:
            print(f"  ... and {len(fallbacks) - 10} more (metrics.json lists every one)", file=out)
    for spec in registered():
        if spec.summary is not None and spec.summary.key in s.estimator:
            print(spec.summary.line(s.estimator[spec.summary.key]), file=out)
    if run.scorer_stats:  # each scorer's calls, failures, timeouts, latency (and a served one's requests)
        print("scorers:", file=out)
        for name, counts in run.scorer_stats.items():
            print(f"  {name:<24} {stats_text(counts)}", file=out)
    if s.credit:
        print("credit assignment: " + ", ".join(f"{key} {value:g}" for key, value in s.credit.items()), file=out)
    if s.process_reward_per_scorer:
        print("mean process reward per turn (weighted), per scorer:", file=out)
        for scorer, value in s.process_reward_per_scorer.items():
            print(f"  {scorer:<24} {value:10.4f}", file=out)
    print(f"advantages on trained timesteps, per shaping mode (configured: {s.shaping_mode}):", file=out)
    print(f"  {'mode':<18} {'mean':>9} {'std':>9} {'min':>9} {'max':>9}", file=out)
    for mode, stats in s.advantages.items():
        if isinstance(stats, str):
            print(f"  {mode:<18} {stats}", file=out)
        else:
            print(f"  {mode:<18} {stats.mean:9.4f} {stats.std:9.4f} {stats.min:9.4f} {stats.max:9.4f}", file=out)
    print("columns:", file=out)
    for name, what in MODE_COLUMNS:
        print(f"  {name:<18} {what}", file=out)
    print("each mode's rule (A: the advantage without process rewards; P: the process reward on a timestep):",
          file=out)
    negative = "token_rewards" in run.batch and bool((np.asarray(run.batch["token_rewards"]) < 0).any())
    for mode in s.advantages:
        if mode in MODE_RULES:
            rule = MODE_RULES[mode] + ("; no P < 0 here, so it equals none" if mode == "gvpo" and not negative else "")
            print(textwrap.fill(rule, 116, initial_indent=f"  {mode:<18} ", subsequent_indent=" " * 21), file=out)
    change = process_change(run)
    if change:
        print(textwrap.fill(change, 118, subsequent_indent="  "), file=out)


def trajectories_why(summary: ScoreSummary) -> str:
    """Why the batch's rows are not one a session, where they are not: a session whose turns branch (a
    tree of interactions) gives one trajectory per leaf; '' where each accepted session is one row."""
    sessions, branched = summary.sessions, summary.branched_sessions
    if sessions is None or sessions == summary.trajectories:
        return ""
    return (f" ({sessions} sessions, one trajectory per leaf of a session's turns: {branched} "
            f"{'session branches' if branched == 1 else 'sessions branch'})")


def process_change(run: ScoreRun) -> str:
    """One line: what the process rewards changed under the configured mode: how many trained timesteps'
    advantages moved from the mode ``none`` (the diagnostics' ``shaping_changed_share``, counted), by how
    much, and how many changed sign (``shaping_sign_flip_share``); '' where no mode shaped."""
    mode = run.summary.shaping_mode
    shaped, unshaped = run.outputs.get(mode or ""), run.outputs.get("none")
    if mode is None or mode == "none" or shaped is None or unshaped is None or isinstance(shaped, str):
        return ""
    mask = np.asarray(run.configured.loss_mask) > 0
    after, before = np.asarray(shaped.advantages)[mask], np.asarray(unshaped.advantages)[mask]
    delta = np.abs(after - before)
    moved = int(np.count_nonzero(delta))
    flipped = int(np.count_nonzero(np.sign(after) * np.sign(before) < 0))
    size = f", by {float(delta[delta > 0].mean()):.3f} on average and {float(delta.max()):.3f} at most" if moved else ""
    return (f"process rewards ({mode}) moved the advantages of {moved:,} of {mask.sum():,} trained timesteps "
            f"({moved / max(int(mask.sum()), 1):.0%}){size}; {flipped:,} changed sign")


def shown_rows(original_rewards: np.ndarray, rows: int = 2) -> list[int]:
    """The rows the turn table shows: the first success beside the first failure (outcome reward above or
    at most 0) when the batch has both, then the next rows in order, ``rows`` in all."""
    rewards = np.asarray(original_rewards)
    picked = [int(np.flatnonzero(rewards > 0)[0])] if (rewards > 0).any() else []
    picked += [int(np.flatnonzero(rewards <= 0)[0])] if (rewards <= 0).any() else []
    picked += [b for b in range(rewards.shape[0]) if b not in picked]
    return sorted(picked[:rows])


def print_turn_table(run: ScoreRun, rows: int = 2, stream=None) -> None:
    """Per turn of a success and a failure (``shown_rows``): the process reward next to the mean advantage
    under each mode."""
    out = stream or sys.stdout
    modes = [m for m in ("none", *SHAPING_MODES) if m in run.outputs and not isinstance(run.outputs[m], str)]
    shown = shown_rows(run.batch["original_rewards"], rows)
    turn_ids = np.asarray(shift_to_next_token(np.asarray(run.batch["turn_ids"])[shown], fill=-1))
    mask = np.asarray(run.configured.loss_mask)[shown] > 0
    process = _process_rewards(run, shown)
    print("per turn (timesteps predicting the turn's tokens): process reward and mean advantage per mode", file=out)
    for i, b in enumerate(shown):
        print(f"row {b}: outcome reward {run.batch['original_rewards'][b]:g} (group-normalized "
              f"{run.batch['rewards'][b]:.3f}), {'truncated' if run.batch['is_truncated'][b] else 'complete'}",
              file=out)
        print(f"  {'turn':>4} {'tokens':>6} {'P':>7} " + " ".join(f"{m:>16}" for m in modes), file=out)
        for k in sorted(set(turn_ids[i][mask[i]].tolist())):
            steps = mask[i] & (turn_ids[i] == k)
            p = float(process[i][steps].mean())
            cells = " ".join(f"{float(np.asarray(run.outputs[m].advantages)[b][steps].mean()):16.4f}" for m in modes)
            print(f"  {k:>4} {int(steps.sum()):>6} {p:7.3f} {cells}", file=out)
    print("columns:", file=out)
    for name, what in TURN_COLUMNS:
        print(f"  {name:<26} {what}", file=out)


