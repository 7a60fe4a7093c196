"""The loss side of a PPO/GRPO step (``prm_jax.kernels._policy_loss``, ``prm_jax.kernels._verl_losses``):
``logprobs_on_timesteps`` gathers a policy's log-probs onto the timesteps ``compute_advantages`` works on;
``ppo_clip_loss`` is AReaL's clipped actor loss (dual clip, asymmetric clip, decoupled PPO, token- or
sequence-mean aggregation); ``gspo_loss``, ``geo_mean_loss``, ``dppo_tv_loss``, ``dppo_kl_loss``,
``clip_cov_loss``, ``kl_cov_loss``, ``gpg_loss``, ``dro_loss``, ``cispo_loss``, ``sapo_loss`` and
``vanilla_ppo_loss`` are verl's, with its five ``loss_agg_mode``s (``VERL_AGG_MODES``); ``gspo_sequence_loss``
is TRL's sequence-level GSPO (``TRL_LOSS_TYPES``); ``policy_loss(...,
mode=)`` picks one by verl's ``policy_loss.loss_mode`` name (``POLICY_LOSS_MODES``). Every loss that aggregates
by ``loss_agg_mode`` takes verl's global batch info (``dp_size``, ``batch_num_tokens``, ``global_batch_size``;
``global_batch_info`` computes them from a mini-batch's mask, ``GlobalBatch`` records them), so micro-batches
and data-parallel ranks give the mini-batch's loss. On-policy distillation: ``distillation_loss`` (AReaL's
capped surrogate on ``prm_jax.credit.distillation_rewards``) and ``supervised_distillation_loss`` (verl's
estimators)."""

from prm_jax.kernels._distillation import (
    DISTILLATION_ESTIMATORS,
    DistillationStats,
    distillation_loss,
    supervised_distillation_loss,
)
from prm_jax.kernels._policy_loss import (
    LOSS_AGG_MODES,
    GlobalBatch,
    PPOLossStats,
    global_batch_info,
    logprobs_on_timesteps,
    ppo_clip_loss,
)
from prm_jax.kernels._verl_losses import (
    POLICY_LOSS_MODES,
    TRL_LOSS_TYPES,
    VERL_AGG_MODES,
    PolicyLossStats,
    SequenceClipStats,
    cispo_loss,
    clip_cov_loss,
    dppo_kl_loss,
    dppo_tv_loss,
    dro_loss,
    geo_mean_loss,
    gpg_loss,
    gspo_loss,
    gspo_sequence_loss,
    kl_cov_loss,
    policy_loss,
    policy_loss_options,
    sapo_loss,
    vanilla_ppo_loss,
)

__all__ = ["LOSS_AGG_MODES", "GlobalBatch", "PPOLossStats", "global_batch_info", "logprobs_on_timesteps",
           "ppo_clip_loss", "VERL_AGG_MODES", "PolicyLossStats", "gspo_loss", "geo_mean_loss", "dppo_tv_loss",
           "dppo_kl_loss", "clip_cov_loss", "kl_cov_loss", "gpg_loss", "dro_loss", "cispo_loss", "sapo_loss",
           "vanilla_ppo_loss", "policy_loss", "policy_loss_options", "POLICY_LOSS_MODES", "gspo_sequence_loss",
           "TRL_LOSS_TYPES", "SequenceClipStats", "DISTILLATION_ESTIMATORS", "DistillationStats", "distillation_loss",
           "supervised_distillation_loss"]
