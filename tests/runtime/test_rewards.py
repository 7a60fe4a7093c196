"""Issue 31.10: ``prm_jax.runtime._rewards`` (a scorer's raw result, validated and weighted) on its own."""

import numpy as np
import pytest
from scorers_for_tests import ConstantScorer

from prm_jax import Interaction
from prm_jax.runtime._rewards import weighted_rewards

TURN = Interaction("t", [1, 2], [3, 4, 5])


@pytest.mark.parametrize("raw,weight,expected", [
    (0.5, 2.0, [1.0, 1.0, 1.0]), (2, 0.5, [1.0, 1.0, 1.0]), (True, 3.0, [3.0, 3.0, 3.0]),
    ([0.0, 1.0, 2.0], -1.0, [0.0, -1.0, -2.0]), (np.float32(0.25), 4.0, [1.0, 1.0, 1.0]),
    (np.array(1.5), 2.0, [3.0, 3.0, 3.0]),
])
def test_a_raw_score_becomes_weight_times_raw_in_float32_with_its_mean(raw, weight, expected):
    weighted, mean = weighted_rewards(ConstantScorer(weight=weight), TURN, raw)
    assert weighted.dtype == np.float32 and weighted.tolist() == expected
    assert mean == pytest.approx(float(np.mean(expected)))


@pytest.mark.parametrize("raw,kind,needle", [
    (float("nan"), ValueError, "non-finite rewards"), ([1.0, float("inf"), 0.0], ValueError, "non-finite rewards"),
    (3e38, ValueError, r"reward \* weight \(2.0\) is non-finite"), ([0.0, 3e38, 0.0], ValueError, "non-finite"),
    ("0.5", TypeError, "expected a float"), ([1.0, 2.0], ValueError, r"shape \(n,\) with n = output_len = 3"),
    ([[1.0, 2.0, 3.0]], ValueError, "output_len = 3"), (object(), TypeError, "expected a float or an array"),
    ([True, False, True], TypeError, "expected a float or an array"),
])
def test_bad_results_are_errors_naming_the_scorer_and_the_turn(raw, kind, needle):
    with pytest.raises(kind, match=needle) as info:
        weighted_rewards(ConstantScorer(weight=2.0), TURN, raw)
    assert "scorer 'constant' on interaction 't'" in str(info.value)
