"""The watchdog of a local Ray cluster prm-jax started: ``python -m prm_jax.runtime._ray_watchdog DRIVER MARKER
TEMP_DIR`` follows the cluster's processes while the driver process lives and, once it has exited, ends them
and removes the cluster's temp dir. Ray stops its processes when the driver disconnects, but a driver killed
by SIGKILL (or SIGTERM without a handler) leaves some of them (its dashboard and runtime-env agents) running
45 s and more; this ends them within a second. A driver that closes normally stops the watchdog itself.

A process of the cluster carries ``PRM_JAX_RAY_OWNER=MARKER`` in its environment (inherited from the driver
at ``ray.init``), or descends from one that does: Ray's agents rename themselves (``ray::DashboardAgent``),
which overwrites the environment ``/proc`` shows, so the tree is followed from the processes that keep it
(the GCS server, the raylet). Each process is named with its start time, so a pid reused meanwhile is
spared. Linux (``/proc``); elsewhere it only waits.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

from prm_jax.runtime._worker import wait_for_exit

VARIABLE = "PRM_JAX_RAY_OWNER"  # in the environment of every process of a local cluster prm-jax starts
FOLLOW_S = 0.5  # how often the watchdog refreshes its view of the cluster's processes while the driver lives
SWEEPS = 5  # after the driver: a process may start while a sweep runs, so sweep again, SWEEP_GAP_S apart
SWEEP_GAP_S = 0.2

Process = tuple[int, str]  # (pid, its start time in clock ticks since boot: /proc/pid/stat's 22nd field)


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (the state first, then the parent pid, ...;
    ``proc(5)``'s fields 3 on), or None where the process is gone (or off Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _stat(pid: int) -> tuple[int, str] | None:
    """Its parent pid and start time, or None where it is gone."""
    fields = proc_stat(pid)
    return None if fields is None or len(fields) < 20 else (int(fields[1]), fields[19])


def cluster_processes(marker: str, exclude: set[int]) -> set[Process]:
    """The processes of the cluster marked ``marker`` now (see the module docstring); none off Linux."""
    wanted = f"{VARIABLE}={marker}".encode()
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return set()
    stats = {pid: s for pid in pids if pid not in exclude and (s := _stat(pid)) is not None}
    marked = set()
    for pid in stats:
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if wanted in environ.read().split(b"\0"):
                    marked.add(pid)
        except OSError:  # gone, or another user's
            continue
    found, frontier = set(marked), set(marked)
    while frontier:
        frontier = {pid for pid, (parent, _) in stats.items() if parent in frontier} - found
        found |= frontier
    return {(pid, stats[pid][1]) for pid in found}


def end_processes(processes: set[Process]) -> int:
    """SIGKILLs each process still running with the same start time; returns how many were signalled."""
    ended = 0
    for pid, started in processes:
        now = _stat(pid)
        if now is None or now[1] != started:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            ended += 1
        except OSError:
            pass
    return ended


def end_cluster(marker: str, exclude: set[int], known: set[Process] | None = None) -> int:
    """Ends the processes of the cluster marked ``marker`` and those in ``known`` (``exclude`` spared),
    sweeping again while new ones appear; returns how many were signalled."""
    ended = end_processes(known or set())
    for sweep in range(SWEEPS):
        found = cluster_processes(marker, exclude | {os.getpid()})
        ended += end_processes(found)
        if not found and sweep:
            break
        time.sleep(SWEEP_GAP_S)
    return ended


def follow_until_exit(driver: int, marker: str) -> set[Process]:
    """Blocks until process ``driver`` has exited; returns the cluster's processes seen until then."""
    known: set[Process] = set()
    wait_for_exit(driver, lambda: None, each=lambda: known.update(cluster_processes(marker, {driver, os.getpid()})),
                  every=FOLLOW_S)
    return known


def main(argv: list[str]) -> int:
    driver, marker, temp_dir = int(argv[0]), argv[1], argv[2]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the terminal is the driver's to handle
    known = follow_until_exit(driver, marker)
    end_cluster(marker, exclude={driver}, known=known)
    shutil.rmtree(temp_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
