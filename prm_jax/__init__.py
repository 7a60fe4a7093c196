"""prm-jax: process rewards to shaped PPO/GRPO advantages, in JAX."""

from prm_jax.kernels import *  # noqa: F401,F403  (the list below is the public surface)
from prm_jax.kernels import __all__ as _kernel_names

__version__ = "0.1.0"
__all__ = list(_kernel_names)
