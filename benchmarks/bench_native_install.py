"""GAE's CPU time as this interpreter's prm-jax install gives it: which native library it loads (a wheel's,
or one built from the sources), and the median time of ``gae(..., method="auto")``.

Run by ``tests/wheel/test_wheel.py`` in a fresh virtual environment holding the wheel (no compiler on
``PATH``) and in the source install; standalone it prints one JSON line:

    python benchmarks/bench_native_install.py [--rows 64 --width 8192 --repeats 60] [--numbers FILE.npy]
        [--against LIBRARY]

``--against`` times this install's GAE and the same GAE calling another built library (the one a source
install built on first use), call for call alternately in this one process on the same arrays, so that the
machine's drift (large on a shared 2-core VM: one process's median differs from the next by up to 40%)
falls on both alike; it adds ``against_ms`` and ``ratio`` (the median of the per-pair time ratios).

``--numbers`` also saves the advantages of GAE (native) and of GiGPO's native step groups on a fixed batch,
so that two installs (or two jaxlib versions) can be compared number for number.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from prm_jax import compute_advantages
from prm_jax.config import AdvantageConfig
from prm_jax.kernels import gae
from prm_jax.native import _ffi as ffi


def gae_inputs(rows: int, width: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The timed GAE's ``(rewards, values, mask)``: the same arrays for every measurement."""
    rng = np.random.default_rng(0)
    rewards, values = (jax.device_put(rng.normal(size=(rows, width)).astype(np.float32)) for _ in range(2))
    return rewards, values, jax.device_put(rng.random((rows, width)) < 0.9)


def gae_step() -> Callable[..., jax.Array]:
    """A fresh jitted ``gae(..., method="auto")`` (its own trace: the native target is read when tracing)."""
    return jax.jit(lambda r, v, m: gae(r, v, m, gamma=0.99, lam=0.95, method="auto").advantages)


def median_ms(rows: int, width: int, repeats: int) -> float:
    inputs = gae_inputs(rows, width)
    step = gae_step()
    step(*inputs).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(*inputs).block_until_ready()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def against_ms(library: str, rows: int, width: int, repeats: int) -> dict[str, float]:
    """This install's GAE against the same jitted GAE whose native call goes to ``library``: alternating calls."""
    target = f"{ffi.TARGET}_against"
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(ctypes.cdll.LoadLibrary(library).PrmJaxGaeF32),
                                platform="cpu")
    inputs = gae_inputs(rows, width)
    ours, theirs = gae_step(), gae_step()
    ours(*inputs).block_until_ready()
    packaged, ffi.TARGET = ffi.TARGET, target  # read when tracing: `theirs` calls the other library
    try:
        np.testing.assert_array_equal(np.asarray(theirs(*inputs)), np.asarray(ours(*inputs)))
    finally:
        ffi.TARGET = packaged
    times = np.empty((repeats, 2))  # [:, 0] this install's, [:, 1] the other library's
    steps = (ours, theirs)
    for i in range(repeats):
        for j in ((0, 1) if i % 2 else (1, 0)):  # each goes first half the time
            start = time.perf_counter()
            steps[j](*inputs).block_until_ready()
            times[i, j] = time.perf_counter() - start
    return {"median_ms": float(np.median(times[:, 0]) * 1e3), "against_ms": float(np.median(times[:, 1]) * 1e3),
            "ratio": float(np.median(times[:, 0] / times[:, 1]))}


def numbers() -> np.ndarray:
    """The advantages of the native GAE and of GiGPO (native step groups) on one fixed batch: ``[2, B, T]``."""
    rng = np.random.default_rng(1)
    rows, width = 8, 64
    turn_ids = np.full((rows, width), -1, np.int32)
    turn_ids[:, 4:20], turn_ids[:, 30:50] = 0, 1
    loss = (turn_ids >= 0).astype(np.int32)
    batch = dict(attention_mask=np.ones((rows, width), np.int32), loss_mask=loss, turn_ids=turn_ids,
                 logprobs=(-rng.exponential(0.5, (rows, width))).astype(np.float32),
                 rewards=rng.normal(size=rows).astype(np.float32),
                 values=rng.normal(size=(rows, width)).astype(np.float32),
                 token_rewards=(0.3 * loss).astype(np.float32), group_sizes=np.array([4, 4], np.int32),
                 is_truncated=np.zeros(rows, bool), anchor_ids=rng.integers(0, 3, (rows, 2)).astype(np.int32))
    out = [compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, gae_method="native", discount=0.99,
                                                     gae_lambda=0.95)).advantages,
           compute_advantages(batch, AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "gigpo"})).advantages]
    return np.stack([np.asarray(x) for x in out])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--numbers", default=None, help="save the fixed batch's advantages here (.npy)")
    parser.add_argument("--against", default=None, help="time this install's GAE against this built library's")
    parser.add_argument("--library", default=None,
                        help="load this built library as the packaged one (one library under two jaxlib versions)")
    args = parser.parse_args()
    if args.library:
        ffi.PACKAGED_LIBRARY = Path(args.library)  # read by the first load, below
    native, why = ffi.status()
    result = {"native": native, "why": why, "jax": jax.__version__, "packaged": str(ffi.PACKAGED_LIBRARY),
              "median_ms": median_ms(args.rows, args.width, args.repeats) if native else None}
    if args.against and native:
        result.update(against_ms(args.against, args.rows, args.width, args.repeats))
    if args.numbers and native:
        np.save(args.numbers, numbers())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
