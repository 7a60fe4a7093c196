"""Built-in scorers."""

from prm_jax.scorers.http_judge import HTTPJudgeScorer
from prm_jax.scorers.length_budget import LengthBudgetScorer

__all__ = ["HTTPJudgeScorer", "LengthBudgetScorer"]
