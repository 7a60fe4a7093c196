"""Built-in scorers: judges on the protocols serving stacks speak (the ``judge`` extra, httpx), a math
answer checker (the ``verify`` extra, math-verify), the agent's code run against tests in a sandbox (local
bubblewrap, or a SandboxFusion server), a length budget, and on-policy distillation's teachers (served by
vLLM or SGLang, or a JAX model on the trainer's device)."""

# (ModelScorer's code is the runtime's: score_arrays has a path for it)
from prm_jax.runtime._model_scorer import ModelScorer, TeacherModelScorer, token_logprobs
from prm_jax.scorers._classify_prm import ClassifyPRMScorer
from prm_jax.scorers._code_execution import CodeExecutionScorer
from prm_jax.scorers._http import ServedScorer, ServedSettings, Transport, transport_setting
from prm_jax.scorers._http_judge import HTTPJudgeScorer
from prm_jax.scorers._length_budget import LengthBudgetScorer
from prm_jax.scorers._math_verifier import MathVerifyScorer
from prm_jax.scorers._openai_judge import OpenAIJudgeScorer
from prm_jax.scorers._pooling_prm import PoolingPRMScorer
from prm_jax.scorers._teacher import TeacherLogprobScorer
from prm_jax.scorers._tei_classifier import TEIClassifierScorer

__all__ = ["ClassifyPRMScorer", "CodeExecutionScorer", "HTTPJudgeScorer", "LengthBudgetScorer", "MathVerifyScorer",
           "ModelScorer", "OpenAIJudgeScorer", "PoolingPRMScorer", "ServedScorer", "ServedSettings",
           "TEIClassifierScorer", "TeacherLogprobScorer", "TeacherModelScorer", "Transport", "token_logprobs",
           "transport_setting"]
