"""Run in a separate process with 8 fake CPU devices (see tests/test_multidevice.py)."""

import math
import re

import jax
import numpy as np
import pytest
import reference
from batches import make_batch, timestep_inputs
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import prm_jax
from prm_jax import AdvantageConfig, NormConfig, ShapingConfig, compute_advantages
from prm_jax.kernels import sequence_parallel_gae

FIELDS = ("advantages", "returns", "kl_rewards", "tot_rewards", "loss_mask", "logprobs")


def gathered_sizes(hlo: str) -> list[int]:
    """Element counts of every all-gather / all-to-all result in compiled HLO text."""
    sizes = []
    for match in re.finditer(r"= \w+\[([\d,]*)\][^=]*? (?:all-gather|all-to-all)\(", hlo):
        dims = [int(d) for d in match.group(1).split(",") if d]
        sizes.append(math.prod(dims))
    return sizes


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() == 8, "this module needs XLA_FLAGS=--xla_force_host_platform_device_count=8"
    return Mesh(np.array(jax.devices()), ("data",))


def shard_batch(batch, mesh):
    out = {}
    for key, value in batch.items():
        spec = P() if key == "group_sizes" else P("data") if np.ndim(value) == 1 else P("data", None)
        out[key] = jax.device_put(value, NamedSharding(mesh, spec))
    return out


CONFIGS = {
    "batch_norm": AdvantageConfig(discount=0.97, gae_lambda=0.9, adv_norm=NormConfig("batch", "batch")),
    "group_norm": AdvantageConfig(reward_norm=NormConfig("group", "group", group_size=4),
                                  adv_norm=NormConfig("group", "batch", mean_leave1out=True, group_size=4)),
    "variable_groups": AdvantageConfig(reward_norm=NormConfig("group", "group"), adv_norm=NormConfig("group", "group")),
    "gvpo": AdvantageConfig(advantage_shaping=ShapingConfig("gvpo"), adv_norm=NormConfig()),
    "turn_level": AdvantageConfig(gae_timestep_unit="turn", discount=0.9, gae_lambda=0.9),
    "fold": AdvantageConfig(token_rewards_as_adv=False),
    "lambda_fn": AdvantageConfig(gae_timestep_unit="turn", gae_lambda_kwargs={"q": 0.5},
                                 gae_lambda="areal.trainer.ppo.lambda_fn.relative_position_gae_lambda"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_batch_sharded_pipeline_equals_one_device(mesh, name):
    rng = np.random.default_rng(len(name))
    batch = make_batch(rng, rows=32, width=40, uniform=name == "fold")
    if name == "variable_groups":
        batch["group_sizes"] = np.array([3, 5, 8, 1, 7, 8], np.int32)
    config = CONFIGS[name]
    want = compute_advantages(batch, config)
    sharded = shard_batch(batch, mesh)
    got = compute_advantages(sharded, config)
    for field in FIELDS:
        np.testing.assert_allclose(getattr(got, field), getattr(want, field), rtol=1e-5, atol=1e-5, err_msg=field)
        assert getattr(got, field).sharding.spec == P("data", None), field
    # Statistics are all-reduced; no [B, T] data is gathered: at most one scalar per device (the
    # location of a failed value check).
    step = jax.jit(compute_advantages, static_argnums=1)
    hlo = step.lower(sharded, config).compile().as_text()
    assert all(size <= jax.device_count() for size in gathered_sizes(hlo)), gathered_sizes(hlo)
    assert "all-reduce" in hlo


def test_batch_sharded_pipeline_matches_float64_reference(mesh):
    batch = make_batch(np.random.default_rng(5), rows=16, width=24)
    got = compute_advantages(shard_batch(batch, mesh), AdvantageConfig(adv_norm=NormConfig()))
    want = reference.compute_advantages(batch, dict(adv_norm=dict(mean_level="batch", std_level="batch")))
    np.testing.assert_allclose(got.advantages, want["advantages"], rtol=2e-5, atol=3e-5)


@pytest.mark.parametrize("method", ["scan", "associative", "auto"])
@pytest.mark.parametrize("layout", [(1, 8), (2, 4), (4, 2)])
def test_sequence_parallel_gae_equals_unsharded(method, layout):
    # One local affine scan per chunk plus one carry correction (no second sequential pass).
    mesh = Mesh(np.array(jax.devices()).reshape(layout), ("data", "seq"))
    rng = np.random.default_rng(sum(layout))
    rewards, values, mask, bootstrap = timestep_inputs(rng, 4, 96, density=0.3)
    mask[0] = False               # a row with nothing to train on
    mask[1, :90] = False          # active timesteps only in the last chunk
    mask[2, 13:] = False          # active timesteps only in the first chunk
    lam = np.array([0.9, 0.5, 1.0, 0.0], np.float32)
    got = sequence_parallel_gae(rewards, values, mask, mesh=mesh, batch_axis="data", gamma=0.95, lam=lam,
                                bootstrap=bootstrap, method=method)
    want_adv, want_ret = reference.gae(rewards, values, mask, 0.95, lam, bootstrap)
    np.testing.assert_allclose(got.advantages, want_adv, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got.returns, want_ret, rtol=2e-5, atol=2e-5)
    assert got.advantages.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "seq")), 2)
    # Only per-chunk summaries cross devices: [chunks, rows per shard], never the time axis.
    from prm_jax.kernels._sequence_parallel import _sp_gae_jit
    hlo = _sp_gae_jit.lower(rewards, values, mask, np.float32(0.95), lam, bootstrap, mesh=mesh, axis_name="seq",
                            batch_axis="data", method=method).compile().as_text()
    sizes = gathered_sizes(hlo)
    assert sizes and all(size <= layout[1] * 4 for size in sizes), sizes
    np.testing.assert_allclose(got.advantages, prm_jax.kernels.gae(rewards, values, mask, gamma=0.95, lam=lam,
                                                           bootstrap=bootstrap, method="scan").advantages,
                               rtol=2e-5, atol=2e-5)


def test_sequence_parallel_gae_long_rows():
    mesh = Mesh(np.array(jax.devices()), ("seq",))
    rng = np.random.default_rng(9)
    rewards, values, mask, bootstrap = timestep_inputs(rng, 2, 8 * 4096, density=0.9)
    got = sequence_parallel_gae(rewards, values, mask, mesh=mesh, gamma=1.0, lam=1.0, bootstrap=bootstrap)
    want = prm_jax.kernels.gae(rewards, values, mask, gamma=1.0, lam=1.0, bootstrap=bootstrap, method="scan")
    np.testing.assert_allclose(got.advantages, want.advantages, rtol=1e-4, atol=5e-3)


def test_sequence_parallel_errors():
    mesh = Mesh(np.array(jax.devices()), ("seq",))
    rewards = np.zeros((2, 12), np.float32)
    with pytest.raises(ValueError, match="divide evenly"):
        sequence_parallel_gae(rewards, None, np.ones((2, 12)), mesh=mesh)
    with pytest.raises(ValueError, match="axis_name"):
        sequence_parallel_gae(rewards, None, np.ones((2, 12)), mesh=mesh, axis_name="time")
