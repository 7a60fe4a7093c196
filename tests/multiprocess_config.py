"""The batch and config shared by the multi-process test and its workers."""

from prm_jax import AdvantageConfig, NormConfig

ROWS, WIDTH, SEED = 16, 32, 123
CONFIG = AdvantageConfig(discount=0.95, gae_lambda=0.9, reward_norm=NormConfig("group", "group", group_size=4),
                         adv_norm=NormConfig("batch", "batch"))
