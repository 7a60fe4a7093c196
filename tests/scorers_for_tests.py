"""Scorers used by the runtime tests, importable by dotted path (``scorers_for_tests.X``)."""

from __future__ import annotations

import anyio
import numpy as np

from prm_jax import BaseScorer, BaseTrajectoryScorer, Interaction, InteractionCache, PRMMetricObservation, PRMScorerResult

EVENTS: list[str] = []


def scorer_of(fn, name="fn", cls=BaseScorer, **kwargs):
    """An instance of a new ``cls`` subclass named ``name`` whose ``evaluate`` is ``fn``."""
    return type(f"S_{name}", (cls,), {"name": name, "evaluate": fn})(**kwargs)


def chain(n_turns, out_len=2, rewards=None, *, messages=False, outcome=None):
    """A branch of ``n_turns`` turns (turn k's outputs ``10k + 1, ...``, each input the previous tokens plus a
    tool token 7), as an ``InteractionCache``; ``rewards[k]``: turn k's token rewards; ``messages``: a user and
    an assistant message per turn; ``outcome``: the last turn's reward."""
    turns, tokens = [], [100]
    for k in range(n_turns):
        out = list(range(10 * k + 1, 10 * k + 1 + out_len))
        text = dict(messages=[{"role": "user", "content": f"q{k}"}],
                    output_messages=[{"role": "assistant", "content": f"a{k}"}]) if messages else {}
        turns.append(Interaction(f"t{k}", list(tokens), out, parent_id=f"t{k - 1}" if k else None,
                                 reward=outcome if k == n_turns - 1 else None,
                                 token_rewards=None if rewards is None else rewards[k], **text))
        tokens = tokens + out + [7]
    return InteractionCache(turns)


def committed(cache):
    """Each turn's committed token rewards as a list (``None`` where none was committed)."""
    return [None if i.token_rewards is None else i.token_rewards.tolist() for i in cache]


class InFlight(BaseScorer):
    """Sleeps, recording how many evaluations run at once; fails on tokens equal to 99."""

    name = "in_flight"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.now = self.most = 0

    async def evaluate(self, interaction, ctx):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await anyio.sleep(0.005)
        finally:
            self.now -= 1
        if (interaction.output_tokens == 99).any():
            raise RuntimeError("judge failed")
        return 1.0


class ConstantScorer(BaseScorer):
    name = "constant"

    def __init__(self, value=0.5, **kwargs):
        super().__init__(**kwargs)
        self.value = value

    async def evaluate(self, interaction, ctx):
        return self.value


class PositionScorer(BaseScorer):
    """Returns the token positions 0..n-1 as an array: checks that positions are kept."""

    name = "position"

    async def evaluate(self, interaction, ctx):
        return np.arange(interaction.output_len, dtype=np.float64)


class Client:
    """A client an ``ExportService`` owns: records its close in EVENTS; can fail to close."""

    def __init__(self, label, fail=False):
        self.label, self.fail = label, fail

    async def aclose(self):
        EVENTS.append(f"client:{self.label}")
        if self.fail:
            raise OSError(f"client {self.label} failed to close")


class ClosingScorer(BaseScorer):
    """Records its aclose() calls in EVENTS; can fail or hang while closing."""

    name = "closing"

    def __init__(self, label="a", fail=False, hang=False, **kwargs):
        super().__init__(**kwargs)
        self.label, self.fail, self.hang = label, fail, hang
        self.closed = 0

    async def evaluate(self, interaction, ctx):
        return 1.0

    async def aclose(self):
        self.closed += 1
        EVENTS.append(f"close:{self.label}")
        if self.hang:
            await anyio.sleep_forever()
        if self.fail:
            raise RuntimeError(f"cleanup of {self.label} failed")


def closing_class(name):
    return type(f"Closing_{name}", (ClosingScorer,), {"name": name})


ClosingA = closing_class("closing_a")
ClosingB = closing_class("closing_b")
ClosingC = closing_class("closing_c")


class BrokenConstructor(ClosingScorer):
    name = "broken_constructor"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        raise RuntimeError("constructor failed")


class NotAScorer:
    name = "not_a_scorer"


class BudgetObservationScorer(BaseScorer):
    name = "observer"

    def __init__(self, value_type="boolean", **kwargs):
        super().__init__(**kwargs)
        self.value_type = value_type

    async def evaluate(self, interaction, ctx):
        return 1.0

    def prepare_result(self, interaction, raw, ctx):
        if self.value_type == "boolean":
            obs = PRMMetricObservation("ok", "turn", interaction.interaction_id, True, "boolean", ("count", "rate"))
        else:
            obs = PRMMetricObservation("ok", "turn", interaction.interaction_id, 2.0, "float", ("mean",))
        return PRMScorerResult(raw, (obs,))


class JointScorer(BaseTrajectoryScorer):
    name = "joint"

    def __init__(self, answer=None, **kwargs):
        super().__init__(**kwargs)
        self.answer = answer
        self.seen = None

    async def evaluate_trajectory(self, interactions, ctx):
        self.seen = [i.interaction_id for i in interactions]
        return self.answer


class Nameless(BaseScorer):
    """No class-level name: start-up (and validate-config) must refuse it."""

    async def evaluate(self, interaction, ctx):
        return 0.0


class StrictKwargs(BaseScorer):
    name = "strict_kwargs"

    def __init__(self, threshold: float, **kwargs):
        super().__init__(**kwargs)
        self.threshold = threshold

    async def evaluate(self, interaction, ctx):
        return float(interaction.output_len > self.threshold)


class NoGvpo(BaseScorer):
    """Rejects gvpo through AReaL's optional per-scorer hook (a 1/0 judge is a no-op under gvpo)."""

    name = "no_gvpo"

    @classmethod
    def validate_prm_config(cls, prm_config):
        if prm_config.advantage_shaping.mode == "gvpo":
            raise ValueError("a 0/1 judge gives gvpo no negative process reward")

    async def evaluate(self, interaction, ctx):
        return 1.0


class FailOnGroup(BaseScorer):
    """Raises for sessions of groups whose key starts with ``prefix``."""

    name = "fail_on_group"

    def __init__(self, prefix="g1", **kwargs):
        super().__init__(**kwargs)
        self.prefix = prefix

    async def evaluate(self, interaction, ctx):
        if ctx["session_key"].startswith(self.prefix):
            raise RuntimeError("judge unavailable")
        return 0.5


class SlowScorer(BaseScorer):
    """Touches ``marker`` when it is first called, then takes ``seconds`` per turn: a run to interrupt."""

    name = "slow"

    def __init__(self, marker="", seconds=30.0, **kwargs):
        super().__init__(**kwargs)
        self.marker, self.seconds = marker, seconds

    async def evaluate(self, interaction, ctx):
        if self.marker:
            open(self.marker, "a").close()
        await anyio.sleep(self.seconds)
        return 0.5


class Zeta(BaseScorer):
    """A turn's score is its first output token mod 7 (GDPO's source order tests: listed before ``Alpha``)."""

    name = "zeta"

    async def evaluate(self, interaction, ctx):
        return float(interaction.output_tokens[0] % 7)


class Alpha(BaseScorer):
    """A turn's score is its prompt's length mod 5 (sorts before ``zeta`` by name)."""

    name = "alpha"

    async def evaluate(self, interaction, ctx):
        return float(len(interaction.input_tokens) % 5)


class Asleep(BaseScorer):
    """Its first call touches ``marker``, then sleeps synchronously (``time.sleep``) in ``async def
    evaluate``: a signal lands in the middle of a scorer's synchronous code (later calls return at once)."""

    name = "asleep"

    def __init__(self, marker="", seconds=30.0, **kwargs):
        super().__init__(**kwargs)
        self.marker, self.seconds = marker, seconds

    async def evaluate(self, interaction, ctx):
        import os
        import time
        if self.marker and not os.path.exists(self.marker):
            open(self.marker, "a").close()
            time.sleep(self.seconds)
        return 0.5


# Synchronous scorers for the process executor (importable, so their worker processes can unpickle them).
from prm_jax.runtime._scoring import SyncScorer  # noqa: E402


def busy_score(interaction, work):
    """A deterministic CPU-bound score in pure Python (holds the GIL): ``work`` rounds over the tokens."""
    total = 0
    tokens = [int(t) for t in interaction.output_tokens]
    for i in range(work):
        total = (total * 31 + tokens[i % len(tokens)]) % 1_000_003
    return total / 1_000_003


class BusyVerifier(SyncScorer):
    name = "busy_verifier"
    executor = "process"

    def __init__(self, work=2000, **kwargs):
        super().__init__(**kwargs)
        self.work = work

    def evaluate(self, interaction, ctx):
        return busy_score(interaction, self.work)


class WorkerPid(SyncScorer):
    """Scores each turn with the id of the process that ran it (and echoes a ctx entry, if given)."""

    name = "worker_pid"
    executor = "process"

    def evaluate(self, interaction, ctx):
        import os

        return float(os.getpid()) + float(ctx.get("offset", 0.0))


class Misbehaves(SyncScorer):
    """Sleeps 30 s on the turns named in ``slow`` (first creating the file ``started``, if given: the call is in
    the worker), exits its process on ``crash``, raises on ``fail``."""

    name = "misbehaves"
    executor = "process"

    def __init__(self, slow=(), crash=(), fail=(), started=None, **kwargs):
        super().__init__(**kwargs)
        self.slow, self.crash, self.fail, self.started = tuple(slow), tuple(crash), tuple(fail), started

    def evaluate(self, interaction, ctx):
        import os
        import time

        if interaction.interaction_id in self.slow:
            if self.started is not None:
                open(self.started, "w").close()
            time.sleep(30)
        if interaction.interaction_id in self.crash:
            os._exit(3)
        if interaction.interaction_id in self.fail:
            raise KeyError(f"no answer for {interaction.interaction_id}")
        return 1.0


from prm_jax.runtime._scoring import SyncTrajectoryScorer  # noqa: E402


class BranchInAProcess(SyncTrajectoryScorer):
    """Scores a whole branch in a worker process: turn k gets k + the process id's parity (0 or 1)."""

    name = "branch_in_a_process"
    executor = "process"

    def evaluate_trajectory(self, interactions, ctx):
        import os

        return {turn.interaction_id: float(k) + float(os.getpid() != ctx["parent_pid"])
                for k, turn in enumerate(interactions)}


class AnswerMatch(BaseScorer):
    """1 where the turn's reply (its last output message) is the session's ``metadata["answer"]``, else 0;
    a reply that tries to write into the metadata fails (it is read-only)."""

    name = "answer_match"

    async def evaluate(self, interaction, ctx):
        reply = interaction.output_messages[-1]["content"]
        if reply == "overwrite":
            ctx["metadata"]["answer"] = reply  # raises: ctx["metadata"] is read-only
        return 1.0 if reply == ctx["metadata"]["answer"] else 0.0


class TurnIndexInAProcess(SyncScorer):
    """Each turn's ``turn_index`` and the row's ``metadata["k"]`` (0 without one), from a worker process."""

    name = "turn_index_process"
    executor = "process"
    timeout = 60.0

    def evaluate(self, interaction, ctx):
        return float(interaction.turn_index) + 10.0 * float(ctx["metadata"].get("k", 0))


class SlowToLoad(SyncScorer):
    """A process scorer whose loading in a worker (its unpickling: imports, set-up) takes ``load_s`` seconds,
    longer than its ``timeout``; each call is quick."""

    name = "slow_to_load"
    executor = "process"

    def __init__(self, load_s=1.5, **kwargs):
        super().__init__(**kwargs)
        self.load_s = load_s

    def __setstate__(self, state):
        import time

        time.sleep(state["load_s"])
        self.__dict__.update(state)

    def evaluate(self, interaction, ctx):
        return 1.0


class Counted(SyncScorer):
    """Appends each call's row to a file (how often each ran), then crashes its process on ``crash`` rows."""

    name = "counted"

    def __init__(self, log, crash=(), **kwargs):
        super().__init__(**kwargs)
        self.log, self.crash = log, tuple(crash)

    def evaluate(self, interaction, ctx):
        with open(self.log, "a") as log:
            log.write(interaction.interaction_id + "\n")
        if interaction.interaction_id in self.crash:
            import os

            os._exit(3)
        return 1.0


class Sleepy(SyncScorer):
    """Sleeps ``seconds`` per call, then scores 1.0."""

    name = "sleepy"

    def __init__(self, seconds=0.1, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def evaluate(self, interaction, ctx):
        import time

        time.sleep(self.seconds)
        return 1.0


class Footprint(SyncScorer):
    """Scores 1.0 where its worker has imported jax, else 0.0 (and keeps the worker's resident memory, in MB, in
    ``ctx``-free form: ``evaluate_rss``)."""

    name = "footprint"
    executor = "process"

    def evaluate(self, interaction, ctx):
        import sys

        return float("jax" in sys.modules)


def resident_mb() -> float:
    """This process's resident memory (Linux), in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Resident(SyncScorer):
    """Scores each turn with its worker's resident memory in MB."""

    name = "resident"
    executor = "process"

    def evaluate(self, interaction, ctx):
        return resident_mb()
