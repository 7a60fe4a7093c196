"""The promotion rules tunix's own code runs under, for the tests that run it (``from tunix_rules import
tunix_promotion_rules``: an autouse fixture of the importing module)."""

import jax
import pytest


@pytest.fixture(autouse=True)
def tunix_promotion_rules():
    # tunix's sampler relies on standard promotion, and runs in a thread: the suite's strict rules are
    # relaxed globally (not only for this thread) while a tunix test runs, then restored.
    saved = jax.config.jax_numpy_dtype_promotion, jax.config.jax_numpy_rank_promotion
    jax.config.update("jax_numpy_dtype_promotion", "standard")
    jax.config.update("jax_numpy_rank_promotion", "allow")
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        yield
    jax.config.update("jax_numpy_dtype_promotion", saved[0])
    jax.config.update("jax_numpy_rank_promotion", saved[1])
