"""Issue 31.3 (its first drift): every estimator honours the configured ``gae_method``. PRIME once re-resolved
``"auto"`` itself, and its compiled program held the native call under ``gae_method="scan"``. Checked
here from the lowered program of ``compute_advantages``: the native GAE call is in it exactly when the
method is ``native`` (or ``auto`` resolves to it) and the estimator runs GAE."""

import dataclasses

import jax
import numpy as np
import pytest
from native_where import runs_native, skip_without_native

from prm_jax import compute_advantages
from prm_jax.config import AdvantageConfig, GiGPOConfig
from prm_jax.estimators import registered
from prm_jax.kernels import _advantages as advantages
from prm_jax.kernels import _gigpo as gigpo_module
from prm_jax.kernels import _inputs as inputs
from prm_jax.kernels._recurrence import resolve_step_groups, resolve_strategy
from prm_jax.native import _ffi as ffi
from prm_jax.native._ffi import FLOAT_MASK_TARGET, TARGET

ROWS, WIDTH = 4, 16
# Every registered estimator from its declared example, and PRIME without its lambda-return too.
ESTIMATORS = {**{spec.name: dict(spec.example) for spec in registered()},
              "prime_lam0": {"credit_assignment": {"mode": "prime"}}}  # lam 0: its implicit rewards need no recursion
# The configurations that run a GAE scan (prime's example: lam 0.5; REINFORCE++'s return is one, with no
# values and lambda 1; a new estimator that runs one fails the test below until it is listed).
RUNS_GAE = {"token_gae", "turn_gae", "prime", "reinforce_pp", "turn_rloo"}


def batch() -> dict:
    rng = np.random.default_rng(0)
    turn_ids = np.full((ROWS, WIDTH), -1, np.int32)
    turn_ids[:, 2:5], turn_ids[:, 7:10] = 0, 1
    loss = (turn_ids >= 0).astype(np.int32)
    node_ids = np.arange(ROWS * 2, dtype=np.int32).reshape(ROWS, 2)
    ref = (-rng.exponential(0.5, (ROWS, WIDTH))).astype(np.float32)
    logprobs = (-rng.exponential(0.5, (ROWS, WIDTH))).astype(np.float32)
    return dict(sum_pi_squared=np.maximum(np.exp(2 * logprobs), 0.5).astype(np.float32),
                attention_mask=np.ones((ROWS, WIDTH), np.int32), loss_mask=loss, turn_ids=turn_ids,
                logprobs=logprobs, ref_logprobs=ref,
                prm_logprobs=(ref + rng.normal(0, 0.2, ref.shape)).astype(np.float32),
                rewards=rng.choice([0.0, 1.0], ROWS).astype(np.float32),
                values=rng.normal(0, 0.5, (ROWS, WIDTH)).astype(np.float32),
                token_rewards=(0.5 * loss).astype(np.float32), group_sizes=np.array([2, 2], np.int32),
                is_truncated=np.zeros(ROWS, bool),
                anchor_ids=np.zeros((ROWS, 2), np.int32), node_ids=node_ids,
                node_parents=np.where(np.arange(ROWS * 2) % 2 == 0, -1, np.arange(ROWS * 2) - 1).astype(np.int32))


def lowered(config: AdvantageConfig) -> str:
    return jax.jit(lambda b: compute_advantages(b, config)).lower(batch()).as_text()


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
@pytest.mark.parametrize("method", ["scan", "associative", "blocked", "native", "pallas"])
def test_every_estimator_runs_the_configured_gae_method(estimator, method):
    config = AdvantageConfig(gae_method=method, **ESTIMATORS[estimator])
    text = lowered(config)
    native = TARGET in text or FLOAT_MASK_TARGET in text
    if method == "pallas":  # (the GAE's kernel alone: every other recurrence, PRIME's lambda-return among
        # them, takes auto's method, native on this CPU)
        jaxpr = str(jax.make_jaxpr(lambda b: compute_advantages(b, config))(batch()))
        assert ("pallas_call" in jaxpr) == (estimator in RUNS_GAE - {"prime"}), (estimator, method)
    else:
        assert native == (method == "native" and estimator in RUNS_GAE), (estimator, method)
    # (That every method computes the same numbers: tests/kernels/test_token_gae.py and test_matrix.py.)


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
@pytest.mark.parametrize("method", ["auto", "scan", "associative"])
def test_nothing_reads_the_backend_the_devices_or_the_native_policy_while_tracing(estimator, method, monkeypatch):
    # Issue 31.3: the strategy (scans, step groups, cumulative sums, sharding) is resolved once before the
    # trace; tracing itself must not ask. Every such read raises here, during the trace only.
    config = AdvantageConfig(gae_method=method, **ESTIMATORS[estimator])
    arrays = inputs.batch_arrays(batch())
    plan = config.plan.with_strategy(arrays)

    def refuse(*args, **kwargs):
        raise AssertionError("read while tracing")

    for module, name in ((ffi, "use_native"), (ffi, "available"), (jax, "default_backend"),
                         (jax, "device_count")):
        monkeypatch.setattr(module, name, refuse)
    text = advantages._pipeline_jit.lower(arrays, plan=plan).as_text()
    assert text


@pytest.mark.parametrize("step_groups", ["native", "sort"])
def test_gigpo_runs_the_chosen_step_group_method(step_groups):
    skip_without_native(step_groups)
    rewards = np.zeros((4, 3), np.float32)
    text = gigpo_module._gigpo_jit.lower(rewards, np.ones((4, 3), bool), np.zeros(4, np.float32),
                                         np.zeros((4, 3), np.int32), None, config=GiGPOConfig(),
                                         step_groups=step_groups).as_text()
    assert (ffi.STEP_GROUPS_TARGET in text) == (step_groups == "native")
    # compute_advantages' GiGPO follows the strategy it resolved (native where the kernels run).
    pipeline = lowered(AdvantageConfig(**ESTIMATORS["gigpo"]))
    assert (ffi.STEP_GROUPS_TARGET in pipeline) == (resolve_step_groups("auto") == "native")


def test_otb_aligns_rows_natively_where_the_kernels_run():
    # Issue 44.1: OTB's alignment by generated-token index follows the strategy (native where the native
    # kernels run, XLA's scatter elsewhere), like the step groups.
    text = lowered(AdvantageConfig(**ESTIMATORS["otb"]))
    assert (ffi.OTB_COMPACT_TARGET in text) == (resolve_strategy("auto", unit_discount=True).alignment == "native")
    assert resolve_strategy("auto", unit_discount=True).alignment == ("native" if runs_native()
                                                                      else "scatter")
    assert resolve_strategy("auto", unit_discount=True, sharded=True).alignment == "scatter"


def test_the_strategy_is_a_record_of_the_plan_resolved_once_and_honoured_when_given():
    # Issue 31.3: one hashable record in the plan. compute_advantages resolves it before tracing; a plan
    # that already holds one runs with it (here the scan, under gae_method "auto", which resolves to the
    # native call where the kernels are built), and a cumulative-sum GAE is refused where it is not exact.
    arrays = inputs.batch_arrays(batch())
    resolved = AdvantageConfig().plan.with_strategy(arrays)
    assert resolved.strategy is not None and resolved == AdvantageConfig().plan.with_strategy(arrays)
    assert hash(resolved) == hash(AdvantageConfig().plan.with_strategy(arrays))  # one static argument: no retrace
    # Resolved once: an equal plan and strategy give the same object, which jit finds by identity.
    assert AdvantageConfig().plan.with_strategy(arrays) is resolved
    scan = resolve_strategy("scan", unit_discount=True)
    plan = dataclasses.replace(AdvantageConfig().plan, strategy=scan)
    assert plan.with_strategy(arrays) is plan
    text = jax.jit(lambda b: compute_advantages(b, plan)).lower(batch()).as_text()
    assert TARGET not in text and FLOAT_MASK_TARGET not in text
    np.testing.assert_allclose(compute_advantages(batch(), plan).advantages,
                               compute_advantages(batch(), AdvantageConfig()).advantages, rtol=1e-6, atol=1e-6)
    cumsum = dataclasses.replace(AdvantageConfig(discount=0.9).plan,
                                 strategy=resolve_strategy("cumsum", unit_discount=True))
    with pytest.raises(ValueError, match=r"cumulative sum.*gamma \* lam == 1"):
        compute_advantages(batch(), cumsum)
