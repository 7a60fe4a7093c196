"""Issue 31.10: ``prm_jax.runtime._scoring`` (the scorer contract: observations, a scorer's own settings,
kinds) on its own."""

import pytest

from prm_jax import BaseScorer, PRMMetricObservation, SyncScorer


def obs(**kwargs):
    fields = dict(metric_id="m", scope="turn", target_id="t0", value=1.0, value_type="float", aggregations=("mean",))
    return PRMMetricObservation(**(fields | kwargs))


def test_an_observation_normalizes_its_value_and_aggregations():
    assert obs(aggregations="sum").aggregations == ("sum",) and obs(value=2).value == 2.0
    flag = obs(value_type="boolean", value=True, aggregations=("count", "rate"))
    assert flag.value is True and flag.schema == ("boolean", ("count", "rate"))


@pytest.mark.parametrize("kwargs,needle", [
    ({"metric_id": ""}, "metric_id must be a non-empty string"), ({"scope": "batch"}, "scope must be one of"),
    ({"value_type": "int"}, "value_type must be one of"), ({"aggregations": ()}, "must not be empty"),
    ({"aggregations": ("mean", "mean")}, "must be unique"), ({"aggregations": ("rate",)}, "allows only"),
    ({"value": float("nan")}, "finite, non-bool number"), ({"value": True}, "finite, non-bool number"),
    ({"value_type": "boolean", "value": 1, "aggregations": ("count",)}, "must be a bool"),
])
def test_a_bad_observation_is_refused_naming_the_field(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        obs(**kwargs)


class Named(BaseScorer):
    name = "named"

    async def evaluate(self, interaction, ctx):
        return 0.0


@pytest.mark.parametrize("kwargs,needle", [
    ({"enabled": "yes"}, "enabled must be a bool"), ({"weight": float("inf")}, "weight"),
    ({"timeout": 0}, "timeout"), ({"max_concurrency": 0}, "max_concurrency"),
    ({"colour": "red"}, r"unexpected keyword arguments \['colour'\]"),
])
def test_a_scorers_own_settings_are_checked_naming_them(kwargs, needle):
    with pytest.raises((ValueError, TypeError), match=needle):
        Named(**kwargs)


def test_a_scorer_class_needs_a_name_and_its_kind_is_declared():
    unnamed = type("Unnamed", (BaseScorer,), {"evaluate": Named.evaluate})
    with pytest.raises(ValueError, match="must set a non-empty class-level name"):
        unnamed()
    assert (Named.unit, Named.executor) == ("turn", "async")
    sync = type("S", (SyncScorer,), {"name": "s", "evaluate": lambda self, i, c: 0.0})
    assert (sync().executor, sync(executor="process").executor) == ("thread", "process")
