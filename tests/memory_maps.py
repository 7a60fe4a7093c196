"""The test process's memory mappings, bounded.

XLA:CPU keeps each compiled program's code in memory mappings of its own (12 for a small program on jax
0.10), and jit's caches keep every program a process compiled alive. A test worker compiles thousands:
past ``vm.max_map_count`` (65,530 by default) the next compilation cannot map its code, and XLA:CPU's error
path then dies in the C++ unwinder (a segfault in ``_Unwind_Find_FDE``, from ``backend_compile_and_load``;
a core of one such crash held 65,531 mappings). ``relieve`` drops JAX's caches, which unmaps the programs,
when the process holds more than a fraction of the limit; tests/conftest.py calls it after every module.
"""

from __future__ import annotations

import gc
from pathlib import Path

import jax

MAPS = Path("/proc/self/maps")
MAX_MAP_COUNT = Path("/proc/sys/vm/max_map_count")
SHARE = 0.5  # of the limit; the largest test module compiles well under the other half


def in_use() -> int | None:
    """This process's memory mappings; None where the system does not say (no /proc)."""
    try:
        with MAPS.open("rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return None


def limit() -> int | None:
    """The kernel's limit on a process's mappings (``vm.max_map_count``); None where the system does not say."""
    try:
        return int(MAX_MAP_COUNT.read_text())
    except (OSError, ValueError):
        return None


def relieve(share: float = SHARE) -> bool:
    """Drops JAX's caches (and with them every compiled program nothing else holds) when this process holds
    more than ``share`` of the mapping limit; True when it did."""
    used, most = in_use(), limit()
    if used is None or most is None or used <= share * most:
        return False
    jax.clear_caches()
    gc.collect()
    return True
