"""tunix's rollout arrays in prm-jax's layout and back (the package docstring has the layout), and the
advantages of a rollout."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

import jax.numpy as jnp
import numpy as np

from prm_jax._validation import integer_dtype, one_of
from prm_jax.config import AdvantageConfig
from prm_jax.kernels import compute_advantages
from prm_jax.runtime._trajectory import TOKEN_ID_RANGE, stray_token_id

TESTED_TUNIX = "0.1.7"  # keep equal to the pin of the `tunix` extra in pyproject.toml


@dataclasses.dataclass(frozen=True)
class Rollout:
    """A tunix rollout in prm-jax's layout: each row's prompt, then its completion, right-padded.

    Attributes:
      input_ids: ``[B, P + C]`` int32 tokens (0 after the completion, where nothing attends).
      attention_mask: ``[B, P + C]`` bool, from the first prompt token to the completion's last real token.
      loss_mask: ``[B, P + C]`` bool, tunix's ``completion_mask`` at the completion's positions.
      turn_ids: ``[B, P + C]`` int32, 0 on the completion up to its last real token (one turn, holes
        included, so a scorer sees the whole completion), -1 elsewhere; or, with ``turns="runs"``, ``k``
        on the ``k``-th run of trained tokens and -1 elsewhere.
      prompt_lengths: ``[B]`` int32, ``p_b``.
      completion_width: ``C``.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    loss_mask: np.ndarray
    turn_ids: np.ndarray
    prompt_lengths: np.ndarray
    completion_width: int

    def batch(self, rewards: Any, *, group_size: int, token_rewards: Any = None) -> dict[str, np.ndarray]:
        """``compute_advantages``' batch: these arrays (``turn_ids`` included: every stage that reads turns sees
        the rollout's, never runs of the loss mask), the outcome ``rewards [B]``, ``group_sizes`` for groups of
        ``group_size`` consecutive rows (tunix's ``num_generations``) and, when given, ``token_rewards [B, P + C]``."""
        rows = self.input_ids.shape[0]
        outcome = np.asarray(rewards, np.float32)
        if outcome.shape != (rows,):
            raise ValueError(f"rewards must have shape ({rows},) (one per completion), got {outcome.shape}")
        if group_size < 1 or rows % group_size:
            raise ValueError(f"group_size must divide the {rows} rows, got {group_size}")
        batch = dict(input_ids=self.input_ids, attention_mask=self.attention_mask, loss_mask=self.loss_mask,
                     turn_ids=self.turn_ids, logprobs=np.zeros(self.input_ids.shape, np.float32), rewards=outcome,
                     is_truncated=np.zeros(rows, bool), group_sizes=np.full(rows // group_size, group_size, np.int32))
        if token_rewards is not None:
            batch["token_rewards"] = np.asarray(token_rewards, np.float32)
        return batch

    def on_completion(self, timesteps: Any) -> jnp.ndarray:
        """``[B, C]`` from a ``[B, P + C]`` array on timesteps (advantages): completion token ``j`` of row ``b``
        gets timestep ``p_b + j - 1``, the one that predicts it."""
        steps = jnp.asarray(timesteps)
        if steps.shape != self.input_ids.shape:
            raise ValueError(f"timesteps must have the rollout's shape [B, P + C] = {self.input_ids.shape}, got "
                             f"{steps.shape}")
        index = self.prompt_lengths[:, None] - 1 + np.arange(self.completion_width)[None, :]
        return jnp.take_along_axis(steps, jnp.asarray(index), axis=1)


TurnLayout = Literal["completion", "runs"]


def rollout_from_tunix(prompt_ids: Any, prompt_mask: Any, completion_ids: Any, completion_mask: Any, *,
                       turns: TurnLayout = "completion") -> Rollout:
    """prm-jax's layout of tunix's rollout arrays (``TrainExample`` fields): see the module docstring.

    Args:
      prompt_ids: ``[B, P]`` int, left-padded prompts.
      prompt_mask: ``[B, P]`` bool, the prompts' real tokens (each prompt needs at least one).
      completion_ids: ``[B, C]`` int, right-padded completions.
      completion_mask: ``[B, C]`` bool, the completion tokens tunix trains.
      turns: ``"completion"``: the whole completion is turn 0 (``GRPOLearner``'s one completion);
        ``"runs"``: turn ``k`` is the ``k``-th run of trained tokens (the agentic learner's assistant
        turns, between the environment's tokens, which get -1).
    """
    prompts, completions = np.asarray(prompt_ids), np.asarray(completion_ids)
    prompt_real, trained = np.asarray(prompt_mask).astype(bool), np.asarray(completion_mask).astype(bool)
    for name, array, like in (("prompt_ids", prompts, None), ("completion_ids", completions, None),
                              ("prompt_mask", prompt_real, prompts), ("completion_mask", trained, completions)):
        if array.ndim != 2 or (like is not None and array.shape != like.shape):
            raise ValueError(f"{name} must be [B, {'P' if 'prompt' in name else 'C'}]"
                             f"{'' if like is None else ' like its ids'}, got shape {array.shape}")
    if prompts.shape[0] != completions.shape[0]:
        raise ValueError(f"prompt_ids has {prompts.shape[0]} rows and completion_ids {completions.shape[0]}")
    for name, ids in (("prompt_ids", prompts), ("completion_ids", completions)):
        integer_dtype(name, ids.dtype)
        bad = stray_token_id(ids)  # (int32 in the batch: never wrapped)
        if bad is not None:
            row = int(np.argwhere(ids == bad)[0][0])
            raise ValueError(f"{name} must hold token ids in {TOKEN_ID_RANGE}; row {row} holds {bad}")
    width_p = prompts.shape[1]
    width_c = completions.shape[1]
    # Left padding: a prompt starts at its first real token and runs to the last column (a pad id inside a
    # prompt stays a prompt token); a prompt whose last column is a pad is right-padded, and refused.
    leading_pads = np.where(prompt_real.any(axis=1), np.argmax(prompt_real, axis=1), width_p)
    lengths = (width_p - leading_pads).astype(np.int32)
    if (lengths == 0).any():
        raise ValueError(f"every prompt needs a token (its completion's first token is predicted from it); row "
                         f"{int(np.argmin(lengths))} has none")
    right_padded = ~prompt_real[:, -1]
    if right_padded.any():
        raise ValueError(f"prompt_mask must be left-padded (tunix's layout: pads first, then the prompt up to the last "
                         f"column); row {int(np.argmax(right_padded))} ends with a pad (right-padded)")
    # The completion's extent: up to its last trained token (a trailing pad is padding, an inner one a hole).
    extent = np.where(trained.any(axis=1), width_c - np.argmax(trained[:, ::-1], axis=1), 0)
    # Shift each row left by its leading pads: position t reads column t + pads of [prompt | completion].
    joined = np.concatenate([prompts, completions], axis=1)
    trained_joined = np.concatenate([np.zeros_like(prompt_real), trained], axis=1)
    positions = np.arange(width_p + width_c)[None, :]
    source = np.minimum(positions + leading_pads[:, None], width_p + width_c - 1)
    inside = positions < (lengths + width_c)[:, None]
    input_ids = np.where(inside, np.take_along_axis(joined, source, axis=1), 0).astype(np.int32)
    completion_part = (positions >= lengths[:, None]) & (positions < (lengths + extent)[:, None])
    loss_mask = inside & np.take_along_axis(trained_joined, source, axis=1)
    if turns == "runs":
        starts = loss_mask & ~np.pad(loss_mask, ((0, 0), (1, 0)))[:, :-1]
        turn_ids = np.where(loss_mask, np.cumsum(starts, axis=1) - 1, -1)
    else:
        one_of("turns", turns, get_args(TurnLayout))
        turn_ids = np.where(completion_part, 0, -1)
    return Rollout(
        input_ids=input_ids,
        attention_mask=positions < (lengths + extent)[:, None],
        loss_mask=loss_mask,
        turn_ids=turn_ids.astype(np.int32),
        prompt_lengths=lengths,
        completion_width=width_c)


def process_advantages(rollout: Rollout, rewards: Any, *, group_size: int, config: AdvantageConfig,
                       token_rewards: Any = None) -> tuple[jnp.ndarray, dict[str, Any]]:
    """tunix's ``[B, C]`` advantages from its outcome ``rewards [B]`` and prm-jax's ``token_rewards
    [B, P + C]`` (``None``: outcome only), and ``compute_advantages``' diagnostics."""
    output = compute_advantages(rollout.batch(rewards, group_size=group_size, token_rewards=token_rewards), config)
    return rollout.on_completion(output.advantages), output.diagnostics
