"""Processes seen through ``/proc`` (Linux): what a test started, and whether it still runs."""

from __future__ import annotations

import os

from prm_jax.runtime._ray_watchdog import proc_stat


def stat(pid: int) -> tuple[str | None, int | None]:
    """A process's state letter and parent pid, or ``(None, None)`` where it is gone."""
    fields = proc_stat(pid)
    return (fields[0], int(fields[1])) if fields else (None, None)


def descendants(root: int) -> set[int]:
    """Every process whose chain of parents leads to ``root`` now."""
    parents = {int(p): stat(int(p))[1] for p in os.listdir("/proc") if p.isdigit()}
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    state, _ = stat(pid)
    return state is not None and state != "Z"


def title(pid: int) -> str:
    """Its command line as one string ('' where gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def with_marker(marker: str) -> list[int]:
    """Every process of the machine whose command line holds ``marker``."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and marker in title(int(p))]


def left_running(pids: set[int], within: float) -> list[str]:
    """The command lines of ``pids`` still running after waiting up to ``within`` seconds for them to end."""
    import time

    deadline = time.monotonic() + within
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [title(pid) for pid in pids if alive(pid)]
