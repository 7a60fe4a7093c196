"""The test process's mappings stay under the kernel's limit (tests/memory_maps.py): the cause of the workers
that XLA:CPU's compiler crashed in the main suite (a core held 65,531 mappings, ``vm.max_map_count`` 65,530:
21,360 triplets of a code page, a read-only page and three data pages, one per compiled module)."""

import jax
import jax.numpy as jnp
import memory_maps
import pytest

pytestmark = pytest.mark.skipif(memory_maps.in_use() is None or memory_maps.limit() is None,
                                reason="the system does not report memory mappings (/proc)")

PROGRAMS = 30


def compiled_programs(count: int) -> list:
    """``count`` jitted functions, each compiled once and kept (as a module's jitted functions are: their
    caches hold the compiled programs)."""
    x = jnp.ones((8, 16), jnp.float32)
    kept = []
    for i in range(count):
        kept.append(jax.jit(lambda a, i=i: jnp.cumsum(a * i, axis=1).sum(axis=0) + jnp.max(a)))
        jax.block_until_ready(kept[-1](x))
    return kept


def test_compiled_programs_hold_mappings_until_relieve_drops_the_caches():
    jax.clear_caches()
    before = memory_maps.in_use()
    kept = compiled_programs(PROGRAMS)
    grown = memory_maps.in_use() - before
    assert grown >= 3 * PROGRAMS  # a code, a read-only and a data mapping at least (12 a program on jax 0.10)
    assert memory_maps.relieve(share=0.0)  # over any share: the caches are dropped
    assert all(f._cache_size() == 0 for f in kept)
    assert memory_maps.in_use() - before < grown / 4  # and the programs unmapped, though the functions live


def test_relieve_keeps_the_caches_under_its_share():
    kept = compiled_programs(2)
    cached = memory_maps.in_use()
    assert not memory_maps.relieve(share=1.0)  # a process over its whole limit could not have compiled these
    assert all(f._cache_size() == 1 for f in kept)
    assert memory_maps.in_use() >= cached
