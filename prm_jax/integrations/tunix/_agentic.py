"""``ProcessRewardAgenticGRPOLearner``: tunix's multi-turn agentic learner with prm-jax's advantages, and
the trajectory engine that records the environment's per-step rewards."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, get_args

import jax.numpy as jnp
import numpy as np

from prm_jax._validation import one_of
from prm_jax.config import AdvantageConfig
from prm_jax.integrations.tunix._layout import TESTED_TUNIX, Rollout, rollout_from_tunix
from prm_jax.integrations.tunix._learners import _RecordsOutcomes, _reward_metrics, _scored, grpo_config
from prm_jax.kernels import compute_advantages
from prm_jax.kernels._gigpo import GiGPOConfig
from prm_jax.runtime._blocking import BlockingRunner

# tunix's agentic learner: the environment's per-step rewards, which its "Token" trajectories leave out, are
# recorded by the trajectory engine below under these keys (one entry per step with assistant tokens).
STEP_REWARDS_KEY = "prm_jax_step_rewards"
STEP_STATES_KEY = "prm_jax_step_states"  # the observation each step answered ("" for the first: the task's)
EnvRewards = Literal["none", "process", "gigpo"]


def default_agentic_ctx(trajectory: Mapping[str, Any]) -> Mapping[str, Any]:
    """A trajectory's scorer context: ``{"conversation": its messages}`` (tunix's ``conversation_text``;
    ``ctx["messages"]`` is the runner's own, the turn's messages)."""
    return {"conversation": list(trajectory.get("conversation_text") or [])}


def _step_engine_class(base: type) -> type:
    """tunix's trajectory engine ``base`` whose ``"Token"`` trajectories also carry each step's environment
    reward (``STEP_REWARDS_KEY``) and the observation it answered (``STEP_STATES_KEY``)."""

    class StepRewardEngine(base):
        async def collect(self, mode: str = "Conversation") -> Any:
            result = await super().collect(mode)
            if mode == "Token" and isinstance(result, dict):
                steps = list(self.agent.trajectory.steps)
                taken = [k for k, step in enumerate(steps)
                         if getattr(step, "assistant_tokens", None) is not None and len(step.assistant_tokens) > 0]
                result[STEP_REWARDS_KEY] = [float(steps[k].reward or 0.0) for k in taken]
                result[STEP_STATES_KEY] = ["" if k == 0 else repr(steps[k - 1].observation) for k in taken]
            return result

    StepRewardEngine.__name__ = f"StepReward{base.__name__}"
    return StepRewardEngine


def _state_ids(states: Sequence[Sequence[str]], turns: int) -> np.ndarray:
    """``[B, turns]`` int64 anchor ids: equal observations get equal ids (-1 past a row's steps)."""
    index: dict[str, int] = {}
    out = np.full((len(states), turns), -1, np.int64)
    for row, row_states in enumerate(states):
        for k, state in enumerate(row_states[:turns]):
            out[row, k] = index.setdefault(state, len(index))
    return out


def _agentic_learner_class() -> type:
    """``ProcessRewardAgenticGRPOLearner``, built on first use (importing this module needs no tunix)."""
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.agentic import agentic_grpo_learner
    from tunix.rl.agentic import utils as agentic_utils

    class ProcessRewardAgenticGRPOLearner(_RecordsOutcomes, agentic_grpo_learner.GRPOLearner):
        """tunix's agentic ``GRPOLearner`` whose advantages come from prm-jax: ``[B, C]`` per token.

        The turns are the runs of each trajectory's ``conversation_masks`` (its assistant tokens; the
        environment's tokens are not trained and get no reward); the outcome is the reward tunix computed
        for the trajectory (its ``_compute_rewards``); process rewards come from ``scorers`` (each row's turns,
        ``ctx(trajectory)`` as its context) and, with ``env_rewards``, from the environment's own reward of each
        step: ``"process"`` adds it to the turn's process reward (on every token of the turn), ``"gigpo"``
        gives it to GiGPO as the turn's step reward, with the observation the step answered as its anchor
        state (``advantage_config`` must then name ``credit_assignment: gigpo``).

        Args (beyond tunix's ``GRPOLearner``'s):
          scorers: a ``prm_jax.BlockingRunner`` (yours to open and close), or None (no scorer).
          advantage_config: how rewards become advantages; default ``grpo_config()`` (tunix's ``grpo``
            advantages when no process reward is given, plus additive process rewards).
          env_rewards: ``"none"`` (default), ``"process"`` or ``"gigpo"`` (above).
          ctx: ``trajectory dict -> mapping`` given to the scorers; default ``default_agentic_ctx``.
          on_error: ``"mask"`` (default): a trajectory a scorer failed on is dropped from the loss (its
            outcome still counts in its group's statistics) and counted in ``prm/failed_rows``; ``"raise"``.

        Hooks: ``_process_results`` (tunix's own runs first; its ``[G]`` advantages are replaced) and
        ``_compute_rewards`` (to keep the outcome it computed); with ``env_rewards``, the orchestrator's
        trajectory engine. All private to tunix: where a release stops calling them as 0.1.7 does, the step
        raises a ``RuntimeError`` saying so instead of training on something else.
        """

        def __init__(self, *args: Any, scorers: BlockingRunner | None = None,
                     advantage_config: AdvantageConfig | None = None, env_rewards: EnvRewards = "none",
                     ctx: Callable[[Mapping[str, Any]], Mapping[str, Any]] = default_agentic_ctx,
                     on_error: str = "mask", **kwargs: Any):
            one_of("on_error", on_error, ("mask", "raise"))
            one_of("env_rewards", env_rewards, get_args(EnvRewards))
            config = advantage_config or grpo_config()
            if (env_rewards == "gigpo") != isinstance(config.plan.estimator, GiGPOConfig):
                raise ValueError("env_rewards='gigpo' and advantage_config's credit_assignment: gigpo go together "
                                 f"(got env_rewards={env_rewards!r} and estimator "
                                 f"{type(config.plan.estimator).__name__})")
            super().__init__(*args, **kwargs)
            self.scorers, self.advantage_config, self.env_rewards = scorers, config, env_rewards
            self.ctx, self.on_error = ctx, on_error

        def _build_orchestrator(self) -> Any:
            orchestrator = super()._build_orchestrator()
            if self.env_rewards != "none":
                if not isinstance(getattr(orchestrator, "engine_cls", None), type):
                    raise RuntimeError(f"tunix's RolloutOrchestrator has no engine_cls (prm-jax records the "
                                       f"environment's step rewards there; tested with tunix {TESTED_TUNIX})")
                orchestrator.engine_cls = _step_engine_class(orchestrator.engine_cls)
            return orchestrator

        def _process_results(self, trajectories: list[Any], mode: Any = rl_cluster_lib.Mode.TRAIN,
                             expected_step: int | None = None) -> list[Any]:
            with self._recording() as outcomes:
                examples = super()._process_results(trajectories, mode=mode, expected_step=expected_step)
            rows = len(trajectories)
            if len(outcomes) != 1 or len(examples) != 1 or outcomes[0][2].shape != (rows,) \
                    or np.shape(examples[0].advantages) != (rows,):
                raise RuntimeError(
                    f"tunix's agentic GRPOLearner computed rewards {len(outcomes)} times and returned "
                    f"{len(examples)} examples for a group of {rows} (prm-jax's hook expects one each, one "
                    f"reward and one advantage per trajectory; tested with tunix {TESTED_TUNIX})")
            example = examples[0]
            width = int(np.shape(example.completion_ids)[1])
            trained = np.stack([agentic_utils.right_pad(item.traj.get("conversation_masks"), width, 0)[:width]
                                for item in trajectories]).astype(bool)  # (before tunix's degenerate masking)
            rollout = rollout_from_tunix(example.prompt_ids, example.prompt_mask, example.completion_ids, trained,
                                         turns="runs")
            advantages, failed, metrics = self._advantages(rollout, outcomes[0][2], [item.traj for item in trajectories])
            completion_mask = trained & ~failed[:, None]
            if self.algo_config.degenerate_group_masking and np.allclose(np.asarray(advantages)[trained], 0.0):
                completion_mask = np.zeros_like(completion_mask)
            self.rl_cluster.buffer_metrics_async(metrics, mode=mode, step=expected_step)
            return [example.replace(advantages=advantages.astype(jnp.float32),
                                    completion_mask=jnp.asarray(completion_mask, jnp.asarray(example.completion_mask).dtype))]

        def _advantages(self, rollout: Rollout, outcome: np.ndarray,
                        trajectories: Sequence[Mapping[str, Any]]) -> tuple[jnp.ndarray, np.ndarray, dict[str, Any]]:
            rows = rollout.input_ids.shape[0]
            turns = rollout.turn_ids.max(axis=1) + 1  # [B] assistant turns of each row
            token_rewards = np.zeros(rollout.input_ids.shape, np.float32)
            failed = np.zeros(rows, bool)
            if self.scorers is not None:
                token_rewards, failed = _scored(self.scorers, rollout, [self.ctx(t) for t in trajectories],
                                                self.on_error, "trajectory")
            extra: dict[str, np.ndarray] = {}
            if self.env_rewards != "none":
                width = max(int(turns.max(initial=0)), 1)
                steps = np.zeros((rows, width), np.float32)
                for row, (trajectory, row_turns) in enumerate(zip(trajectories, turns.tolist())):
                    recorded = trajectory.get(STEP_REWARDS_KEY)
                    if row_turns == 0:
                        continue  # nothing trained (tunix masked the trajectory out): nothing to place
                    if recorded is None or len(recorded) != row_turns:
                        raise RuntimeError(
                            f"trajectory {row} has {row_turns} assistant turns in its conversation_masks and "
                            f"{'no' if recorded is None else len(recorded)} recorded step rewards (env_rewards="
                            f"{self.env_rewards!r} records them in the learner's trajectory engine; tested with "
                            f"tunix {TESTED_TUNIX})")
                    steps[row, :row_turns] = recorded
                if self.env_rewards == "process":
                    on_turn = np.take_along_axis(steps, np.maximum(rollout.turn_ids, 0), axis=1)
                    token_rewards = token_rewards + np.where(rollout.turn_ids >= 0, on_turn, 0.0).astype(np.float32)
                else:
                    extra = {"turn_rewards": steps,
                             "turn_reward_mask": np.arange(width)[None, :] < turns[:, None],
                             "anchor_ids": _state_ids([t.get(STEP_STATES_KEY, []) for t in trajectories], width)}
            batch = rollout.batch(outcome, group_size=rows, token_rewards=token_rewards if (
                self.scorers is not None or self.env_rewards == "process") else None)
            batch.update(extra)
            output = compute_advantages(batch, self.advantage_config)
            metrics = {**_reward_metrics(token_rewards, rollout.loss_mask, failed),
                       "prm/turns_mean": (float(np.mean(turns)), np.mean)}
            return rollout.on_completion(output.advantages), failed, metrics

    return ProcessRewardAgenticGRPOLearner
