#!/usr/bin/env python3
"""The host path of `prm-jax score`: ingest, score, pack, advantages and write, on a realistic rollout dump.

The generator writes AReaL-style sessions (each turn's `input_tokens` repeats the whole prefix): by default
2,000 sessions x 8 turns x ~300 tokens per turn in groups of 8 (about 195 MB). The script then times, in one
run: a pure decode of the same bytes with the JSON decoder prm-jax uses, the validated read, the whole
`prm-jax score` in subprocesses (wall time, peak RSS and the phase breakdown; a first run that compiles
the advantage programs into a fresh persistent compilation cache, then the median of three runs that load
them), and a plain write of the batch; it prints each figure with its floor and target.

  python benchmarks/bench_cli.py [--sessions 2000] [--turns 8] [--tokens 300] [--group 8] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "prm_jax" / "data" / "demo_config.yaml"
sys.path.insert(0, str(ROOT))  # run as a script from a checkout: the examples package is beside it

from examples.rollout_dump import generate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--keep", help="keep the generated input and outputs in this folder")
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="prm-jax-bench-cli-"))
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "sessions.jsonl"
    start = time.perf_counter()
    size = generate(data, args.sessions, args.turns, args.tokens, args.group)
    print(f"input: {args.sessions} sessions x {args.turns} turns x ~{args.tokens} tokens, groups of {args.group}: "
          f"{size / 1e6:.1f} MB (generated in {time.perf_counter() - start:.1f} s)")

    import msgspec

    from prm_jax.app import sessions as sessions_module

    raw = data.read_bytes()
    start = time.perf_counter()
    for line in raw.split(b"\n"):
        if line:
            msgspec.json.decode(line)  # the floor: a plain decode of each line, no schema
    decode = time.perf_counter() - start
    del raw
    start = time.perf_counter()
    records = sessions_module.read_sessions(data)
    read = time.perf_counter() - start
    del records
    print(f"pure decode (msgspec {msgspec.__version__}): {decode:.2f} s = {size / decode / 1e6:.0f} MB/s")
    print(f"read + validate: {read:.2f} s = {size / read / 1e6:.0f} MB/s; ratio to pure decode "
          f"{read / decode:.2f} (target: >= 150 MB/s or <= 3x pure decode)")

    from prm_jax.native import _ffi as native

    # A one-time set-up, like installing: the native CPU kernel is compiled on a machine's first run (a few
    # seconds), then loaded; it is built here so that no timed run pays for it.
    start = time.perf_counter()
    ready = native.available()
    print(f"native CPU kernel: {'ready' if ready else 'unavailable (the runs use the XLA scan)'} after "
          f"{time.perf_counter() - start:.2f} s (built once per machine and version, before the timed runs)")
    out = folder / "out"
    command = [sys.executable, "-m", "prm_jax.app._cli", "score", "--config", str(CONFIG), "--input", str(data),
               "--output", str(out), "--overwrite", "--timings"]  # later runs replace the first one's outputs
    # The first run compiles the advantage programs into a fresh persistent cache (cold); later runs of the
    # same shapes load them (warm), as a user's second run does.
    shutil.rmtree(folder / "xla", ignore_errors=True)
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(folder / "xla"))
    runs = [run_cli(command, env) for _ in range(4)]
    if any(run is None for run in runs):
        return 1
    warm = sorted(runs[1:], key=lambda run: run[0])[1]  # the median of three warm runs
    labelled = (("cold (first run, compiles)", runs[0]), ("warm (compiled programs cached), median of 3", warm))
    for label, (wall, phases, _) in labelled:
        print(f"prm-jax score end to end, {label}: {wall:.2f} s wall (target <= 5 s at the default size)")
        for line in phases:
            print("  " + line)
    print(f"  warm runs: {', '.join(f'{run[0]:.2f} s' for run in runs[1:])}")
    warm_peak = sorted(run[2] for run in runs[1:])[1]
    print(f"peak RSS, warm (median of 3): {warm_peak / 1e6:.0f} MB = {warm_peak / size:.2f}x the input; cold: "
          f"{runs[0][2] / 1e6:.0f} MB = {runs[0][2] / size:.2f}x (XLA compiling) (target <= 2x)")
    batch = out / "batch.npz"
    # The memory floor of any run that produces this output: jax imported and the written batch held once.
    floor_script = ("import resource, sys, numpy as np, jax, prm_jax; arrays = dict(np.load(sys.argv[1])); "
                    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    floor_kb = int(subprocess.run([sys.executable, "-c", floor_script, str(batch)], capture_output=True,
                                  text=True).stdout.split()[-1])
    print(f"memory floor (jax imported + the output batch held once): {floor_kb / 1024:.0f} MB = "
          f"{floor_kb * 1024 / size:.2f}x the input")
    start = time.perf_counter()
    with open(folder / "copy.bin", "wb") as handle:
        handle.write(batch.read_bytes())
        handle.flush()
        os.fsync(handle.fileno())
    copy = time.perf_counter() - start
    print(f"batch.npz {batch.stat().st_size / 1e6:.0f} MB; a plain copy of it (disk floor) {copy:.2f} s")
    return 0


def run_cli(command: list[str], env: dict[str, str]) -> tuple[float, list[str], int] | None:
    """One run: wall time, the phase lines it printed, and its own peak RSS in bytes (``wait4``)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            print(err.read().decode(errors="replace")[-3000:])
            return None
        lines = out.read().decode().splitlines()
    return wall, [line for line in lines if line.startswith("timing:")], usage.ru_maxrss * 1024


if __name__ == "__main__":
    sys.exit(main())
