#!/usr/bin/env python3
"""What bounds each GAE method at one shape: XLA's own account of the compiled program, and a profiler trace.

  python benchmarks/profile_gae.py [--shape 8192x2048] [--gamma 0.99] [--lam 0.95] [--trace DIR]

For each GAE method this backend has (``auto`` and the methods it chooses among), from the compiled program:
the bytes XLA's cost analysis says it accesses (0 for a custom call, which it cannot see into) against the
least any GAE moves (rewards, values and a bool mask in, two float32 arrays out: 17 bytes an element), its
flops, the kernels it launches once (fusions and custom calls in the entry computation) and the loops it
runs (``while`` ops: a sequential scan runs its body once a timestep, each run one or more kernel launches).
With ``--trace``, five calls of each under ``jax.profiler.trace`` into DIR (TensorBoard's or Perfetto's
format: the kernels' own times on a GPU). Issue 47 asks for this where the best XLA method is below half the
copy's bandwidth at 8192x2048 (bench_advantages.py gives the fraction in the same device run).

Then the same account of ``compute_advantages`` unchecked (``check_values=False``) and checked (the default:
every value check computed and returned as counts), issue 56.5: compiled for this backend (XLA's fused
program), and lowered for the accelerators (``cuda``, ``tpu``) from any host (the program before XLA's
fusion: an upper bound on its bytes, but the same for both, so their difference is the checks' own), with
the checked program's largest entry kernels by the bytes of their operands and results, each named by the
source of its first operation (XLA's metadata), so the bytes the checks add are found where they go.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

import jax
import numpy as np
from bench_advantages import bytes_per_step, gae_methods, make_inputs

import prm_jax


def entry_computation(hlo: str) -> str:
    """The ENTRY computation's text of an HLO module."""
    match = re.search(r"^ENTRY .*?^}", hlo, flags=re.M | re.S)
    return match.group(0) if match else hlo


def program_account(compiled: Any, elements: int) -> dict[str, float]:
    """XLA's cost analysis and the launches of one compiled program."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
    entry = entry_computation(compiled.as_text())
    return {"bytes_per_element": float(cost.get("bytes accessed", float("nan"))) / elements,
            "flops_per_element": float(cost.get("flops", float("nan"))) / elements,
            "entry_kernels": len(re.findall(r"\s(?:fusion|custom-call)\(", entry)),
            "loops": len(re.findall(r"\swhile\(", compiled.as_text()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8192x2048")
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--lam", type=float, default=0.95)
    parser.add_argument("--trace", help="write a profiler trace of five calls of each method into this folder")
    args = parser.parse_args()
    rows, width = (int(n) for n in args.shape.split("x"))
    _, rewards, values, mask = make_inputs(rows, width)
    r, v, m = (jax.device_put(x) for x in (rewards, values, mask))
    unit = args.gamma * args.lam == 1.0
    methods = gae_methods(unit_discount=unit)
    least = bytes_per_step((rewards, values, mask)) + 8  # inputs in, two float32 outputs
    print(f"backend={jax.default_backend()} jax={jax.__version__} shape={args.shape} gamma={args.gamma} lam={args.lam}; "
          f"the least any GAE moves: {least} bytes an element")
    print(f"{'method':>12} {'bytes/elem':>11} {'x least':>8} {'flops/elem':>11} {'entry kernels':>14} {'loops':>6}")
    compiled = {}
    for method in methods:
        fn = jax.jit(lambda r, v, m, method=method: prm_jax.kernels.gae(r, v, m, gamma=args.gamma, lam=args.lam,
                                                                         method=method))
        compiled[method] = fn.lower(r, v, m).compile()
        account = program_account(compiled[method], rows * width)
        print(f"{method:>12} {account['bytes_per_element']:11.1f} {account['bytes_per_element'] / least:8.2f} "
              f"{account['flops_per_element']:11.1f} {account['entry_kernels']:14d} {account['loops']:6d}")
    if args.trace:
        for program in compiled.values():
            jax.block_until_ready(program(r, v, m))
        with jax.profiler.trace(args.trace):
            for method, program in compiled.items():
                with jax.profiler.TraceAnnotation(f"gae:{method}"):
                    for _ in range(5):
                        jax.block_until_ready(program(r, v, m))
        print(f"trace of five calls of each method: {args.trace}")
    np.testing.assert_allclose(*(np.asarray(compiled[k](r, v, m)[0]) for k in ("auto", "scan")), rtol=1e-4, atol=1e-4)
    pipeline_account(rows, width, args.gamma, args.lam)


SHAPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8,
               "s64": 8, "u64": 8}


def kernel_bytes(hlo: str) -> list[tuple[int, str]]:
    """Each entry-computation fusion or custom call with the bytes of its result and operands (their shapes
    as the HLO text writes them) and the source of its first operation, largest first."""
    shapes = {}
    entry = entry_computation(hlo)
    for line in entry.splitlines():
        match = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ([^=]*?) (\w[\w-]*)\(", line)
        if match:
            shapes[match.group(1)] = match.group(2)
    found = []
    for line in entry.splitlines():
        match = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (.*?) (fusion|custom-call)\((.*?)\)", line)
        if not match:
            continue
        operands = [name.strip().lstrip("%") for name in match.group(4).split(",")]
        size = sum(shape_bytes(text) for text in [match.group(2), *(shapes.get(o, "") for o in operands)])
        source = re.search(r'op_name="([^"]*)"', line)
        found.append((size, (source.group(1) if source else match.group(1))[-90:]))
    return sorted(found, reverse=True)


def shape_bytes(text: str) -> int:
    """The bytes of every array shape written in ``text`` (``f32[8,2048]{1,0}``, tuples of them)."""
    total = 0
    for dtype, dims in re.findall(r"\b(pred|[sfu]\d+|bf16)\[([\d,]*)\]", text):
        count = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
        total += count * SHAPE_BYTES.get(dtype, 4)
    return total


def pipeline_account(rows: int, width: int, gamma: float, lam: float) -> None:
    """compute_advantages unchecked and checked: bytes an element compiled here and lowered for each
    accelerator; the checked program's largest kernels (see the module's docstring)."""
    from bench_advantages import PIPELINE_INPUTS

    batch = make_inputs(rows, width)[0]
    elements = rows * width
    least = bytes_per_step([batch[k] for k in PIPELINE_INPUTS]) + 24
    print(f"compute_advantages at {rows}x{width}; the least the pipeline moves: {least} bytes an element")
    print(f"{'program':>30} {'bytes/elem':>11} {'x least':>8} {'entry kernels':>14}")
    programs = {}
    for label, checks in (("unchecked", False), ("checked (counts)", True)):
        config = prm_jax.AdvantageConfig(discount=gamma, gae_lambda=lam, check_values=checks)
        plan = config.plan.with_strategy(batch)
        compiled = jax.jit(lambda b, plan=plan: prm_jax.compute_advantages(b, plan)).lower(batch).compile()
        programs[label] = compiled
        account = program_account(compiled, elements)
        print(f"{label + ', ' + jax.default_backend():>30} {account['bytes_per_element']:11.1f} "
              f"{account['bytes_per_element'] / least:8.2f} {account['entry_kernels']:14d}")
        for platform in ("cuda", "tpu"):
            with prm_jax.kernels.lowering_platform(platform):
                there = config.plan.with_strategy(batch, platform=platform)
                lowered = jax.jit(lambda b, plan=there: prm_jax.compute_advantages(b, plan)).trace(batch).lower(
                    lowering_platforms=(platform,))
            cost = lowered.cost_analysis() or {}
            per = float(cost.get("bytes accessed", float("nan"))) / elements
            print(f"{label + ', ' + platform + ' before fusion':>30} {per:11.1f} {per / least:8.2f} {'-':>14}")
    print("the checked program's largest entry kernels (bytes an element of operands and result, its source):")
    for size, source in kernel_bytes(programs["checked (counts)"].as_text())[:8]:
        print(f"  {size / elements:8.1f}  {source}")


if __name__ == "__main__":
    main()
