"""Random padded multi-turn batches for the tests, and a compile counter."""

from __future__ import annotations

import contextlib
import logging

import jax
import numpy as np


def make_batch(rng: np.random.Generator, rows: int, width: int, *, max_turns: int = 4, uniform: bool = False,
               unit_interval: bool = False, with_values: bool = True, with_ref: bool = True,
               with_process: bool = True, explicit_truncation: bool = True) -> dict:
    """Rows with a random prompt, then turns (output spans) separated by random user/tool gaps.

    Padding and prompt positions hold random junk in every float field, so a result that depends on
    them is caught. Turn rewards are uniform per turn when ``uniform``; in [0, 1] when ``unit_interval``.
    """
    attention = np.zeros((rows, width), np.int32)
    loss_mask = np.zeros((rows, width), np.int32)
    turn_ids = np.full((rows, width), -1, np.int32)
    token_rewards = rng.normal(size=(rows, width)).astype(np.float32)  # junk outside turns
    for b in range(rows):
        seqlen = width if rng.random() < 0.25 else int(rng.integers(1, width + 1))
        attention[b, :seqlen] = 1
        pos = int(rng.integers(0, max(1, seqlen // 2)))
        turn = 0
        while pos < seqlen and turn < max_turns:
            end = min(seqlen, pos + int(rng.integers(1, 7)))
            loss_mask[b, pos:end] = 1
            turn_ids[b, pos:end] = turn
            if uniform:
                value = rng.uniform(0, 1) if unit_interval else rng.choice([0.0, -0.5, 0.25, rng.normal()])
                token_rewards[b, pos:end] = value
            elif unit_interval:
                token_rewards[b, pos:end] = rng.uniform(0, 1, size=end - pos)
            pos = end + int(rng.integers(0, 4))
            turn += 1
    batch = dict(
        attention_mask=attention,
        loss_mask=loss_mask,
        logprobs=(-rng.exponential(size=(rows, width))).astype(np.float32),
        rewards=rng.choice([0.0, 1.0, -1.0, 0.5], size=rows).astype(np.float32),
        turn_ids=turn_ids,
    )
    if with_values:
        batch["values"] = rng.normal(size=(rows, width)).astype(np.float32)
    if with_ref:
        batch["ref_logprobs"] = (-rng.exponential(size=(rows, width))).astype(np.float32)
    if with_process:
        batch["token_rewards"] = token_rewards
    if explicit_truncation:
        batch["is_truncated"] = rng.random(rows) < 0.3
    return batch


def timestep_inputs(rng: np.random.Generator, rows: int, width: int, *, density: float = 0.7):
    """Rewards, values, an interleaved (non-contiguous) mask and a bootstrap, on timesteps."""
    mask = rng.random((rows, width)) < density
    # Interleave: carve random gaps so active runs alternate with masked runs of varying length.
    for b in range(rows):
        for start in rng.integers(0, width, size=3):
            mask[b, start:start + int(rng.integers(1, 5))] = False
    rewards = rng.normal(size=(rows, width)).astype(np.float32)
    values = rng.normal(size=(rows, width)).astype(np.float32)
    bootstrap = rng.normal(size=rows).astype(np.float32)
    return rewards, values, mask, bootstrap


@contextlib.contextmanager
def compile_log():
    """The messages of ``jax.log_compiles()`` (a public seam: no private function is patched)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect()
    logging.getLogger("jax").addHandler(handler)
    try:
        with jax.log_compiles():
            yield messages
    finally:
        logging.getLogger("jax").removeHandler(handler)


def enable_x64():
    """A context in which JAX computes in float64 (``jax.enable_x64`` where the jax has it: 0.7 does not)."""
    return jax.enable_x64(True) if hasattr(jax, "enable_x64") else jax.experimental.enable_x64()
