import os
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from batches import compile_log, timestep_inputs
from hypothesis import given, settings
from hypothesis import strategies as st
from native_where import runs_native

import prm_jax
from prm_jax.kernels import _recurrence as recurrence
from prm_jax.native import _ffi as native
from prm_jax.native._build import find_compiler

# ``native`` is skipped where the kernel does not build (tests/kernels/conftest.py).
METHODS = ("scan", "associative", "blocked", "native", "pallas")  # (pallas: interpreted on the CPU, issue 56.4)
ALL_METHODS = METHODS + ("auto",)


def built(methods):
    """The methods this machine runs: ``native`` only where the kernel built."""
    return [m for m in methods if m != "native" or runs_native()]



@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.5), (1.0, 0.9)])
@pytest.mark.parametrize("rows,width", [(1, 1), (3, 17), (5, 130)])
def test_gae_matches_float64_loop(method, gamma, lam, rows, width):
    rng = np.random.default_rng(rows * 1000 + width)
    rewards, values, mask, bootstrap = timestep_inputs(rng, rows, width)
    out = prm_jax.kernels.gae(rewards, values, mask, gamma=gamma, lam=lam, bootstrap=bootstrap, method=method,
                      block_size=8)
    want_adv, want_ret = reference.gae(rewards, values, mask, gamma, lam, bootstrap)
    np.testing.assert_allclose(out.advantages, want_adv, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(out.returns, want_ret, rtol=2e-5, atol=2e-5)
    assert out.advantages.dtype == jnp.float32


@pytest.mark.parametrize("method", ALL_METHODS + ("cumsum",))
def test_unit_discount_paths_match_loop(method):
    rng = np.random.default_rng(7)
    rewards, values, mask, bootstrap = timestep_inputs(rng, 4, 300)
    out = prm_jax.kernels.gae(rewards, values, mask, gamma=1.0, lam=1.0, bootstrap=bootstrap, method=method)
    want_adv, _ = reference.gae(rewards, values, mask, 1.0, 1.0, bootstrap)
    np.testing.assert_allclose(out.advantages, want_adv, rtol=1e-5, atol=5e-5)


def test_cumsum_needs_static_unit_discount():
    rewards, values, mask, _ = timestep_inputs(np.random.default_rng(0), 2, 5)
    with pytest.raises(ValueError, match="gamma \\* lam == 1"):
        prm_jax.kernels.gae(rewards, values, mask, gamma=0.99, lam=1.0, method="cumsum")


@pytest.mark.parametrize("method", METHODS)
def test_per_row_lambda(method):
    rng = np.random.default_rng(3)
    rewards, values, mask, bootstrap = timestep_inputs(rng, 4, 40)
    lam = np.array([0.0, 0.5, 0.95, 1.0], np.float32)
    out = prm_jax.kernels.gae(rewards, values, mask, gamma=0.97, lam=lam, bootstrap=bootstrap, method=method, block_size=7)
    want, _ = reference.gae(rewards, values, mask, 0.97, lam, bootstrap)
    np.testing.assert_allclose(out.advantages, want, rtol=2e-5, atol=2e-5)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, 70), block=st.integers(1, 9),
       gamma=st.floats(0, 1), lam=st.floats(0, 1))
def test_all_methods_agree(seed, width, block, gamma, lam):
    # Any length 1-70, right-padded (masked) to a multiple of 16: the same property, and one compile per
    # width bucket instead of one per random width (issue 31.10).
    rewards, values, mask, bootstrap = timestep_inputs(np.random.default_rng(seed), 3, width)
    pad = ((0, 0), (0, -(-width // 16) * 16 - width))
    rewards, values, mask = np.pad(rewards, pad), np.pad(values, pad), np.pad(mask, pad)
    outs = [prm_jax.kernels.gae(rewards, values, mask, gamma=gamma, lam=lam, bootstrap=bootstrap, method=m,
                        block_size=block).advantages for m in built(METHODS)]
    for other in outs[1:]:
        np.testing.assert_allclose(other, outs[0], rtol=3e-5, atol=3e-5)


@pytest.mark.parametrize("method", METHODS)
def test_masked_rewards_and_values_do_not_change_active_outputs(method):
    rng = np.random.default_rng(11)
    rewards, values, mask, bootstrap = timestep_inputs(rng, 4, 50)
    base = prm_jax.kernels.gae(rewards, values, mask, gamma=0.9, lam=0.8, bootstrap=bootstrap, method=method)
    junk_r = np.where(mask, rewards, rng.normal(size=rewards.shape) * 1e3).astype(np.float32)
    junk_v = np.where(mask, values, rng.normal(size=values.shape) * 1e3).astype(np.float32)
    junk = prm_jax.kernels.gae(junk_r, junk_v, mask, gamma=0.9, lam=0.8, bootstrap=bootstrap, method=method)
    np.testing.assert_array_equal(np.asarray(junk.advantages), np.asarray(base.advantages))
    np.testing.assert_array_equal(np.asarray(junk.returns)[mask], np.asarray(base.returns)[mask])


@pytest.mark.parametrize("method", METHODS)
def test_right_padding_changes_nothing(method):
    rng = np.random.default_rng(12)
    rewards, values, mask, bootstrap = timestep_inputs(rng, 3, 33)
    base = prm_jax.kernels.gae(rewards, values, mask, gamma=0.95, lam=0.9, bootstrap=bootstrap, method=method, block_size=4)
    pad = lambda x, v: np.concatenate([x, np.full((3, 20), v, x.dtype)], axis=1)
    padded = prm_jax.kernels.gae(pad(rewards, 5.0), pad(values, -3.0), pad(mask, False), gamma=0.95, lam=0.9,
                         bootstrap=bootstrap, method=method, block_size=4)
    np.testing.assert_allclose(np.asarray(padded.advantages)[:, :33], base.advantages, rtol=1e-6, atol=1e-6)


def test_bf16_inputs_accumulate_in_float32():
    rng = np.random.default_rng(5)
    rewards, values, mask, bootstrap = timestep_inputs(rng, 2, 2000, density=0.9)
    bf = lambda x: jnp.asarray(x, jnp.bfloat16)
    want, _ = reference.gae(np.asarray(bf(rewards), np.float64), np.asarray(bf(values), np.float64), mask,
                            1.0, 1.0, np.asarray(bf(bootstrap), np.float64))
    for method in built(ALL_METHODS):
        out = prm_jax.kernels.gae(bf(rewards), bf(values), mask, bootstrap=bf(bootstrap), method=method)
        assert out.advantages.dtype == jnp.float32
        # A bf16 accumulator over 2000 steps would be off by whole units; float32 stays near 1e-4.
        np.testing.assert_allclose(out.advantages, want, rtol=1e-4, atol=2e-3)


def test_gae_no_retrace_for_new_python_scalars():
    rewards, values, mask, bootstrap = timestep_inputs(np.random.default_rng(0), 2, 9)
    with compile_log() as compiled:
        for gamma, lam in [(0.9, 0.8), (0.95, 0.7), (0.5, 0.1)]:
            prm_jax.kernels.gae(rewards, values, mask, gamma=gamma, lam=lam, bootstrap=bootstrap, method="scan")
    assert sum("Compiling jit(_gae_jit)" in m for m in compiled) == 1
    step = jax.jit(chex.assert_max_traces(lambda g: prm_jax.kernels.gae(rewards, values, mask, gamma=g, lam=0.9,
                                                                    bootstrap=bootstrap).advantages, n=1))
    for gamma in (0.9, 0.95, 0.5):
        step(gamma)


def test_block_size_compiles_again_only_where_it_is_read():
    # Only ``blocked`` reads block_size: under the other methods a new block size reuses the program.
    rewards, values, mask, bootstrap = timestep_inputs(np.random.default_rng(3), 2, 11)
    for method, most in (("scan", 1), ("associative", 1), ("blocked", 3)):
        with compile_log() as compiled:
            outs = [prm_jax.kernels.gae(rewards, values, mask, gamma=0.9, lam=0.8, bootstrap=bootstrap, method=method,
                                        block_size=block).advantages for block in (1, 4, 7)]
        assert sum("Compiling jit(_gae_jit)" in m for m in compiled) <= most, method
        for other in outs[1:]:
            np.testing.assert_allclose(other, outs[0], rtol=3e-6, atol=3e-6)


def test_gae_under_jit_and_vmap():
    rewards, values, mask, bootstrap = timestep_inputs(np.random.default_rng(1), 4, 12)
    want = prm_jax.kernels.gae(rewards, values, mask, gamma=0.9, lam=0.9, bootstrap=bootstrap, method="associative")

    @jax.jit
    def step(r, v, m, boot, gamma):
        return prm_jax.kernels.gae(r, v, m, gamma=gamma, lam=0.9, bootstrap=boot, method="associative").advantages

    np.testing.assert_allclose(step(rewards, values, mask, bootstrap, 0.9), want.advantages, rtol=1e-6, atol=1e-6)
    per_row = jax.vmap(lambda r, v, m, boot: prm_jax.kernels.gae(r[None], v[None], m[None], gamma=0.9, lam=0.9,
                                                         bootstrap=boot[None], method="scan").advantages[0])
    np.testing.assert_allclose(per_row(rewards, values, mask, bootstrap), want.advantages, rtol=1e-5, atol=1e-5)


def test_gae_argument_errors_name_the_argument():
    r = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="values"):
        prm_jax.kernels.gae(r, np.zeros((2, 4), np.float32), np.ones((2, 3)))
    with pytest.raises(ValueError, match="mask"):
        prm_jax.kernels.gae(r, None, np.ones((3, 3)))
    with pytest.raises(ValueError, match="lam"):
        prm_jax.kernels.gae(r, None, np.ones((2, 3)), lam=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="gamma"):
        prm_jax.kernels.gae(r, None, np.ones((2, 3)), gamma=1.5)
    with pytest.raises(ValueError, match="bootstrap"):
        prm_jax.kernels.gae(r, None, np.ones((2, 3)), bootstrap=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="method"):
        prm_jax.kernels.gae(r, None, np.ones((2, 3)), method="fast")


@pytest.mark.skipif(not find_compiler() or os.environ.get("PRM_JAX_NATIVE", "1") == "0",
                    reason="needs a C++ compiler")
def test_native_kernel_builds_where_a_compiler_exists():
    if not recurrence.on_cpu():
        pytest.skip(f"the native kernels are CPU kernels: programs here are lowered for "
                    f"{recurrence.target_platform()!r}")
    assert native.available()
    assert recurrence.resolve_method("auto", unit_discount=False) == "native"
    # A sharded program never gets the custom call.
    assert recurrence.resolve_method("auto", unit_discount=False, sharded=True) == "scan"
    with pytest.raises(ValueError, match="sharded"):
        recurrence.resolve_method("native", unit_discount=False, sharded=True)


def test_without_the_native_kernel_auto_falls_back_to_scan():
    # (scan for a CPU program; for a GPU or TPU one auto never picks the native kernel: associative there, the
    # resolver asked for each platform, issue 56.1: this test asserted the CPU's choice on every backend)
    code = textwrap.dedent("""
        import importlib, prm_jax, numpy as np
        from prm_jax.native import _ffi as native
        gae = importlib.import_module("prm_jax.kernels._token_gae")
        assert not native.available()
        for platform, choice in (("cpu", "scan"), ("cuda", "associative"), ("tpu", "associative")):
            with prm_jax.kernels.lowering_platform(platform):
                assert gae.resolve_method("auto", unit_discount=False) == choice, platform
        out = prm_jax.kernels.gae(np.ones((2, 5), np.float32), None, np.ones((2, 5)), method="auto")
        assert float(out.advantages[0, 0]) == 5.0
        """)
    env = dict(os.environ, PRM_JAX_NATIVE="0")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-c", "import prm_jax, numpy as np; prm_jax.kernels.gae(np.ones((1, 2), "
                           "np.float32), None, np.ones((1, 2)), method='native')"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and "method='native' needs" in proc.stderr


@pytest.mark.usefixtures("needs_native")
def test_native_kernel_under_vmap_and_inside_jit():
    rewards, values, mask, bootstrap = timestep_inputs(np.random.default_rng(8), 6, 37)
    want, _ = reference.gae(rewards, values, mask, 0.9, 0.8, bootstrap)
    stacked = [x.reshape(2, 3, *x.shape[1:]) for x in (rewards, values, mask, bootstrap)]
    per_group = jax.vmap(lambda r, v, m, b: prm_jax.kernels.gae(r, v, m, gamma=0.9, lam=0.8, bootstrap=b,
                                                        method="native").advantages)
    np.testing.assert_allclose(np.asarray(per_group(*stacked)).reshape(6, 37), want, rtol=2e-5, atol=2e-5)
    # Many rows go through the thread pool; rows in a block of four and across blocks must not mix.
    rewards, values, mask, bootstrap = timestep_inputs(np.random.default_rng(9), 203, 700)
    want, want_ret = reference.gae(rewards, values, mask, 0.97, 0.9, bootstrap)
    got = jax.jit(lambda *a: prm_jax.kernels.gae(*a[:3], gamma=0.97, lam=0.9, bootstrap=a[3], method="native"))(
        rewards, values, mask, bootstrap)
    np.testing.assert_allclose(got.advantages, want, rtol=2e-5, atol=5e-5)
    np.testing.assert_allclose(got.returns, want_ret, rtol=2e-5, atol=5e-5)


@pytest.mark.usefixtures("needs_native")
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 9])
def test_native_kernel_on_every_row_and_timestep_remainder(rows):
    # Four rows at a time, four timesteps per vector block: leftover rows and timesteps take the scalar
    # path, and the carried state must cross from one path to the other.
    rng = np.random.default_rng(rows)
    for width in (1, 2, 3, 4, 5, 7, 8, 9, 13, 16):
        rewards, values, mask, bootstrap = timestep_inputs(rng, rows, width, density=0.6)
        lam = rng.uniform(0.5, 1.0, size=rows).astype(np.float32)
        got = prm_jax.kernels.gae(rewards, values, mask, gamma=0.95, lam=lam, bootstrap=bootstrap, method="native")
        want_adv, want_ret = reference.gae(rewards, values, mask, 0.95, lam, bootstrap)
        np.testing.assert_allclose(got.advantages, want_adv, rtol=2e-5, atol=2e-5, err_msg=f"width {width}")
        np.testing.assert_allclose(got.returns, want_ret, rtol=2e-5, atol=2e-5, err_msg=f"width {width}")


@pytest.mark.usefixtures("needs_native")
def test_native_vector_and_scalar_paths_give_the_same_bits():
    # A row in a group of four takes the vector path (on x86); the same row alone takes the scalar loop.
    rewards, values, mask, bootstrap = timestep_inputs(np.random.default_rng(12), 4, 29)
    together = prm_jax.kernels.gae(rewards, values, mask, gamma=0.97, lam=0.9, bootstrap=bootstrap, method="native")
    for b in range(4):
        alone = prm_jax.kernels.gae(rewards[b:b + 1], values[b:b + 1], mask[b:b + 1], gamma=0.97, lam=0.9,
                            bootstrap=bootstrap[b:b + 1], method="native")
        np.testing.assert_array_equal(alone.advantages[0], together.advantages[b])
        np.testing.assert_array_equal(alone.returns[0], together.returns[b])


# --- issue 23.12: a float32 mask costs what a bool mask does --------------------------------------------

NOT_BINARY = [0.5, np.nan, np.inf, -np.inf, -1.0, 2.0, float(np.nextafter(np.float32(1), np.float32(2))),
              float(np.nextafter(np.float32(0), np.float32(1)))]  # the last: a denormal, which XLA reads as 0


def gae_outcome(*args, **kwargs):
    """``("ok", output)`` or ``("error", the message from "mask must" on)``: XLA prefixes the kernel's message
    with a status that differs between jax versions (``INVALID_ARGUMENT: `` in 0.10, ``Buffer Definition
    Event: `` in 0.7)."""
    try:
        return "ok", jax.block_until_ready(prm_jax.kernels.gae(*args, **kwargs))
    except Exception as err:  # the native kernel fails the computation, mask_check raises ValueError
        first = str(err).splitlines()[0]
        return "error", first[first.find("mask must"):] if "mask must" in first else first


@pytest.mark.usefixtures("needs_native")
@pytest.mark.parametrize("rows,width", [(3, 7), (9, 13), (64, 2048)])  # the last runs on several pool tasks
def test_native_kernel_reads_a_float_mask_with_mask_checks_rule_and_message(rows, width):
    # Issue 23.12: verl and tunix pass float32 masks; the native kernel reads them as they are and applies
    # _checks.mask_check's 0/1 rule itself. It must accept and refuse exactly what mask_check does, name
    # the same (first, row-major) entry, and give the bool mask's bits on a valid mask.
    rng = np.random.default_rng(rows)
    rewards, values, mask, bootstrap = timestep_inputs(rng, rows, width, density=0.6)
    as_bool = prm_jax.kernels.gae(rewards, values, mask, gamma=0.9, lam=0.8, bootstrap=bootstrap, method="native")
    as_float = prm_jax.kernels.gae(rewards, values, mask.astype(np.float32), gamma=0.9, lam=0.8, bootstrap=bootstrap,
                                   method="native")
    np.testing.assert_array_equal(as_float.advantages, as_bool.advantages)
    np.testing.assert_array_equal(as_float.returns, as_bool.returns)
    for bad in [*NOT_BINARY, -0.0]:
        floats = mask.astype(np.float32)
        floats[rows - 1, width - 1] = bad
        floats[rows // 2, width // 2] = bad  # the first in row-major order, whichever task reads it
        native, checked = (gae_outcome(rewards, values, floats, gamma=0.9, lam=0.8, bootstrap=bootstrap, method=m)
                           for m in ("native", "scan"))
        assert native[0] == checked[0], (bad, native, checked)
        if native[0] == "error":
            assert native[1] == checked[1] == (f"mask must be bool or hold only 0 and 1; row {rows // 2}, "
                                               f"position {width // 2} holds {np.float32(bad):.9g}")
        else:
            np.testing.assert_allclose(native[1].advantages, checked[1].advantages, rtol=2e-5, atol=2e-5)
    assert sum(gae_outcome(rewards, values, np.where(mask, 1.0, bad).astype(np.float32), method="native")[0]
               == "error" for bad in NOT_BINARY) == len(NOT_BINARY) - 1  # all but the denormal


@pytest.mark.usefixtures("needs_native")
def test_a_float_mask_under_jit_needs_no_host_callback_and_still_fails_loudly():
    # Issue 23.12: no host round trip for the check, under jit as eagerly; a bad mask fails the step.
    rewards, values, mask, _ = timestep_inputs(np.random.default_rng(3), 4, 9)
    floats = mask.astype(np.float32)
    step = lambda m: prm_jax.kernels.gae(rewards, values, m, gamma=0.9, lam=0.8, method="native").advantages
    jaxpr = jax.make_jaxpr(step)(floats)
    assert "callback" not in str(jaxpr) and "prm_jax_gae_f32_float_mask" in str(jaxpr)
    assert "pure_callback" in str(jax.make_jaxpr(step)(mask.astype(np.int32)))  # other masks keep the check
    floats[2, 5] = 0.25
    with pytest.raises(Exception, match=r"mask must be bool or hold only 0 and 1; row 2, position 5 holds 0.25"):
        jax.block_until_ready(jax.jit(step)(floats))


@pytest.mark.usefixtures("needs_native")
def test_a_float_mask_through_the_native_kernel_has_the_scan_gradient():
    rewards, values, mask, _ = timestep_inputs(np.random.default_rng(5), 5, 11)
    loss = lambda r, v, m, method: jnp.sum(prm_jax.kernels.gae(r, v, m, gamma=0.9, lam=0.8, method=method).advantages ** 2)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=3)
    native = grad(rewards, values, mask.astype(np.float32), "native")
    scan = grad(rewards, values, mask, "scan")
    for got, want in zip(native, scan):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


# Issue 56.4: where rows are few and long, the Pallas kernel splits each row into chunks (a summary pass, an
# associative scan of the chunks' carries, a second pass): the float64 loop's numbers at every chunk size,
# with per-row lambda, bootstrap, holes in the mask, chunks with no trained timestep and a short last chunk.
@pytest.mark.parametrize("chunk", [1, 3, 8, 16])
@pytest.mark.parametrize("density", [0.05, 0.5, 1.0])
def test_the_chunked_pallas_kernel_matches_the_float64_loop(chunk, density):
    from prm_jax.kernels._pallas_gae import pallas_gae

    rng = np.random.default_rng(int(density * 100) + chunk)
    for rows, width in ((1, 1), (3, 37), (4, 64)):
        rewards, values, _, bootstrap = timestep_inputs(rng, rows, width)
        mask = rng.random((rows, width)) < density
        gamma = np.full(rows, 0.97, np.float32)
        lam = np.array([0.0, 0.5, 0.95, 1.0][:rows] + [1.0] * max(0, rows - 4), np.float32)
        for float_mask in (False, True):
            given = mask.astype(np.float32) if float_mask else mask
            adv, ret = pallas_gae(rewards, values, given, gamma, (gamma * lam).astype(np.float32), bootstrap,
                                  chunk=chunk)
            want, want_returns = reference.gae(rewards, values, mask, 0.97, lam, bootstrap)
            np.testing.assert_allclose(adv, want, rtol=2e-5, atol=2e-5, err_msg=f"{rows}x{width} chunk {chunk}")
            np.testing.assert_allclose(ret, want_returns, rtol=2e-5, atol=2e-5)


def test_gae_splits_rows_into_chunks_where_they_are_few_and_long():
    from prm_jax.kernels._pallas_gae import CHUNK, FEW_ROWS, chunked

    assert chunked(16, 32768) and chunked(FEW_ROWS - 1, 2 * CHUNK)
    assert not chunked(8192, 2048) and not chunked(FEW_ROWS, 32768) and not chunked(16, 2 * CHUNK - 1)
    rng = np.random.default_rng(5)
    rewards, values, mask, bootstrap = timestep_inputs(rng, 2, 2 * CHUNK + 5)
    step = lambda r, v, m: prm_jax.kernels.gae(r, v, m, gamma=0.9, lam=0.8, bootstrap=bootstrap, method="pallas")
    kernels = lambda *arrays: str(jax.make_jaxpr(step)(*arrays)).count("pallas_call")
    # (two kernels where the rows are split, a summary pass and the chunks' pass; one for short rows)
    assert kernels(rewards, values, mask) == 2 * kernels(rewards[:, :16], values[:, :16], mask[:, :16]) > 0
    want, _ = reference.gae(rewards, values, mask, 0.9, 0.8, bootstrap)
    np.testing.assert_allclose(step(rewards, values, mask).advantages, want, rtol=2e-5, atol=2e-5)
