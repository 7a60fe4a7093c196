"""Runner benchmark: overhead per turn, concurrent throughput, and host packing cost.

  python benchmarks/bench_runner.py

1. overhead: ``PRMRunner.run`` on 8-turn branches with a trivial scorer; median time per turn.
2. throughput: 1,000 sessions of 8 turns scored concurrently by a scorer that awaits 10 ms per turn; wall
   time against the ideal concurrent time (10 ms: every turn of every session in flight at once), and
   against the floor of the event loop itself: the same 8,000 concurrent 10 ms awaits with no runner, as
   one ``asyncio.gather`` and as anyio task groups shaped like the runner's (a group per session).
3. packing: ``pack_branches`` of 256 scored 8-turn branches into device buffers; median time per turn, and
   the one ``device_put`` of the batch.
"""

from __future__ import annotations

import asyncio
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
    async with anyio.create_task_group() as tg:
        for cache in branches:
            tg.start_soon(runner.run, cache)
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
    wall = anyio.run(throughput)
    gather_floor = anyio.run(bare_gather)
    group_floor = anyio.run(bare_task_groups)
    pack_per_turn, transfer = packing()
    print(f"runner overhead per turn (trivial scorer, 8-turn branches): {per_turn * 1e6:.1f} us (target < 50 us)")
    print(f"1000 sessions x 8 turns, 10 ms scorer: wall {wall * 1e3:.1f} ms, ideal 10.0 ms, "
          f"ratio {wall / 0.01:.2f} (target <= 2)")
    print(f"  the event loop alone, no runner: asyncio.gather of the 8000 awaits {gather_floor * 1e3:.1f} ms "
          f"(ratio to ideal {gather_floor / 0.01:.2f}), anyio task groups {group_floor * 1e3:.1f} ms "
          f"(ratio {group_floor / 0.01:.2f}); runner / task-group floor {wall / group_floor:.2f}")
    print(f"packing per turn (256 branches x 8 turns): {pack_per_turn * 1e6:.2f} us (target < 5 us); "
          f"one device_put of the batch: {transfer * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
