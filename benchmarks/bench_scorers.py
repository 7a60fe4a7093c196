"""Scorers on real serving stacks (issue 30): the four workloads of a real agent-RL run, 256 sessions x 4
turns each, against the ideal their resources allow, in one run.

  python benchmarks/bench_scorers.py [--sessions 256] [--repeats 3]

1. verifier: a CPU-bound verifier in pure Python (~8 ms a turn, holds the GIL) through the process
   executor, with an async 20 ms scorer beside it (``timeout=0.5``). Ideal: the verifier's total CPU time
   (measured serially on a sample, in this run) / the cores. Also the same verifier inside ``async def
   evaluate`` (the old way): its wall and the neighbour's failures.
1m. math verifier: ``MathVerifyScorer`` (math-verify, ``scope: every_turn``) on replies that end in a boxed
   fraction, through the process executor. Ideal: its serial CPU time on a sample / the cores (issue 42.3).
1r. the math verifier on Ray (issue 45): ``MathVerifyScorer`` through ``executor="ray"`` on a local cluster of
   this machine's cores against the process executor on the same machine, both pools warmed, seven rounds
   at least, interleaved (target: within 1.15x); then rows per second on a two-node cluster (``ray.cluster_utils``, one
   CPU a node). Needs the ray extra; run it where Ray may bind (python3 dev.py ray's private network
   namespace: ``unshare --net --map-root-user sh -c 'ip link set lo up && python benchmarks/bench_scorers.py
   --only 1r'``).
2. judge: ``OpenAIJudgeScorer`` against an OpenAI-compatible stub (its own process) with a deployment's
   limits: 250 requests/s, 16 in flight, 429 + ``Retry-After`` beyond, 20 ms a request. Settings: the
   defaults plus ``max_concurrency=16`` and ``max_requests_per_second=250`` (the published limits). Ideal:
   1,024 requests / 250 per second. Rows dropped and requests made (ideal 1,024).
3. pooling PRM: ``PoolingPRMScorer`` against vLLM's /pooling (a stub, its own process: one engine, 10 ms +
   4 us a token per request). Ideal: 4 requests (``max_batch_size=64``), the engine's time for them;
   tokens sent against one leaf per branch.
3t. distillation teacher: ``TeacherLogprobScorer`` against vLLM's /v1/completions with prompt log-probs (a
   stub as in 3). Ideal: 4 requests, the engine's time for them; tokens against one leaf per branch.
4. JAX PRM: ``ModelScorer`` over a trainer's arrays (``score_arrays``) against the best hand-batched loop
   (the same jitted model on chunks of 64 rows padded to the same bucket). Compiles against buckets used;
   numbers against per-turn calls. Beside it, its parts and floors: the checks as the path makes them (in the
   copies) against the hand loop's copies, the native survey and numpy's checks, one read of the arrays, and the
   path's native calls alone (its cost if its Python cost nothing; with ``--model free``, the Python a call).
   4b: rows of mixed lengths (64..512) against the hand loop that sorts rows by length and pads each chunk to
   its own bucket (issue 42.4).
5. batching: a ``BatchScorer`` and a ``BatchTrajectoryScorer`` whose call takes 20 ms: calls made (ideal 16
   and 4) and wall against the same calls in a hand-written loop.
6. shared turns: a prefix-determined scorer on a session tree of 64 leaves and depth 8: calls against
   distinct turns.

Medians over ``--repeats`` runs; every ratio within this run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import jax
import jax.numpy as jnp
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the workloads' scorers, importable by the verifier's worker processes
sys.path.insert(0, str(HERE.parent / "tests"))  # the stub servers

import scorer_workloads as work  # noqa: E402
from stub_servers import answer_seven, engine_time, server_process, step_by_last_token, teacher_logprob  # noqa: E402

from prm_jax import BaseScorer, BatchScorer, BatchTrajectoryScorer, Interaction, InteractionCache, PRMRunner  # noqa: E402
from prm_jax.native._ffi import chunk_rows, plan_rows, scores_placer  # noqa: E402
from prm_jax.runtime import BlockingRunner, score_arrays  # noqa: E402
from prm_jax.runtime._arrays import _fused_chunks, _numpy_rows, _planned_rows, _surveyed_rows  # noqa: E402
from prm_jax.scorers import ModelScorer, OpenAIJudgeScorer, PoolingPRMScorer  # noqa: E402

TURNS = 4
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def sessions(n: int, prompt: int = 200, output: int = 30, tool: int = 10, seed: int = 0,
             separator: int | None = None, step: int = 6, logprobs: bool = False) -> list[list[Interaction]]:
    """``n`` branches of ``TURNS`` turns (~370 tokens at the leaf), with messages; token ids < 30,000. With a
    ``separator``, every ``step``-th token of an output is it (``output // step`` steps per turn); with
    ``logprobs``, the student's log-prob of each output token (a distillation teacher reads them)."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n):
        tokens = rng.integers(1, 30_000, prompt).tolist()
        chain: list[Interaction] = []
        for k in range(TURNS):
            generated = rng.integers(1, 30_000, output).tolist()
            if separator is not None:
                generated[step - 1::step] = [separator] * len(generated[step - 1::step])
            chain.append(Interaction(f"b{b}t{k}", list(tokens), generated,
                                     parent_id=chain[-1].interaction_id if chain else None,
                                     output_logprobs=(-rng.exponential(0.5, output)).tolist() if logprobs else None,
                                     messages=[{"role": "user", "content": f"question {b}.{k}"}],
                                     output_messages=[{"role": "assistant", "content": f"answer {b}.{k}"}]))
            tokens = tokens + generated + rng.integers(1, 30_000, tool).tolist()
        out.append(chain)
    return out


def fresh(branches: list[list[Interaction]]) -> list[list[Interaction]]:
    return [[turn.clone() for turn in chain] for chain in branches]


def median(values: list[float]) -> float:
    return statistics.median(values)


# --- 1. the CPU-bound verifier ----------------------------------------------------------------------------

def calibrate(target_s: float = 0.008) -> int:
    tokens = list(range(1, 31))
    rounds = 20_000
    start = time.perf_counter()
    work.verify(tokens, rounds)
    spent = time.perf_counter() - start
    return max(1000, int(rounds * target_s / spent))


def bench_verifier(n: int, repeats: int) -> None:
    rounds = calibrate()
    branches = sessions(n)
    turns = [turn for chain in branches for turn in chain]
    sample = turns[:128]
    for turn in sample[:16]:  # warm (the first calls run slower)
        work.verify(turn.output_tokens.tolist(), rounds)
    start = time.perf_counter()
    for turn in sample:
        work.verify(turn.output_tokens.tolist(), rounds)
    per_turn = (time.perf_counter() - start) / len(sample)
    ideal = per_turn * len(turns) / CORES

    async def process_executor() -> tuple[list[float], list[int], float]:
        runner = PRMRunner(scorers=(work.Verifier(rounds=rounds, max_workers=CORES), work.Neighbour(timeout=0.5)))
        started = time.perf_counter()
        await runner.run_many(fresh(branches[:2]))  # the workers start (forkserver, imports)
        startup = time.perf_counter() - started
        walls, failures = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            results = await runner.run_many(fresh(branches), return_exceptions=True)
            walls.append(time.perf_counter() - started)
            failures.append(sum(isinstance(r, Exception) for r in results))
        await runner.aclose()
        return walls, failures, startup

    walls, failures, startup = anyio.run(process_executor)

    async def on_the_loop() -> tuple[float, int]:
        import warnings

        runner = PRMRunner(scorers=(work.VerifierOnTheLoop(rounds=rounds), work.Neighbour(timeout=0.5)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            started = time.perf_counter()
            results = await runner.run_many(fresh(branches), return_exceptions=True)
        return time.perf_counter() - started, sum(isinstance(r, Exception) for r in results)

    old_wall, old_failures = anyio.run(on_the_loop)
    print(f"\n1. verifier: {len(turns)} turns x {per_turn * 1e3:.1f} ms CPU, {CORES} cores; ideal (CPU / cores) "
          f"{ideal:.2f} s")
    print(f"   process executor: wall {median(walls):.2f} s = {median(walls) / ideal:.2f}x ideal (runs: "
          f"{', '.join(f'{w / ideal:.2f}' for w in walls)}); neighbour (timeout 0.5 s) failed on "
          f"{max(failures)} of {n} rows; worker start-up {startup:.2f} s (once)")
    print(f"   inside async evaluate (the old way): wall {old_wall:.2f} s = {old_wall / ideal:.2f}x ideal; "
          f"neighbour failed on {old_failures} of {n} rows")


def math_sessions(n: int) -> tuple[list[list[Interaction]], list[dict[str, str]]]:
    """``n`` branches of ``TURNS`` turns whose replies end in a boxed fraction (half of them right), and each
    branch's metadata (its reference answer, a decimal)."""
    rng = np.random.default_rng(1)
    branches, metadata = [], []
    for b in range(n):
        p, q = int(rng.integers(1, 50)), int(rng.integers(2, 9))
        chain: list[Interaction] = []
        tokens = [1, 2, 3]
        for k in range(TURNS):
            shown = (p, q) if (b + k) % 2 == 0 else (p + 1, q)
            text = (f"Step {k}: we simplify the sum of the terms, {p} \\cdot {q} = {p * q}, and divide. "
                    f"So the answer is \\boxed{{\\frac{{{shown[0]}}}{{{shown[1]}}}}}.")
            chain.append(Interaction(f"m{b}t{k}", list(tokens), [4, 5, 6], output_messages=[
                {"role": "assistant", "content": text}], parent_id=chain[-1].interaction_id if chain else None))
            tokens = tokens + [4, 5, 6, 7]
        branches.append(chain)
        metadata.append({"answer": f"{p / q:.6f}"})
    return branches, metadata


def bench_math_verify(n: int, repeats: int) -> None:
    """``MathVerifyScorer`` (math-verify, ``scope: every_turn``) through the process executor: 1,024 turns
    against the cores' ideal (its serial time on a sample in this process, / the cores)."""
    from prm_jax.scorers import MathVerifyScorer

    branches, metadata = math_sessions(n)
    contexts = [{"metadata": m} for m in metadata]
    serial = MathVerifyScorer(scope="every_turn")
    for chain, ctx in zip(branches[:8], contexts):  # warm (sympy's caches, the first parses)
        serial.evaluate_trajectory(chain, ctx)
    sample = min(64, n)
    start = time.perf_counter()
    verdicts = [serial.evaluate_trajectory(chain, ctx) for chain, ctx in zip(branches[:sample], contexts)]
    per_branch = (time.perf_counter() - start) / sample
    turns = n * TURNS
    ideal = per_branch * n / CORES
    right = sum(v == 1.0 for d in verdicts for v in d.values())

    async def run() -> tuple[list[float], list[int], float]:
        runner = PRMRunner(scorers=(MathVerifyScorer(scope="every_turn", max_workers=CORES),))
        started = time.perf_counter()
        await runner.run_many(fresh(branches[:CORES]), contexts[:CORES])  # the workers start (imports)
        startup = time.perf_counter() - started
        walls, failures = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            results = await runner.run_many(fresh(branches), contexts, return_exceptions=True)
            walls.append(time.perf_counter() - started)
            failures.append(sum(isinstance(r, Exception) for r in results))
        await runner.aclose()
        return walls, failures, startup

    walls, failures, startup = anyio.run(run)
    print(f"\n1m. math verifier (MathVerifyScorer, every_turn): {turns} turns, {per_branch / TURNS * 1e3:.1f} ms CPU "
          f"a turn, {CORES} cores; ideal (CPU / cores) {ideal:.2f} s; {right} of {sample * TURNS} sampled turns right")
    print(f"   process executor: wall {median(walls):.2f} s = {median(walls) / ideal:.2f}x ideal (runs: "
          f"{', '.join(f'{w / ideal:.2f}' for w in walls)}); failed rows {max(failures)}; worker start-up "
          f"{startup:.2f} s (once)")


def bench_math_verify_on_ray(n: int, repeats: int) -> None:
    """``MathVerifyScorer`` through ``executor="ray"`` (a local cluster of this machine's cores) against the
    process executor, interleaved rounds after both pools warmed; then a two-node cluster's rows per second."""
    try:
        import ray  # noqa: F401
        from ray.cluster_utils import Cluster
    except ImportError:
        print("\n1r. math verifier on Ray: skipped (pip install 'prm-jax[ray]')")
        return
    from prm_jax.scorers import MathVerifyScorer

    branches, metadata = math_sessions(n)
    contexts = [{"metadata": m} for m in metadata]

    from prm_jax.runtime._ray_pool import _CLUSTER
    from prm_jax.runtime._ray_watchdog import cluster_processes, proc_stat

    ticks = os.sysconf("SC_CLK_TCK")

    def cpu_s(pids: list[int]) -> float:
        """The CPU seconds (user + system) the processes ``pids`` have used so far."""
        total = 0
        for pid in pids:
            fields = proc_stat(pid)
            if fields is not None:
                total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / ticks

    def ray_own() -> list[int]:
        """The local cluster's own processes (GCS, raylet, agents: every one but the actors)."""
        own = []
        for pid, _ in cluster_processes(_CLUSTER.marker, {os.getpid()}):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    if not cmdline.read().startswith(b"ray::ScorerActor"):
                        own.append(pid)
            except OSError:
                pass
        return own

    async def interleaved() -> tuple[list[float], list[float], float, dict[str, list[float]]]:
        process = PRMRunner(scorers=(MathVerifyScorer(scope="every_turn", max_workers=CORES),))
        on_ray = PRMRunner(scorers=(MathVerifyScorer(scope="every_turn", executor="ray", max_workers=CORES),))
        started = time.perf_counter()
        await on_ray.run_many(fresh(branches[:CORES * 4]), contexts[:CORES * 4])  # ray.init, actors, imports
        ray_startup = time.perf_counter() - started
        await process.run_many(fresh(branches[:CORES * 4]), contexts[:CORES * 4])
        own = ray_own()
        workers = {"process": [w.process.pid for w in process._executors[id(process._scorers[0])]._live],
                   "ray": [a.pid for a in on_ray._executors[id(on_ray._scorers[0])]._live]}
        walls: dict[str, list[float]] = {"process": [], "ray": []}
        # CPU seconds a round: this driver's, the workers' (the work, and each pool's own costs there), and
        # the cluster's own processes'
        cpu: dict[str, list[float]] = {"process": [], "ray": [], "process_workers": [], "ray_workers": [],
                                       "ray_own": []}
        for _ in range(max(repeats, 7)):  # (rounds on two shared cores vary by 0.7-1.5x: seven at least)
            for name, runner in (("process", process), ("ray", on_ray)):
                driver, cluster, work = time.process_time(), cpu_s(own), cpu_s(workers[name])
                started = time.perf_counter()
                results = await runner.run_many(fresh(branches), contexts, return_exceptions=True)
                walls[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - driver)
                cpu[f"{name}_workers"].append(cpu_s(workers[name]) - work)
                if name == "ray":
                    cpu["ray_own"].append(cpu_s(own) - cluster)
                assert not any(isinstance(r, Exception) for r in results), name
        await process.aclose()
        await on_ray.aclose()
        return walls["process"], walls["ray"], ray_startup, cpu

    process_walls, ray_walls, startup, cpu = anyio.run(interleaved)
    ratio = median(ray_walls) / median(process_walls)
    # The floor: the cores' time Ray's machinery takes beside the work (its GCS, raylet and agents, and this
    # driver's share beyond the process executor's), added to the process executor's wall on the same cores.
    m = {key: median(values) for key, values in cpu.items()}
    extra = m["ray"] + m["ray_workers"] + m["ray_own"] - m["process"] - m["process_workers"]
    floor = 1 + extra / (median(process_walls) * CORES)
    print(f"\n1r. math verifier on Ray: {n * TURNS} turns, {CORES} cores, a local cluster (start-up {startup:.1f} s, "
          f"once)")
    rounds = ", ".join(f"{r / p:.2f}" for r, p in zip(ray_walls, process_walls))
    print(f"   ray executor: wall {median(ray_walls):.2f} s = {ratio:.2f}x the process executor's "
          f"{median(process_walls):.2f} s (target <= 1.15x; rounds interleaved: {rounds})")
    print(f"   CPU-s a round, ray (process): driver {m['ray']:.2f} ({m['process']:.2f}), workers {m['ray_workers']:.2f} "
          f"({m['process_workers']:.2f}), the cluster's own processes {m['ray_own']:.2f}: Ray's machinery takes "
          f"{extra:.2f} CPU-s more of {CORES} cores, a floor of {floor:.2f}x")

    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])
    cluster = Cluster(initialize_head=True, head_node_args=dict(node))
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()

        async def two_nodes() -> tuple[list[float], int]:
            scorer = MathVerifyScorer(scope="every_turn", executor="ray", max_workers=2, ray_address=cluster.address)
            runner = PRMRunner(scorers=(scorer,))
            await runner.run_many(fresh(branches[:8]), contexts[:8])
            walls = []
            for _ in range(repeats):
                started = time.perf_counter()
                await runner.run_many(fresh(branches), contexts)
                walls.append(time.perf_counter() - started)
            nodes = len(runner._executors[id(scorer)].nodes)  # type: ignore[attr-defined]
            await runner.aclose()
            return walls, nodes

        walls, nodes = anyio.run(two_nodes)
    finally:
        cluster.shutdown()
    print(f"   two-node cluster (1 CPU a node, actors on {nodes} nodes): {n * TURNS / median(walls):.0f} turns/s "
          f"({n} rows: {n / median(walls):.0f} rows/s), wall {median(walls):.2f} s")


# --- 2. the LLM judge -------------------------------------------------------------------------------------

def bench_judge(n: int, repeats: int) -> None:
    rate, capacity, service = 250.0, 16, 0.02
    branches = sessions(n)
    turns = n * TURNS
    ideal = turns / min(rate, capacity / service)
    walls, dropped, sent, statuses = [], [], [], []
    for _ in range(repeats):
        with server_process("chat", answer=answer_seven, capacity=capacity, rate=rate, service_s=service) as server:
            async def run(server=server) -> tuple[float, int, int]:
                scorer = OpenAIJudgeScorer(server["url"] + "/v1", "judge", max_concurrency=capacity,
                                           max_requests_per_second=rate)
                runner = PRMRunner(scorers=(scorer,))
                started = time.perf_counter()
                results = await runner.run_many(fresh(branches), return_exceptions=True)
                wall = time.perf_counter() - started
                stats = runner.scorer_stats()["openai_judge"]
                await scorer.aclose()
                return wall, sum(isinstance(r, Exception) for r in results), int(stats["requests_sent"])

            wall, failed, requests = anyio.run(run)
        walls.append(wall)
        dropped.append(failed)
        sent.append(requests)
        statuses.append(server["summary"]["statuses"])
    print(f"\n2. judge: {turns} turns, server {rate:.0f} req/s, {capacity} in flight, {service * 1e3:.0f} ms a "
          f"request; ideal {ideal:.2f} s")
    print(f"   wall {median(walls):.2f} s = {median(walls) / ideal:.2f}x ideal (runs: "
          f"{', '.join(f'{w / ideal:.2f}' for w in walls)}); rows dropped {max(dropped)}; requests "
          f"{max(sent)} = {max(sent) / turns:.3f} x {turns}; server statuses {statuses[-1]}")


def served_runs(kind: str, make_scorer: Callable[..., Any], branches: list[list[Interaction]], repeats: int,
                limit: int | None, **server: Any) -> tuple[list[float], list[int], list[int]]:
    """``repeats`` runs of ``make_scorer(base_url=...)`` over fresh copies of ``branches`` against a stub
    server of ``kind`` in its own process: each run's wall, requests and tokens received."""
    walls, requests, tokens = [], [], []
    for _ in range(repeats):
        with server_process(kind, **server) as stub:
            async def run(url: str = stub["url"]) -> float:
                scorer = make_scorer(base_url=url)
                runner = PRMRunner(scorers=(scorer,))
                started = time.perf_counter()
                await runner.run_many(fresh(branches), limit=limit)
                wall = time.perf_counter() - started
                await scorer.aclose()
                return wall

            walls.append(anyio.run(run))
        requests.append(stub["summary"]["requests"])
        tokens.append(stub["summary"]["tokens_received"])
    return walls, requests, tokens


# --- 3. the pooling PRM -----------------------------------------------------------------------------------

def bench_pooling(n: int, repeats: int) -> None:
    from prm_jax.runtime._steps import StepRule
    from prm_jax.scorers._pooling_prm import branch_tokens

    tag, separator = 30_001, 30_000  # steps of 6 tokens (5 per turn), each tagged (Qwen2.5-Math-PRM's layout)
    branches = sessions(n, separator=separator)
    rule = StepRule.parse([[separator]], tag)
    leaf_tokens = [len(branch_tokens(chain, tag, rule).ids) for chain in branches]
    steps = sum(len(rule.ends(t.output_tokens)) for chain in branches for t in chain)
    per_turn_tokens = sum(len(t.input_tokens) + t.output_len + 1 for chain in branches for t in chain)
    batches = [leaf_tokens[i:i + 64] for i in range(0, n, 64)]
    ideal = sum(engine_time(sum(batch)) for batch in batches)
    for limit in (64, None):
        walls, requests, tokens = served_runs(
            "pooling", functools.partial(PoolingPRMScorer, model="prm", step_tag_id=tag, max_batch_size=64,
                                         step_separator=[[separator]], spread="step"),
            branches, repeats, limit, step_score=step_by_last_token, step_tag_id=tag, engine_s=engine_time)
        print(f"\n3. pooling PRM (run_many limit={limit}): {n} branches, {steps} tagged steps "
              f"({steps / n / TURNS:.0f} per turn); ideal {len(batches)} requests, engine "
              f"{ideal:.2f} s" if limit == 64 else f"   limit={limit}:")
        print(f"   wall {median(walls):.2f} s = {median(walls) / ideal:.2f}x the engine time (runs: "
              f"{', '.join(f'{w / ideal:.2f}' for w in walls)}); requests {max(requests)}; tokens sent "
              f"{max(tokens)} (one leaf per branch: {sum(leaf_tokens)}; a request per turn: {per_turn_tokens})")


# --- 3t. the distillation teacher ---------------------------------------------------------------------------

def bench_teacher(n: int, repeats: int) -> None:
    """``TeacherLogprobScorer`` against vLLM's /v1/completions with prompt log-probs (a stub, its own process:
    one engine, 10 ms + 4 us a token per request): requests against the ideal (one per batch of 64 branches),
    wall against the engine's time for them, tokens sent against one leaf per branch (issue 44.3)."""
    from prm_jax.scorers import TeacherLogprobScorer

    branches = sessions(n, logprobs=True)
    leaf_tokens = [len(chain[-1].input_tokens) + chain[-1].output_len for chain in branches]
    batches = [leaf_tokens[i:i + 64] for i in range(0, n, 64)]
    ideal = sum(engine_time(sum(batch)) for batch in batches)
    walls, requests, tokens = served_runs(
        "teacher", functools.partial(TeacherLogprobScorer, model="teacher", max_batch_size=64), branches, repeats,
        64, logprob=teacher_logprob, engine_s=engine_time)
    print(f"\n3t. distillation teacher (vLLM prompt log-probs): {n} branches x {TURNS} turns; ideal {len(batches)} "
          f"requests, engine {ideal:.2f} s")
    print(f"   wall {median(walls):.2f} s = {median(walls) / ideal:.2f}x the engine time (runs: "
          f"{', '.join(f'{w / ideal:.2f}' for w in walls)}); requests {max(requests)}; tokens sent {max(tokens)} "
          f"(one leaf per branch: {sum(leaf_tokens)})")


# --- 4. the JAX PRM ---------------------------------------------------------------------------------------

VOCAB, DIM, HIDDEN = 30_002, 64, 256
KEYS = jax.random.split(jax.random.key(0), 3)
PARAMS = {"embed": jax.random.normal(KEYS[0], (VOCAB, DIM)) * 0.1,
          "w1": jax.random.normal(KEYS[1], (DIM, HIDDEN)) / DIM ** 0.5,
          "w2": jax.random.normal(KEYS[2], (HIDDEN,)) / HIDDEN ** 0.5}
TRACES = [0]


def jax_prm(input_ids, attention_mask, turn_ids):
    """A causal PRM: embeddings, a causal running mean, a two-layer head, a sigmoid per token."""
    TRACES[0] += 1
    mask = attention_mask.astype(jnp.float32)[..., None]
    state = jnp.cumsum(PARAMS["embed"][input_ids] * mask, axis=1)
    state = state / jnp.maximum(jnp.cumsum(mask, axis=1), 1.0)
    hidden = jax.nn.gelu(state @ PARAMS["w1"])
    return jax.nn.sigmoid(hidden @ PARAMS["w2"])


def free_model(input_ids, attention_mask, turn_ids):
    """A model that costs almost nothing (a constant per token): what ``ModelScorer`` then costs beside the
    hand-batched loop is its host path alone (issue 56.6: on a GPU the model is fast and the overhead is all
    there is)."""
    TRACES[0] += 1
    return jnp.full(input_ids.shape, 0.5, jnp.float32)


MODELS = {"prm": jax_prm, "free": free_model}


def wall_times(repeats: int, *fns: Callable[[], Any]) -> list[list[float]]:
    """Seconds of ``repeats`` calls of each of ``fns``, interleaved (one call of each per round, so a drift of
    the machine's speed weighs on every function alike): one list per function."""
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, seconds in zip(fns, out):
            started = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - started)
    return out


def bench_model(n: int, repeats: int, chunks: tuple[int, ...] = (64,), model: str = "prm", scale: int = 1) -> None:
    """4. ``ModelScorer`` through ``score_arrays`` against the hand-batched loop, at each chunk size of ``chunks``
    (``max_batch_size``: rows per model call, and the hand loop's chunk), with ``model`` (``MODELS``: the PRM,
    or ``free``, a constant that leaves the host path's overhead alone); rows ``scale`` times as long (prompt,
    outputs and tool outputs; ``T`` = 512 * ``scale``)."""
    for chunk in chunks:
        bench_model_chunk(n, repeats, chunk, MODELS[model], scale)


def bench_model_chunk(n: int, repeats: int, chunk: int, model: Callable[..., Any] = jax_prm, scale: int = 1) -> None:
    branches = sessions(n, prompt=200 * scale, output=30 * scale, tool=10 * scale)
    width = 512 * scale
    tokens = np.zeros((n, width), np.int64)
    turn_ids = np.full((n, width), -1, np.int64)
    attention = np.zeros((n, width), np.int64)
    for b, chain in enumerate(branches):
        leaf = chain[-1]
        row = np.concatenate([leaf.input_tokens, leaf.output_tokens])
        tokens[b, :row.size] = row
        attention[b, :row.size] = 1
        for k, turn in enumerate(chain):
            turn_ids[b, len(turn.input_tokens):len(turn.input_tokens) + turn.output_len] = k
    scorer = ModelScorer(fn=model, max_batch_size=chunk, bucket=128)
    runner = PRMRunner(scorers=(scorer,))
    TRACES[0] = 0
    async def score() -> Any:  # (not a functools.partial holding the arrays: asyncio's runner reprs its main
        # task, a partial's repr prints its arrays, 0.75 ms a call on this VM: Python's cost, not the path's)
        return await score_arrays(runner, tokens, turn_ids, attention_mask=attention)

    out = anyio.run(score)  # compiles
    compiles = TRACES[0]
    used = {-(-int(attention[b:b + chunk].sum(axis=1).max()) // 128) * 128 for b in range(0, n, chunk)}
    jitted = jax.jit(model)
    padded = max(used)

    def hand_chunk(b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """The hand loop's copies of rows b, b + 1, ... into one call's buffers."""
        ids = np.zeros((chunk, padded), np.int32)
        mask = np.zeros((chunk, padded), np.int32)
        turns = np.full((chunk, padded), -1, np.int32)
        rows = min(chunk, n - b)
        ids[:rows] = tokens[b:b + chunk, :padded]
        mask[:rows] = attention[b:b + chunk, :padded]
        turns[:rows] = turn_ids[b:b + chunk, :padded]
        return ids, mask, turns, rows

    def hand_loop() -> np.ndarray:
        result = np.zeros((n, width), np.float32)
        for b in range(0, n, chunk):
            ids, mask, turns, rows = hand_chunk(b)
            # (np.asarray, not jax.device_get: the best hand loop; device_get's pytree walk costs 15-30 us a
            # call here, which this loop paid before 2026-12-07 and ModelScorer too)
            scores = np.asarray(jitted(ids, mask, turns))[:rows]
            result[b:b + chunk, :padded] = np.where(turns[:rows] >= 0, scores, 0.0)
        return result

    hand_loop()  # compiles
    # A synchronous trainer's call (BlockingRunner.score_arrays: the rows scored in its own thread), beside the
    # async call in a running loop (score_arrays, one hop to a worker thread), and the parts: the checks any
    # correct path must make of the arrays (token ids in range, AReaL's turn rule), made as the path makes them
    # with one scorer (as the rows are copied into the chunks: each row's length, then the checked copies)
    # against the hand loop's copies alone; and made apart from the copies (the native survey, numpy's passes),
    # beside the floor under any check not fused into the copies: one read of each of the three arrays (a
    # reduction over its bytes).
    blocking = BlockingRunner(scorers=(ModelScorer(fn=model, max_batch_size=chunk, bucket=128),))
    blocking.score_arrays(tokens, turn_ids, attention_mask=attention)  # compiles

    def checked_copies() -> None:
        planned = _planned_rows(tokens, turn_ids, attention)
        assert planned is not None, "the native library is not at hand: the path checks the rows with numpy"
        _, host, plan = planned
        _fused_chunks(host, plan, np.flatnonzero(plan.lengths), np.zeros(n, np.int64), chunk, 128)

    def hand_copies() -> None:
        for b in range(0, n, chunk):
            hand_chunk(b)

    def checks_native() -> None:
        _surveyed_rows(tokens, turn_ids, attention)

    def checks_numpy() -> None:
        _numpy_rows(tokens, turn_ids, attention)

    def one_read() -> None:
        for array in (tokens, turn_ids, attention):
            array.view(np.uint64).max()

    # The path's native work with the least Python around it: each row's length (plan_rows), the checked copies
    # (chunk_rows), the model's calls and one placement (ScoresPlacer), the chunks planned once outside the loop
    # as the hand loop's width is: what the path would cost if its Python cost nothing.
    _, host, plan = _planned_rows(tokens, turn_ids, attention)
    planned_chunks = _fused_chunks(host, plan, np.flatnonzero(plan.lengths), np.zeros(n, np.int64), chunk, 128)
    members = np.concatenate([c.rows for c in planned_chunks])
    sizes, widths = [c.rows.size for c in planned_chunks], [c.ids.shape[1] for c in planned_chunks]

    def native_calls() -> np.ndarray:
        plan_rows(host)
        _, flat_ids, flat_mask, flat_turns, _ = chunk_rows(host, members, sizes, widths, chunk)
        result = np.zeros((n, width), np.float32)
        placer = scores_placer(result)
        assert placer is not None
        offset = 0
        for c, padded in zip(planned_chunks, widths):
            ids, mask, turns = (flat[offset:offset + chunk * padded].reshape(chunk, padded)
                                for flat in (flat_ids, flat_mask, flat_turns))
            placer.add(np.asarray(jitted(ids, mask, turns)), turns, c.rows, c.cut)
            offset += chunk * padded
        placer.place()
        return result

    np.testing.assert_array_equal(native_calls(), out)

    # Three loops: the path against the hand loop (the figure), the parts, then the async call. In one
    # loop of rounds, an anyio.run (its rows read in anyio's worker thread) made every call after it slower, 2x
    # on this VM, and the path more than the hand loop (at chunks of 256, 1.25-1.31x against 1.18-1.20x without
    # it); the checked copies, which came next, measured 1.7-2.5x numpy's copies in that loop and 1.1x apart.
    walls, hand = wall_times(repeats, lambda: blocking.score_arrays(tokens, turn_ids, attention_mask=attention),
                             hand_loop)
    fused, copies, checks, numpy_checks, read = wall_times(repeats, checked_copies, hand_copies, checks_native,
                                                           checks_numpy, one_read)
    native, hand_again = wall_times(repeats, native_calls, hand_loop)
    [in_loop] = wall_times(repeats, lambda: anyio.run(score))
    blocking.close()
    # The numbers against per-turn calls (each turn's prefix alone, unpadded) on a few rows.
    worst = 0.0
    for b in range(4):
        for k, turn in enumerate(branches[b]):
            prefix = np.concatenate([turn.input_tokens, turn.output_tokens]).astype(np.int32)[None]
            alone = np.asarray(model(prefix, np.ones_like(prefix), np.zeros_like(prefix)))[0, -turn.output_len:]
            worst = max(worst, float(np.abs(out[b, turn_ids[b] == k] - alone).max()))
    what = "PRM" if model is jax_prm else "free model (the host path alone)"
    python = "" if model is not free_model else (  # (beside a model that costs something, its time's noise dominates)
        f", so the path's Python costs about {(median(walls) - median(native) * median(hand) / median(hand_again)) * 1e6:.0f}"
        " us a call")
    print(f"\n4. JAX {what}: {n} rows x {TURNS} turns, {int(attention.sum())} tokens (T = {width}); ModelScorer through "
          f"score_arrays, chunks of {chunk} rows: {n / median(walls):,.0f} rows/s against the hand loop's "
          f"{n / median(hand):,.0f}")
    print(f"   BlockingRunner.score_arrays (a synchronous trainer's call; the async call in its own anyio.run: "
          f"{median(in_loop) * 1e3:.1f} ms = {median(in_loop) / median(hand):.2f}x). The checks as the path makes "
          f"them, in the copies: {median(fused) * 1e3:.3f} ms against the hand loop's copies alone "
          f"{median(copies) * 1e3:.3f} ms ({median(fused) / median(copies):.2f}x). Apart from the copies: the native "
          f"survey {median(checks) * 1e3:.3f} ms (numpy's {median(numpy_checks) * 1e3:.3f}), so (hand loop + survey) "
          f"/ hand loop = {(median(hand) + median(checks)) / median(hand):.2f}x; one read of the three arrays, the "
          f"floor of a check not fused into the copies, {median(read) * 1e3:.3f} ms: "
          f"{(median(hand) + median(read)) / median(hand):.2f}x. The path's native calls alone (each row's length, "
          f"the checked copies, the model's calls, one placement; the chunks planned outside the loop), in rounds "
          f"of their own with the hand loop: {median(native) / median(hand_again):.2f}x it{python}:")
    print(f"   wall {median(walls) * 1e3:.1f} ms = {median(walls) / median(hand):.2f}x the hand-batched loop "
          f"({median(hand) * 1e3:.1f} ms; runs: {', '.join(f'{w / median(hand):.2f}' for w in walls)}); compiles "
          f"{compiles} for {len(used)} bucket(s) used; {scorer.forwards // (repeats + 1)} forwards a batch; max |diff| "
          f"against per-turn calls {worst:.2e}")


def bench_model_lengths(n: int, repeats: int) -> None:
    """4b. Rows of mixed lengths (64..512 tokens, shuffled): ``ModelScorer`` through ``score_arrays`` against
    the best hand-batched loop, which sorts the rows by length and pads each chunk of 64 to its own bucket."""
    rng = np.random.default_rng(4)
    width = 512
    lengths = rng.integers(64, width + 1, n)
    tokens = np.zeros((n, width), np.int64)
    turn_ids = np.full((n, width), -1, np.int64)
    attention = np.zeros((n, width), np.int64)
    for b, length in enumerate(lengths):
        tokens[b, :length] = rng.integers(1, VOCAB, length)
        attention[b, :length] = 1
        turn_ids[b, 16:length] = 0
    scorer = ModelScorer(fn=jax_prm, max_batch_size=64, bucket=128)
    runner = PRMRunner(scorers=(scorer,))
    async def score() -> Any:  # (not a functools.partial holding the arrays: asyncio's runner reprs its main
        # task, a partial's repr prints its arrays, 0.75 ms a call on this VM: Python's cost, not the path's)
        return await score_arrays(runner, tokens, turn_ids, attention_mask=attention)

    out = anyio.run(score)  # compiles
    jitted = jax.jit(jax_prm)

    def hand_loop() -> np.ndarray:
        result = np.zeros((n, width), np.float32)
        order = np.argsort(lengths, kind="stable")
        for begin in range(0, n, 64):
            rows = order[begin:begin + 64]
            padded = -(-int(lengths[rows].max()) // 128) * 128
            ids = np.zeros((64, padded), np.int32)
            mask = np.zeros((64, padded), np.int32)
            turns = np.full((64, padded), -1, np.int32)
            ids[:rows.size] = tokens[rows, :padded]
            mask[:rows.size] = attention[rows, :padded]
            turns[:rows.size] = turn_ids[rows, :padded]
            scores = np.asarray(jitted(ids, mask, turns))[:rows.size]
            result[rows, :padded] = np.where(turns[:rows.size] >= 0, scores, 0.0)
        return result

    want = hand_loop()  # compiles
    walls, hand = wall_times(repeats, lambda: anyio.run(score), hand_loop)
    print(f"\n4b. JAX PRM, mixed lengths: {n} rows of 64..{width} tokens, {int(attention.sum())} tokens; "
          "ModelScorer through score_arrays")
    print(f"   wall {median(walls) * 1e3:.1f} ms = {median(walls) / median(hand):.2f}x the hand-batched loop that "
          f"sorts by length ({median(hand) * 1e3:.1f} ms; runs: {', '.join(f'{w / median(hand):.2f}' for w in walls)}); "
          f"max |diff| {float(np.abs(out - want).max()):.2e}")


# --- 5. batched scorers -----------------------------------------------------------------------------------

class TurnBatches(BatchScorer):
    name = "turn_batches"

    async def evaluate_batch(self, items):
        await anyio.sleep(0.02)
        return [1.0] * len(items)


class BranchBatches(BatchTrajectoryScorer):
    name = "branch_batches"

    async def evaluate_batch(self, items):
        await anyio.sleep(0.02)
        return [{} for _ in items]


def bench_batching(n: int, repeats: int) -> None:
    branches = sessions(n)
    for cls, ideal_calls in ((TurnBatches, n * TURNS // 64), (BranchBatches, n // 64)):
        walls, calls = [], []
        for _ in range(repeats):
            scorer = cls(max_batch_size=64)
            runner = PRMRunner(scorers=(scorer,))
            started = time.perf_counter()
            anyio.run(functools.partial(runner.run_many, fresh(branches), limit=None))
            walls.append(time.perf_counter() - started)
            calls.append(int(runner.scorer_stats()[scorer.name]["calls"]))

        async def by_hand(count: int = ideal_calls) -> None:
            for _ in range(count):
                await anyio.sleep(0.02)

        [hand] = wall_times(repeats, lambda: anyio.run(by_hand))
        print(f"{'' if cls is BranchBatches else chr(10) + '5. batching: '}{cls.__name__}: calls {max(calls)} (ideal "
              f"{ideal_calls}); wall {median(walls) * 1e3:.0f} ms = {median(walls) / median(hand):.2f}x the same "
              f"calls one after another by hand ({median(hand) * 1e3:.0f} ms)")


# --- 6. shared turns ----------------------------------------------------------------------------------------

class Counts(BaseScorer):
    name = "counts"
    prefix_determined = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    async def evaluate(self, interaction, ctx):
        self.calls += 1
        await asyncio.sleep(0)
        return 1.0


def bench_shared() -> None:
    turns, frontier = [], [(None, [1])]
    for k in range(2):
        parent, tokens = frontier[0]
        turns.append(Interaction(f"s{k}", tokens, [10 + k], parent_id=parent))
        frontier = [(f"s{k}", tokens + [10 + k])]
    for level in range(6):
        nxt = []
        for i, (parent, tokens) in enumerate(frontier):
            for child in range(2):
                iid = f"n{level}.{2 * i + child}"
                turns.append(Interaction(iid, tokens, [20 + child], parent_id=parent))
                nxt.append((iid, tokens + [20 + child]))
        frontier = nxt
    session = InteractionCache(turns)
    scorer = Counts()
    anyio.run(PRMRunner(scorers=(scorer,)).run_many, [session.clone_chain(leaf) for leaf in session.leaves()])
    print(f"\n6. shared turns: {len(session.leaves())} leaves, depth 8: {scorer.calls} calls for {len(turns)} distinct "
          f"turns (one call per branch and turn: {len(session.leaves()) * 8})")


CPU_TEST = "import sys\nn = int(sys.stdin.read())\nprint(sum(i * i % 7 for i in range(n)))"
TESTS_A_TURN = 8  # (a coding problem's stdin/stdout tests: APPS and CodeContests have about 5 to 20)


def bench_code_execution(sessions: int, repeats: int) -> None:
    """7. code execution (issue 58.7): turns of ``TESTS_A_TURN`` CPU-bound stdin/stdout tests (about 30 ms, then
    about 0.15 s of Python each), ``2 x cores`` turns on ``cores`` threads through ``CodeExecutionScorer``'s
    local sandbox (a sandbox run a test), against the bare interpreter running the same tests the same way (a
    plain subprocess a test) in this run, interleaved: throughput against the bare one (target >= 0.9x); and
    the floor, measured in the same run: the CPU of a test that does nothing, sandboxed (setpriv, bubblewrap's
    namespaces and mounts, prlimit) against bare."""
    import resource
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from prm_jax.scorers import CodeExecutionScorer
    from prm_jax.scorers._code_execution import IOTest
    from prm_jax.scorers._sandbox import unavailable

    interpreter = "/usr/bin/python3"
    reason = unavailable(interpreter)
    if reason is not None:
        print(f"\n7. code execution: skipped ({reason})")
        return
    scorer = CodeExecutionScorer(time_per_test=30.0, total_time=300.0)
    turns, per_turn = 2 * CORES, TESTS_A_TURN

    def throughput(fn: Any) -> float:
        started = time.perf_counter()
        with ThreadPoolExecutor(CORES) as pool:
            list(pool.map(fn, range(turns)))
        return turns * per_turn / (time.perf_counter() - started)

    def cpu_seconds(fn: Any, n: int = 11) -> float:
        """CPU seconds (user and system) of the processes ``fn`` starts, per call."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(n):
            fn()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / n

    def sandboxed_turn(tests: list[IOTest]) -> None:
        kinds = scorer.run_tests(CPU_TEST, tests)
        assert kinds == ["passed"] * len(tests), kinds

    def bare_turn(tests: list[IOTest]) -> None:
        for test in tests:
            subprocess.run([interpreter, "-c", CPU_TEST], input=test.input.encode(), capture_output=True,
                           check=True, timeout=30)

    empty = [IOTest("0", "0")] * per_turn
    each_cpu = (cpu_seconds(lambda: sandboxed_turn(empty)) - cpu_seconds(lambda: bare_turn(empty))) / per_turn
    print(f"\n7. code execution: {turns} turns of {per_turn} CPU-bound tests on {CORES} threads, sandboxed (a "
          "sandbox run a test) against the bare interpreter (a subprocess a test)")
    print(f"   the floor: a test costs {each_cpu * 1e3:.1f} ms of CPU beyond its program (setpriv, bubblewrap's "
          "namespaces and mounts, the prlimit exec; the namespaces' teardown, in kernel threads, uncounted)")
    for size in ("300000", "3000000"):
        tests = [IOTest(size, str(sum(i * i % 7 for i in range(int(size)))))] * per_turn
        ratios, sandbox_rates, bare_rates = [], [], []
        for _ in range(max(repeats, 3)):  # interleaved: bare, then sandboxed, each round
            bare_rate = throughput(lambda _, tests=tests: bare_turn(tests))
            sandbox_rate = throughput(lambda _, tests=tests: sandboxed_turn(tests))
            bare_rates.append(bare_rate)
            sandbox_rates.append(sandbox_rate)
            ratios.append(sandbox_rate / bare_rate)
        run_s = CORES / statistics.median(bare_rates)
        ceiling = run_s / (run_s + max(each_cpu, 0.0))
        print(f"   n={size} ({run_s * 1e3:.0f} ms a test): sandboxed {statistics.median(sandbox_rates):.1f} "
              f"tests/s, bare {statistics.median(bare_rates):.1f}/s: {statistics.median(ratios):.2f}x the bare "
              f"throughput (target >= 0.9x; the floor's ceiling: {ceiling:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="workload numbers to run (default: all)")
    parser.add_argument("--chunks", default="64", help="4: ModelScorer's max_batch_size (and the hand loop's "
                        "chunk), comma-separated: one run each (e.g. 8,64,256)")
    parser.add_argument("--row-scale", type=int, default=1, help="4: rows this many times as long (T = 512 x it; "
                        "the default's ~350 tokens a row is a small batch, where the host path's fixed cost shows most)")
    parser.add_argument("--model", choices=sorted(MODELS), default="prm", help="4: the PRM, or 'free' (a constant "
                        "per token: the host path's overhead alone)")
    args = parser.parse_args()
    print(f"bench_scorers: {args.sessions} sessions x {TURNS} turns, {CORES} cores, jax {jax.__version__}, "
          f"Python {sys.version.split()[0]}; medians of {args.repeats}")
    runs = {"1": bench_verifier, "1m": bench_math_verify, "1r": bench_math_verify_on_ray, "2": bench_judge,
            "3": bench_pooling, "3t": bench_teacher,
            "4": functools.partial(bench_model, chunks=tuple(int(c) for c in args.chunks.split(",")),
                                   model=args.model, scale=args.row_scale),
            "4b": bench_model_lengths, "5": bench_batching, "7": bench_code_execution}
    for key, fn in runs.items():
        if args.only is None or key in args.only:
            fn(args.sessions, args.repeats)
    if args.only is None or "6" in args.only:
        bench_shared()


if __name__ == "__main__":
    main()
