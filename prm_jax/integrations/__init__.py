"""prm-jax inside other trainers: ``prm_jax.integrations.tunix`` (tunix's GRPO learner).

Each integration imports its trainer only when its learner is first used, so importing the module (and its
array conversions) needs nothing beyond prm-jax.
"""
