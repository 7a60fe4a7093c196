"""Issue 56.2: a program exported for an accelerator from a CPU host takes the accelerator's choices. With the
plan's backend choices resolved for the platform it is lowered for (``AdvantagePlan.with_strategy(batch,
platform=...)``), ``compute_advantages`` under every registered estimator and every shaping mode exports for
``cuda`` and ``tpu`` here (``jax.export``), with no custom call (the native kernels are the CPU's) and no loop
whose trip count grows with T: the module has the same loops at two widths (GAE's and GiGPO's recurrences are
their associative forms there; the tree estimator's loops walk its nodes, whatever T)."""

import dataclasses
import re
import warnings

import jax
import numpy as np
import pytest
from jax import export
from matrix_cases import make_batch

import prm_jax
from prm_jax.config import AdvantageConfig
from prm_jax.estimators import registered
from prm_jax.kernels import SHAPING_MODES

PLATFORMS = ("cuda", "tpu")


def widened(batch, width):
    """``batch`` with its positions and timesteps padded (right, as a trainer pads) to ``width``."""
    out = {}
    for key, value in batch.items():
        value = np.asarray(value)
        if value.ndim == 2 and key not in ("turn_rewards", "turn_reward_mask", "anchor_ids", "node_ids",
                                           "reward_sources"):
            fill = -1 if key == "turn_ids" else 0
            value = np.pad(value, ((0, 0), (0, width - value.shape[1])), constant_values=fill)
        out[key] = value
    return out


def lowered(plan, batch, platform):
    shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), batch)
    resolved = plan.with_strategy(batch, platform=platform)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export.export(jax.jit(lambda b: prm_jax.compute_advantages(b, resolved)),
                             platforms=(platform,))(shapes).mlir_module()


def loops(text):
    """Each ``while`` loop's condition as it compares: SSA names, locations and shapes left out, and each
    constant it reads replaced by its value (a loop over T compares against T: 32, then 64)."""
    out = []
    for match in re.finditer(r"stablehlo\.while.*?cond \{(.*?)\} do \{", text, re.S):
        cond = match.group(1)
        for name in set(re.findall(r"%c[\w]*", cond)):
            defined = re.findall(rf"{re.escape(name)} = stablehlo\.constant dense<([^>]*)>", text[:match.start()])
            cond = cond.replace(name, f"<{defined[-1] if defined else '?'}>")
        cond = re.sub(r"loc\([^)]*\)|tensor<[^>]*>|%[\w#]+", "", cond)
        out.append(" ".join(cond.split()))
    return sorted(out)


CASES = [(spec.label, dict(spec.example or {})) for spec in registered()] + [
    (f"shaping {mode}", {"advantage_shaping": {"mode": mode}}) for mode in SHAPING_MODES]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("label,fields", CASES, ids=[c[0] for c in CASES])
def test_compute_advantages_exports_for_an_accelerator_without_cpu_kernels_or_loops_over_t(label, fields, platform):
    batch = make_batch(np.random.default_rng(3))
    plan = AdvantageConfig(**{"kl_ctl": 0.0, **fields}).plan
    narrow, wide = (lowered(plan, widened(batch, width), platform) for width in (32, 64))
    assert "stablehlo.custom_call" not in narrow, label
    assert loops(narrow) == loops(wide), label  # (a loop over T would compare against 32, then 64)
    if "tree" not in label:
        assert "stablehlo.while" not in narrow, label


def test_the_platform_takes_the_accelerators_choices_and_refuses_a_cpu_kernel():
    from prm_jax.kernels._recurrence import resolve_strategy

    for platform in PLATFORMS:
        with prm_jax.kernels.lowering_platform(platform):
            strategy = resolve_strategy("auto", unit_discount=False)
            assert (strategy.gae, strategy.step_groups, strategy.cumsum, strategy.alignment) == (
                "associative", "sort", "lax", "scatter")
            assert resolve_strategy("auto", unit_discount=True).gae == "cumsum"
            with pytest.raises(ValueError, match=f"method='native' is a CPU kernel: not for a program lowered for "
                                                 f"'{platform}'"):
                resolve_strategy("native", unit_discount=False)
    # The CPU's own choice is unchanged (native where it builds, else scan).
    with prm_jax.kernels.lowering_platform("cpu"):
        cpu = resolve_strategy("auto", unit_discount=False)
    assert cpu == resolve_strategy("auto", unit_discount=False)
    assert dataclasses.replace(cpu).gae in ("native", "scan")


def test_the_loop_check_sees_a_loop_over_t():
    # (the check can fail: an explicit sequential scan over T, exported for a GPU, compares against T)
    batch = make_batch(np.random.default_rng(3))
    plan = AdvantageConfig(kl_ctl=0.0, gae_method="scan").plan
    narrow, wide = (lowered(plan, widened(batch, width), "cuda") for width in (32, 64))
    assert "stablehlo.while" in narrow and loops(narrow) != loops(wide)


def spec(*shape, dtype=np.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


# The public kernels whose checks travel as data or are made before tracing (the credit kernels that raise
# from a host callback under a trace, REINFORCE++, OTB and PRIME's, have a CPU callback no other platform
# can lower: export compute_advantages, whose checks are counts, for those).
KERNELS = {
    "kernels.gae": (lambda r, v, m: prm_jax.kernels.gae(r, v, m, gamma=0.9, lam=0.95).advantages,
                    lambda t: (spec(4, t), spec(4, t), spec(4, t, dtype=np.bool_))),
    "kernels.gae (gamma*lam = 1)": (lambda r, v, m: prm_jax.kernels.gae(r, v, m).advantages,
                                    lambda t: (spec(4, t), spec(4, t), spec(4, t, dtype=np.bool_))),
    "kernels.normalize": (lambda x, m: prm_jax.kernels.normalize(x, m),
                          lambda t: (spec(4, t), spec(4, t, dtype=np.bool_))),
    "credit.gigpo": (lambda r, m, o: prm_jax.credit.gigpo(r, m, o).advantages,
                     lambda t: (spec(4, t), spec(4, t, dtype=np.bool_), spec(4))),
    "credit.sum_pi_squared": (lambda z: prm_jax.credit.sum_pi_squared(z), lambda t: (spec(4, t, 50),)),
    "losses.ppo_clip_loss": (lambda lp, px, a, m: prm_jax.losses.ppo_clip_loss(lp, px, a, m)[0],
                             lambda t: (spec(4, t), spec(4, t), spec(4, t), spec(4, t, dtype=np.bool_))),
}


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_a_public_kernel_exports_for_an_accelerator_within_lowering_platform(name, platform):
    fn, shapes = KERNELS[name]

    def module(width):
        with prm_jax.kernels.lowering_platform(platform):
            return export.export(jax.jit(fn), platforms=(platform,))(*shapes(width)).mlir_module()

    narrow, wide = module(32), module(64)
    assert "stablehlo.custom_call" not in narrow and loops(narrow) == loops(wide), name


def test_lowering_platform_is_scoped_and_checked():
    from prm_jax.kernels._recurrence import on_cpu, resolve_method

    assert on_cpu() == (jax.default_backend() == "cpu")
    with prm_jax.kernels.lowering_platform("tpu"):
        assert not on_cpu() and resolve_method("auto", unit_discount=False) == "associative"
    assert on_cpu() == (jax.default_backend() == "cpu")
    with pytest.raises(ValueError, match="platform must be one of"):
        with prm_jax.kernels.lowering_platform("gpu0"):
            pass
