import copy
from pathlib import Path

import anyio
import numpy as np
import pytest
import yaml

from prm_jax import (
    AdvantageConfig,
    ExperimentConfig,
    Interaction,
    InteractionCache,
    PRMRunner,
    ShapingConfig,
    compute_advantages,
    load_config,
    pack_branches,
)
from prm_jax.config import PRMConfig, ScorerSpec
from prm_jax.scorers import LengthBudgetScorer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "prm_config.yaml"
BASE = yaml.safe_load(EXAMPLE.read_text())


def with_changes(*changes):
    data = copy.deepcopy(BASE)
    for path, value in changes:
        node = data
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return data


DELETE = object()


def test_seed_example_loads_and_runs_unchanged():
    config = load_config(EXAMPLE)
    assert config.prm.active and config.actor.advantage_shaping == ShapingConfig("process_weighted")
    assert config.actor.token_rewards_as_adv

    async def main():
        runner = await PRMRunner.create(config)
        cache = InteractionCache([Interaction("a", [1, 2], [3] * 100, reward=1.0),
                                  Interaction("b", [1, 2] + [3] * 100 + [4], [5] * 200, parent_id="a", reward=1.0)])
        results = await runner.run(cache)
        await runner.aclose()
        return cache, results

    cache, results = anyio.run(main)
    assert [r.reward for r in results] == [1.0, 0.0]
    batch = pack_branches([cache.to_sequence("b")])
    out = compute_advantages(batch, config.actor)
    assert np.isfinite(np.asarray(out.advantages)).all()


@pytest.mark.parametrize("changes,key", [
    ([("rollout.agent.prm.advantage_shaping.mode", "boost")], "advantage_shaping.mode"),
    ([("rollout.agent.prm.advantage_shaping.negative_scale", -0.1)], "advantage_shaping.negative_scale"),
    ([("rollout.agent.prm.advantage_shaping.zero_penalty", float("nan"))], "advantage_shaping.zero_penalty"),
    ([("rollout.agent.prm.advantage_shaping.zero_eps", float("inf"))], "advantage_shaping.zero_eps"),
    ([("rollout.agent.prm.advantage_shaping.mode", "additive"), ("actor.token_rewards_as_adv", False)],
     "actor.token_rewards_as_adv"),
    ([("rollout.agent.prm.scorers", []), ("actor.token_rewards_as_adv", False)], "token_rewards_as_adv"),
    ([("actor.mask_no_eos_with_zero", True)], "mask_no_eos_with_zero"),
    ([("rollout.agent.export_style", "individual")], "rollout.agent.export_style"),
    ([("rollout.agent.chat_template_type", "hf")], "rollout.agent.chat_template_type"),
    ([("rollout._version", "v2"), ("rollout.api_url", "http://model")], "rollout.api_url"),
    ([("rollout._version", "v3")], "rollout._version"),
    ([("rollout.agent.prm.scorers", [{"path": "prm_jax.scorers.LengthBudgetScorer", "wieght": 1}])],
     r"scorers\[0\] has unknown keys \['wieght'\]"),
    ([("rollout.agent.prm.scorers", [{"path": ""}])], r"scorers\[0\]\.path"),
    ([("rollout.agent.prm.scorers", [{"path": "x.Y", "weight": "heavy"}])], r"scorers\[0\]\.weight"),
    ([("rollout.agent.prm.temperature", 1.0)], r"rollout\.agent\.prm has unknown keys"),
    ([("actor.learning_rate", 1e-6)], "actor has unknown keys"),
    ([("actor.discount", 2.0)], "actor.discount"),
    ([("actor.adv_norm", {"mean_level": "token"})], "actor.adv_norm.mean_level"),
])
def test_validation_names_the_key(changes, key):
    with pytest.raises(ValueError, match=key):
        ExperimentConfig.from_mapping(with_changes(*changes))


def test_a_full_areal_config_is_read_with_its_other_sections_ignored_once():
    # Issue 20.14: AReaL's experiment config has sections prm-jax does not read: accepted, listed in one
    # warning; an unknown key inside a section prm-jax reads stays an error.
    data = with_changes(("cluster", {"n_nodes": 1}), ("gconfig", {"max_new_tokens": 512}), ("trainer", {}))
    with pytest.warns(UserWarning, match=r"ignored: \['cluster', 'gconfig', 'trainer'\]") as caught:
        config = ExperimentConfig.from_mapping(data)
    assert len(caught) == 1 and config == ExperimentConfig.from_mapping(with_changes())
    with pytest.raises(ValueError, match="actor has unknown keys"):
        ExperimentConfig.from_mapping(with_changes(("cluster", {}), ("actor.learning_rate", 1e-6)))


@pytest.mark.parametrize("key,value", [("max_turns", True), ("gae_block_size", False), ("max_turns", 2.0)])
def test_bools_and_floats_are_not_counts(key, value):
    # Issue 20.14: YAML's `max_turns: true` was accepted as 1.
    with pytest.raises(ValueError, match=f"actor.{key} must be an integer >= 1, got {value}"):
        ExperimentConfig.from_mapping(with_changes((f"actor.{key}", value)))


def test_numbers_are_read_as_areal_reads_them(tmp_path):
    # Issue 20.14: `eps: 1e-5` is a string to PyYAML (YAML 1.1), a float to AReaL's OmegaConf.
    from prm_jax.config._loader import load_config
    path = tmp_path / "c.yaml"
    path.write_text("actor:\n  adv_norm: {mean_level: batch, std_level: batch, eps: 1e-5}\n  kl_ctl: 2E-3\n")
    config = load_config(path)
    assert config.actor.adv_norm.eps == 1e-5 and config.actor.kl_ctl == 2e-3


def test_deeply_nested_yaml_is_a_located_error(tmp_path):
    from prm_jax.config._loader import load_config
    path = tmp_path / "deep.yaml"
    path.write_text("actor: " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ValueError, match=r"deep\.yaml: the YAML is nested too deeply"):
        load_config(path)


@pytest.mark.parametrize("changes", [
    [("rollout.agent.prm.enabled", False), ("actor.token_rewards_as_adv", False),
     ("rollout.agent.export_style", "individual")],
    [("rollout.agent.prm.scorers", []), ("rollout.agent.export_style", "individual"),
     ("rollout._version", "v2"), ("rollout.api_url", "http://model")],
    [("rollout.agent.prm.advantage_shaping.mode", "additive"), ("rollout.agent.prm.scorers", []),
     ("actor.token_rewards_as_adv", False)],
])
def test_scorer_rules_do_not_apply_without_active_scorers(changes):
    config = ExperimentConfig.from_mapping(with_changes(*changes))
    assert not config.prm.active  # the rules these settings break are the active scorers' rules
    written = dict(changes)
    assert config.rollout.export_style == written.get("rollout.agent.export_style", "concat")
    assert config.rollout.api_url == written.get("rollout.api_url")
    assert config.actor.token_rewards_as_adv is written.get("actor.token_rewards_as_adv", True)


def test_disabled_prm_leaves_the_actor_unshaped():
    config = ExperimentConfig.from_mapping(with_changes(("rollout.agent.prm.enabled", False)))
    assert config.actor.advantage_shaping == ShapingConfig()


def test_load_config_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: [unclosed")
    with pytest.raises(ValueError, match=r"bad\.yaml"):
        load_config(bad)


def test_prm_section_from_dict_and_runner_accept_full_config():
    prm = PRMConfig.from_mapping(BASE["rollout"]["agent"]["prm"])
    assert prm.scorers[0].path == "prm_jax.scorers.LengthBudgetScorer"
    runner = PRMRunner(BASE)
    assert [type(s) for s in runner.scorers] == [LengthBudgetScorer]


def test_length_budget_scorer():
    with pytest.raises(ValueError, match="max_output_tokens"):
        LengthBudgetScorer(max_output_tokens=0)
    scorer = LengthBudgetScorer(max_output_tokens=2)
    turn = Interaction("t", [1], [2, 3, 4])
    assert anyio.run(scorer.evaluate, turn, {}) == 0.0
    result = scorer.prepare_result(turn, 0.0, {})
    assert result.observations[0].value is False and result.observations[0].aggregations == ("count", "rate")


def test_advantage_config_from_actor_section():
    config = ExperimentConfig.from_mapping(with_changes(("actor.discount", 0.99), ("actor.adv_norm",
                                                                              {"mean_level": "group", "group_size": 4})))
    assert isinstance(config.actor, AdvantageConfig) and config.actor.adv_norm.group_size == 4


def test_config_classes_validate_when_built_in_code():
    # Issue 11.7: one validation path, in __post_init__, whether built from YAML or in code.
    from prm_jax.config._experiment import RolloutConfig
    from prm_jax.errors import ConfigError
    with pytest.raises(ConfigError, match=r"^path must be a non-empty"):
        ScorerSpec("")
    with pytest.raises(ConfigError, match=r"^timeout must be > 0"):
        ScorerSpec("a.B", timeout=0)
    with pytest.raises(ConfigError, match=r"^_version must be one of"):
        RolloutConfig(version="v3")
    with pytest.raises(ConfigError, match=r"^actor\.token_rewards_as_adv must be true with active PRM scorers"):
        ExperimentConfig(prm=PRMConfig(scorers=(ScorerSpec("prm_jax.scorers.LengthBudgetScorer"),)),
                         actor=AdvantageConfig(token_rewards_as_adv=False))


def test_errors_name_the_full_key_path():
    data = {"actor": {"adv_norm": {"mean_level": "batch", "eps": -1.0}}}
    with pytest.raises(ValueError, match=r"^actor\.adv_norm\.eps must be >= 0"):
        ExperimentConfig.from_mapping(data)
    data = {"rollout": {"agent": {"prm": {"scorers": [{"path": "a.B", "weight": "heavy"}]}}}}
    with pytest.raises(ValueError, match=r"^rollout\.agent\.prm\.scorers\[0\]\.weight must be a finite number"):
        ExperimentConfig.from_mapping(data)
    data = {"rollout": {"agent": {"prm": {"advantage_shaping": {"mode": "gvpo", "zero_eps": -1}}}}}
    with pytest.raises(ValueError, match=r"^rollout\.agent\.prm\.advantage_shaping\.zero_eps must be >= 0"):
        ExperimentConfig.from_mapping(data)


def test_the_shaping_mode_has_one_owner():
    # Issue 11.8: written under rollout.agent.prm, held by the actor's AdvantageConfig only.
    config = ExperimentConfig.from_mapping({"rollout": {"agent": {"prm": {"advantage_shaping": {"mode": "gvpo"}}}}})
    assert config.actor.advantage_shaping.mode == "gvpo"
    assert not hasattr(config.prm, "advantage_shaping")
    assert config.prm_section.advantage_shaping is config.actor.advantage_shaping
