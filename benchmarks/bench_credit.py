#!/usr/bin/env python3
"""The credit formulas of issue 22 against plain loops of the same maths and against compute_advantages.

  python benchmarks/bench_credit.py [--rows 256] [--turns 8] [--tokens 512] [--group 64] [--repeats 10]

Prints, from one run, for each formula (``prm_jax.credit``): the jitted kernel against the float64 loop of
``tests/reference.py`` (written from the authors' code of each method (its repository and commit named where it is used), one
element at a time; target >= 100x), and
``compute_advantages`` with the formula configured against plain ``compute_advantages`` (token GAE) on the
same ``[B, T]`` batch (target <= 2x). Trees: each group of ``--group`` rows is one session tree whose rows
are its leaves, ``--turns`` deep (a binary split at each level until the group's leaves are reached).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import prm_jax
from prm_jax.config import AdvantageConfig
from prm_jax.kernels._normalization import _decoupled_normalization_core
from prm_jax.kernels._prime import _implicit_rewards_core
from prm_jax.kernels._pure import _min_form_core
from prm_jax.kernels._recurrence import resolve_strategy
from prm_jax.kernels._tree import _tree_advantages_core, _tree_discount_core

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import reference  # the float64 loops of the tests
from bench_advantages import interleaved_medians, median_seconds


def session_trees(rows: int, turns: int, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``node_ids [rows, turns]``, ``node_parents [N]`` and each node's group: per group a tree whose ``group``
    leaves are its rows, splitting in two at each level while it has fewer branches than leaves."""
    node_ids = np.full((rows, turns), -1, np.int32)
    parents: list[int] = []
    groups: list[int] = []
    for g in range(rows // group):
        prefix: dict[tuple[int, ...], int] = {}
        for leaf in range(group):
            path: tuple[int, ...] = ()
            above = -1
            for k in range(turns):
                path = path + ((leaf >> max(0, turns - 1 - k)) if k < turns - 1 else leaf,)
                if path not in prefix:
                    prefix[path] = len(parents)
                    parents.append(above)
                    groups.append(g)
                above = node_ids[g * group + leaf, k] = prefix[path]
    return node_ids, np.array(parents, np.int32), np.array(groups, np.int32)


def make_batch(rows: int, turns: int, tokens: int, group: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    width = turns * tokens
    t = np.arange(width)[None]
    turn_ids = np.broadcast_to(np.where((t % tokens) < tokens * 3 // 4, t // tokens, -1), (rows, width)).astype(np.int32)
    loss_mask = (turn_ids >= 0).astype(np.int32)
    per_turn = rng.uniform(-1, 1, (rows, turns)).astype(np.float32)
    token_rewards = np.where(turn_ids >= 0, np.take_along_axis(per_turn, np.maximum(turn_ids, 0), axis=1), 0.0)
    ref = (-rng.exponential(size=(rows, width))).astype(np.float32)
    node_ids, parents, _ = session_trees(rows, turns, group)
    logprobs = (-rng.exponential(size=(rows, width))).astype(np.float32)
    pi = np.exp(np.roll(logprobs, -1, axis=1).astype(np.float64))  # the sampled token's pi on timesteps
    sum_pi_squared = pi ** 2 + (1 - pi) ** 2 * rng.uniform(0, 1, (rows, width))  # as from real logits: >= pi^2
    return dict(attention_mask=np.ones((rows, width), np.int32), loss_mask=loss_mask, turn_ids=turn_ids,
                logprobs=logprobs, sum_pi_squared=sum_pi_squared.astype(np.float32),
                rollout_is_weights=rng.uniform(0.8, 1.2, (rows, width)).astype(np.float32),
                ref_logprobs=ref, prm_logprobs=(-np.abs(ref + rng.normal(0, 0.1, ref.shape))).astype(np.float32),
                token_rewards=token_rewards.astype(np.float32), rewards=rng.choice([0.0, 1.0], rows).astype(np.float32),
                is_truncated=np.zeros(rows, bool), group_sizes=np.full(rows // group, group, np.int32),
                reward_sources=rng.normal(size=(rows, 2)).astype(np.float32), node_ids=node_ids, node_parents=parents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--group", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    batch = make_batch(args.rows, args.turns, args.tokens, args.group)
    rows, width = batch["loss_mask"].shape
    _, parents, node_group = session_trees(args.rows, args.turns, args.group)
    size = parents.shape[0]
    rng = np.random.default_rng(1)
    node_reward = rng.normal(size=size).astype(np.float32)
    print(f"backend={jax.default_backend()} B={rows} turns={args.turns} T={width} groups of {args.group}; "
          f"trees: {size} nodes, {rows} leaves, depth {args.turns}")

    used = jnp.ones(size, bool)
    discount = jax.jit(lambda p, r: _tree_discount_core(p, r, used, jnp.float32(0.9)))
    tree = jax.jit(lambda p, r, g: _tree_advantages_core(p, r, used, used, g, size, "sqrt", "state_value").values)
    steps = jnp.asarray(np.ones((rows, args.turns), bool))
    scores = jnp.asarray(rng.uniform(-1, 1, (rows, args.turns)).astype(np.float32))
    min_form = jax.jit(lambda s: _min_form_core(s, steps, 0.1))
    active = jnp.asarray(reference.shift(batch["loss_mask"] > 0, fill=False))
    strategy = resolve_strategy("auto", unit_discount=False)
    implicit = jax.jit(lambda a, b, m: _implicit_rewards_core(a, b, m, 0.05, 0.9, None, strategy))
    floor = jax.jit(lambda s: s + 0)
    sources = np.concatenate([batch["rewards"][:, None], batch["reward_sources"]], axis=1)
    row_group = jnp.asarray(np.arange(rows) // args.group, jnp.int32)
    decoupled = jax.jit(lambda r: _decoupled_normalization_core(r, jnp.ones(3), jnp.ones(rows, bool), row_group,
                                                               rows // args.group, 1e-4)[0])
    p, r, g = jax.device_put((parents, node_reward, node_group))
    prm, ref = jax.device_put((batch["prm_logprobs"], batch["ref_logprobs"]))
    kernels = {
        "tree_discount": (lambda: discount(p, r), lambda: reference.tree_discount(parents, node_reward, 0.9)),
        "tree_advantages": (lambda: tree(p, r, g),
                            lambda: reference.tree_advantages(parents, node_reward, group=node_group)),
        "min_form": (lambda: min_form(scores), lambda: reference.min_form(np.asarray(scores), np.ones(scores.shape),
                                                                           0.1)),
        "implicit_process_rewards": (lambda: implicit(prm, ref, active),
                                     lambda: reference.implicit_rewards(batch["prm_logprobs"], batch["ref_logprobs"],
                                                                        np.asarray(active), 0.05, 0.9)),
        "decoupled_normalization": (lambda: decoupled(jnp.asarray(sources)),
                                    lambda: reference.decoupled(sources, [1.0, 1.0, 1.0], np.arange(rows) // args.group)),
    }
    dispatch = median_seconds(lambda: floor(scores), args.repeats)
    print(f"the floor of any jitted call here (dispatch of s + 0 on [{rows}, {args.turns}]): {dispatch * 1e3:.3f} ms")
    print(f"{'formula':<26} {'kernel ms':>10} {'loop ms':>10} {'speedup':>9}   (target >= 100x)")
    for name, (kernel, loop) in kernels.items():
        fast = median_seconds(kernel, args.repeats)
        slow = median_seconds(loop, max(1, min(3, args.repeats)))
        print(f"{name:<26} {fast * 1e3:10.3f} {slow * 1e3:10.1f} {slow / fast:8.0f}x")

    device = jax.device_put({k: v for k, v in batch.items()})
    plain = {k: v for k, v in device.items() if k not in ("prm_logprobs", "reward_sources", "node_ids", "node_parents",
                                                         "sum_pi_squared", "rollout_is_weights")}
    otb = {k: v for k, v in device.items() if k not in ("prm_logprobs", "reward_sources", "node_ids", "node_parents")}
    configs = {
        "gae (baseline)": (AdvantageConfig(kl_ctl=0.0, check_values=False), plain),
        "tree": (AdvantageConfig(kl_ctl=0.0, check_values=False, credit_assignment={"mode": "tree"}), device),
        "pure": (AdvantageConfig(kl_ctl=0.0, check_values=False, credit_assignment={"mode": "pure"}), device),
        "prime": (AdvantageConfig(kl_ctl=0.0, check_values=False, credit_assignment={"mode": "prime"}), device),
        "reinforce_pp": (AdvantageConfig(kl_ctl=0.0, check_values=False, discount=0.99,
                                         credit_assignment={"mode": "reinforce_pp"}), plain),
        "reinforce_pp_baseline": (AdvantageConfig(kl_ctl=0.0, check_values=False,
                                                  credit_assignment={"mode": "reinforce_pp_baseline"}), plain),
        "otb": (AdvantageConfig(kl_ctl=0.0, check_values=False, credit_assignment={"mode": "otb"}), otb),
        "decoupled": (AdvantageConfig(kl_ctl=0.0, check_values=False, reward_norm={"mode": "decoupled"}), device),
        "min_form": (AdvantageConfig(kl_ctl=0.0, check_values=False,
                                     process_reward_transform={"mode": "min_form", "temperature": 0.1}), device),
    }
    fns = {name: (lambda c=config, b=data: prm_jax.compute_advantages(b, c).advantages)
           for name, (config, data) in configs.items()}
    times = interleaved_medians(fns, args.repeats)
    base = times["gae (baseline)"]
    print(f"{'compute_advantages with':<26} {'ms':>10} {'/ plain':>9}   (target <= 2x)")
    for name, seconds in times.items():
        print(f"{name:<26} {seconds * 1e3:10.3f} {seconds / base:8.2f}x")


if __name__ == "__main__":
    main()
