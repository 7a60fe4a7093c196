"""Issue 56.2: a program exported for an accelerator from a CPU host takes the accelerator's choices. With the
plan's backend choices resolved for the platform it is lowered for (``AdvantagePlan.with_strategy(batch,
platform=...)``), ``compute_advantages`` under every registered estimator and every shaping mode exports for
``cuda`` and ``tpu`` here (``jax.export``), with no custom call (the native kernels are the CPU's) and no loop
whose trip count grows with T: the module has the same loops at two widths (GAE's and GiGPO's recurrences are
their associative forms there; the tree estimator's loops walk its nodes, whatever T)."""

import dataclasses
import inspect
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from exports import module, shapes_of
from matrix_cases import make_batch

import prm_jax
from prm_jax.config import AdvantageConfig
from prm_jax.estimators import registered
from prm_jax.kernels import SHAPING_MODES
from prm_jax.kernels._platform import target_platform

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
    resolved = plan.with_strategy(batch, platform=platform)
    return module(lambda b: prm_jax.compute_advantages(b, resolved), platform, shapes_of(batch))


# XLA's own custom calls that every backend lowers (not a CPU kernel): top_k on older jax (0.7) lowers to one.
PORTABLE_CALLS = {"mhlo.topk"}


def cpu_only_calls(text):
    """The custom calls of an exported module other than XLA's portable ones: a CPU kernel would be one."""
    return set(re.findall(r"stablehlo\.custom_call @([\w$.]+)", text)) - PORTABLE_CALLS


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
    assert not cpu_only_calls(narrow), label
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
    # The CPU's own choice is unchanged (native where it builds, else scan), and the ambient one returns after.
    ambient = resolve_strategy("auto", unit_discount=False)
    with prm_jax.kernels.lowering_platform("cpu"):
        cpu = resolve_strategy("auto", unit_discount=False)
    assert ambient == resolve_strategy("auto", unit_discount=False)
    assert dataclasses.replace(cpu).gae in ("native", "scan")
    assert (cpu == ambient) == (target_platform() == "cpu")


def test_the_loop_check_sees_a_loop_over_t():
    # (the check can fail: an explicit sequential scan over T, exported for a GPU, compares against T)
    batch = make_batch(np.random.default_rng(3))
    plan = AdvantageConfig(kl_ctl=0.0, gae_method="scan").plan
    narrow, wide = (lowered(plan, widened(batch, width), "cuda") for width in (32, 64))
    assert "stablehlo.while" in narrow and loops(narrow) != loops(wide)


def spec(*shape, dtype=np.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


K, L, F, M, INT = prm_jax.kernels, prm_jax.losses, (lambda t: spec(4, t)), (lambda t: spec(4, t, dtype=np.bool_)), (
    lambda t: spec(4, t, dtype=np.int32))
LOSS_ARGS = lambda t: (F(t), F(t), F(t), M(t))  # logprobs, proximal log-probs, advantages, loss mask
# Every public array kernel (issue 56.2), each with inputs of width T: kernels.*, credit.*, losses.*. The
# checks that raise under a trace are exported as the NaN they leave in a failed program's output
# (``_checks.raise_when_run``: no program for export carries a host callback). Left out, as not array
# kernels of width T: lowering_platform itself, compute_advantages (the tests above), compute_advantage_variants
# (compute_advantages, once per shaping), the host-side helpers (dense_anchor_ids, turn_ids_from_spans,
# global_batch_info, policy_loss_options) and sequence_parallel_gae (a mesh: tests/multidevice).
KERNELS = {
    "kernels.gae": (lambda r, v, m: K.gae(r, v, m, gamma=0.9, lam=0.95).advantages, lambda t: (F(t), F(t), M(t))),
    "kernels.gae (gamma*lam = 1)": (lambda r, v, m: K.gae(r, v, m).advantages, lambda t: (F(t), F(t), M(t))),
    "kernels.gae (int mask, checked)": (lambda r, v, m: K.gae(r, v, m, gamma=0.9, lam=0.95).advantages,
                                        lambda t: (F(t), F(t), INT(t))),
    "kernels.turn_gae": (lambda r, v, m, i: K.turn_gae(r, v, m, i, gamma=0.9, lam=0.95, num_turns=4).advantages,
                         lambda t: (F(t), F(t), M(t), INT(t))),
    "kernels.backward_linear_recurrence": (
        lambda c, d: K.backward_linear_recurrence(c, d, jnp.zeros(4), method="associative"), lambda t: (F(t), F(t))),
    "kernels.normalize": (lambda x, m: K.normalize(x, m), lambda t: (F(t), M(t))),
    "kernels.normalize (traced group sizes)": (
        lambda x, m, g: K.normalize(x, m, prm_jax.NormConfig("group", "group"), group_sizes=g),
        lambda t: (F(t), M(t), spec(2, dtype=np.int32))),
    "kernels.broadcast_turn_rewards": (lambda r, i: K.broadcast_turn_rewards(r, i), lambda t: (spec(4, 3), INT(t))),
    "kernels.kl_estimate": (lambda a, b: K.kl_estimate(a, b, "k3"), lambda t: (F(t), F(t))),
    "kernels.kl_rewards": (lambda a, b, m: K.kl_rewards(a, b, m), lambda t: (F(t), F(t), M(t))),
    "kernels.shape_advantages": (lambda a, p, m: K.shape_advantages(a, p, m), lambda t: (F(t), F(t), M(t))),
    "kernels.shift_to_next_token": (lambda x: K.shift_to_next_token(x), lambda t: (F(t),)),
    "credit.gigpo": (lambda r, m, o: prm_jax.credit.gigpo(r, m, o).advantages, lambda t: (F(t), M(t), spec(4))),
    "credit.sum_pi_squared": (lambda z: prm_jax.credit.sum_pi_squared(z), lambda t: (spec(4, t, 50),)),
    "credit.reinforce_pp": (lambda r, m, g: prm_jax.credit.reinforce_pp(r, m, baseline=True, group_sizes=g).advantages,
                            lambda t: (F(t), M(t), spec(2, dtype=np.int32))),
    "credit.optimal_token_baseline": (
        lambda r, m, lp, s: prm_jax.credit.optimal_token_baseline(r, m, lp, s, group_sizes=jnp.array([2, 2])).advantages,
        lambda t: (F(t), M(t), F(t), F(t))),
    "credit.implicit_process_rewards": (lambda a, b, m, o: prm_jax.credit.implicit_process_rewards(a, b, m, outcome=o),
                                        lambda t: (F(t), F(t), M(t), spec(4))),
    "credit.distillation_rewards": (lambda a, b, m: prm_jax.credit.distillation_rewards(a, b, m), lambda t: (F(t), F(t), M(t))),
    "credit.min_form": (lambda s, m: prm_jax.credit.min_form(s, m), lambda t: (F(t), M(t))),
    "credit.decoupled_normalization": (lambda r: prm_jax.credit.decoupled_normalization(r), lambda t: (spec(t, 3),)),
    # (the tree kernels have no T: their inputs are a tree's nodes, 33 at either width; their loops walk its
    # depth, bounded by the node count)
    "credit.tree_discount": (lambda p, r: prm_jax.credit.tree_discount(p, r, 0.9),
                             lambda t: (spec(33, dtype=np.int32), spec(33))),
    "credit.tree_advantages": (lambda p, r: prm_jax.credit.tree_advantages(p, r),
                               lambda t: (spec(33, dtype=np.int32), spec(33))),
    "losses.logprobs_on_timesteps": (lambda z, i: L.logprobs_on_timesteps(z, i), lambda t: (spec(4, t, 50), INT(t))),
    "losses.distillation_loss": (lambda a, b, r, m: L.distillation_loss(a, b, r, m)[0], lambda t: (F(t), F(t), F(t), M(t))),
    "losses.supervised_distillation_loss": (lambda a, b, m: L.supervised_distillation_loss(a, b, m),
                                            lambda t: (F(t), F(t), M(t))),
    "losses.gspo_sequence_loss": (lambda *a: L.gspo_sequence_loss(*a)[0], lambda t: (F(t), F(t), spec(4), M(t))),
    "losses.dro_loss": (lambda *a: L.dro_loss(*a, dro_beta=0.1)[0], LOSS_ARGS),
    "losses.clip_cov_loss": (lambda *a: L.clip_cov_loss(*a[:4], chosen=a[4])[0], lambda t: (*LOSS_ARGS(t), M(t))),
    "losses.gspo_loss": (lambda *a: L.gspo_loss(*a)[0], LOSS_ARGS),
    **{f"losses.{name}": (lambda *a, name=name: getattr(L, name)(*a)[0], LOSS_ARGS) for name in (
        "ppo_clip_loss", "policy_loss", "geo_mean_loss", "dppo_tv_loss", "dppo_kl_loss",
        "kl_cov_loss", "gpg_loss", "cispo_loss", "sapo_loss", "vanilla_ppo_loss")},
}


def test_every_public_kernel_is_exported_or_named_as_left_out():
    left_out = {"kernels.lowering_platform", "kernels.compute_advantages", "kernels.compute_advantage_variants",
                "kernels.dense_anchor_ids", "kernels.turn_ids_from_spans", "losses.global_batch_info",
                "losses.policy_loss_options", "kernels.sequence_parallel_gae"}
    public = {f"{ns}.{name}" for ns in ("kernels", "credit", "losses") for name in getattr(prm_jax, ns).__all__
              if inspect.isfunction(getattr(getattr(prm_jax, ns), name))}
    assert public == {name.split(" ")[0] for name in KERNELS} | left_out, sorted(
        public ^ ({name.split(" ")[0] for name in KERNELS} | left_out))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_a_public_kernel_exports_for_an_accelerator_within_lowering_platform(name, platform):
    fn, shapes = KERNELS[name]

    narrow, wide = (module(fn, platform, *shapes(width)) for width in (32, 64))
    # (a loop may remain whose bound is not T: group sizes' repeat walks the groups, the tree kernels the nodes)
    assert not cpu_only_calls(narrow) and loops(narrow) == loops(wide), name


def test_lowering_platform_is_scoped_and_checked():
    from prm_jax.kernels._platform import on_cpu
    from prm_jax.kernels._recurrence import resolve_method

    # (the ambient platform: the process's backend, or the one PRM_JAX_TESTS_AS_PLATFORM sets around each test)
    ambient = target_platform()
    assert on_cpu() == (ambient == "cpu") and ambient in (jax.default_backend(), os.environ.get(
        "PRM_JAX_TESTS_AS_PLATFORM"))
    with prm_jax.kernels.lowering_platform("tpu"):
        assert not on_cpu() and resolve_method("auto", unit_discount=False) == "associative"
        with prm_jax.kernels.lowering_platform("cpu"):
            assert on_cpu()
        assert target_platform() == "tpu"
    assert target_platform() == ambient
    with pytest.raises(ValueError, match="platform must be one of"):
        with prm_jax.kernels.lowering_platform("gpu0"):
            pass


def test_the_pallas_gae_exports_for_a_gpu_as_one_triton_kernel_without_a_loop():
    # Issue 56.4: method="pallas" exported for cuda is Pallas's Triton kernel (a custom call whose loop over T
    # runs inside the kernel, one program per row), no XLA loop, at two widths; compute_advantages with it too;
    # a TPU is refused (no lowering for its scalar loads).
    from prm_jax.kernels._pallas_gae import TRITON_TARGET

    def triton(fn, *shapes):
        return module(fn, "cuda", *shapes, custom_calls=(TRITON_TARGET,))

    gae = lambda r, v, m: K.gae(r, v, m, gamma=0.9, lam=0.95, method="pallas")
    for width in (32, 64):
        text = triton(gae, F(width), F(width), M(width))
        assert set(re.findall(r"custom_call @([\w$.]+)", text)) == {TRITON_TARGET} and "stablehlo.while" not in text
    # few long rows: split into chunks (two Triton kernels and an associative scan of the chunks' carries)
    from prm_jax.kernels._pallas_gae import CHUNK

    for width in (2 * CHUNK, 4 * CHUNK):
        text = triton(gae, spec(2, width), spec(2, width), spec(2, width, dtype=np.bool_))
        assert "prm_jax_gae_chunks" in text and "stablehlo.while" not in text
        assert set(re.findall(r"custom_call @([\w$.]+)", text)) == {TRITON_TARGET}
    batch = make_batch(np.random.default_rng(3))
    plan = AdvantageConfig(kl_ctl=0.0, gae_method="pallas").plan.with_strategy(batch, platform="cuda")
    text = triton(lambda b: prm_jax.compute_advantages(b, plan), shapes_of(batch))
    assert set(re.findall(r"custom_call @([\w$.]+)", text)) == {TRITON_TARGET} and "stablehlo.while" not in text
    with prm_jax.kernels.lowering_platform("tpu"), pytest.raises(ValueError, match="method='pallas' is a GPU kernel"):
        K.gae(np.zeros((2, 4), np.float32), None, np.ones((2, 4), bool), method="pallas")
