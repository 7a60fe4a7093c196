"""The cases of the option matrix (``tests/kernels/test_matrix.py``): each estimator's and shaping's
settings, and the batch every cell runs on; a helper module, so that other tests can run on the same ones."""

from __future__ import annotations

import numpy as np

from prm_jax.estimators import registered

# Every registered estimator (the built-ins and the tests' plug-ins, tests/conftest.py), run from the example
# configuration it declares (EstimatorSpec.example): none is listed here.
ESTIMATORS = {spec.name: dict(spec.example) for spec in registered()}
SHAPINGS = {"additive": {}, "gvpo": {"advantage_shaping": {"mode": "gvpo"}},
            "process_weighted": {"advantage_shaping": {"mode": "process_weighted"}},
            "fold": {"token_rewards_as_adv": False}}

ROWS, WIDTH, GROUP = 6, 24, 3


def make_batch(rng: np.random.Generator) -> dict:
    """Two groups of three rows; each row a prompt then 2-3 turns separated by tool tokens, one turn with a hole
    in its loss mask (tunix's pad inside a completion); each group's rows are root-to-leaf paths of one tree
    (they share their first turns); every optional input filled (``with_states`` removes or breaks them).
    Every batch has the same shapes (``node_parents`` padded): op by op, each primitive compiles once."""
    attention = np.zeros((ROWS, WIDTH), np.int32)
    loss = np.zeros((ROWS, WIDTH), np.int32)
    turn_ids = np.full((ROWS, WIDTH), -1, np.int32)
    turns_of = []
    for b in range(ROWS):
        pos, turns = 1 + int(rng.integers(0, 2)), int(rng.integers(2, 4))
        for k in range(turns):
            n = int(rng.integers(2, 5))
            loss[b, pos:pos + n], turn_ids[b, pos:pos + n] = 1, k
            pos += n + int(rng.integers(1, 3))
        attention[b, :min(pos - 1, WIDTH)] = 1
        turns_of.append(turns)
    hole = np.flatnonzero(turn_ids[2] == 0)
    loss[2, hole[1]] = 0  # a hole inside row 2's first turn
    uniform = rng.uniform(0.05, 0.95, (ROWS, 4))  # per-turn process rewards in [0, 1] (process_weighted)
    token_rewards = np.where(turn_ids >= 0, np.take_along_axis(uniform, np.maximum(turn_ids, 0), axis=1), 0.0)
    # Trees: row b's turn k is node (group, shared prefix, k) while it shares row b-1's first s turns.
    node_ids = np.full((ROWS, 4), -1, np.int32)
    parents: list[int] = []
    for g in range(ROWS // GROUP):
        previous: list[int] = []
        for b in range(g * GROUP, (g + 1) * GROUP):
            shared = 0 if not previous else int(rng.integers(0, min(len(previous), turns_of[b]) ))
            path = previous[:shared]
            for _ in range(shared, turns_of[b]):
                parents.append(path[-1] if path else -1)
                path.append(len(parents) - 1)
            node_ids[b, :len(path)] = path
            previous = path
    ref = (-rng.exponential(0.5, (ROWS, WIDTH))).astype(np.float32)
    logprobs = (-rng.exponential(0.5, (ROWS, WIDTH))).astype(np.float32)
    prox = (-rng.exponential(0.5, (ROWS, WIDTH))).astype(np.float32)
    # OTB's sum of pi^2 at timestep t is at least the sampled token's pi^2 (either log-prob the pipeline reads:
    # prox, or the behaviour one of position t + 1), as from real logits: the token weights are >= 0.
    top = np.maximum(np.exp(prox), np.exp(np.concatenate([logprobs[:, 1:], logprobs[:, :1]], axis=1)))
    sum_pi_squared = top ** 2 + (1 - top ** 2) * rng.uniform(0, 0.8, (ROWS, WIDTH))
    return dict(attention_mask=attention, loss_mask=loss, turn_ids=turn_ids,
                logprobs=logprobs, sum_pi_squared=sum_pi_squared.astype(np.float32),
                rollout_is_weights=rng.uniform(0.5, 1.5, (ROWS, WIDTH)).astype(np.float32),
                rewards=rng.choice([0.0, 1.0], ROWS).astype(np.float32),
                values=rng.normal(0, 0.5, (ROWS, WIDTH)).astype(np.float32), ref_logprobs=ref,
                prox_logprobs=prox,
                prm_logprobs=(-np.abs(ref + rng.normal(0, 0.2, ref.shape))).astype(np.float32),  # (log-probs: <= 0)
                token_rewards=token_rewards.astype(np.float32),
                gae_lambda=rng.uniform(0.5, 1.0, ROWS).astype(np.float32),
                turn_rewards=rng.normal(0, 1, (ROWS, 4)).astype(np.float32),
                anchor_ids=rng.integers(0, 2, (ROWS, 4)).astype(np.int32),
                reward_sources=rng.normal(0, 1, (ROWS, 2)).astype(np.float32),
                node_ids=node_ids, node_parents=np.array(parents + [-1] * (ROWS * 4 + 2 - len(parents)), np.int32),
                is_truncated=rng.random(ROWS) < 0.4,
                token_reward_mask=np.where(turn_ids >= 0, rng.random((ROWS, 4))[np.arange(ROWS)[:, None],
                                                                              np.maximum(turn_ids, 0)] < 0.7, True))
