"""Process rewards in tunix's GRPO learner (``google-tunix``, tested with the version pinned by the
``tunix`` extra).

tunix's ``GRPOLearner`` gives each completion one reward and one advantage; its GRPO loss also takes a
``[B, C]`` advantage per completion token. (``ProcessRewardAgenticGRPOLearner`` does the same for tunix's
multi-turn agentic learner: see its docstring.) ``ProcessRewardGRPOLearner`` keeps everything of tunix's step
(sampling, reference and old log-probs, its reward functions, metrics, the loss) and replaces the
advantages: prm-jax's scorers score each completion, and ``compute_advantages`` turns tunix's outcome
rewards plus the process rewards into ``[B, C]`` advantages, which tunix's own loss then uses.

Where it hooks in, and why there: tunix's GRPO learner calls its advantage estimator with the ``[B]``
rewards and the group size only, so it cannot receive token rewards. The learner therefore overrides
``GRPOLearner._generate_and_compute_advantage`` (it calls tunix's own, then swaps the advantages in the
``TrainExample`` it returns) and ``_compute_rewards`` (to keep the outcome rewards tunix computed). Both
are private methods of tunix: if a tunix release stops calling ``_compute_rewards`` exactly once per
``_generate_and_compute_advantage``, or changes the example's layout, the step raises a ``RuntimeError``
saying so instead of training on something else.

The layout (tunix's rollout arrays -> prm-jax's batch, ``rollout_from_tunix``): tunix left-pads prompts
(``prompt_ids [B, P]``) and right-pads completions (``completion_ids [B, C]``, EOS stripped); a pad token
sampled inside a completion leaves a hole in ``completion_mask`` (not trained, still part of the
sequence). prm-jax's batch puts each row's prompt first and its completion right after, right-padded
(``[B, P + C]``), attends from the first prompt token to the completion's last real token, and trains
the tokens of ``completion_mask``. Completion token ``j`` of row ``b`` sits at position ``p_b + j``
(``p_b``: the prompt's length), and its advantage lives on the timestep before it, ``p_b + j - 1``: that
is what ``Rollout.on_completion`` reads back into tunix's ``[B, C]``.
"

The package: ``layout`` (the rollout's layout and its advantages), ``learners`` (the one-completion
learner), ``agentic`` (the agentic learner), ``losses`` and ``estimators`` (prm-jax's losses and advantage
estimators, registered in tunix by name). The learners are built on first access: they subclass tunix's
classes, so they need the ``tunix`` extra; nothing else here does.
"""

from __future__ import annotations

from typing import Any

from prm_jax.integrations.tunix._agentic import STEP_REWARDS_KEY, STEP_STATES_KEY, default_agentic_ctx
from prm_jax.integrations.tunix._estimators import (
    ESTIMATOR_NAME,
    GAE_ESTIMATOR_NAME,
    gae_advantages,
    group_norm_advantages,
    register_estimators,
)
from prm_jax.integrations.tunix._layout import TESTED_TUNIX, Rollout, TurnLayout, process_advantages, rollout_from_tunix
from prm_jax.integrations.tunix._learners import default_ctx, grpo_config
from prm_jax.integrations.tunix._losses import (
    LOSS_NAME,
    LOSS_PREFIX,
    register_loss,
    register_losses,
    tunix_policy_loss,
    tunix_ppo_loss,
)

__all__ = [
    "ESTIMATOR_NAME", "GAE_ESTIMATOR_NAME", "LOSS_NAME", "LOSS_PREFIX", "STEP_REWARDS_KEY", "STEP_STATES_KEY",
    "TESTED_TUNIX", "ProcessRewardAgenticGRPOLearner", "ProcessRewardGRPOLearner", "Rollout", "TurnLayout",
    "default_agentic_ctx", "default_ctx", "gae_advantages", "grpo_config", "group_norm_advantages",
    "process_advantages", "register_estimators", "register_loss", "register_losses", "rollout_from_tunix",
    "tunix_policy_loss", "tunix_ppo_loss",
]


def __getattr__(name: str) -> Any:
    """The learners, built on first access (each subclasses tunix's own)."""
    if name == "ProcessRewardGRPOLearner":
        from prm_jax.integrations.tunix._learners import _learner_class as build
    elif name == "ProcessRewardAgenticGRPOLearner":
        from prm_jax.integrations.tunix._agentic import _agentic_learner_class as build
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    learner = build()
    globals()[name] = learner
    return learner
