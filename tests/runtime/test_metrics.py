import anyio
import numpy as np
import pytest

from prm_jax import PRMRunner
from prm_jax.runtime import InMemoryRecorder, MetricStats, PRMTurnResult
from prm_jax.runtime._metrics import branch_stats, quote_name, reduce_workers
from prm_jax.runtime._scoring import PRMMetricObservation
from prm_jax.runtime._trajectory import Interaction, InteractionCache
from prm_jax.scorers import LengthBudgetScorer


def turn(scorer, iid, reward, *observations):
    return PRMTurnResult(scorer, iid, 2.0, np.zeros(1, np.float32), reward, tuple(observations))


def test_names_weighting_and_trajectory_sum():
    ok = lambda iid, v: PRMMetricObservation("within budget/%", "turn", iid, v, "boolean", ("count", "rate"))
    results = [turn("judge", "a", 1.0, ok("a", True)), turn("judge", "b", 0.5, ok("b", False)),
               turn("len", "a", -1.0)]
    values = branch_stats(results).values()
    assert values["rollout/prm_turn_reward/judge"] == 0.75
    assert values["rollout/prm_trajectory_reward/judge"] == 1.5
    assert values["rollout/prm_trajectory_reward/len"] == -1.0
    assert values["rollout/prm_metric/turn/judge/within%20budget%2F%25/count"] == 1.0
    assert values["rollout/prm_metric/turn/judge/within%20budget%2F%25/rate"] == 0.5
    assert set(branch_stats(results, is_eval=True).values()) == {k.replace("rollout/", "eval-rollout/", 1)
                                                                  for k in values}


def test_quoting_keeps_the_safe_characters():
    assert quote_name("a-b_c.d:e f/g") == "a-b_c.d:e%20f%2Fg"


def test_cross_worker_reduction_weights_means_by_count_and_adds_sums():
    w1, w2 = MetricStats(), MetricStats()
    for v in (1.0, 1.0, 1.0):
        w1.add("rollout/x/mean", v, averaged=True)
    w2.add("rollout/x/mean", 0.0, averaged=True)
    w1.add("rollout/x/count", 3, averaged=False)
    w2.add("rollout/x/count", 1, averaged=False)
    values = reduce_workers([w1, w2]).values()
    # A plain mean of worker means would give 0.5; count-weighted gives 0.75.
    assert values == {"rollout/x/mean": 0.75, "rollout/x/count": 4.0}
    with pytest.raises(ValueError, match="averaged"):
        w1.add("rollout/x/mean", 1.0, averaged=False)


def test_float_observations_sum_and_mean():
    obs = lambda iid, v: PRMMetricObservation("latency", "turn", iid, v, "float", ("sum", "mean"))
    values = branch_stats([turn("j", "a", 0.0, obs("a", 2.0)), turn("j", "b", 0.0, obs("b", 4.0))]).values()
    assert values["rollout/prm_metric/turn/j/latency/sum"] == 6.0
    assert values["rollout/prm_metric/turn/j/latency/mean"] == 3.0


def test_recorder_flushes_runner_metrics():
    recorder = InMemoryRecorder()

    async def main():
        runner = PRMRunner(scorers=(LengthBudgetScorer(max_output_tokens=2, weight=0.5),))
        for out_len in (1, 5):
            cache = InteractionCache([Interaction("a", [1], [2] * out_len)])
            recorder.record(branch_stats(await runner.run(cache)))

    anyio.run(main)
    values = recorder.flush()
    assert values["rollout/prm_turn_reward/length_budget"] == 0.25  # weighted: (0.5 + 0) / 2
    assert values["rollout/prm_metric/turn/length_budget/within_budget/rate"] == 0.5  # unweighted
    assert values["rollout/prm_metric/turn/length_budget/within_budget/count"] == 1.0
    assert recorder.flush() == {}
