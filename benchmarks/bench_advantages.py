"""Advantage-kernel benchmark: medians of GAE methods, compute_advantages, a roofline pass and a numpy loop.

  python benchmarks/bench_advantages.py [--shapes 64x1024,64x8192,...] [--repeats 20]

All figures come from one run on the current default backend. The roofline is one jitted elementwise pass
reading and writing the same arrays as GAE (rewards, values and mask in; advantages and returns out); the
pipeline roofline is the same for ``compute_advantages``: one pass reading its six ``[B, T]`` inputs and
writing six ``[B, T]`` outputs, the least any implementation of its interface moves. The loop is the
plain numpy recurrence of AReaL (vectorized over rows, a Python loop over timesteps).
Compile time is ``lower().compile()`` for the ``auto`` method. The candidates of a shape are timed
round-robin (one call of each per round), so a change in the machine's speed during the run affects all
of them alike and the ratios stay meaningful.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import prm_jax
from prm_jax.kernels._recurrence import resolve_method
from prm_jax.kernels._token_gae import _gae_jit
from prm_jax.native import _ffi as native

DEFAULT_SHAPES = "64x1024,64x8192,256x8192,16x32768"
SLOW_CALL_S = 0.01  # a call this long is timed once a round (interleaved_medians)


def median_seconds(fn, repeats: int) -> float:
    return interleaved_medians({"fn": fn}, repeats, inner=1)["fn"]


def interleaved_medians(fns: dict, repeats: int, inner: int = 5, first: dict | None = None) -> dict[str, float]:
    """Median seconds per call of each function, over ``repeats`` rounds.

    Each round times ``inner`` back-to-back calls of every function in turn (one call of those whose first
    call took over ``SLOW_CALL_S``: their cache state is their own at that length, and a slow method at a
    long row would otherwise take most of the run): back-to-back calls keep each function's own cache
    state, and the round-robin makes drift in the machine's speed hit all alike. ``first``, when given,
    receives each function's first call in seconds (its trace and compile included): compile time apart.
    """
    inners = {}
    for name, fn in fns.items():
        start = time.perf_counter()
        jax.block_until_ready(fn())
        seconds = time.perf_counter() - start
        if first is not None:
            first[name] = seconds
        start = time.perf_counter()
        jax.block_until_ready(fn())
        inners[name] = inner if time.perf_counter() - start < SLOW_CALL_S else 1
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            jax.block_until_ready(fn())
            start = time.perf_counter()
            for _ in range(inners[name]):
                jax.block_until_ready(fn())
            times[name].append((time.perf_counter() - start) / inners[name])
    return {name: statistics.median(t) for name, t in times.items()}


def numpy_loop(rewards, values, mask, gamma, lam):
    rows, width = rewards.shape
    advantages = np.zeros((rows, width), np.float32)
    last = np.zeros(rows, np.float32)
    next_value = np.zeros(rows, np.float32)
    for t in reversed(range(width)):
        m = mask[:, t]
        new = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * last
        last = np.where(m, new, last)
        next_value = np.where(m, values[:, t], next_value)
        advantages[:, t] = last
    return advantages, advantages + values


@jax.jit
def device_copy(rewards, values, mask):
    """A device-to-device copy of the GAE's input bytes: the bandwidth every kernel is compared with."""
    return jnp.array(rewards, copy=True), jnp.array(values, copy=True), jnp.array(mask, copy=True)


@jax.jit
def roofline(rewards, values, mask):
    return jnp.where(mask, rewards, values), rewards + values


PIPELINE_INPUTS = ("attention_mask", "loss_mask", "logprobs", "ref_logprobs", "values", "token_rewards")


@jax.jit
def pipeline_roofline(batch):
    """Reads every [B, T] input of compute_advantages once and writes six float32 [B, T] outputs."""
    f32 = jnp.float32
    logprobs, ref, values, process = (batch[k] for k in ("logprobs", "ref_logprobs", "values", "token_rewards"))
    mask = batch["loss_mask"].astype(f32)
    attention = batch["attention_mask"].astype(f32)
    return logprobs - ref, values + process, mask * attention, logprobs + ref, values - process, mask + attention


def gae_methods(unit_discount: bool) -> tuple[str, ...]:
    """The GAE methods this backend runs (``prm_jax.kernels.GAE_METHODS``): ``cumsum`` only where gamma * lam
    == 1, ``native`` only where its kernel is available, ``pallas`` only on a GPU (elsewhere it is interpreted:
    a check of its numbers, not a method to time)."""
    gpu = jax.default_backend() in ("cuda", "rocm", "gpu")
    return tuple(m for m in prm_jax.kernels.GAE_METHODS
                 if (m != "cumsum" or unit_discount) and (m != "native" or native.available())
                 and (m != "pallas" or gpu))


def bytes_per_step(arrays) -> int:
    return sum(np.dtype(a.dtype).itemsize for a in arrays)


def make_inputs(rows: int, width: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, width // 4, size=rows)
    seqlen = rng.integers(width // 2, width + 1, size=rows)
    t = np.arange(width)[None]
    # Turns of 32-256 generated tokens separated by 16-token tool outputs: an interleaved mask.
    in_turn = ((t - prompt[:, None]) % 272) < 256
    loss_mask = ((t >= prompt[:, None]) & (t < seqlen[:, None]) & in_turn).astype(np.int32)
    attention = (t < seqlen[:, None]).astype(np.int32)
    batch = dict(
        attention_mask=attention, loss_mask=loss_mask,
        logprobs=(-rng.exponential(size=(rows, width))).astype(np.float32),
        ref_logprobs=(-rng.exponential(size=(rows, width))).astype(np.float32),
        values=rng.normal(size=(rows, width)).astype(np.float32),
        token_rewards=(rng.random((rows, width)) * loss_mask).astype(np.float32),
        rewards=rng.choice([0.0, 1.0], size=rows).astype(np.float32),
        is_truncated=seqlen == width,
    )
    rewards = rng.normal(size=(rows, width)).astype(np.float32)
    return batch, rewards, batch["values"], np.roll(loss_mask, -1, axis=1).astype(bool)


TURN_PERIOD = 272  # make_inputs' turns: 256 generated tokens, then 16 tool tokens


def estimator_inputs(batch: dict, group: int = 8, seed: int = 1) -> dict:
    """What the registered estimators read beyond ``make_inputs``' batch, on the same rows: ``turn_ids``
    (make_inputs' turns), a session tree per group of ``group`` rows (their first turn shared, each later turn
    a node of its own row: ``node_ids [B, K]``, ``node_parents [N]``), ``group_sizes``, a PRM's log-probs
    (PRIME) and each token's sum of pi^2 (OTB: at least the sampled token's pi^2, as from real logits)."""
    rng = np.random.default_rng(seed)
    loss_mask = batch["loss_mask"].astype(bool)
    rows, width = loss_mask.shape
    group = min(group, rows)
    first = loss_mask.argmax(axis=1)  # make_inputs' prompt length (every row has a turn)
    turn_ids = np.where(loss_mask, (np.arange(width)[None] - first[:, None]) // TURN_PERIOD, -1).astype(np.int32)
    turns = turn_ids.max(axis=1) + 1
    node_ids = np.full((rows, int(turns.max())), -1, np.int32)
    parents: list[int] = []
    for begin in range(0, rows, group):
        parents.append(-1)
        root = len(parents) - 1
        for b in range(begin, min(begin + group, rows)):
            node_ids[b, 0] = root
            for k in range(1, turns[b]):
                parents.append(int(node_ids[b, k - 1]))
                node_ids[b, k] = len(parents) - 1
    sizes = [group] * (rows // group) + ([rows % group] if rows % group else [])
    pi = np.exp(np.roll(batch["logprobs"], -1, axis=1).astype(np.float64))
    return dict(turn_ids=turn_ids, node_ids=node_ids, node_parents=np.array(parents, np.int32),
                group_sizes=np.array(sizes, np.int32),
                prm_logprobs=(-np.abs(batch["ref_logprobs"] + rng.normal(0, 0.1, (rows, width)))).astype(np.float32),
                sum_pi_squared=(pi ** 2 + (1 - pi ** 2) * rng.uniform(0, 0.8, (rows, width))).astype(np.float32))


def estimator_batches(batch: dict) -> dict[str, tuple[prm_jax.AdvantageConfig, dict]]:
    """Every registered estimator (``prm_jax.estimators.registered``: the built-ins and any plug-in imported
    before this runs) from the example configuration it declares, value checks off, on ``batch`` plus the
    inputs it reads and ``group_sizes``."""
    from prm_jax.estimators import registered

    extra = estimator_inputs(batch)
    return {spec.name: (prm_jax.AdvantageConfig(**{**spec.example, "check_values": False}),
                        {**batch, "group_sizes": extra["group_sizes"], **{k: extra[k] for k in spec.reads if k in extra}})
            for spec in registered()}


GAE_METHODS_SHOWN = ("auto", "auto_float_mask", "native", "pallas", "scan", "associative", "blocked", "cumsum")
PIPELINE_SHOWN = ("pipeline_roofline", "compute_advantages", "compute_advantages_checked")


def bench_shape(rows: int, width: int, repeats: int, gamma: float, lam: float, loop: bool = True,
                estimators: bool = False) -> dict:
    """The figures of one ``[rows, width]`` shape: seconds per call of each candidate (medians), its first
    call (``first``: trace and compile included), the bytes it moves per ``[B, T]`` element (``bytes``), and
    ``fastest``: the fastest GAE method ``auto`` may choose on this backend. ``estimators``: also
    ``compute_advantages`` under every registered estimator (``estimator:<name>``)."""
    batch, rewards, values, mask = make_inputs(rows, width)
    r, v, m = (jax.device_put(x) for x in (rewards, values, mask))
    m_float = jax.device_put(mask.astype(np.float32))  # how verl and tunix pass masks
    device_batch = jax.device_put(batch)
    out: dict = {"shape": f"{rows}x{width}", "elements": rows * width}
    auto = resolve_method("auto", unit_discount=gamma * lam == 1.0)
    start = time.perf_counter()
    _gae_jit.lower(r, v, m, gamma, lam, None, method=auto, block_size=64).compile()
    out["compile_auto"] = time.perf_counter() - start
    config = prm_jax.AdvantageConfig(discount=gamma, gae_lambda=lam, check_values=False)
    checked = prm_jax.AdvantageConfig(discount=gamma, gae_lambda=lam, check_values=True)
    candidates = {"roofline": lambda: roofline(r, v, m), "copy": lambda: device_copy(r, v, m),
                  "pipeline_roofline": lambda: pipeline_roofline(device_batch),
                  "compute_advantages": lambda: prm_jax.compute_advantages(device_batch, config),
                  # The library's default: every value check computed and returned as counts (no host sync).
                  "compute_advantages_checked": lambda: prm_jax.compute_advantages(device_batch, checked)}
    # Bytes per [B, T] element: the GAE reads rewards, values, mask and writes two float32 arrays; the
    # pipeline reads its six inputs and writes six float32 arrays (an estimator: and the [B, T] inputs it reads).
    gae_bytes = bytes_per_step((rewards, values, mask)) + 8
    pipeline_bytes = bytes_per_step([batch[k] for k in PIPELINE_INPUTS]) + 24
    moved = {"copy": 2 * bytes_per_step((rewards, values, mask)), "roofline": gae_bytes,
             **dict.fromkeys(PIPELINE_SHOWN, pipeline_bytes)}
    methods = gae_methods(unit_discount=gamma * lam == 1.0)
    for method in methods:
        candidates[method] = lambda method=method: prm_jax.kernels.gae(r, v, m, gamma=gamma, lam=lam, method=method)
        moved[method] = gae_bytes
    # The library's default method with a float32 mask (checked to hold only 0 and 1), beside "auto" (bool).
    candidates["auto_float_mask"] = lambda: prm_jax.kernels.gae(r, v, m_float, gamma=gamma, lam=lam)
    moved["auto_float_mask"] = gae_bytes + 3
    if estimators:
        for name, (est_config, est_batch) in estimator_batches(batch).items():
            on_device = jax.device_put(est_batch)
            candidates[f"estimator:{name}"] = (lambda c=est_config, b=on_device:
                                               prm_jax.compute_advantages(b, c).advantages)
            moved[f"estimator:{name}"] = bytes_per_step([a for a in est_batch.values()
                                                         if np.shape(a) == (rows, width)]) + 24
    first: dict[str, float] = {}
    out.update(interleaved_medians(candidates, repeats, first=first))
    out["first"], out["bytes"] = first, moved
    out["fastest"] = min((mt for mt in methods if mt != "auto"), key=lambda mt: out[mt])
    if loop:
        loop_repeats = max(3, repeats // 5)
        out["numpy_loop"] = median_seconds(lambda: numpy_loop(rewards, values, mask, gamma, lam), loop_repeats)
    return out


def bandwidth_fraction(res: dict, name: str) -> float:
    """Achieved bytes per second of ``name`` over those of the device copy (same run)."""
    return (res["bytes"][name] / res[name]) / (res["bytes"]["copy"] / res["copy"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--lam", type=float, default=0.95)
    parser.add_argument("--no-loop", action="store_true", help="skip the numpy loop (large shapes, accelerators)")
    parser.add_argument("--estimators", action="store_true",
                        help="also compute_advantages under every registered estimator (its example configuration)")
    parser.add_argument("--estimators-shape", metavar="RxW",
                        help="with --estimators: at this one of the shapes only (each estimator compiles once; "
                             "default: at every shape)")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    args = parser.parse_args()
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    unit = args.gamma * args.lam == 1
    print(f"backend={jax.default_backend()} devices={jax.devices()} jax={jax.__version__} "
          f"gamma={args.gamma} lam={args.lam} auto={resolve_method('auto', unit_discount=unit)}")
    header = ("shape", "method", "median_ms", "x_roofline", "speedup_vs_loop", "of_copy_bw", "first_call_s")
    print("{:>10} {:>32} {:>10} {:>11} {:>16} {:>11} {:>13}".format(*header))
    results = []
    if args.estimators_shape and args.estimators_shape not in args.shapes.split(","):
        parser.error(f"--estimators-shape {args.estimators_shape} is not one of --shapes {args.shapes}")
    for rows, width in shapes:
        here = args.estimators and args.estimators_shape in (None, f"{rows}x{width}")
        res = bench_shape(rows, width, args.repeats, args.gamma, args.lam, loop=not args.no_loop, estimators=here)
        results.append(res)
        shown = ("copy", "roofline", *GAE_METHODS_SHOWN, *PIPELINE_SHOWN,
                 *(name for name in res["bytes"] if name.startswith("estimator:")), "numpy_loop")
        for name in shown:
            if name in res:
                speedup = f"{res['numpy_loop'] / res[name]:16.1f}" if "numpy_loop" in res else f"{'-':>16}"
                fraction = f"{bandwidth_fraction(res, name):11.2f}" if name != "numpy_loop" else f"{'-':>11}"
                first = f"{res['first'][name]:13.3f}" if name in res["first"] else f"{'-':>13}"
                print(f"{res['shape']:>10} {name:>32} {res[name] * 1e3:10.3f} {res[name] / res['roofline']:11.2f} "
                      f"{speedup} {fraction} {first}")
        print(f"{res['shape']:>10} {'compile(auto) s':>32} {res['compile_auto']:10.3f}   "
              f"compute_advantages / auto = {res['compute_advantages'] / res['auto']:.2f}, "
              f"float mask / bool mask = {res['auto_float_mask'] / res['auto']:.2f}, "
              f"checked / unchecked = {res['compute_advantages_checked'] / res['compute_advantages']:.2f}, "
              f"pipeline_roofline / auto = {res['pipeline_roofline'] / res['auto']:.2f}, "
              f"compute_advantages / pipeline_roofline = {res['compute_advantages'] / res['pipeline_roofline']:.2f}, "
              f"bytes per element: pipeline {res['bytes']['compute_advantages']} vs GAE {res['bytes']['auto']}")
    # What auto would pick if it picked by this run: the fastest method per shape, and auto's cost against it.
    print(f"fastest GAE method per shape (gamma*lam {'= 1' if unit else '< 1'}; auto chooses "
          f"{resolve_method('auto', unit_discount=unit)}): " + "; ".join(
              f"{res['shape']} {res['fastest']} (auto's time / its time: {res['auto'] / res[res['fastest']]:.2f})"
              for res in results))
    if args.json:
        import json
        with open(args.json, "w") as handle:
            json.dump({"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
                       "jax": jax.__version__, "gamma": args.gamma, "lam": args.lam, "results": results}, handle,
                      indent=2)


if __name__ == "__main__":
    main()
