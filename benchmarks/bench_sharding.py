"""Scaling benchmark: a fixed global batch on 1, 2, 4 and 8 devices, and sequence-parallel GAE at T = 131072.

  python benchmarks/bench_sharding.py [--rows 64 --width 4096] [--devices 1,2,4,8]

On a CPU-only machine each device count runs in a fresh process with that many fake CPU devices
(``--xla_force_host_platform_device_count``), which share the machine's cores: the figures show the
overhead of partitioning, not a speedup. On a multi-GPU or TPU host pass ``--real`` to use the real
devices (the first N of ``jax.devices()``) in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def measure(devices: int, rows: int, width: int, sp_width: int, repeats: int) -> dict:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_advantages import make_inputs
    from bench_advantages import median_seconds as _median

    import prm_jax

    if len(jax.devices()) < devices:  # never measure fewer devices than the row says
        raise SystemExit(f"bench_sharding: {devices} devices requested, {len(jax.devices())} present "
                         f"({jax.default_backend()}); pass --devices with counts this machine has")
    mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
    batch, _, _, _ = make_inputs(rows, width)
    sharded = {k: jax.device_put(v, NamedSharding(mesh, P("data") if v.ndim == 1 else P("data", None)))
               for k, v in batch.items()}
    config = prm_jax.AdvantageConfig(discount=0.99, gae_lambda=0.95, adv_norm=prm_jax.NormConfig(),
                                     check_values=False)
    out = {"devices": devices, "compute_advantages_ms": 1e3 * _median(
        lambda: prm_jax.compute_advantages(sharded, config), repeats)}
    if sp_width:
        seq_mesh = Mesh(np.array(jax.devices()[:devices]), ("seq",))
        rng = np.random.default_rng(0)
        sp_rows = 4
        r = rng.normal(size=(sp_rows, sp_width)).astype(np.float32)
        v = rng.normal(size=(sp_rows, sp_width)).astype(np.float32)
        m = rng.random((sp_rows, sp_width)) < 0.8
        spec = NamedSharding(seq_mesh, P(None, "seq"))
        r, v, m = (jax.device_put(x, spec) for x in (r, v, m))
        out["sequence_parallel_gae_ms"] = 1e3 * _median(
            lambda: prm_jax.kernels.sequence_parallel_gae(r, v, m, mesh=seq_mesh, gamma=0.99, lam=0.95), repeats)
        local = jax.device_put(np.asarray(r), jax.devices()[0]), jax.device_put(np.asarray(v), jax.devices()[0]), \
            jax.device_put(np.asarray(m), jax.devices()[0])
        out["unsharded_gae_ms"] = 1e3 * _median(lambda: prm_jax.kernels.gae(*local, gamma=0.99, lam=0.95), repeats)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--sp-width", type=int, default=131072)
    parser.add_argument("--devices", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--real", action="store_true", help="use the real devices of this host")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    counts = [int(n) for n in args.devices.split(",")]
    if args.child:
        print(json.dumps(measure(args.child, args.rows, args.width, args.sp_width if args.child > 1 else 0,
                                 args.repeats)))
        return
    results = []
    for n in counts:
        if args.real:
            results.append(measure(n, args.rows, args.width, args.sp_width if n > 1 else 0, args.repeats))
            continue
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
        proc = subprocess.run([sys.executable, __file__, "--child", str(n), "--rows", str(args.rows), "--width",
                               str(args.width), "--sp-width", str(args.sp_width), "--repeats", str(args.repeats)],
                              env=env, capture_output=True, text=True, check=True)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base = results[0]["compute_advantages_ms"]
    print(f"global batch {args.rows}x{args.width}, {'real' if args.real else 'fake CPU'} devices; medians of "
          f"{args.repeats}")
    print(f"{'devices':>8} {'compute_advantages ms':>22} {'vs 1 device':>12} {f'SP GAE ms (T={args.sp_width})':>22} "
          f"{'unsharded GAE ms':>17}")
    for r in results:
        sp = f"{r['sequence_parallel_gae_ms']:22.2f} {r['unsharded_gae_ms']:17.2f}" if "sequence_parallel_gae_ms" in r \
            else f"{'-':>22} {'-':>17}"
        print(f"{r['devices']:>8} {r['compute_advantages_ms']:22.2f} {r['compute_advantages_ms'] / base:12.2f} {sp}")


if __name__ == "__main__":
    main()
