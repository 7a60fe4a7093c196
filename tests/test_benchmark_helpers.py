"""The measuring helpers of the benchmarks that the device check (benchmarks/gpu_check.sh, issue 47) relies
on: the host round trips found in a compiled step, the inputs every estimator is benchmarked on, and auto's
rule read from the measurements."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from auto_table import rule, table
from bench_advantages import estimator_inputs, make_inputs
from bench_train_step import host_round_trips


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



def _result(shape: str, **ms: float) -> dict:
    res = {"shape": shape, **{m: t / 1e3 for m, t in ms.items()}, "copy": 1e-3}
    res["bytes"] = {"copy": 34, **dict.fromkeys(ms, 17)}
    res["fastest"] = min(ms, key=ms.__getitem__)
    return res


def test_auto_rule_is_the_least_geometric_mean_of_time_over_the_fastest_per_regime_and_row_length():
    below = {"gamma": 0.99, "lam": 0.95, "results": [
        _result("64x1024", scan=1.0, associative=2.0, blocked=1.5),
        _result("256x2048", scan=1.0, associative=0.9, blocked=3.0),  # associative wins one short shape ...
        _result("64x8192", scan=8.0, associative=2.0, blocked=4.0),
        _result("16x32768", scan=30.0, associative=5.0, blocked=2.5)]}
    unit = {"gamma": 1.0, "lam": 1.0, "results": [
        _result("64x1024", scan=1.0, associative=2.0, blocked=1.5, cumsum=0.5),
        _result("64x8192", scan=8.0, associative=2.0, blocked=4.0, cumsum=1.0)]}
    got = rule([below, unit], long=8192)
    # ... but scan's ratios (1, 1.11) beat its (2, 1); long rows: associative (1, 2) against blocked (2, 1) ties
    # on the geometric mean, and the first in the list wins; gamma*lambda = 1: cumsum everywhere
    assert got == {(False, False): "scan", (False, True): "associative", (True, False): "cumsum",
                   (True, True): "cumsum"}
    text = table([below, unit])
    # each as a fraction of the copy's bandwidth: (17 bytes / its time) / (34 bytes / 1 ms)
    # (the columns: every method but auto, prm_jax.kernels.GAE_METHODS: scan, associative, blocked, cumsum,
    # native, pallas; the last three not measured here)
    assert "| < 1 | 16x32768 | 30.000 ms (2%) | 5.000 ms (10%) | 2.500 ms (20%) | - | - | - | blocked |" in text
