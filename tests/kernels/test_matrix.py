"""Where options meet, one test (issue 29): every estimator x process transform x reward normalization x shaping
mode, each with the optional inputs absent, present, or present on some rows or turns only.

Every cell is either refused at configuration, with a message naming both keys (the pairs of
``prm_jax.config.refused_pairs()``, read from there), or computed and checked against the float64 loop of
``tests/reference.py``. An optional input present on some rows only is either refused where a stage reads it
(a ``ValueError`` naming it: ``READERS`` below says which stages read what) or changes nothing where none
does; the cell's numbers are then checked with the input made whole, in the same program.

The 288 configurations are crossed in full; the optional inputs and the other settings that meet them
(``kl_ctl``, ``mask_no_eos_with_zero``, ``adv_norm``, the groups) are assigned to the cells by a greedy
pairwise design, so every pair of values of any two dimensions meets in some cell (asserted). The cells run
op by op (``jax.disable_jit``): 288 programs would cost 288 compiles of about a second on the CI machine, op
by op they cost about 0.1 s each; the compiled path of every estimator is tested in its own module.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import jax
import numpy as np
import pytest
import reference
from matrix_cases import ESTIMATORS, GROUP, ROWS, SHAPINGS, make_batch

from prm_jax.config import AdvantageConfig, ConfigError, refused_pairs
from prm_jax.estimators import registered

TRANSFORMS = {"none": {}, "min_form": {"process_reward_transform": {"mode": "min_form", "temperature": 0.3}},
              "progress": {"process_reward_transform": {"mode": "progress", "gamma": 0.9, "initial": 0.2,
                                                        "terminal": "outcome"}},
              "progress_token": {"process_reward_transform": {"mode": "progress", "gamma": 0.8, "initial": -0.1,
                                                              "level": "token"}}}
NORMS = {"none": {}, "group": {"reward_norm": {"mean_level": "group", "std_level": "group"}},
         "decoupled": {"reward_norm": {"mode": "decoupled", "eps": 1e-4}}}
CONFIG_DIMS = {"estimator": ESTIMATORS, "transform": TRANSFORMS, "norm": NORMS, "shaping": SHAPINGS}

# The optional inputs and their states, and the other settings that meet them.
STATES = ("absent", "present", "partial")
INPUTS = ("values", "ref_logprobs", "prox_logprobs", "prm_logprobs", "token_rewards", "turn_ids", "gae_lambda",
          "turn_rewards", "anchor_ids", "reward_sources", "node_ids", "is_truncated", "token_reward_mask",
          "sum_pi_squared", "rollout_is_weights")
FREE_DIMS = {**{key: STATES for key in INPUTS}, "groups": ("none", "sizes", "ids", "sizes+members"),
             "kl_ctl": (0.0, 0.1), "mask_no_eos_with_zero": (False, True), "adv_norm": ("none", "batch")}
FREE_DIMS["is_truncated"] = ("absent", "present")  # a bool per row has no "some rows only"
FREE_DIMS["token_reward_mask"] = ("absent", "present")  # present: False on some turns (unscored), True elsewhere


def settings(cell: dict) -> dict:
    """The cell's setting of each key that refused_pairs() names, as written in the actor section."""
    estimator, transform = cell["estimator"], cell["transform"]
    credit = ESTIMATORS[estimator].get("credit_assignment", {}).get("mode")
    written = TRANSFORMS[transform].get("process_reward_transform", {})
    return {"credit_assignment.mode": credit, "process_reward_transform.mode": written.get("mode"),
            "advantage_shaping.mode": "additive" if cell["shaping"] == "fold" else cell["shaping"],
            "token_rewards_as_adv": cell["shaping"] != "fold",
            "process_reward_transform.level": written.get("level", "turn" if written.get("mode") == "progress"
                                                          else None),
            "gae_timestep_unit": ESTIMATORS[estimator].get("gae_timestep_unit", "token"),
            "mask_no_eos_with_zero": cell["mask_no_eos_with_zero"]}


def refusal(cell: dict):
    """The declared refusal that applies to the cell, or None."""
    values = settings(cell)
    for rule in refused_pairs():
        (first, firsts), (second, seconds) = rule.first, rule.second
        if first in values and second in values and values[first] in firsts and values[second] in seconds:
            return rule
    return None


def config_fields(cell: dict) -> dict:
    fields = {"kl_ctl": cell["kl_ctl"], "mask_no_eos_with_zero": cell["mask_no_eos_with_zero"]}
    for dim, table in CONFIG_DIMS.items():
        fields.update(table[cell[dim]])
    if cell["adv_norm"] == "batch":
        fields["adv_norm"] = {"mean_level": "batch", "std_level": "batch"}
    return fields


def pairwise_cells(seed: int = 29) -> list[dict]:
    """Every configuration once, the free dimensions chosen greedily so that every pair of values of two
    dimensions meets in some cell; cells are added until none is left uncovered."""
    dims = {**{dim: tuple(table) for dim, table in CONFIG_DIMS.items()}, **FREE_DIMS}
    names = list(dims)
    uncovered = {(a, va, b, vb) for a, b in itertools.combinations(names, 2) for va in dims[a] for vb in dims[b]}
    rng = np.random.default_rng(seed)

    def complete(cell: dict) -> dict:
        for name in names:
            if name in cell:
                continue
            options = list(dims[name])
            rng.shuffle(options)
            gains = [sum((a, cell[a], name, v) in uncovered or (name, v, a, cell[a]) in uncovered for a in cell)
                     for v in options]
            cell[name] = options[int(np.argmax(gains))]
        for a, b in itertools.combinations(names, 2):
            uncovered.discard((a, cell[a], b, cell[b]))
        return cell

    cells = [complete(dict(zip(CONFIG_DIMS, combo))) for combo in itertools.product(*CONFIG_DIMS.values())]
    while uncovered:
        a, va, b, vb = min(uncovered, key=str)
        cells.append(complete({a: va, b: vb}))
    return cells


CELLS = pairwise_cells()


def test_the_design_covers_every_pair():
    names = list(CONFIG_DIMS) + list(FREE_DIMS)
    values = {**{dim: tuple(table) for dim, table in CONFIG_DIMS.items()}, **FREE_DIMS}
    seen = {(a, cell[a], b, cell[b]) for cell in CELLS for a, b in itertools.combinations(names, 2)}
    missing = [(a, va, b, vb) for a, b in itertools.combinations(names, 2) for va in values[a] for vb in values[b]
               if (a, va, b, vb) not in seen]
    assert not missing
    assert {tuple(cell[d] for d in CONFIG_DIMS) for cell in CELLS} == set(itertools.product(*CONFIG_DIMS.values()))


# --- the batch: tests/matrix_cases.py's make_batch -----------------------------------------------------

def first_trained(batch: dict, row: int) -> int:
    """A trained timestep of ``row`` (a timestep t predicts position t + 1)."""
    active = reference.shift((batch["loss_mask"] > 0) & (batch["attention_mask"] > 0), fill=False)
    return int(np.flatnonzero(active[row])[0])


def with_states(full: dict, cell: dict) -> tuple[dict, dict]:
    """The cell's batch, and the same batch with every partial input made whole (the same keys and shapes)."""
    batch, whole = dict(full), dict(full)
    for key in INPUTS:
        state = cell[key]
        companions = {"node_ids": ("node_parents",), "turn_rewards": ("turn_reward_mask",),
                      "token_rewards": ("token_reward_mask",)}.get(key, ())
        if state == "absent":
            for name in (key, *companions):
                batch.pop(name, None)
                whole.pop(name, None)
            continue
        if state != "partial":
            continue
        broken = np.array(full[key], copy=True)
        row = 1
        if key in ("values", "ref_logprobs", "prox_logprobs", "prm_logprobs", "token_rewards", "sum_pi_squared",
                   "rollout_is_weights"):
            broken[row, first_trained(full, row)] = np.nan  # a turn without the model output (a NaN)
            if key == "token_rewards":  # NaN over the whole turn: a failed scorer row's, never a 0
                broken[row] = np.where(full["turn_ids"][row] == 0, np.nan, full[key][row])
        elif key == "turn_ids":
            broken[row, first_trained(full, row) + 1] = -1  # a trained token outside every turn
        elif key == "gae_lambda":
            broken[row] = np.nan
        elif key == "turn_rewards":  # step rewards given on some turns: the others derived (the mask)
            mask = np.ones(broken.shape, bool)
            mask[::2] = False
            batch["turn_reward_mask"] = whole["turn_reward_mask"] = mask
        elif key == "anchor_ids":
            broken[::2, 1] = -1  # some turns without an anchor
        elif key == "reward_sources":
            broken[row, 0] = np.nan  # a scorer that did not score a row
        elif key == "node_ids":
            broken[row, 0] = -1  # a trained turn without its node
        batch[key] = broken
        if key in ("turn_rewards", "anchor_ids", "reward_sources"):
            whole[key] = broken  # valid: not a refusal, the numbers are checked with it
    groups = cell["groups"]
    sizes = np.array([GROUP] * (ROWS // GROUP), np.int32)
    for b in (batch, whole):
        if groups in ("sizes", "sizes+members"):
            b["group_sizes"] = sizes
        if groups == "sizes+members":
            b["group_member_counts"] = sizes
        if groups == "ids":
            b["group_ids"] = np.repeat(np.arange(ROWS // GROUP, dtype=np.int32), GROUP)
    return batch, whole


def spec_of(cell: dict):
    """The cell's estimator's declaration (the registry's, by the name the matrix knows it by)."""
    return next(spec for spec in registered() if spec.name == cell["estimator"])


def reads(cell: dict, key: str) -> bool:
    """Whether a stage of the cell reads ``key`` where it is broken: the estimator's as it declares (its
    ``reads``, and turn ids where it reads turns), the other stages' from the README's table of which stage
    reads what."""
    spec = spec_of(cell)
    with_process = cell["token_rewards"] != "absent"
    turns_read = (spec.reads_turns
                  or (with_process and (cell["transform"] in ("min_form", "progress") or cell["shaping"] == "fold")))
    # (progress_token reads no turns: its steps are the trained timesteps)
    return {"values": True, "prox_logprobs": True, "token_rewards": True, "gae_lambda": True,
            "ref_logprobs": cell["kl_ctl"] != 0 or "ref_logprobs" in spec.reads,
            "turn_ids": turns_read,
            "rollout_is_weights": "rollout_is_weights" in spec.batch_keys}.get(key, key in spec.reads)


def expected_refusals(cell: dict) -> set[str]:
    """The batch keys whose state the cell refuses (a partial input a stage reads, a required one absent: the
    keys the cell's estimator declares it reads)."""
    refused = {key for key in INPUTS if cell[key] == "partial" and reads(cell, key)}
    refused |= {key for key in spec_of(cell).reads if key in INPUTS and cell[key] == "absent"}
    return refused


MATRIX_CHUNKS = 8  # (test items of 10-20 s: a longer one, last on a worker, held the suite's end)


@pytest.mark.parametrize("chunk", range(MATRIX_CHUNKS))
def test_every_cell_is_refused_or_equals_the_float64_loop(chunk):
    rng = np.random.default_rng(2900 + chunk)
    checked = refused_config = refused_input = extremes = 0
    for index, cell in enumerate(CELLS):
        if (index // len(SHAPINGS)) % MATRIX_CHUNKS != chunk:  # each chunk: every shaping of an eighth of the rest
            continue
        rule = refusal(cell)
        if rule is not None:
            with pytest.raises(ConfigError) as caught:
                AdvantageConfig(**config_fields(cell))
            message = str(caught.value)
            assert rule.first[0] in message and rule.second[0] in message, (cell, message)
            refused_config += 1
            continue
        config = AdvantageConfig(**config_fields(cell))
        batch, whole = with_states(make_batch(rng), cell)
        refusing = expected_refusals(cell)
        with warnings.catch_warnings(), jax.disable_jit():
            warnings.simplefilter("ignore")
            if refusing:
                with pytest.raises(ValueError) as caught:
                    from prm_jax import compute_advantages
                    compute_advantages(batch, config)
                assert any(key in str(caught.value) for key in refusing), (cell, str(caught.value))
                refused_input += 1
                batch = {k: v for k, v in whole.items() if k not in refusing or cell[k] != "absent"}
                if any(cell[k] == "absent" for k in refusing):
                    continue  # a required input is missing: there are no numbers to check
            from prm_jax import compute_advantages
            out = compute_advantages(batch, config)
        want = reference.compute_advantages(batch, config_fields(cell))
        for field in ("advantages", "returns", "tot_rewards", "kl_rewards"):
            np.testing.assert_allclose(np.asarray(getattr(out, field)), want[field], rtol=3e-4, atol=3e-4,
                                       err_msg=f"{field} of {cell}")
        checked += 1
        if checked % 2 == 1 and cell["shaping"] != "process_weighted":
            extremes += finite_or_counted(cell, config, rng)
    assert checked > 10 and refused_config > 0 and refused_input > 0, (checked, refused_config, refused_input)
    assert extremes > 3


# --- the float32 range ----------------------------------------------------------------------------------

EXTREMES = {"values": 3e38, "token_rewards": 1e38, "ref_logprobs": -3e38, "prm_logprobs": -3e38,
            "turn_rewards": 3e38, "reward_sources": 3e38}


def finite_or_counted(cell: dict, config: AdvantageConfig, rng: np.random.Generator) -> int:
    """Issue 29.9: PRIME (norm: none) with a reference log-prob of -3e38 and GiGPO with turn_rewards 3e38
    returned non-finite advantages with every check at 0. Every input here is finite in float32 (a third of
    the entries of each float input near float32's largest); the cell returns finite advantages and returns
    on trained timesteps, or raises naming the overflow (under jit it counts it: test_advantages_api)."""
    from prm_jax import compute_advantages
    batch, _ = with_states(make_batch(rng), {**cell, **{key: "present" for key in INPUTS}})
    for key, scale in EXTREMES.items():
        batch[key] = np.where(rng.random(np.shape(batch[key])) < 0.3, scale, batch[key]).astype(np.float32)
    if cell["shaping"] == "fold":  # folding needs a reward uniform over each turn: scale whole turns
        ids = batch["turn_ids"]
        batch["token_rewards"] = np.where(ids >= 0, np.where(ids % 2 == 0, 1e38, -1e38), 0.0).astype(np.float32)
    with warnings.catch_warnings(), jax.disable_jit():
        warnings.simplefilter("ignore")
        try:
            out = compute_advantages(batch, config)
        except ValueError as err:
            assert "compute_advantages computed a non-finite" in str(err), (cell, str(err))
            return 1
    active = np.asarray(out.loss_mask) > 0
    assert np.isfinite(np.asarray(out.advantages)[active]).all() and np.isfinite(np.asarray(out.returns)[active]).all()
    return 1


# (The guide's table of refused pairs is rendered from refused_pairs() at docs build: tests/test_doc_tables.py.)


def test_every_registered_estimator_has_a_float64_reference_and_runs_in_the_matrix():
    # Issue 43.2: the matrix runs every registered estimator from its declared example; one without a
    # float64 reference fails here, named.
    from prm_jax.estimators import registered

    missing = [spec.name for spec in registered()
               if spec.name not in reference.CREDIT and spec.name not in reference.CREDIT_FROM_REWARDS
               and spec.name not in reference.GAE_ESTIMATORS]
    assert missing == [], f"registered estimators without a float64 reference in tests/reference.py: {missing}"
    assert {cell["estimator"] for cell in CELLS} == {spec.name for spec in registered()}


def test_a_plug_in_that_replaces_gae_is_refused_with_the_turn_unit_from_its_declaration():
    # Issue 43.2: RLOO (tests/rloo_estimator.py) declares units=("token",) and is listed nowhere else.
    with pytest.raises(ConfigError, match=r"gae_timestep_unit 'turn' cannot be combined with credit_assignment\.mode "
                                          r"'tree', 'pure', 'prime', .*'rloo': these replace GAE"):
        AdvantageConfig(credit_assignment={"mode": "rloo"}, gae_timestep_unit="turn")
    assert AdvantageConfig(credit_assignment={"mode": "rloo"}).plan is not None


def float_settings():
    """Every float setting of the actor section and its nested records, as ``(fields, name)``."""
    from prm_jax.config import (
        DecoupledNorm,
        GiGPOConfig,
        MinFormTransform,
        NormConfig,
        PrimeCredit,
        ProgressTransform,
        PureCredit,
    )
    from prm_jax.kernels._shaping import ShapingConfig
    top = ["discount", "gae_lambda", "kl_ctl", "reward_bias", "reward_scaling", "reward_clip"]
    nested = {"credit_assignment": (("gigpo", GiGPOConfig), ("pure", PureCredit), ("prime", PrimeCredit)),
              "process_reward_transform": (("min_form", MinFormTransform), ("progress", ProgressTransform)),
              "reward_norm": (("decoupled", DecoupledNorm),), "adv_norm": ((None, NormConfig),),
              "advantage_shaping": ((None, ShapingConfig),)}
    out = [({name: None}, name) for name in top]
    for key, records in nested.items():
        for mode, cls in records:
            for field in dataclasses.fields(cls):
                if isinstance(field.default, float):
                    out.append(({key: {**({"mode": mode} if mode else {}), field.name: None}}, f"{key}.{field.name}"))
    return out


@pytest.mark.parametrize("fields, name", float_settings(), ids=[name for _, name in float_settings()])
def test_settings_beyond_float32_or_subnormal_in_it_are_refused_at_configuration(fields, name):
    # Issue 29.9: settings whose range makes a mode meaningless are refused at configuration: 3.5e38 is no
    # float32; 1e-39 is a float32 subnormal, flushed to 0 on the CPU (a temperature of 1e-39 zeroed min-form).
    def with_value(value):
        (key, inner), = fields.items()
        if inner is None:
            return {key: value}
        return {key: {k: (value if v is None else v) for k, v in inner.items()}}
    for value in (3.5e38, 1e-39, -1e-39):
        with pytest.raises(ConfigError, match=name.rsplit(".", 1)[-1]):
            AdvantageConfig(**with_value(value))
