"""Issue 20.7: the array API checks instead of reshaping: exact shapes, integer dtypes and ranges, each
error naming the argument."""

import anyio
import numpy as np
import pytest

from prm_jax import PRMRunner, score_arrays
from prm_jax.kernels import turn_ids_from_spans
from prm_jax.runtime.arrays import chains_from_arrays


def arrays(rows=2, width=6):
    tokens = np.arange(rows * width, dtype=np.int32).reshape(rows, width)
    turn_ids = np.full((rows, width), -1, np.int32)
    turn_ids[:, 2:4] = 0
    return tokens, turn_ids


@pytest.mark.parametrize("name", ["attention_mask", "logprobs"])
def test_a_transposed_array_is_refused_not_reshaped(name):
    tokens, turn_ids = arrays(rows=2, width=6)
    transposed = np.zeros((6, 2), np.float32)  # [T, B]: reshaped into [B, T] before, scrambled silently
    with pytest.raises(ValueError, match=rf"{name} must have shape \(2, 6\)"):
        chains_from_arrays(tokens, turn_ids, **{name: transposed})


def test_rewards_must_be_one_per_row():
    tokens, turn_ids = arrays()
    with pytest.raises(ValueError, match=r"rewards must have shape \(2,\)"):
        chains_from_arrays(tokens, turn_ids, rewards=np.zeros((2, 1)))


def test_float_token_ids_and_turn_ids_are_refused():
    tokens, turn_ids = arrays()
    with pytest.raises(TypeError, match="input_ids must be an integer array, got dtype float64"):
        chains_from_arrays(tokens + 0.7, turn_ids)  # 7.7 became 7
    with pytest.raises(TypeError, match="turn_ids must be an integer array"):
        chains_from_arrays(tokens, turn_ids.astype(np.float32))
    with pytest.raises(ValueError, match=r"input_ids must hold token ids in \[0, 2147483647\], got -3"):
        chains_from_arrays(np.where(tokens == 0, -3, tokens), turn_ids)


def test_int64_spans_beyond_int32_do_not_wrap():
    # (2**32 + 1, 2**32 + 3) wrapped to (1, 3): turn 0 appeared on real positions.
    spans = np.array([[[2, 4], [2**32 + 1, 2**32 + 3]]], np.int64)
    np.testing.assert_array_equal(turn_ids_from_spans(spans, 6), [[-1, -1, 0, 0, -1, -1]])
    with pytest.raises(TypeError, match="spans must be an integer array"):
        turn_ids_from_spans(spans.astype(np.float32), 6)


def test_a_short_per_row_ctx_list_is_a_named_error():
    tokens, turn_ids = arrays(rows=3)

    async def main():
        async with PRMRunner() as runner:
            await score_arrays(runner, tokens, turn_ids, ctx=[{}, {}])
    with pytest.raises(ValueError, match=r"ctx must be one mapping, or one entry per row of input_ids \(3\), got 2"):
        anyio.run(main)
