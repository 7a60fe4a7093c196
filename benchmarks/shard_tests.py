#!/usr/bin/env python3
"""Deal test files to ``N`` pytest processes (benchmarks/gpu_check.sh: the device's image has no pytest-xdist).

  python benchmarks/shard_tests.py N FIRST... [-- REST...]

Prints ``N`` lines, the files of one process each (empty shards left out). The FIRST files are dealt before
the REST ones, so every process starts with its share of them; within each, the largest file (in bytes, the
count of its tests' text) goes to the process with the least so far. An entry ``path::test`` (a test, or
one parametrization of it) shares its file's bytes with the file's other entries.
"""

from __future__ import annotations

import sys
from pathlib import Path


def deal(shards: int, *groups: list[str]) -> list[list[str]]:
    """Each group's files, largest first, to the shard with the fewest bytes so far; groups in order. An
    entry may name tests of a file (``path::test[id]``): the file's bytes are shared among its entries."""
    out: list[list[str]] = [[] for _ in range(max(1, shards))]
    load = [0.0] * len(out)
    entries = [name for files in groups for name in files]
    path = {name: name.split("::")[0] for name in entries}
    weight = {name: Path(path[name]).stat().st_size / sum(path[e] == path[name] for e in entries) for name in entries}
    for files in groups:
        for name in sorted(files, key=lambda f: -weight[f]):
            least = load.index(min(load))
            out[least].append(name)
            load[least] += weight[name]
    return [files for files in out if files]


def main(argv: list[str]) -> None:
    shards, rest = int(argv[0]), argv[1:]
    first, _, later = (rest[:rest.index("--")], None, rest[rest.index("--") + 1:]) if "--" in rest else (rest, None, [])
    for files in deal(shards, first, later):
        print(" ".join(files))


if __name__ == "__main__":
    main(sys.argv[1:])
