import jax
import pytest

# Every test runs with the strictest promotion rules, so implicit rank or dtype promotion is a bug.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(autouse=True)
def _no_implicit_promotion():
    with jax.numpy_rank_promotion("raise"), jax.numpy_dtype_promotion("strict"):
        yield
