"""Issue 31.10: ``prm_jax.runtime._specs`` (a config entry's class and arguments, checked without building a
scorer) on its own."""

import pytest

from prm_jax.config import PRMConfig, ScorerSpec
from prm_jax.runtime._specs import check_scorer_specs, resolve_scorer_class
from prm_jax.scorers import LengthBudgetScorer


@pytest.mark.parametrize("path,kind,needle", [
    ("", ValueError, "non-empty dotted import path"),
    ("NoModule", ValueError, "must be 'package.module.ClassName'"),
    ("no_such_module_here.Scorer", ValueError, "cannot import module 'no_such_module_here'"),
    ("prm_jax.scorers.NoSuchScorer", ValueError, "has no attribute 'NoSuchScorer'"),
    ("prm_jax.kernels._token_gae", TypeError, "which is not a BaseScorer subclass"),
])
def test_a_scorer_path_that_names_no_scorer_class_is_refused(path, kind, needle):
    with pytest.raises(kind, match=needle):
        resolve_scorer_class(path)


def test_a_scorer_path_names_its_class():
    assert resolve_scorer_class("prm_jax.scorers.LengthBudgetScorer") is LengthBudgetScorer


def entry(**kwargs):
    return ScorerSpec("prm_jax.scorers.LengthBudgetScorer", kwargs=kwargs)


@pytest.mark.parametrize("kwargs,needle", [
    ({"weight": 2.0}, r"scorers\[0\]\.kwargs: \['weight'\] belong to the entry itself"),
    ({"max_output_tokens": 8, "colour": "red"}, r"does not accept \['colour'\]"),
    ({"max_output_tokens": 0}, r"LengthBudgetScorer: max_output_tokens"),  # the class's own validate_kwargs
])
def test_an_entrys_arguments_are_bound_against_the_constructor_chain(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        check_scorer_specs(PRMConfig(scorers=(entry(**kwargs),)))
    with pytest.raises(ValueError, match=r"HTTPJudgeScorer needs \['url'\]"):  # a required argument left out
        check_scorer_specs(PRMConfig(scorers=(ScorerSpec("prm_jax.scorers.HTTPJudgeScorer"),)))


def test_names_are_unique_across_entries_and_lent_instances():
    two = PRMConfig(scorers=(entry(max_output_tokens=8), entry(max_output_tokens=9)))
    with pytest.raises(ValueError, match=r"scorers\[1\]: scorer name 'length_budget' is already used by "
                                         r"rollout.agent.prm.scorers\[0\]"):
        check_scorer_specs(two)
    with pytest.raises(ValueError, match=r"scorers\[0\] \(borrowed\): scorer name 'length_budget' is already used"):
        check_scorer_specs(PRMConfig(scorers=(entry(max_output_tokens=8),)),
                           [LengthBudgetScorer(max_output_tokens=8)])
    with pytest.raises(TypeError, match=r"scorers\[0\] must be a BaseScorer instance"):
        check_scorer_specs(PRMConfig(), [object()])
    assert check_scorer_specs(PRMConfig(scorers=(entry(max_output_tokens=8),))) == [LengthBudgetScorer]
