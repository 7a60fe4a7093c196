"""The scorers of bench_scorers.py's workloads, in a module of their own so that worker processes (the
process executor) can import them."""

from __future__ import annotations

import anyio

from prm_jax import BaseScorer, SyncScorer


def verify(tokens: list[int], rounds: int) -> float:
    """A CPU-bound verifier in pure Python (holds the GIL, as sympy does): ``rounds`` steps of a hash."""
    total = 0
    n = len(tokens)
    for i in range(rounds):
        total = (total * 31 + tokens[i % n]) % 1_000_003
    return total / 1_000_003


class Verifier(SyncScorer):
    """The verifier through the process executor."""

    name = "verifier"
    executor = "process"

    def __init__(self, rounds: int = 100_000, **kwargs):
        super().__init__(**kwargs)
        self.rounds = rounds

    def evaluate(self, interaction, ctx):
        return verify(interaction.output_tokens.tolist(), self.rounds)


class VerifierOnTheLoop(BaseScorer):
    """The same verifier written as the README once suggested: inside ``async def evaluate``."""

    name = "verifier_on_the_loop"

    def __init__(self, rounds: int = 100_000, **kwargs):
        super().__init__(**kwargs)
        self.rounds = rounds

    async def evaluate(self, interaction, ctx):
        return verify(interaction.output_tokens.tolist(), self.rounds)


class Neighbour(BaseScorer):
    """An async scorer beside the verifier: 20 ms of waiting a turn, ``timeout=0.5``."""

    name = "neighbour"

    async def evaluate(self, interaction, ctx):
        await anyio.sleep(0.02)
        return 1.0
