"""The loss side of a PPO/GRPO step (``prm_jax.kernels.policy_loss``): ``logprobs_on_timesteps`` gathers a
policy's log-probs onto the timesteps ``compute_advantages`` works on; ``ppo_clip_loss`` is AReaL's clipped
actor loss (dual clip, asymmetric clip, decoupled PPO, token- or sequence-mean aggregation)."""

from prm_jax.kernels.policy_loss import LOSS_AGG_MODES, PPOLossStats, logprobs_on_timesteps, ppo_clip_loss

__all__ = ["LOSS_AGG_MODES", "PPOLossStats", "logprobs_on_timesteps", "ppo_clip_loss"]
