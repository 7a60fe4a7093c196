"""The measuring helpers of the benchmarks that the device check (benchmarks/gpu_check.sh, issue 47) relies
on: the host round trips found in a compiled step, the inputs every estimator is benchmarked on, and the
dealing of test files to parallel pytest processes."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_advantages import estimator_batches, estimator_inputs, make_inputs
from bench_train_step import host_round_trips
from shard_tests import deal

import prm_jax
from prm_jax.estimators import registered


def test_host_round_trips_counts_each_callback_of_a_compiled_program_and_nothing_else():
    def step(x):
        jax.debug.callback(lambda v: None, x)
        y = jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return jnp.sin(y) + 1

    with_callbacks = jax.jit(step).lower(jnp.ones(3)).compile().as_text()
    without = jax.jit(lambda x: jnp.sin(x * 2) + 1).lower(jnp.ones(3)).compile().as_text()
    assert sum(host_round_trips(with_callbacks).values()) == 2
    assert not host_round_trips(without)


def test_estimator_inputs_are_make_inputs_turns_and_a_tree_per_group():
    batch, *_ = make_inputs(12, 1200)
    extra = estimator_inputs(batch, group=8)
    turn_ids, node_ids, parents = extra["turn_ids"], extra["node_ids"], extra["node_parents"]
    np.testing.assert_array_equal(turn_ids >= 0, batch["loss_mask"] > 0)
    assert extra["group_sizes"].tolist() == [8, 4]
    for b in range(12):
        turns = turn_ids[b].max() + 1
        # turns are numbered in order, one span of generated tokens each, 272 tokens apart
        starts = [int(np.flatnonzero(turn_ids[b] == k)[0]) for k in range(turns)]
        assert np.all(np.diff(starts) == 272)
        path = node_ids[b, :turns]
        assert np.all(node_ids[b, turns:] == -1) and np.all(path >= 0)
        assert parents[path[0]] == -1 and np.all(parents[path[1:]] == path[:-1])
        assert path[0] == node_ids[8 * (b // 8), 0]  # the group's first turn is one node
    assert len(set(node_ids[node_ids >= 0].tolist())) == parents.size  # every node is some row's turn
    pi_squared = np.exp(np.roll(batch["logprobs"], -1, axis=1).astype(np.float64)) ** 2
    assert np.all(extra["sum_pi_squared"] >= pi_squared.astype(np.float32)) and np.all(extra["sum_pi_squared"] <= 1)


def test_every_registered_estimator_runs_on_its_benchmark_batch():
    batch, *_ = make_inputs(8, 600)
    runs = estimator_batches(batch)
    assert sorted(runs) == sorted(spec.name for spec in registered())
    for name, (config, inputs) in runs.items():
        advantages = np.asarray(prm_jax.compute_advantages(inputs, config).advantages)
        assert np.all(np.isfinite(advantages)) and np.any(advantages != 0), name


def test_deal_gives_every_file_once_the_first_group_before_the_rest_and_balances_bytes(tmp_path):
    sizes = {"a": 900, "b": 500, "c": 400, "d": 300, "e": 100, "f": 50}
    for name, size in sizes.items():
        (tmp_path / name).write_text("x" * size)
    first, rest = [str(tmp_path / n) for n in "abc"], [str(tmp_path / n) for n in "def"]
    shards = deal(2, first, rest)
    assert sorted(f for shard in shards for f in shard) == sorted(first + rest)
    for shard in shards:  # each process starts with its share of the first group
        kinds = [f in first for f in shard]
        assert kinds == sorted(kinds, reverse=True)
    loads = sorted(sum(sizes[Path(f).name] for f in shard) for shard in shards)
    assert loads == [1050, 1200]  # a | b c (900 each), then d to the first, e and f to the lighter: a+d, b+c+e+f
    assert deal(8, first, []) == [[f] for f in first]  # no empty process
    # the tests of one file on two processes: each entry weighs half the file's bytes (450 < b's 500)
    halves = [f"{first[0]}::test[0]", f"{first[0]}::test[1]"]
    assert deal(2, [*halves, first[1]]) == [[first[1]], halves]
