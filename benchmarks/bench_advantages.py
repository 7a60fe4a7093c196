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


def median_seconds(fn, repeats: int) -> float:
    return interleaved_medians({"fn": fn}, repeats, inner=1)["fn"]


def interleaved_medians(fns: dict, repeats: int, inner: int = 5) -> dict[str, float]:
    """Median seconds per call of each function, over ``repeats`` rounds.

    Each round times ``inner`` back-to-back calls of every function in turn: back-to-back calls keep each
    function's own cache state, and the round-robin makes drift in the machine's speed hit all alike.
    """
    for fn in fns.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            jax.block_until_ready(fn())
            start = time.perf_counter()
            for _ in range(inner):
                jax.block_until_ready(fn())
            times[name].append((time.perf_counter() - start) / inner)
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


def bench_shape(rows: int, width: int, repeats: int, gamma: float, lam: float, loop: bool = True) -> dict:
    batch, rewards, values, mask = make_inputs(rows, width)
    r, v, m = (jax.device_put(x) for x in (rewards, values, mask))
    m_float = jax.device_put(mask.astype(np.float32))  # how verl and tunix pass masks
    device_batch = jax.device_put(batch)
    out = {"shape": f"{rows}x{width}"}
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
    # pipeline reads its six inputs and writes six float32 arrays.
    out["bytes_gae"] = bytes_per_step((rewards, values, mask)) + 8
    out["bytes_pipeline"] = bytes_per_step([batch[k] for k in PIPELINE_INPUTS]) + 24
    methods = ("auto", "scan", "associative", "blocked") + (("cumsum",) if gamma * lam == 1.0 else ())
    methods += ("native",) if native.available() else ()
    for method in methods:
        candidates[method] = lambda method=method: prm_jax.kernels.gae(r, v, m, gamma=gamma, lam=lam, method=method)
    # The library's default method with a float32 mask (checked to hold only 0 and 1), beside "auto" (bool).
    candidates["auto_float_mask"] = lambda: prm_jax.kernels.gae(r, v, m_float, gamma=gamma, lam=lam)
    out.update(interleaved_medians(candidates, repeats))
    out["bytes_copy"] = 2 * bytes_per_step((rewards, values, mask))
    out["elements"] = rows * width
    if loop:
        loop_repeats = max(3, repeats // 5)
        out["numpy_loop"] = median_seconds(lambda: numpy_loop(rewards, values, mask, gamma, lam), loop_repeats)
    return out


def bandwidth_fraction(res: dict, name: str) -> float:
    """Achieved bytes per second of ``name`` over those of the device copy (same run)."""
    if name == "copy":
        return 1.0
    moved = (res["bytes_pipeline"] if name in ("compute_advantages", "compute_advantages_checked", "pipeline_roofline")
             else res["bytes_gae"])
    return (moved / res[name]) / (res["bytes_copy"] / res["copy"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--lam", type=float, default=0.95)
    parser.add_argument("--no-loop", action="store_true", help="skip the numpy loop (large shapes, accelerators)")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    args = parser.parse_args()
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    print(f"backend={jax.default_backend()} devices={jax.devices()} jax={jax.__version__} "
          f"gamma={args.gamma} lam={args.lam} auto={resolve_method('auto', unit_discount=args.gamma * args.lam == 1)}")
    header = ("shape", "method", "median_ms", "x_roofline", "speedup_vs_loop", "of_copy_bw")
    print("{:>10} {:>26} {:>10} {:>11} {:>16} {:>11}".format(*header))
    results = []
    for rows, width in shapes:
        res = bench_shape(rows, width, args.repeats, args.gamma, args.lam, loop=not args.no_loop)
        results.append(res)
        for name in ("copy", "roofline", "auto", "auto_float_mask", "native", "scan", "associative", "blocked", "cumsum",
                     "pipeline_roofline", "compute_advantages", "compute_advantages_checked", "numpy_loop"):
            if name in res:
                speedup = f"{res['numpy_loop'] / res[name]:16.1f}" if "numpy_loop" in res else f"{'-':>16}"
                fraction = f"{bandwidth_fraction(res, name):11.2f}" if name != "numpy_loop" else f"{'-':>11}"
                print(f"{res['shape']:>10} {name:>26} {res[name] * 1e3:10.3f} {res[name] / res['roofline']:11.2f} "
                      f"{speedup} {fraction}")
        print(f"{res['shape']:>10} {'compile(auto) s':>26} {res['compile_auto']:10.3f}   "
              f"compute_advantages / auto = {res['compute_advantages'] / res['auto']:.2f}, "
              f"float mask / bool mask = {res['auto_float_mask'] / res['auto']:.2f}, "
              f"checked / unchecked = {res['compute_advantages_checked'] / res['compute_advantages']:.2f}, "
              f"pipeline_roofline / auto = {res['pipeline_roofline'] / res['auto']:.2f}, "
              f"compute_advantages / pipeline_roofline = {res['compute_advantages'] / res['pipeline_roofline']:.2f}, "
              f"bytes per element: pipeline {res['bytes_pipeline']} vs GAE {res['bytes_gae']}")
    if args.json:
        import json
        with open(args.json, "w") as handle:
            json.dump({"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
                       "jax": jax.__version__, "gamma": args.gamma, "lam": args.lam, "results": results}, handle,
                      indent=2)


if __name__ == "__main__":
    main()
