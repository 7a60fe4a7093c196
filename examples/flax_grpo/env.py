"""The toy environment: three turns, each must answer its cue; the outcome is 1 only if all three are right.

A row is ``[BOS, cue_0, answer_0, cue_1, answer_1, cue_2, answer_2, PAD]``. The right answer to cue ``c``
in turn ``k`` is ``(c + k) mod 4``: the policy must read both the cue and the turn. With 4 answers a
random policy gets a whole episode right 1 time in 64, so the outcome alone is a sparse signal; the
judge scores every turn, which is where process rewards can help.
"""

from __future__ import annotations

import numpy as np

from prm_jax import BaseScorer

PAD, BOS, CUE0, ANSWER0 = 0, 1, 2, 6
CHOICES, TURNS, WIDTH = 4, 3, 8
VOCAB = ANSWER0 + CHOICES
ANSWER_POSITIONS = np.array([2, 4, 6])


def right_answer(cue_token: np.ndarray, turn: int) -> np.ndarray:
    return ANSWER0 + (cue_token - CUE0 + turn) % CHOICES


def outcome(tokens: np.ndarray) -> np.ndarray:
    """``[B]`` float32: 1 where every turn of the row is answered right."""
    right = [tokens[:, p] == right_answer(tokens[:, p - 1], k) for k, p in enumerate(ANSWER_POSITIONS)]
    return np.all(right, axis=0).astype(np.float32)


class CueJudge(BaseScorer):
    """A process-reward scorer: ``correct`` for a right answer, ``wrong`` otherwise.

    It reads the turn as any scorer would: the prompt so far (``input_tokens``, ending in the cue) and
    the answer (``output_tokens``). For ``process_weighted`` the scores must lie in [0, 1] (``wrong=0``);
    for ``gvpo`` a wrong turn must score below 0, or gvpo changes nothing.
    """

    name = "cue_judge"

    def __init__(self, correct: float = 1.0, wrong: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.correct, self.wrong = float(correct), float(wrong)

    async def evaluate(self, interaction, ctx):
        turn = (len(interaction.input_tokens) - 2) // 2
        expected = right_answer(interaction.input_tokens[-1], turn)
        return self.correct if interaction.output_tokens[0] == expected else self.wrong


def cue_model(correct: float = 1.0, wrong: float = 0.0):
    """``CueJudge`` as a JAX function of whole rows, for ``prm_jax.scorers.ModelScorer`` (the factory a
    config names: ``config_model.yaml``): each turn's token scores ``correct`` where it answers the cue
    before it right, ``wrong`` elsewhere; the same numbers as ``CueJudge``, one forward per batch."""
    import jax.numpy as jnp

    def score(input_ids, attention_mask, turn_ids):
        cue = jnp.roll(input_ids, 1, axis=1)  # the token before each position
        right = input_ids == ANSWER0 + (cue - CUE0 + jnp.maximum(turn_ids, 0)) % CHOICES
        return jnp.where(right, jnp.float32(correct), jnp.float32(wrong))

    return score
