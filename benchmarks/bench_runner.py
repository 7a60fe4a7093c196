"""Runner benchmark: overhead per turn, concurrent throughput, and host packing cost.

  python benchmarks/bench_runner.py

1. overhead: ``PRMRunner.run`` on 8-turn branches with a trivial scorer; median time per turn.
2. throughput: 1,000 sessions of 8 turns scored concurrently (``run_many``) by a scorer that awaits 10 ms
   per turn (``anyio.sleep``); wall time against the ideal concurrent time (10 ms: every turn in flight at
   once), and against the floor of the event loop itself with no runner: the 8,000 10 ms awaits as one
   ``asyncio.gather`` of ``asyncio.sleep`` (the bare floor), the scorer's own ``evaluate`` coroutines (the
   same awaits, ``anyio.sleep`` inside) under one ``asyncio.gather``, and anyio task groups shaped like
   the runner's (a group per session). A rerun with the cyclic GC off says how much of the runner's time
   is CPython's collector walking the live heap (the 1,000 sessions), which the floors hardly have.
3. packing: ``pack_branches`` of 256 scored 8-turn branches into device buffers; median time per turn, and
   the one ``device_put`` of the batch.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time

import anyio
import jax

from prm_jax import BaseScorer, Interaction, InteractionCache, PRMRunner, pack_branches

TURNS = 8


class Trivial(BaseScorer):
    name = "trivial"

    async def evaluate(self, interaction, ctx):
        return 1.0


class Sleepy(BaseScorer):
    name = "sleepy"

    async def evaluate(self, interaction, ctx):
        await anyio.sleep(0.01)
        return 0.5


def make_branch(turns: int = TURNS, out_len: int = 64, prompt: int = 32) -> InteractionCache:
    items, tokens = [], list(range(prompt))
    for k in range(turns):
        out = list(range(1000 + k * out_len, 1000 + (k + 1) * out_len))
        items.append(Interaction(f"t{k}", list(tokens), out, parent_id=f"t{k - 1}" if k else None,
                                 output_logprobs=[-0.5] * out_len, reward=1.0,
                                 messages=[{"role": "user", "content": f"turn {k}"}],
                                 output_messages=[{"role": "assistant", "content": "ok"}]))
        tokens = tokens + out + [7, 7, 7]
    return InteractionCache(items)


async def overhead(repeats: int = 200) -> float:
    runner = PRMRunner(scorers=(Trivial(),))
    branches = [make_branch() for _ in range(repeats)]
    times = []
    for cache in branches:
        start = time.perf_counter()
        await runner.run(cache)
        times.append((time.perf_counter() - start) / TURNS)
    return statistics.median(times)


async def throughput(sessions: int = 1000) -> float:
    runner = PRMRunner(scorers=(Sleepy(),))
    branches = [make_branch() for _ in range(sessions)]
    start = time.perf_counter()
    await runner.run_many(branches, limit=None)
    return time.perf_counter() - start


def throughput_without_gc() -> float:
    gc.disable()
    try:
        return anyio.run(throughput)
    finally:
        gc.enable()


async def scorer_gather(sessions: int = 1000) -> float:
    """The scorer's own 8,000 ``evaluate`` coroutines under one ``asyncio.gather``: the same awaits, no runner."""
    scorer, ctx = Sleepy(), {}
    views = [turn.readonly() for _ in range(sessions) for turn in make_branch()]
    start = time.perf_counter()
    await asyncio.gather(*(scorer.evaluate(view, ctx) for view in views))
    return time.perf_counter() - start


async def bare_gather(sessions: int = 1000) -> float:
    """The least any asyncio program pays for 8,000 concurrent 10 ms awaits."""
    start = time.perf_counter()
    await asyncio.gather(*(asyncio.sleep(0.01) for _ in range(sessions * TURNS)))
    return time.perf_counter() - start


async def bare_task_groups(sessions: int = 1000) -> float:
    """The same awaits in anyio task groups, a group of 8 per session, as the runner spawns them."""
    async def session() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(TURNS):
                tg.start_soon(anyio.sleep, 0.01)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(sessions):
            tg.start_soon(session)
    return time.perf_counter() - start


def packing(rows: int = 256, repeats: int = 20) -> tuple[float, float]:
    sequences = [make_branch().to_sequence(f"t{TURNS - 1}") for _ in range(rows)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        batch = pack_branches(sequences, bucket=128)
        times.append((time.perf_counter() - start) / (rows * TURNS))
    start = time.perf_counter()
    jax.block_until_ready(jax.device_put(batch))
    return statistics.median(times), time.perf_counter() - start


def main() -> None:
    per_turn = anyio.run(overhead)
    rounds = [(anyio.run(throughput), anyio.run(bare_gather), anyio.run(scorer_gather)) for _ in range(3)]
    wall, gather_floor, same_awaits = (statistics.median(r[i] for r in rounds) for i in range(3))
    ratios = sorted(r[0] / r[1] for r in rounds)
    same_ratios = sorted(r[0] / r[2] for r in rounds)
    no_gc = throughput_without_gc()
    group_floor = anyio.run(bare_task_groups)
    pack_per_turn, transfer = packing()
    print(f"runner overhead per turn (trivial scorer, 8-turn branches): {per_turn * 1e6:.1f} us (target < 50 us)")
    print(f"1000 sessions x 8 turns, 10 ms scorer: wall {wall * 1e3:.1f} ms, ideal 10.0 ms, "
          f"ratio {wall / 0.01:.2f} (target <= 2)")
    print(f"  the event loop alone, no runner (medians of 3 rounds): asyncio.gather of 8000 asyncio.sleep "
          f"{gather_floor * 1e3:.1f} ms; of the scorer's own evaluate (the same awaits) {same_awaits * 1e3:.1f} ms; "
          f"anyio task groups {group_floor * 1e3:.1f} ms")
    print(f"  runner / bare gather: median {statistics.median(ratios):.2f} (rounds {', '.join(f'{r:.2f}' for r in ratios)}); "
          f"runner / the same awaits gathered: median {statistics.median(same_ratios):.2f} (rounds "
          f"{', '.join(f'{r:.2f}' for r in same_ratios)}; target <= 3); runner with the cyclic GC off "
          f"{no_gc * 1e3:.1f} ms ({no_gc / gather_floor:.2f}x the bare gather)")
    print(f"packing per turn (256 branches x 8 turns): {pack_per_turn * 1e6:.2f} us (target < 5 us); "
          f"one device_put of the batch: {transfer * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
