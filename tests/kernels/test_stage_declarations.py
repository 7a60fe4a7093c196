"""Issue 43.1: every stage kind is declared. Outcome normalizations, process transforms and shapings declare
what they read, their diagnostics prefix and their value checks (``StageSpec``), as estimators do; the driver
runs a plan's stages from those declarations, so a stage record it has never seen runs with no edit of it."""

import dataclasses
import inspect

import jax.numpy as jnp
import numpy as np
import pytest
from batches import make_batch

from prm_jax import compute_advantages
from prm_jax.app._score import credit_prefixes
from prm_jax.config import AdvantageConfig
from prm_jax.kernels import _advantages as advantages
from prm_jax.kernels._plan import STAGE_DIAGNOSTICS, STAGE_SPECS
from prm_jax.kernels._stage import StageResult, StageSpec

# Each declared stage selected in a config (the key its kind names, and the mode); the batch is one whose
# process rewards lie in [0, 1], so process_weighted's check runs and passes.
CONFIGS = {
    ("reward_norm", "normalize"): {"reward_norm": {"mean_level": "group", "std_level": "group"}},
    ("reward_norm", "decoupled"): {"reward_norm": {"mode": "decoupled"}},
    ("process_reward_transform", "min_form"): {"process_reward_transform": {"mode": "min_form"}},
    ("process_reward_transform", "progress"): {"process_reward_transform": {"mode": "progress", "level": "turn"},
                                               "advantage_shaping": {"mode": "additive"}},
    ("adv_norm", "normalize"): {"adv_norm": {"mean_level": "group", "std_level": "group"}},
    **{("advantage_shaping", mode): {"advantage_shaping": {"mode": mode}}
       for mode in ("additive", "gvpo", "process_weighted")},
}


def test_every_declared_stage_has_a_case_here():
    assert sorted((spec.kind, spec.mode) for spec in STAGE_SPECS) == sorted(CONFIGS)


@pytest.mark.parametrize("kind,mode", sorted(CONFIGS))
def test_a_stage_writes_its_declared_diagnostics_and_checks(kind, mode):
    spec = next(s for s in STAGE_SPECS if (s.kind, s.mode) == (kind, mode))
    config = AdvantageConfig(kl_ctl=0.0, **CONFIGS[kind, mode])
    assert any(declared is spec for declared, _ in config.plan.stages)
    batch = make_batch(np.random.default_rng(43), rows=4, width=24, unit_interval=True)
    batch["group_sizes"] = np.array([2, 2], np.int32)
    out = compute_advantages(batch, config)
    if spec.diagnostics is not None:
        assert any(key.startswith(spec.diagnostics) for key in out.diagnostics), spec.diagnostics
    for check in spec.checks:
        assert f"checks/{check}" in out.diagnostics, check
    assert set(spec.reads) <= set(config.plan.reads)


def test_the_summary_lists_every_declared_prefix():
    assert set(STAGE_DIAGNOSTICS) == {s.diagnostics for s in STAGE_SPECS if s.diagnostics is not None}
    assert set(STAGE_DIAGNOSTICS) <= set(credit_prefixes())


def test_the_driver_asks_no_stage_what_it_is():
    assert "isinstance" not in inspect.getsource(advantages)


@dataclasses.dataclass(frozen=True)
class Clipped:
    """A process transform the driver has never seen: ``P`` clipped to ``[0, ceiling]``."""

    ceiling: float = 0.5

    @property
    def spec(self) -> StageSpec:
        return CLIPPED


def _clipped(stage, process, active):  # (it names the inputs it reads, as every stage does: INPUTS)
    out = jnp.where(active, jnp.clip(process, 0.0, stage.ceiling), jnp.zeros((), process.dtype))
    return StageResult(out, {"clipped/steps": jnp.sum(active, dtype=jnp.int32)})


CLIPPED = StageSpec("process_reward_transform", "clipped", Clipped, _clipped, diagnostics="clipped/")


def test_a_new_process_transform_runs_from_its_declaration_alone():
    # A property: the same numbers as the batch with its process rewards clipped beforehand (on positions; the
    # transform reads them on timesteps, shifted, which clipping commutes with) and no transform.
    batch = make_batch(np.random.default_rng(7), rows=3, width=20, unit_interval=True)
    config = AdvantageConfig(kl_ctl=0.0)
    plan = dataclasses.replace(config.plan, process_transform=Clipped(0.5))
    got = compute_advantages(batch, plan)
    clipped = dict(batch, token_rewards=np.clip(batch["token_rewards"].astype(np.float64), 0.0, 0.5).astype(np.float32))
    want = compute_advantages(clipped, config)
    np.testing.assert_allclose(got.advantages, want.advantages, rtol=1e-6, atol=1e-6)
    assert int(got.diagnostics["clipped/steps"]) == int(np.asarray(got.loss_mask).sum())


def test_the_stages_run_in_the_order_the_steps_are_numbered():
    # Issue 57.4: adv_norm was the one stage not declared, and the driver's step numbers were not its order
    # (1, 2, "5, first", 3, 4-5, ...): every stage kind is declared, the plan lists a config's stages in the
    # order they run, and the driver's step comments count up in the order of its lines.
    import re

    config = AdvantageConfig(kl_ctl=0.0, reward_norm={"mean_level": "group", "std_level": "group"},
                             process_reward_transform={"mode": "min_form"},
                             adv_norm={"mean_level": "batch", "std_level": "batch"})
    kinds = [spec.kind for spec, _ in config.plan.stages]
    assert kinds == ["reward_norm", "process_reward_transform", "adv_norm", "advantage_shaping"]
    assert [spec.kind for spec in STAGE_SPECS] == sorted((spec.kind for spec in STAGE_SPECS), key=kinds.index)
    steps = [int(step.split("-")[0]) for step in re.findall(r"#\s+(\d+(?:-\d+)?)\s*$",
                                                             inspect.getsource(advantages._pipeline), re.M)]
    assert steps == sorted(steps) and steps[0] == 1 and len(steps) >= 7, steps


def test_every_stage_kind_has_one_call_contract():
    # Issue 57.4: the four stage kinds had four call contracts (an estimator named inputs, a normalization took 7
    # positional arguments, a transform 8, a shaping 5; estimators returned a record, the others tuples; every
    # stage appended to a checks list passed down). Every declared stage and estimator names only inputs of the
    # one INPUTS table after its record, none takes a checks list, and each returns a StageResult.
    from prm_jax.estimators import INPUTS, registered

    for spec in (*STAGE_SPECS, *registered()):
        names = tuple(inspect.signature(spec.run).parameters)[1:]
        assert names == spec.inputs and set(names) <= set(INPUTS) and "checks" not in names, (spec, names)
        assert inspect.signature(spec.run).return_annotation in ("StageResult", StageResult), spec
    with pytest.raises(ValueError, match=r"run\(\) names inputs \['checks'\]"):
        StageSpec("process_reward_transform", "old", Clipped, lambda stage, checks, process: None)
