"""Issue 31.10: ``prm_jax.config._loader`` (YAML in, a validated ExperimentConfig out, every error naming the
file) on its own."""

import pytest

from prm_jax.config import ConfigFileError, load_config, parse_yaml
from prm_jax.config._loader import MAX_YAML_NODES


def test_a_config_file_loads_into_a_validated_experiment_config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout: {agent: {prm: {enabled: true, scorers: []}}}\nactor: {kl_ctl: 0.0, discount: 0.9}\n")
    config = load_config(path)
    assert config.actor.kl_ctl == 0.0 and config.actor.discount == pytest.approx(0.9) and config.prm.enabled


@pytest.mark.parametrize("text,needle", [
    ("", "must be a YAML mapping"), ("- a\n- b\n", "must be a YAML mapping"),
    ("rollout: [unclosed\n", "not valid YAML"),
    ("actor: {discount: 2.0}\n", "discount"),
    ("[" * 100_000, "nested too deeply|not valid YAML"),
])
def test_every_error_names_the_file(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError, match=needle) as info:
        load_config(path)
    assert str(info.value).startswith(str(path))


def test_an_alias_bomb_is_refused():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(6))
    with pytest.raises(ConfigFileError, match=f"more than {MAX_YAML_NODES} nodes"):
        parse_yaml(bomb, "bomb.yaml")
    # (A long document as written is read as it is: tests/app/test_cli_faults.py, the long flat list.)
    assert parse_yaml("a: &a [1, 2]\nb: [*a, *a]\n", "small.yaml") == {"a": [1, 2], "b": [[1, 2], [1, 2]]}
