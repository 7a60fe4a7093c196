import numpy as np
import pytest

from prm_jax import Interaction, InteractionCache
from prm_jax.kernels import turn_ids_from_spans
from prm_jax.runtime._trajectory import concat_spans, turn_spans


def parent_child(parent_rewards=(0.5, 0.0), child_rewards=(0.0, -1.0), **child):
    parent = Interaction("p", [1, 2], [3, 4], output_logprobs=[-0.1, -0.2],
                         token_rewards=None if parent_rewards is None else list(parent_rewards))
    child = Interaction("c", [1, 2, 3, 4, 5], [6, 7], parent_id="p", output_logprobs=[-0.3, -0.4],
                        token_rewards=None if child_rewards is None else list(child_rewards), **child)
    return InteractionCache([parent, child])


def test_spec_concat_example():
    seq = parent_child().to_sequence("c")
    np.testing.assert_array_equal(seq.input_ids, [1, 2, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(seq.token_rewards, [0, 0, 0.5, 0, 0, 0, -1])
    np.testing.assert_array_equal(seq.loss_mask, [0, 0, 1, 1, 0, 1, 1])
    np.testing.assert_array_equal(seq.turn_ids, [-1, -1, 0, 0, -1, 1, 1])
    np.testing.assert_allclose(seq.logprobs, [0, 0, -0.1, -0.2, 0, -0.3, -0.4])
    assert seq.interaction_ids == ("p", "c")


def test_token_rewards_key_absent_or_zero_filled():
    assert parent_child(None, None).to_sequence("c").token_rewards is None
    assert "token_rewards" not in parent_child(None, None).to_sequence("c").as_dict()
    seq = parent_child(None, (1.0, 2.0)).to_sequence("c")
    np.testing.assert_array_equal(seq.token_rewards, [0, 0, 0, 0, 0, 1, 2])


def test_truncation_from_stop_reason():
    assert parent_child(stop_reason="length").to_sequence("c").is_truncated
    assert not parent_child().to_sequence("c").is_truncated


def test_child_must_extend_parent():
    cache = InteractionCache([Interaction("p", [1, 2], [3, 4]), Interaction("c", [1, 2, 9], [6], parent_id="p")])
    with pytest.raises(ValueError, match="must start with its parent"):
        cache.to_sequence("c")


@pytest.mark.parametrize("kwargs,match", [
    (dict(token_rewards=[1.0]), "token_rewards must have shape"),
    (dict(output_logprobs=[1.0, 2.0, 3.0]), "output_logprobs must have shape"),
    (dict(stop_reason="eos"), "stop_reason"),
    (dict(reward=float("nan")), "reward"),
])
def test_interaction_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Interaction("x", [1], [2, 3], **kwargs)


def test_message_only_interaction_cannot_be_exported():
    cache = InteractionCache([Interaction("m", None, None, messages=[{"role": "user", "content": "hi"}])])
    with pytest.raises(ValueError, match="token-backed"):
        cache.to_sequence("m")


def test_cycles_and_missing_parents():
    cache = InteractionCache([Interaction("a", [1], [2], parent_id="b"), Interaction("b", [1], [2], parent_id="a")])
    with pytest.raises(ValueError, match="cycle"):
        cache.branches()
    with pytest.raises(ValueError, match="cycle"):
        cache.chain("a")
    orphan = InteractionCache([Interaction("a", [1], [2], parent_id="ghost")])
    with pytest.raises(ValueError, match="not in the session"):
        orphan.branches()
    with pytest.raises(ValueError, match="already"):
        InteractionCache([Interaction("a", [1], [2]), Interaction("a", [1], [2])])


def test_branches_are_root_to_leaf():
    cache = InteractionCache([
        Interaction("r", [1], [2]),
        Interaction("x", [1, 2, 3], [4], parent_id="r"),
        Interaction("y", [1, 2, 5], [6], parent_id="r"),
        Interaction("z", [1, 2, 3, 4, 7], [8], parent_id="x"),
    ])
    assert [[i.interaction_id for i in b] for b in cache.branches()] == [["r", "y"], ["r", "x", "z"]]


def test_clone_chain_is_deep():
    cache = parent_child()
    clone = cache.clone_chain("c")
    clone.get("p").token_rewards[0] = 99.0
    clone.get("p").reward = 3.0
    assert cache.get("p").token_rewards[0] == 0.5 and cache.get("p").reward is None
    assert [i.interaction_id for i in clone] == ["p", "c"]


def test_readonly_view_cannot_mutate_anything_stored():
    cache = InteractionCache([Interaction("a", [1, 2], [3], messages=[{"role": "user", "content": "hi",
                                                                      "meta": {"k": [1]}}])])
    view = cache.get("a").readonly()
    with pytest.raises(AttributeError):
        view.reward = 1.0
    with pytest.raises(ValueError):
        view.output_tokens[0] = 7
    with pytest.raises(TypeError):
        view.messages[0]["content"] = "bye"
    with pytest.raises(TypeError):
        view.messages[0]["meta"]["k"] += (2,)
    stored = cache.get("a")
    assert stored.output_tokens[0] == 3 and stored.messages[0]["content"] == "hi"
    assert stored.messages[0]["meta"] == {"k": [1]}


def test_frozen_messages_are_built_on_first_read_and_follow_a_new_value():
    # Issue 12: views freeze messages only when a scorer reads them, once per interaction.
    turn = Interaction("a", [1], [2], messages=[{"role": "user", "content": "hi"}])
    view = turn.readonly()
    assert "_frozen_cache" not in turn.__dict__  # nothing frozen yet
    first = view.messages
    assert first[0]["content"] == "hi" and turn.readonly().messages is first  # built once, shared
    turn.messages = ({"role": "user", "content": "new"},)
    assert turn.readonly().messages[0]["content"] == "new"
    clone = turn.clone()
    assert clone.messages[0]["content"] == "new" and clone.readonly().messages is clone.messages
    clone.messages = ({"role": "user", "content": "clone's own"},)
    assert turn.readonly().messages[0]["content"] == "new"


def _stitch_by_loop(chain):
    """The concat export as the host-path guide states it, one position at a time (float64, no numpy tricks)."""
    leaf = chain[-1]
    ids = list(leaf.input_tokens) + list(leaf.output_tokens)
    loss, logprobs, turn_ids, rewards = [0] * len(ids), [0.0] * len(ids), [-1] * len(ids), [0.0] * len(ids)
    for k, turn in enumerate(chain):
        assert list(ids[:len(turn.input_tokens) + turn.output_len]) == \
            list(turn.input_tokens) + list(turn.output_tokens)
        for j in range(turn.output_len):
            at = len(turn.input_tokens) + j
            loss[at], turn_ids[at] = 1, k
            if turn.output_logprobs is not None:
                logprobs[at] = float(turn.output_logprobs[j])
            if turn.token_rewards is not None:
                rewards[at] = float(turn.token_rewards[j])
    return ids, loss, logprobs, turn_ids, rewards


@pytest.mark.parametrize("shared", [False, True])
def test_stitch_matches_a_plain_loop_on_random_chains(shared):
    # The concat export against a position-by-position loop, for turns holding their own arrays and for turns
    # that are views of one buffer (as the session reader builds them); a child that does not extend its
    # parent (other values, or the same buffer at another offset) is refused.
    from prm_jax.runtime._trajectory import stitch

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 6))
        outputs = [rng.integers(0, 100, int(rng.integers(0, 4))) for _ in range(n)]
        gaps = [rng.integers(0, 100, int(rng.integers(0, 3))) for _ in range(n)]
        full = np.concatenate([x for pair in zip(gaps, outputs) for x in pair]).astype(np.int64)
        full.setflags(write=False)
        chain, start, parent = [], 0, None
        for k in range(n):
            start += gaps[k].size
            stop = start + outputs[k].size
            inputs, outs = (full[:start], full[start:stop]) if shared else (full[:start].copy(), outputs[k])
            chain.append(Interaction(
                f"t{k}", inputs, outs, parent_id=parent,
                output_logprobs=None if rng.random() < 0.3 else -rng.random(outs.size),
                token_rewards=None if rng.random() < 0.5 else rng.normal(size=outs.size)))
            parent, start = f"t{k}", stop
        seq = stitch(chain)
        ids, loss, logprobs, turn_ids, rewards = _stitch_by_loop(chain)
        np.testing.assert_array_equal(seq.input_ids, ids)
        np.testing.assert_array_equal(seq.loss_mask, loss)
        np.testing.assert_array_equal(seq.turn_ids, turn_ids)
        np.testing.assert_allclose(seq.logprobs, np.float32(logprobs), rtol=0, atol=0)
        if any(turn.token_rewards is not None for turn in chain):
            np.testing.assert_allclose(seq.token_rewards, np.float32(rewards), rtol=0, atol=0)
        else:
            assert seq.token_rewards is None
        assert (seq.loss_mask.dtype, seq.turn_ids.dtype, seq.logprobs.dtype) == (np.int32, np.int32, np.float32)
        # One turn-id rule, three readers of it: the host inverse (score_arrays), the device writer.
        spans = concat_spans(chain)
        nonempty = [span for span in spans if span[1] > span[0]]
        if len(nonempty) == len(spans):
            assert turn_spans(seq.turn_ids) == spans
        if seq.turn_ids.size:
            device = turn_ids_from_spans(np.asarray(spans, np.int64)[None], seq.turn_ids.size)
            np.testing.assert_array_equal(np.asarray(device)[0], seq.turn_ids)
        if n > 1 and chain[0].output_len:  # a child whose inputs are other memory (same buffer, shifted) or
            child = chain[1]                # other values is refused unless it happens to hold equal tokens
            size = child.input_tokens.shape[0]
            moved = full[1:1 + size] if shared else np.asarray(child.input_tokens) + 1
            if moved.shape[0] == size:
                chain[1] = Interaction("t1", moved, child.output_tokens, parent_id="t0")
                prefix = np.concatenate([chain[0].input_tokens, chain[0].output_tokens])
                if not np.array_equal(moved[:prefix.shape[0]], prefix):
                    with pytest.raises(ValueError, match="must start with its parent"):
                        stitch(chain)


def test_freeze_copies_deeply_and_refuses_writes():
    from types import MappingProxyType

    from prm_jax.runtime._trajectory import freeze

    class Role(str):
        pass

    array = np.arange(3)
    value = [{"role": Role("user"), "content": [{"type": "text", "text": "hi"}], "ids": array,
              "tags": {"a"}}, ("x", 1, 2.5, None, True)]
    frozen = freeze(value)
    assert isinstance(frozen, tuple) and isinstance(frozen[0], MappingProxyType)
    assert frozen[0]["content"] == (MappingProxyType({"type": "text", "text": "hi"}),)
    assert frozen[1] == ("x", 1, 2.5, None, True) and frozen[0]["tags"] == frozenset({"a"})
    value[0]["content"][0]["text"] = "changed"
    array[0] = 99
    assert frozen[0]["content"][0]["text"] == "hi" and frozen[0]["ids"][0] == 0
    with pytest.raises(TypeError):
        frozen[0]["role"] = "assistant"  # type: ignore[index]
    with pytest.raises(ValueError):
        frozen[0]["ids"][0] = 1


def test_views_and_clones_share_read_only_views_that_cannot_be_made_writeable():
    # Issue 12: a turn whose token arrays are already read-only views (the session reader's) shares them as
    # they are instead of viewing them again per clone and per scorer view: numpy refuses to make such a
    # view writeable, so sharing it hands out nothing a fresh view would not. Every array stays read-only.
    full = np.arange(1, 8)
    full.setflags(write=False)
    shared = Interaction("a", full[:3], full[3:5], output_logprobs=[-0.1, -0.2])
    plain = Interaction("b", [1, 2], [3, 4], token_rewards=[0.5, 0.5])
    for turn in (shared, plain):
        for copy in (turn.readonly(), turn.clone()):
            for name in ("input_tokens", "output_tokens", "output_logprobs"):
                array = getattr(copy, name)
                if array is None:
                    continue
                with pytest.raises(ValueError):
                    array[0] = 0
                if turn is shared and name != "output_logprobs":
                    with pytest.raises(ValueError):
                        array.setflags(write=True)
    assert shared.clone().input_tokens is shared.input_tokens  # shared, not viewed again
    assert plain.clone().token_rewards is not plain.token_rewards  # the clone's own, to commit into
    np.testing.assert_array_equal(full, np.arange(1, 8))


def test_turn_spans_refuses_ids_that_stitch_never_writes():
    assert turn_spans(np.array([-1, 0, 0, -1, 1, -1])) == [(1, 3), (4, 5)]
    for bad, match in (([1, 1, -1], "in order"), ([0, -1, 0], "not contiguous"), ([0, 2], "in order")):
        with pytest.raises(ValueError, match=match):
            turn_spans(np.array(bad), row=3)
