"""The tests' plug-in estimators, registered as a user registers one: importing this module registers them
(``tests/conftest.py`` does, so the option matrix and the strategy tests, which run every registered
estimator, run these too). ``without_plugins()`` lifts them for a test of the built-in surface (the guide's
table of refused pairs documents the built-in estimators)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rloo_estimator import RLOO

from prm_jax.estimators import register_estimator, registered, unregister_estimator

PLUGINS = (RLOO,)
for _spec in PLUGINS:
    if _spec not in registered():
        register_estimator(_spec)


@contextlib.contextmanager
def without_plugins() -> Iterator[None]:
    for spec in PLUGINS:
        unregister_estimator(spec)
    try:
        yield
    finally:
        for spec in PLUGINS:
            register_estimator(spec)
