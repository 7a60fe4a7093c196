"""Multi-device and multi-process checks, each in fresh processes so this suite keeps one device."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
from batches import make_batch
from multiprocess_config import CONFIG, ROWS, SEED, WIDTH

from prm_jax import compute_advantages

HERE = Path(__file__).resolve().parent


def env(devices):
    out = dict(os.environ)
    out["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    out["PRM_JAX_MULTIDEVICE"] = "1"
    out["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent), out.get("PYTHONPATH", "")])
    return out


def test_eight_fake_devices():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "multidevice")],
                          env=env(8), cwd=HERE.parent, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one(tmp_path):
    port, processes = free_port(), 2
    workers = [subprocess.Popen([sys.executable, str(HERE / "multidevice" / "mp_worker.py"), str(port), str(i),
                                 str(processes), str(tmp_path / f"out{i}.npz")], env=env(2),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for i in range(processes)]
    logs = [w.communicate(timeout=300)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers), "\n".join(log[-3000:] for log in logs)
    want = compute_advantages(make_batch(np.random.default_rng(SEED), rows=ROWS, width=WIDTH), CONFIG)
    seen = []
    for i in range(processes):
        got = np.load(tmp_path / f"out{i}.npz")
        rows = got["rows"]
        seen.extend(rows.tolist())
        for field in ("advantages", "returns", "kl_rewards", "tot_rewards"):
            np.testing.assert_allclose(got[field], np.asarray(getattr(want, field))[rows], rtol=1e-5, atol=1e-5,
                                       err_msg=field)
    assert sorted(seen) == list(range(ROWS))
