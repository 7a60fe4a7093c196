"""Issue 31.10: ``prm_jax.runtime._context.ScorerContext`` (the read-only ``ctx`` scorers get) on its own."""

import pickle

import pytest

from prm_jax import Interaction
from prm_jax.runtime._context import ScorerContext

LEAF = Interaction("leaf", [1], [2], messages=[{"role": "user", "content": "q"}],
                   output_messages=[{"role": "assistant", "content": "a"}])


def test_the_callers_entries_are_frozen_and_the_runner_adds_is_eval_and_messages():
    ctx = ScorerContext({"task": {"id": [1, 2]}, "messages": "ignored"}, LEAF, True)
    assert ctx["task"]["id"] == (1, 2) and ctx["is_eval"] is True
    with pytest.raises(TypeError):
        ctx["task"]["id2"] = 3
    assert [m["content"] for m in ctx["messages"]] == ["q", "a"]  # the leaf's conversation, not the caller's
    assert sorted(ctx) == ["is_eval", "messages", "task"] and len(ctx) == 3


def test_messages_are_built_on_first_read_only():
    ctx = ScorerContext(None, LEAF, False)
    assert "messages" not in ctx._items  # most scorers never read it
    assert len(ctx) == 2 and ctx["is_eval"] is False
    assert ctx["messages"]
    assert "messages" in ctx._items and len(ctx) == 2


def test_a_context_pickles_for_a_worker_process_as_what_it_reads():
    ctx = ScorerContext({"row": 3, "tags": ["x"]}, LEAF, False)
    again = pickle.loads(pickle.dumps(ctx))
    assert dict(again) == dict(ctx)
