"""Issue 56.1: a check that raises under ``jit`` (the single kernels' traced checks, and
``AdvantageConfig(check_values="callback")``) reaches the caller on every backend. The mechanism is equinox's
``error_if``: a ``pure_callback`` under a ``cond`` whose answer the output depends on (the output's first entry
is selected by it), not a ``jax.debug.callback`` side effect that a backend may run without failing the
computation. Within ``lowering_platform`` (``jax.export``, which cannot carry a callback) a failed check sets
that entry to NaN instead."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from exports import exported

import prm_jax
from prm_jax import AdvantageConfig, NormConfig, ShapingConfig, compute_advantages
from prm_jax.kernels import normalize

GROUP = NormConfig("group", "group")


def grouped(x, sizes):
    return normalize(x, None, GROUP, group_sizes=sizes)


def rows(seed, n=4, width=3):
    return np.random.default_rng(seed).normal(size=(n, width)).astype(np.float32)


def test_the_error_reaches_whoever_reads_the_output_and_the_output_is_the_eager_one():
    x = rows(1)
    x[0, 0] = -0.0  # (the tied entry keeps its bits: -0.0 stays -0.0)
    step = jax.jit(grouped)
    with pytest.raises(Exception, match="sum to the batch size 4"):
        np.asarray(step(x, jnp.array([2, 5])))  # read, not waited for
    with pytest.raises(Exception, match="sum to the batch size 4"):
        jax.block_until_ready(step(x, jnp.array([3, 5])))
    good = step(x, jnp.array([2, 2]))  # (the failed calls leave nothing behind)
    want = grouped(x, np.array([2, 2]))
    np.testing.assert_array_equal(np.asarray(good), np.asarray(want))
    assert np.signbit(np.asarray(good)[0, 0]) == np.signbit(np.asarray(want)[0, 0])


def test_one_host_callback_carries_every_check_and_runs_only_on_failure():
    jaxpr = str(jax.make_jaxpr(grouped)(rows(2), jnp.array([2, 2])))
    assert jaxpr.count("pure_callback") == 1 and "cond" in jaxpr and "debug_callback" not in jaxpr
    calls = []
    step = jax.jit(lambda x, s: grouped(x, s))
    jax.block_until_ready(step(rows(2), jnp.array([2, 2])))
    # (a passing call never reaches the host: the callback's own raise is the only way to see it run)
    original = prm_jax.kernels._checks._raise_on_host
    try:
        prm_jax.kernels._checks._raise_on_host = lambda *a: calls.append(a)
        jax.block_until_ready(jax.jit(lambda x, s: grouped(x, s))(rows(2), jnp.array([2, 2])))
        assert calls == []
        jax.block_until_ready(jax.jit(lambda x, s: grouped(x, s) * 1)(rows(2), jnp.array([1, 2])))
        assert calls  # (the failing call did)
    finally:
        prm_jax.kernels._checks._raise_on_host = original


def test_under_vmap_only_a_failing_member_raises():
    x = np.stack([rows(3), rows(4)])
    batched = jax.jit(jax.vmap(grouped))
    out = batched(x, jnp.array([[2, 2], [1, 3]]))  # both members valid
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(out[i]), np.asarray(grouped(x[i], np.array([[2, 2], [1, 3]][i]))))
    with pytest.raises(Exception, match="sum to the batch size 4"):
        jax.block_until_ready(batched(x, jnp.array([[2, 2], [1, 4]])))  # the second member fails


def test_a_gradient_passes_through_a_checked_kernel_and_equals_the_eager_one():
    x = rows(5)
    loss = lambda x, s: jnp.sum(grouped(x, s) ** 3)
    want = jax.grad(loss)(x, np.array([2, 2]))
    got = jax.jit(jax.grad(loss))(x, jnp.array([2, 2]))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)  # (jit's fusion)
    assert np.isfinite(np.asarray(got)).all()


def test_compute_advantages_with_the_callback_raises_when_only_one_output_is_read():
    from test_advantages import spec_example

    batch = spec_example(token_rewards=np.array([[0, 0, 0, 0, 0, 2.0, 2.0, 2.0]], np.float32))
    cfg = AdvantageConfig(advantage_shaping=ShapingConfig("process_weighted"), check_values="callback")
    for field in ("returns", "advantages", "loss_mask"):
        step = jax.jit(lambda b, f=field: getattr(compute_advantages(b, cfg), f))
        with pytest.raises(Exception, match=r"\[0, 1\]"):
            np.asarray(step(batch))
    ok = dataclasses.replace(cfg, advantage_shaping=ShapingConfig("additive"))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda b: compute_advantages(b, ok).advantages)(batch)),
                                  np.asarray(compute_advantages(batch, ok).advantages))


@pytest.mark.parametrize("platform", ["cpu", "cuda", "tpu"])
def test_an_exported_kernel_carries_no_callback_and_a_failed_check_leaves_nan(platform):
    x = jax.ShapeDtypeStruct((4, 3), np.float32)
    sizes = jax.ShapeDtypeStruct((2,), np.int32)
    program = exported(grouped, platform, x, sizes)
    assert "custom_call" not in program.mlir_module()
    if platform == "cpu":  # (this host runs it)
        good = np.asarray(program.call(rows(6), np.array([2, 2], np.int32)))
        np.testing.assert_array_equal(good, np.asarray(grouped(rows(6), np.array([2, 2]))))
        bad = np.asarray(program.call(rows(6), np.array([2, 5], np.int32)))
        assert np.isnan(bad[0, 0])
