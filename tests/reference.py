"""Independent float64 references, written as plain loops over rows and timesteps.

Nothing here imports prm_jax: these are AReaL's semantics (alignment, the advantage pipeline,
normalization, the group filters) spelled out one element at a time, so a vectorization bug in the
library cannot hide in the reference too.
"""

from __future__ import annotations

import math

import numpy as np


def shift(x, fill=0):
    x = np.asarray(x)
    out = np.empty_like(x)
    rows, width = x.shape
    for b in range(rows):
        for t in range(width):
            out[b, t] = x[b, t + 1] if t + 1 < width else fill
    return out


def gae(rewards, values, mask, gamma, lam, bootstrap):
    """The AReaL loop: right to left, masked timesteps carry (last, nextv) unchanged."""
    rewards, values, mask = (np.asarray(a, np.float64) for a in (rewards, values, mask))
    rows, width = rewards.shape
    lam = np.broadcast_to(np.asarray(lam, np.float64), (rows,))
    advantages = np.zeros((rows, width))
    for b in range(rows):
        last, next_value = 0.0, float(bootstrap[b])
        for t in reversed(range(width)):
            if mask[b, t]:
                delta = rewards[b, t] + gamma * next_value - values[b, t]
                last = delta + gamma * lam[b] * last
                next_value = values[b, t]
            advantages[b, t] = last
    return advantages, advantages + values


def turn_gae(rewards, values, mask, turn_ids, gamma, lam, bootstrap, num_turns):
    rewards, values = np.asarray(rewards, np.float64), np.asarray(values, np.float64)
    rows, width = rewards.shape
    lam = np.broadcast_to(np.asarray(lam, np.float64), (rows,))
    advantages = np.zeros((rows, width))
    returns = np.zeros((rows, width))
    for b in range(rows):
        turn_reward, turn_value = {}, {}
        for t in range(width):
            k = int(turn_ids[b, t])
            if mask[b, t] and 0 <= k < num_turns:
                turn_reward[k] = turn_reward.get(k, 0.0) + rewards[b, t]
                turn_value.setdefault(k, values[b, t])
        turn_adv = {}
        last, next_value = 0.0, float(bootstrap[b])
        for k in sorted(turn_reward, reverse=True):
            last = turn_reward[k] + gamma * next_value - turn_value[k] + gamma * lam[b] * last
            next_value = turn_value[k]
            turn_adv[k] = last
        for t in range(width):
            k = int(turn_ids[b, t])
            if mask[b, t] and 0 <= k < num_turns:
                advantages[b, t] = turn_adv[k]
                returns[b, t] = turn_adv[k] + turn_value[k]
            else:
                advantages[b, t] = 0.0
                returns[b, t] = values[b, t]
    return advantages, returns


def group_of_rows(rows, group_size=1, group_sizes=None):
    if group_sizes is None:
        return [b // group_size for b in range(rows)]
    out = []
    for g, size in enumerate(group_sizes):
        out += [g] * int(size)
    return out


def normalize(x, mask, *, mean_level="batch", std_level="batch", mean_leave1out=False, std_unbiased=True,
              eps=1e-5, group_size=1, group_sizes=None, group_member_counts=None):
    """AReaL's ``Normalization``, one entry at a time."""
    x = np.asarray(x, np.float64)
    mask = np.asarray(mask).astype(bool)
    flat = x.ndim == 1
    if flat:
        x, mask = x[:, None], mask[:, None]
    rows, width = x.shape
    groups = group_of_rows(rows, group_size, group_sizes)
    if not mask.any():
        return x[:, 0] if flat else x

    def members(level, b):
        return [c for c in range(rows) if level == "batch" or groups[c] == groups[b]]

    def single_member(level, b):
        if level == "batch":
            return False
        if group_member_counts is not None:
            return int(group_member_counts[groups[b]]) == 1
        return len(members(level, b)) == 1

    def entries(level, b):
        return [(c, t) for c in members(level, b) for t in range(width) if mask[c, t]]

    def mean_at(b, t):
        if mean_level is None:
            return 0.0
        vals = [x[c, s] for c, s in entries(mean_level, b)]
        n = len(vals)
        if mean_leave1out:
            if single_member(mean_level, b):
                return x[b, t]
            if n <= 1:
                return 0.0
            return (math.fsum(vals) - x[b, t]) / (n - 1) if mask[b, t] else math.fsum(vals) / n
        return math.fsum(vals) / n if n else 0.0

    def std_at(b):
        level_entries = entries(std_level, b)
        n = len(level_entries)
        if std_unbiased and single_member(std_level, b):
            return 1.0
        ss = math.fsum((x[c, s] - mean_at(c, s)) ** 2 for c, s in level_entries)
        if std_unbiased:
            return math.sqrt(ss / (n - 1)) if n > 1 else 1.0
        return math.sqrt(ss / n) if n > 0 else 1.0

    out = np.zeros_like(x)
    for b in range(rows):
        std, e = (1.0, 0.0) if std_level is None else (std_at(b), eps)
        for t in range(width):
            if mask[b, t]:
                out[b, t] = (x[b, t] - mean_at(b, t)) / (std + e)
    return out[:, 0] if flat else out


def shape(advantages, process, mask, mode, negative_scale=0.2, zero_penalty=0.4, zero_eps=1e-6):
    advantages = np.asarray(advantages, np.float64).copy()
    rows, width = advantages.shape
    for b in range(rows):
        for t in range(width):
            if not mask[b, t]:
                continue
            a, p = advantages[b, t], float(process[b, t])
            if mode == "additive":
                a = a + p
            elif mode == "gvpo":
                if p < 0:
                    if a < -zero_eps:
                        a = (1 + negative_scale) * a
                    elif a > zero_eps:
                        a = 0.0
                    else:
                        a = -zero_penalty
            else:
                if a >= 0:
                    a = a * p
                elif p > 0:
                    a = p
            advantages[b, t] = a
    return advantages


def kl(logp, ref, estimator, clamp=10.0):
    d = logp - ref
    if estimator == "k1":
        value = d
    elif estimator == "k2":
        value = d * d / 2
    else:
        value = math.exp(ref - logp) - 1 - (ref - logp)
    return min(max(value, -clamp), clamp)


def gae_lambda_fn(name, row_mask, row_turn_ids, unit, **kwargs):
    """AReaL's built-in λ functions for one row, from its timestep mask and turn ids."""
    tokens = sum(1 for a in row_mask if a)
    turns = 0
    if row_turn_ids is not None:
        turns = len({int(k) for a, k in zip(row_mask, row_turn_ids) if a})
    length = tokens if unit == "token" else turns
    name = name.rsplit(".", 1)[-1]
    if name == "constant_gae_lambda":
        return kwargs["value"]
    if name == "vapo_length_adaptive_gae":
        return max(0.0, 1.0 - 1.0 / (kwargs["alpha"] * length)) if length > 0 else 0.0
    if name == "relative_position_gae_lambda":
        if length >= 2:
            return kwargs["q"] ** (1.0 / (length - 1))
        return 1.0 if length == 1 else 0.0
    raise ValueError(name)


def _groups_of(batch, rows):
    """Each row's GRPO group: from ``group_sizes``, or consecutive ``group_ids``, else one group."""
    if batch.get("group_sizes") is not None:
        return group_of_rows(rows, group_sizes=np.asarray(batch["group_sizes"]))
    if batch.get("group_ids") is not None:
        return [int(g) for g in np.asarray(batch["group_ids"])]
    return [0] * rows


def _sizes_of(batch, rows):
    """``group_sizes`` for ``normalize`` (consecutive ``group_ids`` give the same groups)."""
    if batch.get("group_sizes") is not None or batch.get("group_ids") is None:
        return batch.get("group_sizes")
    ids = [int(g) for g in np.asarray(batch["group_ids"])]
    assert ids == sorted(ids), "reference: consecutive group_ids only"
    return [ids.count(g) for g in sorted(set(ids))]


def compute_advantages(batch, cfg):
    """The advantage pipeline step by step. ``cfg`` is a plain dict of AdvantageConfig fields (norms as dicts;
    ``credit_assignment``, ``process_reward_transform`` and a decoupled ``reward_norm`` as ``{mode: ...}``;
    the shaping as ``shaping`` or, as AdvantageConfig names it, ``advantage_shaping``)."""
    c = dict(discount=1.0, gae_lambda=1.0, kl_ctl=0.1, kl_estimator="k1", kl_clamp=10.0, reward_bias=0.0,
             reward_scaling=1.0,
             reward_clip=20.0, mask_no_eos_with_zero=False, token_rewards_as_adv=True, gae_timestep_unit="token",
             reward_norm=None, adv_norm=None, shaping=dict(mode="additive"), max_turns=None,
             overlong_reward_penalty=False, credit_assignment=None, process_reward_transform=None)
    c.update(cfg)
    if "advantage_shaping" in c:
        c["shaping"] = dict(c.pop("advantage_shaping"))
    credit = dict(c["credit_assignment"] or {})
    mode = credit.pop("mode", None)
    attention = np.asarray(batch["attention_mask"]).astype(bool)
    loss_mask = np.asarray(batch["loss_mask"]).astype(bool)
    rows, width = attention.shape
    f64 = lambda key: np.asarray(batch[key], np.float64)
    seqlen = attention.sum(1)
    rewards = f64("rewards").copy()
    values = f64("values") if "values" in batch else np.zeros((rows, width))
    gs = _sizes_of(batch, rows)
    groups = _groups_of(batch, rows)

    # 1
    for b in range(rows):
        if c["overlong_reward_penalty"]:
            exceed = loss_mask[b].sum() - (c["max_new_tokens"] - c["overlong_tokens"])
            rewards[b] += min(-exceed / c["overlong_tokens"] * c["overlong_penalty_factor"], 0.0)
        rewards[b] = min(max((rewards[b] + c["reward_bias"]) * c["reward_scaling"], -c["reward_clip"]),
                         c["reward_clip"])
    gmc = batch.get("group_member_counts")
    norm = c["reward_norm"]
    if norm is not None and norm.get("mode") == "decoupled":
        sources = [rewards[:, None]] + ([f64("reward_sources")] if "reward_sources" in batch else [])
        columns = np.concatenate(sources, axis=1)
        weights = norm.get("weights") or [1.0] * columns.shape[1]
        rewards = decoupled(columns, weights, groups, norm.get("eps", 1e-4))
    elif norm is not None:
        rewards = normalize(rewards, np.ones(rows, bool), group_sizes=gs, group_member_counts=gmc, **norm)

    # 2
    m = shift(loss_mask, False).astype(bool)
    # Rollout-side arrays are shifted; model outputs (ref, prox, values) are already on timesteps.
    logp = np.where(m, f64("prox_logprobs") if "prox_logprobs" in batch else shift(f64("logprobs")), 0.0)
    ref = np.where(m, f64("ref_logprobs"), 0.0) if "ref_logprobs" in batch else np.zeros((rows, width))
    tids = shift(np.asarray(batch["turn_ids"]), -1) if "turn_ids" in batch else None
    has_p = "token_rewards" in batch
    process = np.where(m, shift(f64("token_rewards")), 0.0) if has_p else None
    ends = turn_ends(m, tids)
    transform = c["process_reward_transform"]
    if has_p and transform is not None and transform.get("mode") == "progress":
        scored = shift(np.asarray(batch["token_reward_mask"]).astype(bool), False) if "token_reward_mask" in batch \
            else np.ones((rows, width), bool)
        process = progress(process, m, tids, scored & m, rewards, **{k: v for k, v in transform.items() if k != "mode"})
    elif has_p and transform is not None:  # min-form: each turn's reward at its end, over the turn's timesteps
        r = min_form(np.where(ends, process, 0.0), ends, transform.get("temperature", 0.1))
        spread = np.zeros((rows, width))
        for b in range(rows):
            for t in range(width):
                if m[b, t]:
                    spread[b, t] = r[b, next(u for u in range(t, width) if ends[b, u])]
        process = spread

    # 3
    kl_rewards = np.zeros((rows, width))
    for b in range(rows):
        for t in range(width):
            if c["kl_ctl"] != 0 and m[b, t] and t != seqlen[b] - 1:
                kl_rewards[b, t] = -c["kl_ctl"] * kl(logp[b, t], ref[b, t], c["kl_estimator"], c["kl_clamp"])

    # 4
    truncated = (np.asarray(batch["is_truncated"]).astype(bool) if "is_truncated" in batch
                 else seqlen == width)
    tot = np.zeros((rows, width))
    outcome = rewards.copy()  # what every estimator reads: 0 on truncated rows under mask_no_eos_with_zero
    for b in range(rows):
        if c["mask_no_eos_with_zero"] and truncated[b]:
            outcome[b] = 0.0
            if has_p:
                process[b] = 0.0
        tot[b, max(seqlen[b] - 2, 0)] += outcome[b]
    outcome_step = np.maximum(seqlen - 2, 0)

    # 5 fold (not under PURE, whose returns take the process rewards)
    if has_p and not c["token_rewards_as_adv"] and mode != "pure":
        for b in range(rows):
            for t in range(width):
                if not m[b, t]:
                    continue
                following = next_in_turn(m, tids, b, t)
                if following is not None:
                    assert process[b, t] == process[b, following], "reference: non-uniform turn"
                else:
                    tot[b, t] += process[b, t]

    # 6-7
    bootstrap = np.array([values[b, max(seqlen[b] - 1, 0)] if truncated[b] else 0.0 for b in range(rows)])
    if "gae_lambda" in batch:
        lam = f64("gae_lambda")
    elif isinstance(c["gae_lambda"], str):
        lam = np.array([gae_lambda_fn(c["gae_lambda"], m[b], None if tids is None else tids[b],
                                      c["gae_timestep_unit"], **dict(c.get("gae_lambda_kwargs", {})))
                        for b in range(rows)])
    else:
        lam = c["gae_lambda"]
    if mode in CREDIT_FROM_REWARDS:  # an estimator that takes the task rewards with the KL rewards in them
        real = attention.any(axis=1)
        model = {"logprobs": logp, "turn_ids": tids, **{key: f64(key) if key in batch else None
                                      for key in ("sum_pi_squared", "rollout_is_weights")}}
        advantages, returns = CREDIT_FROM_REWARDS[mode](credit, tot + kl_rewards, m, groups, real, c["discount"],
                                                        model)
    elif mode is not None:
        advantages = _credit(mode, credit, batch, m, tids, ends, process, outcome, outcome_step, groups) + kl_rewards
        returns = advantages + values
    elif c["gae_timestep_unit"] == "token":
        tot = tot + kl_rewards
        advantages, returns = gae(tot, values, m, c["discount"], lam, bootstrap)
    else:
        advantages, returns = turn_gae(tot, values, m, tids, c["discount"], lam, bootstrap,
                                       c["max_turns"] or width)
        advantages = advantages + kl_rewards
    if mode is not None or c["gae_timestep_unit"] != "token":
        tot = tot + kl_rewards

    # 8
    if c["adv_norm"] is not None:
        advantages = normalize(advantages, m, group_sizes=gs, group_member_counts=gmc, **c["adv_norm"])

    # 9
    if has_p and c["token_rewards_as_adv"] and mode != "pure":
        advantages = shape(advantages, process, m, **c["shaping"])
    return dict(advantages=advantages, returns=returns, kl_rewards=kl_rewards, tot_rewards=tot,
                loss_mask=m.astype(np.float64), logprobs=logp)


def _credit(mode, options, batch, m, tids, ends, process, outcome, outcome_step, groups):
    """Steps 6-7 of a credit mode: per-timestep advantages, before the KL rewards (the authors' rules, each named in its
    kernel's docstring), from
    the mode's float64 reference in ``CREDIT``."""
    if mode not in CREDIT:
        raise NotImplementedError(f"estimator {mode!r} is registered but has no float64 reference: add one to "
                                  "tests/reference.py's CREDIT")
    p = np.zeros(m.shape) if process is None else process
    return CREDIT[mode](options, batch, m, tids, ends, p, outcome, outcome_step, groups)


def _credit_pure(options, batch, m, tids, ends, p, outcome, outcome_step, groups):
    advantages, _ = pure(p, outcome, m, tids, outcome_step, groups, options.get("temperature", 0.1),
                         options.get("verifier_coef", 1.0), options.get("whiten", True))
    return advantages


def _credit_prime(options, batch, m, tids, ends, p, outcome, outcome_step, groups):
    prm = np.where(m, np.asarray(batch["prm_logprobs"], np.float64), 0.0)
    ref = np.where(m, np.asarray(batch["ref_logprobs"], np.float64), 0.0)
    advantages, _, _ = prime(prm, ref, outcome, m, groups, beta=options.get("beta", 0.05),
                             lam=options.get("lam", 0.0), use_gt=options.get("use_gt", False),
                             dpo_coef=options.get("dpo_coef", 5.0), gt_coef=options.get("gt_coef", 5.0),
                             batch_norm=options.get("norm", "batch_norm") == "batch_norm")
    return advantages


def _credit_gigpo(options, batch, m, tids, ends, p, outcome, outcome_step, groups):
    rows, width = m.shape
    turns = next((np.shape(batch[k])[1] for k in ("turn_rewards", "anchor_ids") if k in batch), width)
    counts, sums, last = np.zeros((rows, turns)), np.zeros((rows, turns)), np.zeros((rows, turns))
    for b in range(rows):
        for t in range(width):
            if m[b, t] and 0 <= tids[b, t] < turns:
                k = tids[b, t]
                counts[b, k] += 1
                sums[b, k] += p[b, t]
                if ends[b, t]:
                    last[b, k] = p[b, t]
    rule = options.get("step_reward", "mean")
    step = {"sum": sums, "mean": sums / np.maximum(counts, 1), "last": last}[rule]
    if "turn_rewards" in batch:
        given = np.asarray(batch["turn_rewards"], np.float64)
        use = np.asarray(batch["turn_reward_mask"]).astype(bool) if "turn_reward_mask" in batch else True
        step = np.where(use, given, step)
    per_turn, *_ = gigpo(step, counts > 0, outcome, batch.get("anchor_ids"), groups=groups,
                         step_weight=options.get("step_weight", 1.0), step_discount=options.get("step_discount", 0.95),
                         norm=options.get("norm", "mean_norm"), eps=options.get("eps", 1e-6),
                         episode_stats=options.get("episode_stats", "trajectory"))
    return np.array([[per_turn[b, tids[b, t]] if m[b, t] and 0 <= tids[b, t] < turns else 0.0
                      for t in range(width)] for b in range(rows)])


def _credit_tree(options, batch, m, tids, ends, p, outcome, outcome_step, groups):
    rows, width = m.shape
    node_ids = np.asarray(batch["node_ids"])
    parents = np.asarray(batch["node_parents"])
    size = len(parents)
    used = np.zeros(size, bool)
    leaf_reward = np.zeros(size)
    node_group = np.zeros(size, int)
    for b in range(rows):
        path = [int(n) for n in node_ids[b] if 0 <= n < size]
        for node in path:
            used[node] = True
            node_group[node] = groups[b]
        if path:
            leaf_reward[path[-1]] = outcome[b]
    values = tree_advantages(parents, leaf_reward, mask=used, group=node_group,
                             weighting=options.get("weighting", "sqrt"), value=options.get("value", "state_value"))
    return np.array([[values[node_ids[b, tids[b, t]]] if m[b, t] and 0 <= tids[b, t] < node_ids.shape[1] else 0.0
                      for t in range(width)] for b in range(rows)])


def _credit_rloo(options, batch, m, tids, ends, p, outcome, outcome_step, groups):
    """The RLOO plug-in (tests/rloo_estimator.py): ``R_i - mean_{j != i} R_j`` over the other real rows of
    row ``i``'s group on its trained timesteps; 0 for a row alone in its group."""
    rows, width = m.shape
    real = np.asarray(batch["attention_mask"]).astype(bool).any(axis=1)
    out = np.zeros((rows, width))
    for b in range(rows):
        others = [c for c in range(rows) if real[c] and c != b and groups[c] == groups[b]]
        if real[b] and others:
            out[b] = np.where(m[b], outcome[b] - math.fsum(outcome[c] for c in others) / len(others), 0.0)
    return out


def reinforce_pp(rewards, mask, gamma, groups, real, baseline=False):
    """REINFORCE++ after verl's #7300 and its baseline variant (verl's REINFORCE++ after its fix #7300 (verl-project/verl @
    1dda039b, core_algos.py compute_reinforce_plus_plus_outcome_advantage; arXiv 2501.03262); prm-jax's rules where verl's break
    (the credit-assignment guide states each)), in plain loops:
    ``(advantages, returns)``. The return runs backwards over trained timesteps only (a masked one passes the
    running return on, undiscounted, and its reward is not read); the baseline variant sums each row's rewards
    on trained timesteps and subtracts its group's mean over every real row of the group (0 for a group of one);
    both whiten over every trained timestep of the batch (mean over N, unbiased variance, +1e-8), 0 for fewer
    than two."""
    rows, width = mask.shape
    g = np.zeros((rows, width))
    if baseline:
        score = [math.fsum(rewards[b, t] for t in range(width) if mask[b, t]) if real[b] else 0.0 for b in range(rows)]
        for b in range(rows):
            members = [c for c in range(rows) if real[c] and groups[c] == groups[b]]
            mean = math.fsum(score[c] for c in members) / len(members) if len(members) > 1 else 0.0
            for t in range(width):
                if mask[b, t]:
                    g[b, t] = score[b] - mean
    else:
        for b in range(rows):
            running = 0.0
            for t in reversed(range(width)):
                if mask[b, t]:
                    running = rewards[b, t] + gamma * running
                    g[b, t] = running
    used = [(b, t) for b in range(rows) for t in range(width) if mask[b, t]]
    advantages = np.zeros((rows, width))
    if len(used) >= 2:
        mean = math.fsum(g[b, t] for b, t in used) / len(used)
        var = math.fsum((g[b, t] - mean) ** 2 for b, t in used) / (len(used) - 1)
        for b, t in used:
            advantages[b, t] = (g[b, t] - mean) / math.sqrt(var + 1e-8)
    return advantages, (advantages if baseline else g)


def optimal_token_baseline(rewards, mask, logprobs, sum_pi_squared, groups, weights=None, zero_tail=True, eps=1e-8):
    """OTB, with prm-jax's rules where verl's break (the credit-assignment guide states each), in plain loops: ``(advantages,
    returns)``. Each row's trained tokens in
    order (index k); ``G`` the reward-to-go over them; ``w = (1 - 2 pi + S) rho^2``, ``W`` its running sum; per
    group and k, over the group's non-empty rows reaching k, ``B = sum G W / (sum W + eps)`` (0 for a group with
    fewer than two non-empty rows); the zero tail: a unique longest row gets B = 0 from the second longest
    length on; ``A = G - B`` on trained tokens, 0 elsewhere."""
    rows, width = mask.shape
    tokens = [[t for t in range(width) if mask[b, t]] for b in range(rows)]
    ret, cum = [], []
    for b in range(rows):
        g, running = [0.0] * len(tokens[b]), 0.0
        for k in reversed(range(len(tokens[b]))):
            running += rewards[b, tokens[b][k]]
            g[k] = running
        total, w = 0.0, []
        for t in tokens[b]:
            rho = 1.0 if weights is None else weights[b, t]
            total += (1.0 - 2.0 * math.exp(logprobs[b, t]) + sum_pi_squared[b, t]) * rho * rho
            w.append(total)
        ret.append(g)
        cum.append(w)
    advantages, returns = np.zeros((rows, width)), np.zeros((rows, width))
    for b in range(rows):
        members = [c for c in range(rows) if groups[c] == groups[b] and tokens[c]]
        lengths = sorted((len(tokens[c]) for c in range(rows) if groups[c] == groups[b]), reverse=True)
        alone = len(lengths) >= 1 and len(tokens[b]) == lengths[0] and (len(lengths) == 1 or lengths[1] < lengths[0])
        second = lengths[1] if len(lengths) > 1 else 0
        for k, t in enumerate(tokens[b]):
            baseline = 0.0
            if len(members) >= 2 and not (zero_tail and alone and k >= second):
                reach = [c for c in members if k < len(tokens[c])]
                baseline = (math.fsum(ret[c][k] * cum[c][k] for c in reach)
                            / (math.fsum(cum[c][k] for c in reach) + eps))
            advantages[b, t] = ret[b][k] - baseline
            returns[b, t] = ret[b][k]
    return advantages, returns


def turn_rloo(rewards, mask, tids, gamma, groups, real, per_index=False):
    """The per-turn leave-one-out baseline (``credit_assignment: {mode: turn_rloo}``; prm-jax's own, issue 59, after
    verl's RFC #7244), in plain loops: ``(advantages, returns)``. A turn is the trained timesteps of one id; its
    reward the sum of the rewards on them; its return ``G_k = r_k + gamma G_next`` over the row's turns (an id the
    row skips passes the return on undiscounted); its baseline the mean of ``G_k`` over the other real rows of
    the group that have a turn ``k`` (0 where none has); ``A = G_k - b_k`` and return ``G_k`` on the turn's
    timesteps, 0 elsewhere. ``per_index``: #7244's biased form, each turn's reward less its own baseline (the
    mean reward at that index over the others), those summed over the row's remaining turns."""
    rows, width = mask.shape
    turn_reward, ret = [], []
    for b in range(rows):
        ids = {int(tids[b, t]) for t in range(width) if mask[b, t]}
        r = {k: math.fsum(rewards[b, t] for t in range(width) if mask[b, t] and tids[b, t] == k) for k in ids}
        g, running = {}, 0.0
        for k in sorted(ids, reverse=True):
            running = r[k] + gamma * running
            g[k] = running
        turn_reward.append(r)
        ret.append(g)

    def baseline(b, k, values):
        others = [values[c][k] for c in range(rows)
                  if c != b and real[c] and groups[c] == groups[b] and k in values[c]]
        return math.fsum(others) / len(others) if others else 0.0

    advantages, returns = np.zeros((rows, width)), np.zeros((rows, width))
    for b in range(rows):
        if per_index:
            own, running = {}, 0.0
            for k in sorted(turn_reward[b], reverse=True):
                running = turn_reward[b][k] - baseline(b, k, turn_reward) + gamma * running
                own[k] = running
        else:
            own = {k: ret[b][k] - baseline(b, k, ret) for k in ret[b]}
        for t in range(width):
            if mask[b, t]:
                advantages[b, t] = own[int(tids[b, t])]
                returns[b, t] = ret[b][int(tids[b, t])]
    return advantages, returns

# The float64 reference of each credit mode, by its registered name: a registered estimator without one
# fails the option matrix naming it (tests/kernels/test_matrix.py); the GAE estimators are steps 6-7 above.
CREDIT = {"pure": _credit_pure, "prime": _credit_prime, "gigpo": _credit_gigpo, "tree": _credit_tree,
          "rloo": _credit_rloo}
# Those that read the task rewards with the KL rewards in them (EstimatorSpec.kl == "rewards") and form their
# own returns: ``(options, rewards, mask, groups, real_rows, discount, model) -> (advantages, returns)``, ``model``
# the model outputs on timesteps (``logprobs``: the pipeline's old log-probs; the batch's ``sum_pi_squared`` and
# ``rollout_is_weights`` as given, or None) and ``turn_ids`` (shifted to timesteps, or None).
CREDIT_FROM_REWARDS = {
    "reinforce_pp": lambda options, r, m, groups, real, discount, model: reinforce_pp(r, m, discount, groups, real),
    "reinforce_pp_baseline": lambda options, r, m, groups, real, discount, model: reinforce_pp(
        r, m, discount, groups, real, baseline=True),
    "otb": lambda options, r, m, groups, real, discount, model: optimal_token_baseline(
        r, m, model["logprobs"], model["sum_pi_squared"], groups, model["rollout_is_weights"],
        zero_tail=options.get("handle_zero_tail", True), eps=options.get("epsilon", 1e-8)),
    "turn_rloo": lambda options, r, m, groups, real, discount, model: turn_rloo(r, m, model["turn_ids"], discount,
                                                                                groups, real),
}
GAE_ESTIMATORS = ("token_gae", "turn_gae")


def group_filter(group, kind):
    """AReaL's group filters, one row at a time: ``(accepted, failed_or_perfect, all_correct, all_wrong, penalized)``.

    ``kind`` is ``plain``, ``penalized`` or ``penalized_mask_no_eos``.
    """
    key = "original_rewards" if group.get("original_rewards") is not None else "rewards"
    rewards = [float(r) for r in np.asarray(group[key]).reshape(-1)]
    mixed = False
    for r in rewards:
        if r != rewards[0]:
            mixed = True
    all_wrong = True
    for r in rewards:
        if r > 0:
            all_wrong = False
    preserved = False
    if kind != "plain" and not mixed and all_wrong and group.get("token_rewards") is not None \
            and group.get("loss_mask") is not None:
        token_rewards, loss_mask = np.asarray(group["token_rewards"]), np.asarray(group["loss_mask"])
        for b in range(token_rewards.shape[0]):
            if kind == "penalized_mask_no_eos":
                attention = np.asarray(group["attention_mask"])
                if group.get("is_truncated") is not None:
                    truncated = bool(np.asarray(group["is_truncated"])[b])
                else:
                    truncated = sum(1 for a in attention[b] if a) == attention.shape[1]
                if truncated:
                    continue
            for t in range(token_rewards.shape[1]):
                if loss_mask[b, t] and token_rewards[b, t] < 0:
                    preserved = True
    accepted = mixed or preserved
    if kind == "plain":
        all_correct = all(r >= 1 - 1e-3 for r in rewards)
    else:
        all_correct = all(r > 0 for r in rewards)
    return (accepted, int(not accepted), int(not accepted and all_correct), int(not accepted and not all_correct),
            int(preserved))


def gigpo(turn_rewards, turn_mask, outcome, anchor_ids=None, group_sizes=None, *, step_weight=1.0,
          step_discount=0.95, norm="mean_norm", eps=1e-6, episode_stats="trajectory", groups=None):
    """GiGPO the way the reference implementation reads: dicts keyed by group and anchor, plain loops
    (``groups``: each row's group, instead of ``group_sizes``)."""
    turn_rewards = np.asarray(turn_rewards, np.float64)
    rows, turns = turn_rewards.shape
    if groups is None:
        groups = group_of_rows(rows, rows, group_sizes) if group_sizes is not None else [0] * rows

    def mean_std(values):
        if len(values) <= 1:
            return (values[0] if values else 0.0), 1.0
        mean = math.fsum(values) / len(values)
        return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))

    episode = np.zeros(rows)
    for b in range(rows):
        members = [c for c in range(rows) if groups[c] == groups[b]]
        if episode_stats == "trajectory":
            entries = [float(outcome[c]) for c in members]
        else:  # verl-agent: one entry per step
            entries = [float(outcome[c]) for c in members for k in range(turns) if turn_mask[c][k]]
        mean, std = (0.0, 1.0) if len(entries) <= 1 else mean_std(entries)
        episode[b] = (outcome[b] - mean) / (std + eps) if norm == "mean_std_norm" else outcome[b] - mean
    returns = np.zeros((rows, turns))
    for b in range(rows):
        running = 0.0
        for k in reversed(range(turns)):
            if turn_mask[b][k]:
                running = turn_rewards[b, k] + step_discount * running
                returns[b, k] = running
    step_groups: dict = {}
    for b in range(rows):
        for k in range(turns):
            anchor = 0 if anchor_ids is None else int(anchor_ids[b][k])
            if turn_mask[b][k] and anchor != -1:  # only -1 means "no anchor"
                step_groups.setdefault((groups[b], anchor), []).append((b, k))
    step = np.zeros((rows, turns))
    for members in step_groups.values():
        values = [returns[b, k] for b, k in members]
        if len(values) == 1:
            continue
        mean, std = mean_std(values)
        for b, k in members:
            step[b, k] = (returns[b, k] - mean) / (std + eps) if norm == "mean_std_norm" else returns[b, k] - mean
    advantages = np.zeros((rows, turns))
    for b in range(rows):
        for k in range(turns):
            if turn_mask[b][k]:
                advantages[b, k] = episode[b] + step_weight * step[b, k]
    return advantages, episode, step, returns


# ---- Credit assignment (the authors' code of each method (its repository and commit named where it is used)), plain float64
# loops written from the formulas, not from the kernels ----

def tree_discount(parent, raw, gamma, mask=None):
    """AReaL PR #1666's rule: r(n) = raw(n) + gamma * mean of r over n's children, children first."""
    n = len(parent)
    used = [True] * n if mask is None else [bool(m) for m in mask]
    children = {i: [c for c in range(n) if used[c] and parent[c] == i] for i in range(n)}
    memo: dict = {}

    def r(i):
        if i not in memo:
            kids = children[i]
            memo[i] = float(raw[i]) + (gamma * math.fsum(r(c) for c in kids) / len(kids) if kids else 0.0)
        return memo[i]
    return [r(i) if used[i] else 0.0 for i in range(n)]


def areal_linear_discount(raw, gamma):
    """AReaL today: one running value over the insertion order, reversed: c = c * gamma + raw(i)."""
    out, running = [0.0] * len(raw), 0.0
    for i in reversed(range(len(raw))):
        running = running * gamma + float(raw[i])
        out[i] = running
    return out


def tree_advantages(parent, leaf_reward, *, mask=None, selected=None, group=None, weighting="sqrt",
                    value="state_value"):
    """TreeRL as its code reads (TreeRL's code (THUDM/TreeRL @ f0edbea6, openrlhf/trainer/ppo_utils/tree_node.py); prm-jax's
    rules where the originals disagree (the credit-assignment guide states each)): centred leaves, subtree sums, paths from the
    synthetic
    root with the fill-in rule, node by node. The fill-in's tie is TreeRL's ``|l| < 1e-8`` where the group's
    rewards are integers (exact in float32); for other rewards prm-jax's documented float32 rule, a local value
    within ``8 * eps32`` of the rewards' scale (``kernels.tree``), restated here in float64."""
    n = len(parent)
    used = [True] * n if mask is None else [bool(m) for m in mask]
    grp = [0] * n if group is None else [int(g) for g in group]
    children = {i: [c for c in range(n) if used[c] and parent[c] == i] for i in range(n)}
    leaves = [i for i in range(n) if used[i] and not children[i]]
    chosen = set(leaves if selected is None else [i for i in leaves if selected[i]])
    centred = {}
    for g in set(grp[i] for i in leaves):
        mine = [i for i in leaves if grp[i] == g]
        total = math.fsum(float(leaf_reward[i]) for i in mine)
        for i in mine:
            centred[i] = 0.0 if len(mine) == 1 else float(leaf_reward[i]) - (total - float(leaf_reward[i])) / (len(mine) - 1)

    def below(i):
        return [i] if not children[i] else [leaf for c in children[i] for leaf in below(c)]

    def weigh(a, k):
        if k == 0 or weighting == "none":
            return a
        return a / math.sqrt(k) if weighting == "sqrt" else a / k

    def state(leafs):
        a = math.fsum(centred[leaf] for leaf in leafs)
        return weigh(a, sum(leaf in chosen for leaf in leafs)) / len(leafs)

    def scale(leafs, root_leaves):
        if len(root_leaves) < 2:
            return 0.0
        mean_abs = math.fsum(abs(float(leaf_reward[leaf])) for leaf in leafs) / len(leafs) + math.fsum(
            abs(float(leaf_reward[leaf])) for leaf in root_leaves) / len(root_leaves)
        k = sum(leaf in chosen for leaf in leafs)
        return weigh(mean_abs, k) * len(root_leaves) / (len(root_leaves) - 1)

    def tie_below(root_leaves, node, above):
        rewards = [float(leaf_reward[leaf]) for leaf in root_leaves]
        if all(r == round(r) for r in rewards):
            return 1e-8
        eps32 = float(np.finfo(np.float32).eps)
        return max(1e-8, 8 * eps32 * (scale(below(node), root_leaves) + scale(below(above), root_leaves)))

    out = [0.0] * n
    for i in range(n):
        if not used[i]:
            continue
        path = [i]
        while parent[path[-1]] >= 0:
            path.append(parent[path[-1]])
        path.reverse()  # root first
        root_leaves = [leaf for leaf in leaves if grp[leaf] == grp[i]]
        states = [state(root_leaves)] + [state(below(node)) for node in path]
        local = [states[j + 1] - states[j] for j in range(len(path))]
        for j in range(1, len(local)):  # TreeRL's fill-in, along the path
            if abs(local[j]) < tie_below(root_leaves, path[j], path[j - 1]):
                local[j] = local[j - 1]
        out[i] = {"state_value": local[-1] + states[-1], "value_only": states[-1], "local_only": local[-1]}[value]
    return out


def progress(process, mask, turn_ids, scored, outcome, gamma=1.0, initial=0.0, terminal="zero", level="turn"):
    """Potential-based shaping, step by step along each row: a step (a turn, read at its last trained
    timestep, or a trained timestep) leaves the potential phi (its score where scored, else the one before;
    ``initial`` before the first step), the last step leaves the terminal potential (0 or the outcome), and
    earns gamma * (potential after) - (potential before), given on each of its timesteps."""
    rows, width = np.shape(mask)
    ends = turn_ends(mask, turn_ids) if level == "turn" else np.asarray(mask, bool)
    out = np.zeros((rows, width))
    for b in range(rows):
        marks = [t for t in range(width) if ends[b][t]]
        phi, earned = float(initial), {}
        for i, t in enumerate(marks):
            after = phi if not scored[b][t] else float(process[b][t])
            if i == len(marks) - 1:
                after = 0.0 if terminal == "zero" else float(outcome[b])
            earned[t] = gamma * after - phi
            phi = after
        for t in range(width):
            if mask[b][t]:
                end = t if level == "token" else next(u for u in range(t, width) if ends[b][u])
                out[b][t] = earned[end]
    return out


def min_form(scores, steps, temperature):
    """PURE's weights over all of a row's steps: w = softmax(-s / tau), r = w * s."""
    out = np.zeros(np.shape(scores))
    for b in range(len(scores)):
        idx = [k for k in range(len(scores[b])) if steps[b][k]]
        if not idx:
            continue
        top = max(-float(scores[b][k]) / temperature for k in idx)
        e = {k: math.exp(-float(scores[b][k]) / temperature - top) for k in idx}
        z = math.fsum(e.values())
        for k in idx:
            out[b][k] = e[k] / z * float(scores[b][k])
    return out


def whiten(x, mask, eps=1e-8):
    vals = [float(x[b][t]) for b in range(len(x)) for t in range(len(x[b])) if mask[b][t]]
    out = np.zeros(np.shape(x))
    if not vals:
        return out
    mu = math.fsum(vals) / len(vals)
    var = math.fsum((v - mu) ** 2 for v in vals) / max(len(vals) - 1, 1)
    for b in range(len(x)):
        for t in range(len(x[b])):
            if mask[b][t]:
                out[b][t] = (float(x[b][t]) - mu) / math.sqrt(var + eps)
    return out


def returns_to_go(x, mask):
    """sum_{u >= t} x_u over each row's trained timesteps, 0 elsewhere."""
    rows, width = np.shape(mask)
    out = np.zeros((rows, width))
    for b in range(rows):
        running = 0.0
        for t in reversed(range(width)):
            if mask[b][t]:
                running += float(x[b][t])
                out[b][t] = running
    return out


def next_in_turn(mask, turn_ids, b, t):
    """The row's next trained timestep after ``t`` when it is in ``t``'s turn, else None: with turn ids a turn is
    the trained timesteps of one id (untrained holes inside it do not split it), without them a run of
    adjacent trained timesteps."""
    width = len(mask[b])
    if turn_ids is None:
        return t + 1 if t + 1 < width and mask[b][t + 1] else None
    for u in range(t + 1, width):
        if mask[b][u]:
            return u if turn_ids[b][u] == turn_ids[b][t] else None
    return None


def turn_ends(mask, turn_ids):
    """Each turn's last trained timestep."""
    rows, width = np.shape(mask)
    ends = np.zeros((rows, width), bool)
    for b in range(rows):
        for t in range(width):
            if mask[b][t]:
                ends[b][t] = next_in_turn(mask, turn_ids, b, t) is None
    return ends


def pure(process, outcome, mask, turn_ids, outcome_step, groups, temperature, verifier_coef, whitened=True):
    """The PURE recipe (PURE's authors' code (CJReinforce/PURE, branch verl @ 83f9869c) steps 3-4, with prm-jax's per-row
    length): min-form at turn ends, the verifier
    score at the outcome's timestep, sum returns, RLOO baseline, whitening."""
    rows, width = np.shape(mask)
    ends = turn_ends(mask, turn_ids)
    r = min_form(np.where(ends, process, 0.0), ends, temperature)
    q = np.array(r, np.float64)
    for b in range(rows):
        q[b][outcome_step[b]] += verifier_coef * float(outcome[b])
    g = returns_to_go(q, mask)
    per_token = [math.fsum(g[b]) / max(int(np.sum(mask[b])), 1) for b in range(rows)]
    returns = np.zeros((rows, width))
    scored = np.zeros((rows, width), bool)
    for b in range(rows):
        others = [c for c in range(rows) if groups[c] == groups[b] and c != b]
        if not others:
            continue
        base = math.fsum(per_token[c] for c in others) / len(others)
        for t in range(width):
            if mask[b][t]:
                returns[b][t] = g[b][t] - base
                scored[b][t] = True
    return (whiten(returns, scored) if whitened else returns), returns


def implicit_rewards(prm, ref, mask, beta, lam=0.0, outcome=None):
    rows, width = np.shape(mask)
    out = np.zeros((rows, width))
    for b in range(rows):
        idx = [t for t in range(width) if mask[b][t]]
        if not idx:
            continue
        q = {t: beta * (float(prm[b][t]) - float(ref[b][t])) for t in idx}
        if lam == 0.0:
            r = q
        else:
            if outcome is not None:
                q[idx[-1]] = float(outcome[b]) - math.fsum(q[t] for t in idx[:-1])
            r, running = {}, 0.0
            for t in reversed(idx):
                running = q[t] + lam * running
                r[t] = running
        for t in idx[:-1]:  # the last trained token's reward is dropped
            out[b][t] = r[t]
    return out


def prime(prm, ref, outcome, mask, groups, *, beta, lam=0.0, use_gt=False, dpo_coef=5.0, gt_coef=5.0,
          batch_norm=True):
    rows, width = np.shape(mask)
    s = implicit_rewards(prm, ref, mask, beta, lam, outcome if use_gt else None)
    if batch_norm:
        top = float(np.abs(returns_to_go(s, mask)).max(initial=0.0))
        s = s / (top + 1e-6)
    final = np.zeros((rows, width))
    for b in range(rows):
        members = [c for c in range(rows) if groups[c] == groups[b]]
        n = len(members)
        idx = [t for t in range(width) if mask[b][t]]
        mu = {c: math.fsum(s[c][t] for t in range(width) if mask[c][t]) / max(int(np.sum(mask[c])), 1)
              for c in members}
        for t in idx:
            final[b][t] += dpo_coef * (s[b][t] * n / (n - 1) - math.fsum(mu.values()) / (n - 1))
        if idx:
            others = [float(outcome[c]) for c in members if c != b]
            final[b][idx[-1]] += gt_coef * (float(outcome[b]) - math.fsum(others) / len(others))
    returns = returns_to_go(final, mask)
    return whiten(returns, mask), returns, s


def decoupled(rewards, weights, groups, eps=1e-4):
    """TRL's normalize_then_sum: per source nan-aware group z-scores, weighted sum, batch z-score, NaN -> 0."""
    rows, sources = np.shape(rewards)
    p = [math.nan] * rows
    for b in range(rows):
        if all(math.isnan(float(rewards[b][k])) for k in range(sources)):
            continue
        total = 0.0
        for k in range(sources):
            r = float(rewards[b][k])
            if math.isnan(r):
                continue
            members = [c for c in range(rows) if groups[c] == groups[b]]
            if len(members) == 1:
                continue  # G = 1: std 0, (r - r) / eps = 0
            vals = [float(rewards[c][k]) for c in members if not math.isnan(float(rewards[c][k]))]
            if len(vals) < 2:
                continue  # nanstd of fewer than two values is NaN: the term drops out of the nansum
            mu = math.fsum(vals) / len(vals)
            sd = math.sqrt(math.fsum((v - mu) ** 2 for v in vals) / (len(vals) - 1))
            total += float(weights[k]) * (r - mu) / (sd + eps)
        p[b] = total
    vals = [v for v in p if not math.isnan(v)]
    out = np.zeros(rows)
    if len(vals) < 2:
        return out
    mu = math.fsum(vals) / len(vals)
    sd = math.sqrt(math.fsum((v - mu) ** 2 for v in vals) / (len(vals) - 1))
    for b in range(rows):
        if not math.isnan(p[b]):
            out[b] = (p[b] - mu) / (sd + eps)
    return out


def ppo_clip_loss(logp, prox, adv, mask, *, old=None, eps_clip=0.2, eps_clip_higher=None, c_clip=None, cap=None,
                  agg="token-mean"):
    """AReaL's ppo_actor_loss_fn, one timestep at a time (float64)."""
    rows, width = np.shape(logp)
    per = np.zeros((rows, width))
    high = eps_clip if eps_clip_higher is None else eps_clip_higher
    for b in range(rows):
        for t in range(width):
            if not mask[b][t]:
                continue
            a = float(adv[b][t])
            r = math.exp(float(logp[b][t]) - float(prox[b][t]))
            pg = max(-a * r, -a * min(max(r, 1 - eps_clip), 1 + high))
            if c_clip is not None:
                pg = min(pg, math.copysign(1.0, a) * c_clip * a if a != 0 else 0.0)
            if old is not None:
                w = math.exp(float(prox[b][t]) - float(old[b][t]))
                pg *= 0.0 if cap is not None and w > cap else w
            per[b][t] = pg
    n = sum(bool(mask[b][t]) for b in range(rows) for t in range(width))
    if agg == "token-mean":
        return math.fsum(per.ravel()) / max(n, 1)
    counts = [sum(bool(m) for m in mask[b]) for b in range(rows)]
    used = [b for b in range(rows) if counts[b]]
    if agg == "seq-mean-token-mean":
        return math.fsum(math.fsum(per[b]) / counts[b] for b in used) / max(len(used), 1)
    return math.fsum(math.fsum(per[b]) for b in used) / max(len(used), 1)


def verl_agg(per, mask, mode, scale=None):
    """verl's agg_loss of per-token losses (verl's agg_loss (verl-project/verl @ 1dda039b, core_algos.py:1140-1206)), float64,
    with prm-jax's empty-batch rule (0)."""
    rows, width = np.shape(per)
    counts = [sum(bool(m) for m in mask[b]) for b in range(rows)]
    n = sum(counts)
    kept = [[float(per[b][t]) if mask[b][t] else 0.0 for t in range(width)] for b in range(rows)]
    used = [b for b in range(rows) if counts[b]]
    if mode == "token-mean":
        return math.fsum(map(math.fsum, kept)) / n if n else 0.0
    if mode == "token-sum":
        return math.fsum(map(math.fsum, kept))
    if not used:
        return 0.0
    if mode == "seq-mean-token-mean":
        return math.fsum(math.fsum(kept[b]) / (counts[b] + 1e-8) for b in used) / len(used)
    loss = math.fsum(math.fsum(kept[b]) for b in used) / len(used)
    return loss / (width if scale is None else scale) if mode == "seq-mean-token-sum-norm" else loss


def verl_token_loss(kind, logp, old, adv, *, low=0.2, high=0.2, beta=None, tau_pos=1.0, tau_neg=1.05, cap=3.0):
    """One token's loss and its derivative in logp, as verl computes them (verl's compute_policy_loss_sapo (verl-project/verl @
    1dda039b, core_algos.py:1622-1703); verl's compute_policy_loss_cispo (verl-project/verl @ 1dda039b,
    core_algos.py:2047-2104); verl's GPG and DRO losses (verl-project/verl @ 1dda039b, core_algos.py)), float64."""
    d = float(logp) - float(old)
    a = float(adv)
    if kind == "gpg":
        return -float(logp) * a, -a
    if kind == "dro":
        return -(float(logp) * a - 0.5 * beta * d * d), -a + beta * d
    x = min(max(d, -20.0), 20.0)
    inside = -20.0 < d < 20.0  # torch.clamp passes the gradient strictly inside only
    r = math.exp(x)
    # verl's compute_policy_loss_vanilla (verl-project/verl @ 1dda039b, core_algos.py:1286-1376): the clip, the dual clip for A
    # < 0, torch's ties and bounds
    if kind == "vanilla":
        lo, hi = 1.0 - low, 1.0 + high
        p1, p2 = -a * r, -a * min(max(r, lo), hi)
        c1 = max(p1, p2)
        kappa = 1.0 if p1 > p2 else 0.0 if p1 < p2 else (1.0 if lo < r < hi else 0.5)
        if a < 0:
            p3 = -a * cap
            kappa_c = 1.0 if c1 < p3 else 0.0 if c1 > p3 else 0.5
            return min(p3, c1), (-a * r * kappa * kappa_c if inside else 0.0)
        return c1, (-a * r * kappa if inside else 0.0)
    if kind in ("dppo_tv", "dppo_kl"):  # verl's DPPO losses (verl-project/verl @ 1dda039b, core_algos.py:1380-1542)
        tau = min(r, cap)
        p, p_old = math.exp(float(logp)), math.exp(float(old))
        if kind == "dppo_tv":
            valid = (p - p_old <= high) if a > 0 else (p - p_old >= -low)
        else:
            arg = (1.0 - p_old + 1e-8) / (1.0 - p + 1e-8)
            div = p_old * (float(old) - float(logp)) + (1.0 - p_old) * math.log(arg) if arg > 0 else math.nan
            valid = (div <= high or p <= p_old) if a > 0 else (div <= low or p >= p_old)
        return (-a * tau * float(logp) if valid else 0.0), (-a * tau if valid else 0.0)
    if kind == "cispo":
        w = min(max(r, 1.0 - low), 1.0 + high)
        return -w * a * float(logp), -w * a
    tau = tau_pos if a > 0 else tau_neg  # sapo
    s = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
    return -s * 4.0 / tau * a, (-a * 4.0 * s * (1.0 - s) * r if inside else 0.0)


def gspo_token(mean, a, low, high):
    """verl's gspo at one token of a row whose mean log ratio is ``mean``: ``(loss, d loss / d logp)``; the
    max's tie and the clamp's bound as torch's (torch's gradient rules, as verl's and AReaL's losses get them (torch.clamp: 1
    strictly inside, 0 at a bound and beyond; torch.min/max: 1/2 each at a tie))."""
    rho = math.exp(min(mean, 10.0))
    lo, hi = 1.0 - low, 1.0 + high
    p1, p2 = -a * rho, -a * min(max(rho, lo), hi)
    kappa = 1.0 if p1 > p2 else 0.0 if p1 < p2 else (1.0 if lo < rho < hi else 0.5)
    return max(p1, p2), (-a * rho * kappa if mean < 10.0 else 0.0)


def verl_loss(kind, logp, old, adv, mask, mode, *, weights=None, scale=None, **params):
    """``(loss, d loss / d logp [B, T])`` of a verl loss over a batch, float64 loops."""
    rows, width = np.shape(logp)
    per, local = np.zeros((rows, width)), np.zeros((rows, width))
    for b in range(rows):
        trained = [t for t in range(width) if mask[b][t]]
        mean = math.fsum(float(logp[b][t]) - float(old[b][t]) for t in trained) / max(len(trained), 1)
        for t in trained:
            w = 1.0 if weights is None else float(weights[b][t])
            # verl's compute_policy_loss_gspo (verl-project/verl @ 1dda039b, core_algos.py:1546-1618): the row's mean log ratio,
            # capped at 10 (no gradient at or past it)
            if kind == "gspo":
                value, slope = gspo_token(mean, float(adv[b][t]), params.get("low", 0.2), params.get("high", 0.2))
            else:
                value, slope = verl_token_loss(kind, logp[b][t], old[b][t], adv[b][t], **params)
            per[b][t], local[b][t] = w * value, w * slope
    return verl_agg(per, mask, mode, scale), verl_agg_grad(local, mask, mode, scale)


def geo_mean_loss(logp, old, adv, mask, *, low=0.2, high=0.2, weights=None):
    """verl's geo_mean (GMPO: verl's compute_policy_loss_geo_mean (verl-project/verl @ 1dda039b, core_algos.py:1928-2010)):
    ``(loss, d loss / d logp [B, T])``, float64 loops."""
    rows, width = np.shape(logp)
    grad = np.zeros((rows, width))
    total = 0.0
    for b in range(rows):
        trained = [t for t in range(width) if mask[b][t]]
        n = len(trained) + 1e-8
        m, kappa = {}, {}
        for t in trained:
            d, a = float(logp[b][t]) - float(old[b][t]), float(adv[b][t])
            capped = min(max(d, -low), high)
            if a > 0:
                m[t] = min(d, capped)
            elif a < 0:
                m[t] = max(d, capped)
            else:
                m[t] = 0.0
            on_bound = d in (-low, high)
            uncapped = (a > 0 and d < high) or (a < 0 and d > -low)
            kappa[t] = 0.0 if a == 0 else 0.5 if on_bound else 1.0 if uncapped else 0.0
        ratio = math.exp(math.fsum(m.values()) / n)
        mean_adv = math.fsum(float(adv[b][t]) for t in trained) / n
        w = 1.0 if weights is None else math.exp(math.fsum(math.log(float(weights[b][t]) + 1e-10) for t in trained) / n)
        total += -mean_adv * ratio * w
        for t in trained:
            grad[b][t] = w * (-mean_adv) * ratio / n * kappa[t] / rows
    return total / rows, grad


def kl_cov_loss(logp, old, adv, mask, mode, *, ratio=0.0002, coef=0.1):
    """verl's kl_cov (verl's compute_policy_loss_kl_cov (verl-project/verl @ 1dda039b, core_algos.py:1848-1924)): ``(loss, d
    loss / d logp)``, float64; the k largest covariances by a
    stable sort (ties: the earlier position)."""
    rows, width = np.shape(logp)
    trained = [(b, t) for b in range(rows) for t in range(width) if mask[b][t]]
    per, local = np.zeros((rows, width)), np.zeros((rows, width))
    if trained:
        mean_a = math.fsum(float(adv[b][t]) for b, t in trained) / len(trained)
        mean_l = math.fsum(float(logp[b][t]) for b, t in trained) / len(trained)
        cov = {bt: (float(adv[bt]) - mean_a) * (float(logp[bt]) - mean_l) for bt in trained}
        k = max(1, math.floor(len(trained) * ratio))
        chosen = set(sorted(trained, key=lambda bt: -cov[bt])[:k])
        for b, t in trained:
            d, a = float(logp[b][t]) - float(old[b][t]), float(adv[b][t])
            r = math.exp(d)
            sign = (d > 0) - (d < 0)
            per[b][t] = -a * r + (coef * abs(d) if (b, t) in chosen else 0.0)
            local[b][t] = -a * r + (coef * sign if (b, t) in chosen else 0.0)
    return verl_agg(per, mask, mode), verl_agg_grad(local, mask, mode)


def clip_cov_loss(logp, old, adv, mask, chosen, mode, *, low=0.2, high=0.2):
    """verl's clip_cov with the chosen tokens fixed (verl's compute_policy_loss_clip_cov (verl-project/verl @ 1dda039b,
    core_algos.py:1743-1844)): ``(loss, d loss / d logp)``, float64."""
    rows, width = np.shape(logp)
    per, local = np.zeros((rows, width)), np.zeros((rows, width))
    lo, hi = 1.0 - low, 1.0 + high
    for b in range(rows):
        for t in range(width):
            if not mask[b][t] or chosen[b][t]:
                continue
            a = float(adv[b][t])
            r = math.exp(float(logp[b][t]) - float(old[b][t]))
            p1, p2 = -a * r, -a * min(max(r, lo), hi)
            kappa = 1.0 if p1 > p2 else 0.0 if p1 < p2 else (1.0 if lo < r < hi else 0.5)
            per[b][t], local[b][t] = max(p1, p2), -a * r * kappa
    return verl_agg(per, mask, mode), verl_agg_grad(local, mask, mode)


def verl_agg_grad(local, mask, mode, scale=None):
    """d agg_loss / d logp from each token's local derivative (verl's agg_loss (verl-project/verl @ 1dda039b,
    core_algos.py:1140-1206): its u)."""
    rows, width = np.shape(local)
    counts = [sum(bool(m) for m in mask[b]) for b in range(rows)]
    n, used = sum(counts), sum(1 for c in counts if c)
    grad = np.zeros((rows, width))
    for b in range(rows):
        for t in range(width):
            if mask[b][t]:
                u = {"token-mean": 1.0 / n if n else 0.0, "token-sum": 1.0,
                     "seq-mean-token-sum": 1.0 / used if used else 0.0,
                     "seq-mean-token-sum-norm": 1.0 / used / (width if scale is None else scale) if used else 0.0,
                     "seq-mean-token-mean": 1.0 / ((counts[b] + 1e-8) * used) if used else 0.0}[mode]
                grad[b][t] = u * local[b][t]
    return grad


def gspo_sequence_loss(logp, old, adv, mask, *, eps=0.2, eps_high=None, delta=None, loss_type="grpo", max_len=512):
    """TRL's sequence-level GSPO (huggingface/trl @ f2cd5771, trl/trainer/grpo_trainer.py): ``(loss, d loss / d logp)``,
    float64; advantages ``[B]``."""
    rows, width = np.shape(logp)
    hi, lo = 1.0 + (eps if eps_high is None else eps_high), 1.0 - eps
    counts = [sum(bool(m) for m in mask[b]) for b in range(rows)]
    n_total = sum(counts)
    per, slope = np.zeros(rows), np.zeros(rows)
    for b in range(rows):
        trained = [t for t in range(width) if mask[b][t]]
        lam = math.fsum(float(logp[b][t]) - float(old[b][t]) for t in trained) / max(len(trained), 1)
        c = math.exp(lam)
        a = float(adv[b])
        c2 = min(max(c, lo), hi)
        c1 = c if delta is None else min(c, delta)
        first, second = c1 * a, c2 * a
        per[b] = -min(first, second)
        k1 = 1.0 if delta is None or c < delta else 0.0
        k2 = 1.0 if lo < c < hi else 0.0
        kappa = k1 if first < second else k2 if second < first else 0.5 * (k1 + k2)
        slope[b] = -a * kappa * c  # d row loss / d lam
    weight = {"grpo": [counts[b] / max(counts[b], 1) / rows for b in range(rows)],
              "bnpo": [counts[b] / max(n_total, 1) for b in range(rows)],
              "dapo": [counts[b] / max(n_total, 1) for b in range(rows)],
              "dr_grpo": [counts[b] / (rows * max_len) for b in range(rows)],
              "luspo": [counts[b] / rows for b in range(rows)]}[loss_type]
    grad = np.zeros((rows, width))
    for b in range(rows):
        for t in range(width):
            if mask[b][t]:
                grad[b][t] = weight[b] * slope[b] / max(counts[b], 1)
    return math.fsum(weight[b] * per[b] for b in range(rows)), grad
