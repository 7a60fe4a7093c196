"""The example scorer: does each turn stay within an output-token budget?"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from prm_jax._validation import integer
from prm_jax.runtime._scoring import BaseScorer, PRMMetricObservation, PRMScorerResult
from prm_jax.runtime._settings import Settings, setting
from prm_jax.runtime._trajectory import Interaction


@dataclasses.dataclass(frozen=True, kw_only=True)
class LengthBudgetSettings(Settings):
    max_output_tokens: int = setting(128, doc="The budget: a turn with at most this many output tokens (>= 1) "
                                     "scores 1.0, a longer one 0.0.")

    def check(self) -> None:
        integer("max_output_tokens", self.max_output_tokens, minimum=1)


class LengthBudgetScorer(BaseScorer):
    """``1.0`` for a turn with at most ``max_output_tokens`` output tokens, else ``0.0``.

    Also reports the boolean turn observation ``within_budget`` (aggregated as count and rate).

    Example:
        >>> scorer = prm_jax.scorers.LengthBudgetScorer(max_output_tokens=3)
        >>> with prm_jax.BlockingRunner(scorers=[scorer]) as runner:
        ...     rewards = runner.score_arrays(np.array([[1, 2, 3, 0, 0], [1, 2, 3, 4, 5]]),
        ...                                   np.array([[-1, 0, 0, -1, -1], [-1, 0, 0, 0, 0]]))
        ...
        >>> rewards.tolist()
        [[0.0, 1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]]
    """

    name = "length_budget"
    settings_class = LengthBudgetSettings

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> float:
        return float(interaction.output_len <= self.settings.max_output_tokens)

    def prepare_result(self, interaction: Interaction, raw: Any, ctx: Mapping[str, Any]) -> PRMScorerResult:
        """The score with its ``within_budget`` observation.

        Args:
            raw: What ``evaluate`` returned: 1.0 or 0.0.
        """
        observation = PRMMetricObservation("within_budget", "turn", interaction.interaction_id, bool(raw == 1.0),
                                           "boolean", ("count", "rate"))
        return PRMScorerResult(raw, (observation,))
