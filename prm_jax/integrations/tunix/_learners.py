"""``ProcessRewardGRPOLearner``: tunix's ``GRPOLearner`` with prm-jax's advantages (the package docstring
says where it hooks in), ``grpo_config`` and the scoring it shares with the agentic learner."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from prm_jax._validation import one_of
from prm_jax.config import AdvantageConfig
from prm_jax.integrations.tunix._layout import TESTED_TUNIX, Rollout, process_advantages, rollout_from_tunix
from prm_jax.kernels._normalization import NormConfig
from prm_jax.kernels._shaping import ShapingConfig
from prm_jax.runtime._arrays import ScoredArrays
from prm_jax.runtime._blocking import BlockingRunner


def grpo_config(shaping: ShapingConfig = ShapingConfig(), **overrides: Any) -> AdvantageConfig:
    """An ``AdvantageConfig`` that gives tunix's ``grpo`` advantages when there are no process rewards.

    tunix's estimator is ``(r - group mean) / (unbiased group std + 1e-6)`` of the outcome rewards, the same
    for every token: here the outcome reward is normalized the same way within each group
    (``reward_norm``), and GAE with ``discount = gae_lambda = 1`` and no values carries it to every trained
    token, with no KL reward (tunix puts its KL term in the loss, ``beta``). ``shaping`` says how process
    rewards reshape those advantages; ``overrides`` are other ``AdvantageConfig`` fields.
    """
    settings: dict[str, Any] = dict(kl_ctl=0.0, discount=1.0, gae_lambda=1.0, adv_norm=None,
                                    reward_norm=NormConfig("group", "group", std_unbiased=True, eps=1e-6),
                                    advantage_shaping=shaping)
    settings.update(overrides)
    return AdvantageConfig(**settings)


def default_ctx(prompts: Sequence[str], completions: Sequence[str]) -> list[Mapping[str, Any]]:
    """Each row's scorer context: ``{"prompt": text, "completion": text}`` (tunix's strings)."""
    return [{"prompt": p, "completion": c} for p, c in zip(prompts, completions)]


class _RecordsOutcomes:
    """What both learners hook in tunix's ``_compute_rewards``: each call's prompts, completions and rewards,
    recorded while ``_recording()`` is open (per thread: tunix's producer may run in one of its own)."""

    _step: threading.local

    def _compute_rewards(self, prompts: Any, completions: Any, mode: Any, *args: Any, **kwargs: Any) -> Any:
        rewards = super()._compute_rewards(prompts, completions, mode, *args, **kwargs)  # type: ignore[misc]
        outcomes = getattr(self._step, "outcomes", None)
        if outcomes is not None:
            outcomes.append((list(prompts), list(completions), np.asarray(rewards, np.float32)))
        return rewards

    @contextlib.contextmanager
    def _recording(self) -> Iterator[list[tuple[list[str], list[str], np.ndarray]]]:
        if not hasattr(self, "_step"):
            self._step = threading.local()
        outcomes: list[tuple[list[str], list[str], np.ndarray]] = []
        self._step.outcomes = outcomes
        try:
            yield outcomes
        finally:
            self._step.outcomes = None


def _scored(scorers: BlockingRunner, rollout: Rollout, ctx: Sequence[Mapping[str, Any]], on_error: str,
            what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(token_rewards [B, P + C], failed [B])``: the scorers' rewards of each row's turns, 0 on a row whose
    scoring failed (it trains on nothing); with ``on_error="raise"`` the first failure raises, naming the row
    (a ``what``: completion, trajectory)."""
    scored: ScoredArrays = scorers.score_arrays(  # type: ignore[assignment]  # on_error='mask'
        rollout.input_ids, rollout.turn_ids, attention_mask=rollout.attention_mask, ctx=list(ctx), on_error="mask")
    failed = np.asarray(scored.failed, bool)
    if on_error == "raise" and failed.any():
        row = int(np.argmax(failed))
        raise RuntimeError(f"scoring {what} {row} failed: {scored.errors[row]}")
    return np.where(failed[:, None], 0.0, scored.token_rewards).astype(np.float32), failed


def _reward_metrics(token_rewards: np.ndarray, loss_mask: np.ndarray, failed: np.ndarray) -> dict[str, Any]:
    """The metrics both learners log: failed rows, and the mean process reward on the trained tokens (a
    failed row's count as 0)."""
    return {"prm/failed_rows": (int(failed.sum()), np.sum),
            "prm/process_reward_mean": (float(np.mean(token_rewards[loss_mask])) if loss_mask.any() else 0.0,
                                        np.mean)}


def _learner_class() -> type:
    """``ProcessRewardGRPOLearner``, built on first use so that importing this module needs no tunix."""
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner

    class ProcessRewardGRPOLearner(_RecordsOutcomes, grpo_learner.GRPOLearner):
        """tunix's ``GRPOLearner`` whose advantages come from prm-jax: outcome plus process rewards.

        Args (beyond ``GRPOLearner``'s):
          scorers: a ``prm_jax.BlockingRunner`` (yours to open and close) whose scorers score each
            completion as one turn; its input is the prompt's tokens.
          advantage_config: how rewards become advantages; default ``grpo_config()`` (tunix's ``grpo``
            advantages plus additive process rewards).
          ctx: ``(prompts, completions) -> one mapping per row`` given to the scorers; default
            ``default_ctx`` (the texts).
          on_error: ``"mask"`` (default): a completion a scorer failed on is dropped from the loss (its
            ``completion_mask`` row is cleared; its outcome reward still counts in its group's statistics)
            and counted in the ``prm/failed_rows`` metric; ``"raise"``: the step raises.
        """

        def __init__(self, *args: Any, scorers: BlockingRunner, advantage_config: AdvantageConfig | None = None,
                     ctx: Callable[[Sequence[str], Sequence[str]], Sequence[Mapping[str, Any]]] = default_ctx,
                     on_error: str = "mask", **kwargs: Any):
            one_of("on_error", on_error, ("mask", "raise"))
            super().__init__(*args, **kwargs)
            self.scorers = scorers
            self.advantage_config = advantage_config or grpo_config()
            self.ctx = ctx
            self.on_error = on_error

        def _generate_and_compute_advantage(self, training_input: Any,
                                            mode: Any = rl_cluster_lib.Mode.TRAIN) -> Any:
            with self._recording() as outcomes:
                example = super()._generate_and_compute_advantage(training_input, mode)
            if len(outcomes) != 1:
                raise RuntimeError(
                    f"tunix's GRPOLearner called _compute_rewards {len(outcomes)} times in one "
                    f"_generate_and_compute_advantage (prm-jax's hook expects once; tested with tunix "
                    f"{TESTED_TUNIX}): the process-reward advantages would not match this step")
            prompts, completions, rewards = outcomes[0]
            rows = int(np.shape(example.completion_ids)[0])
            if np.shape(example.advantages) != (rows,) or rewards.shape != (rows,):
                raise RuntimeError(
                    f"tunix's GRPOLearner returned advantages of shape {np.shape(example.advantages)} and "
                    f"rewards of shape {rewards.shape} for {rows} completions (prm-jax's hook expects one "
                    f"each; tested with tunix {TESTED_TUNIX})")
            rollout = rollout_from_tunix(example.prompt_ids, example.prompt_mask, example.completion_ids,
                                         example.completion_mask)
            token_rewards, failed = _scored(self.scorers, rollout, self.ctx(prompts, completions), self.on_error,
                                            "completion")
            advantages, diagnostics = process_advantages(rollout, rewards, group_size=self.algo_config.num_generations,
                                                         config=self.advantage_config, token_rewards=token_rewards)
            self.rl_cluster.buffer_metrics({
                **_reward_metrics(token_rewards, rollout.loss_mask, failed),
                "prm/rows_off_trained_timesteps": (int(diagnostics["outcome/rows_off_trained_timesteps"]), np.sum),
            }, mode=mode)
            completion_mask = jnp.asarray(example.completion_mask) & jnp.asarray(~failed)[:, None]
            return example.replace(advantages=advantages.astype(jnp.float32), completion_mask=completion_mask)

    return ProcessRewardGRPOLearner
