"""The command's summary statistics (issue 20.10: a huge scorer weight overflowed them to inf, and writing
metrics.json then raised)."""

import dataclasses
import types

import jax
import numpy as np
import pytest

from prm_jax.app._score import AdvantageStats, advantage_stats
from prm_jax.kernels._diagnostics import statistics


def output(advantages, mask):
    """An output as the pipeline returns it: the advantages' statistics computed by the kernel's one home."""
    stats = jax.jit(lambda a, m: statistics("advantages", a, m))(advantages, mask)
    return types.SimpleNamespace(advantages=advantages, loss_mask=mask, diagnostics=stats)


@pytest.mark.parametrize("scale", [1.0, 3e37, 1e-30])
def test_advantage_stats_match_a_float64_reference_at_any_magnitude(scale):
    # Issue 43: the report reads the kernel's statistics (diagnostics.statistics); the host recomputation went.
    rng = np.random.default_rng(3)
    advantages = (rng.normal(size=(40, 300)) * scale).astype(np.float32)
    mask = rng.random((40, 300)) < 0.6
    got = dataclasses.asdict(advantage_stats(output(advantages, mask)))
    active = advantages[mask].astype(np.float64)
    want = {"mean": active.mean(), "std": active.std(), "min": active.min(), "max": active.max()}
    for key in want:
        assert np.isfinite(got[key]) and got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6 * scale), key


def test_advantage_stats_of_no_active_timestep_and_of_non_finite_advantages():
    assert advantage_stats(output(np.ones((2, 3), np.float32), np.zeros((2, 3), bool))) == AdvantageStats(
        mean=0.0, std=0.0, min=0.0, max=0.0)
    with pytest.raises(ValueError, match="the advantages are not finite"):
        advantage_stats(output(np.array([[1.0, np.inf]], np.float32), np.ones((1, 2), bool)))


def test_the_turn_table_shows_a_success_beside_a_failure():
    # Issue 23.11: the demo's table showed two failed rows only.
    from prm_jax.app._report import shown_rows
    assert shown_rows(np.array([0.0, 0.0, 0.0, 1.0])) == [0, 3]
    assert shown_rows(np.array([1.0, 0.0, 1.0])) == [0, 1]
    assert shown_rows(np.array([0.0, 0.0, 0.0])) == [0, 1]  # no success: the first rows
    assert shown_rows(np.array([1.0]), rows=2) == [0]
