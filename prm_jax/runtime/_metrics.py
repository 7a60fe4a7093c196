"""Scoring metrics: names, weighting, and reduction across workers.

Names live under ``rollout/`` (or ``eval-rollout/`` for evaluation):

  prm_turn_reward/<scorer>                              per turn: mean over its tokens of weight * raw
  prm_trajectory_reward/<scorer>                        per branch: sum of its turn metrics
  prm_metric/<scope>/<scorer>/<metric>/<aggregation>    structured observations, unweighted

Scorer and metric are URL-quoted in ``prm_metric`` names (``-_.:`` kept). Every metric is a running
``(total, count)``: ``mean`` and ``rate`` report ``total / count``, ``sum`` and ``count`` report ``total``.
Merging two workers adds totals and counts, so means and rates are weighted by observation counts while
sums and counts add up. A boolean ``count`` is the number of true observations.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import Protocol
from urllib.parse import quote

from prm_jax.runtime._scoring import PRMTurnResult

AVERAGED = ("mean", "rate")


def namespace(is_eval: bool) -> str:
    return "eval-rollout" if is_eval else "rollout"


@functools.lru_cache(maxsize=4096)  # a run quotes the same few scorer and metric names for every turn
def quote_name(name: str) -> str:
    return quote(name, safe="-_.:")


@dataclasses.dataclass
class Metric:
    total: float = 0.0
    count: int = 0
    averaged: bool = True

    @property
    def value(self) -> float:
        if not self.averaged:
            return self.total
        return self.total / self.count if self.count else 0.0


class MetricStats:
    """Named running metrics that merge exactly across workers.

    Example:
        >>> stats = prm_jax.runtime.MetricStats()
        >>> stats.add("prm/reward", 1.0, averaged=True)
        >>> stats.add("prm/reward", 0.0, averaged=True)
        >>> stats.add("prm/turns", 3.0, averaged=False)
        >>> stats.values()
        {'prm/reward': 0.5, 'prm/turns': 3.0}
    """

    def __init__(self):
        self.metrics: dict[str, Metric] = {}

    def add(self, name: str, value: float, *, averaged: bool, count: int = 1) -> None:
        """Adds ``count`` observations totalling ``value`` to the metric ``name``.

        Args:
            name: The metric's name.
            value: The observations' total.
            averaged: Whether the metric is a mean (its total divided by its count) or a sum; a metric is
                always one or the other.
            count: How many observations ``value`` totals, >= 1.
        """
        metric = self.metrics.setdefault(name, Metric(averaged=averaged))
        if metric.averaged != averaged:
            raise ValueError(f"metric {name!r} is recorded both as averaged and as summed")
        metric.total += float(value)
        metric.count += count

    def merge(self, other: MetricStats) -> MetricStats:
        """Adds another's metrics into this one (count-weighted); returns this one.

        Args:
            other: The stats to add.
        """
        for name, metric in other.metrics.items():
            self.add(name, metric.total, averaged=metric.averaged, count=metric.count)
        return self

    def values(self) -> dict[str, float]:
        """Each metric's value (a mean or a sum), by name."""
        return {name: metric.value for name, metric in sorted(self.metrics.items())}

    def __len__(self) -> int:
        return len(self.metrics)


def trajectory_rewards(results: Iterable[PRMTurnResult]) -> dict[str, float]:
    """Per scorer, the sum of one branch's turn metrics (``prm_trajectory_reward``)."""
    totals: dict[str, float] = {}
    for result in results:
        totals[result.scorer] = totals.get(result.scorer, 0.0) + result.reward
    return totals


def branch_stats(results: Iterable[PRMTurnResult], *, is_eval: bool = False) -> MetricStats:
    """The metrics of one scored branch (the list ``PRMRunner.run`` returned).

    Args:
        results: The branch's per-turn results (what ``PRMRunner.run`` returned).

    Example:
        >>> with prm_jax.BlockingRunner(scorers=[prm_jax.scorers.LengthBudgetScorer(max_output_tokens=2)]) as runner:
        ...     results = runner.run([prm_jax.Interaction("t0", [1], [2, 3])])
        ...
        >>> stats = prm_jax.runtime.branch_stats(results).values()
        >>> stats["rollout/prm_metric/turn/length_budget/within_budget/rate"]
        1.0
    """
    ns = namespace(is_eval)
    stats = MetricStats()
    results = list(results)
    for result in results:
        stats.add(f"{ns}/prm_turn_reward/{result.scorer}", result.reward, averaged=True)
        for obs in result.observations:
            base = f"{ns}/prm_metric/{obs.scope}/{quote_name(result.scorer)}/{quote_name(obs.metric_id)}"
            for aggregation in obs.aggregations:
                value = float(obs.value)
                stats.add(f"{base}/{aggregation}", value, averaged=aggregation in AVERAGED)
    for scorer, total in trajectory_rewards(results).items():
        stats.add(f"{ns}/prm_trajectory_reward/{scorer}", total, averaged=True)
    return stats


def reduce_workers(per_worker: Iterable[MetricStats]) -> MetricStats:
    """Cross-worker reduction: count-weighted means and rates, added sums and counts.

    Args:
        per_worker: Each worker's ``MetricStats``.

    Example:
        >>> a, b = prm_jax.runtime.MetricStats(), prm_jax.runtime.MetricStats()
        >>> a.add("prm/reward", 1.0, averaged=True)
        >>> b.add("prm/reward", 0.0, averaged=True, count=3)
        >>> prm_jax.runtime.reduce_workers([a, b]).values()
        {'prm/reward': 0.25}
    """
    total = MetricStats()
    for stats in per_worker:
        total.merge(stats)
    return total


class MetricRecorder(Protocol):
    """Where a trainer's PRM metrics go: anything with ``record(stats)`` (``InMemoryRecorder`` keeps them).

    Example:
        >>> class Printer:
        ...     def record(self, stats):
        ...         print(stats.values())
        ...
        >>> printer: prm_jax.runtime.MetricRecorder = Printer()
        >>> stats = prm_jax.runtime.MetricStats()
        >>> stats.add("prm/calls", 2.0, averaged=False)
        >>> printer.record(stats)
        {'prm/calls': 2.0}
    """

    def record(self, stats: MetricStats) -> None:
        """Records one group's (or branch's) metrics.

        Args:
            stats: The metrics to record.
        """


class InMemoryRecorder:
    """Accumulates stats until a trainer flushes them to its own logger.

    Example:
        >>> recorder = prm_jax.runtime.InMemoryRecorder()
        >>> stats = prm_jax.runtime.MetricStats()
        >>> stats.add("prm/length_budget/reward", 1.0, averaged=True)
        >>> recorder.record(stats)
        >>> recorder.flush()
        {'prm/length_budget/reward': 1.0}
    """

    def __init__(self):
        self._stats = MetricStats()

    def record(self, stats: MetricStats) -> None:
        """Adds them to what was recorded since the last flush.

        Args:
            stats: The metrics to record.
        """
        self._stats.merge(stats)

    def peek(self) -> dict[str, float]:
        return self._stats.values()

    def flush(self) -> dict[str, float]:
        values, self._stats = self._stats.values(), MetricStats()
        return values
