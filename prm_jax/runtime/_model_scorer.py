"""``ModelScorer``: a JAX model as a scorer (a PRM, a value head, a classifier on the trainer's device).

The model is a function of whole rows, ``fn(input_ids [B, L] int32, attention_mask [B, L] int32,
turn_ids [B, L] int32) -> [B, L]`` token scores (``output="tokens"``: each turn's tokens get the scores on
its positions) or ``[B, max_turns]`` turn scores (``output="turns"``: turn ``k`` gets column ``k``,
broadcast over its tokens). A causal model scores every turn of a row in one forward, so a call covers
whole rows: the turns of up to ``max_batch_size`` rows, padded with zeros to ``max_batch_size`` rows and
to a width rounded up to ``bucket`` (``bucket_width``), so it compiles once per width bucket, never per
batch. ``turn_ids`` is -1 off the turns (the prompt, tool output, padding).

Steps (``spread``, ``step_separator``; ``prm_jax.runtime._steps``): by default each token gets the model's
score on its position. With a ``spread`` (``step``, ``step_end``, ``turn``, ``tokens``), the model's token
score at each step's last token is the step's score (where a causal PRM has read the whole step), placed by
the spread; steps are the turns (the default) or split at ``step_separator`` (token-id sequences, e.g.
``[[271]]``). Nothing is inserted into the rows (a model that needs a step tag there reads its separator's
position), and a turn's end always ends a step. ``output: turns`` takes neither.

Two paths:

- ``score_arrays`` (a trainer's arrays), when every enabled scorer of the runner is a ``ModelScorer``: the
  arrays go to ``fn`` chunk by chunk as they are (no per-turn interactions built); trailing columns without
  attention are cut before bucketing. A failed call fails the rows in it.

Forwards run in a worker thread (JAX releases the GIL while the device computes), so the event loop
serves other scorers meanwhile.
- Sessions and every other caller (``run``, ``run_many``, ``prm-jax score``, or ``score_arrays`` beside
  other scorers): a ``BatchTrajectoryScorer``; each branch becomes one row (its leaf's tokens, turn ids on
  its turns' outputs, by the concat rule) and the branches in flight share calls.

A config entry cannot hold a model: pass the scorer in (``PRMRunner(config, scorers=[ModelScorer(fn)])``,
``BlockingRunner(config, scorers=[...])``, the caller keeps it and its parameters; close over them in
``fn``, or pass ``fn=functools.partial(apply, params)``), or name a factory in the config
(``kwargs: {factory: mypkg.prm.make_scorer_fn, factory_kwargs: {...}}``, a dotted path to a function that
loads the model, called with ``factory_kwargs``, and returns ``fn``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal, NamedTuple

import anyio
import jax
import jax.numpy as jnp
import numpy as np

from prm_jax._validation import boolean, imported_callable, integer, short_repr
from prm_jax.kernels._distillation import reward_bounds
from prm_jax.kernels._policy_loss import logprobs_on_timesteps
from prm_jax.runtime._batching import bucket_width
from prm_jax.runtime._rewards import weighted_float32
from prm_jax.runtime._scoring import BatchTrajectoryScorer
from prm_jax.runtime._settings import Settings, setting
from prm_jax.runtime._steps import Spread, StepRule, check_spread, place_steps
from prm_jax.runtime._trajectory import Interaction, concat_spans

ModelOutput = Literal["tokens", "turns"]
ModelFn = Callable[[Any, Any, Any], Any]


def resolve_factory(path: Any) -> Callable[..., ModelFn]:
    """``package.module.function``: a factory that loads the model and returns the model function."""
    if not isinstance(path, str) or "." not in path:
        raise ValueError(f"factory must be a dotted path 'package.module.function', got {short_repr(path)}")
    return imported_callable("factory", path)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSettings(Settings):
    fn: ModelFn | None = setting(None, doc="The model, in code: a function of ``(input_ids, attention_mask, "
                                 "turn_ids)`` (``[B, L]`` each) returning ``[B, L]`` token scores (``output: "
                                 "tokens``) or ``[B, max_turns]`` turn scores (``output: turns``); give it or "
                                 "``factory``.")
    factory: str | None = setting(None, doc="The model, in a config: a dotted path ``package.module.function`` "
                                  "to a factory that loads the model and returns that function; give it or "
                                  "``fn``.")
    factory_kwargs: Mapping[str, Any] | None = setting(None, doc="Keyword arguments of ``factory`` (a mapping); "
                                                       "``None``: none.")
    output: ModelOutput = setting("tokens", doc="What the model returns: ``tokens`` (a score per token) or "
                                  "``turns`` (a score per turn, spread over the turn's tokens).")
    max_turns: int | None = setting(None, doc="The width of the model's ``[B, max_turns]`` output, >= 1 "
                                    "(``output: turns`` only; a row with more turns fails).")
    bucket: int = setting(128, doc="Rows are padded to a multiple of this many tokens, >= 1, so the jitted "
                          "model compiles once per bucket, not per length.")
    jit: bool = setting(True, doc="Whether the scorer wraps the model in ``jax.jit`` (``False`` for one that "
                        "is jitted already or must not be).")
    spread: Spread | None = setting(None, doc="How the model's token scores are placed on the steps "
                                    "(``step``, ``step_end``, ``turn``, ``tokens``); ``None``: as the model "
                                    "returns them (``step`` when ``step_separator`` is set).")
    step_separator: Sequence[Sequence[int]] | None = setting(None, doc="Token sequences that end a step inside "
                                                             "a turn's output; ``None``: each turn one step.")
    positional: ClassVar[tuple[str, ...] | None] = ("fn",)

    def check(self) -> None:
        if (self.fn is None) == (self.factory is None):
            raise ValueError("give exactly one of fn (a function, in code) and factory (a dotted path, in a "
                             "config)")
        if self.factory_kwargs is not None and (self.factory is None or not isinstance(self.factory_kwargs, Mapping)):
            raise ValueError("factory_kwargs must be a mapping, given with factory")
        if self.factory is not None:
            resolve_factory(self.factory)
        if self.output not in ("tokens", "turns"):
            raise ValueError(f"output must be 'tokens' or 'turns', got {short_repr(self.output)}")
        if self.output == "turns":
            if self.max_turns is None:
                raise ValueError("output 'turns' needs max_turns (the width of the model's [B, max_turns] output)")
            integer("max_turns", self.max_turns, minimum=1)
        integer("bucket", self.bucket, minimum=1)
        boolean("jit", self.jit, config=False)
        if self.spread is not None:
            check_spread(self.spread)
        StepRule.parse(self.step_separator)
        if self.output == "turns" and (self.spread is not None or self.step_separator is not None):
            raise ValueError("spread and step_separator read the model's token scores at step ends: output "
                             "'turns' gives one score per turn (use output 'tokens')")


class ModelScorer(BatchTrajectoryScorer):
    """Scores turns with a JAX model over whole rows (see the module docstring). Subclass it (with another
    class-level ``name``) for a second model in one runner.

    Example:
        >>> def first_token_is_one(input_ids, attention_mask, turn_ids):   # [B, L] token scores, jitted by you
        ...     return (input_ids == 1).astype(np.float32) * attention_mask
        ...
        >>> scorer = prm_jax.scorers.ModelScorer(first_token_is_one, max_batch_size=8, bucket=8)
        >>> with prm_jax.BlockingRunner(scorers=[scorer]) as runner:
        ...     rewards = runner.score_arrays(np.array([[5, 1, 2], [5, 2, 1]]), np.array([[-1, 0, 0], [-1, 0, 0]]))
        ...
        >>> rewards.tolist()
        [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """

    name = "model"
    settings_class = ModelSettings
    base_defaults = {"max_batch_size": 32}
    pads = True  # rows are padded to the longest: batches sorted by length
    # Whether it reads the turns' output_logprobs (a teacher): score_arrays then builds interactions for it.
    reads_logprobs: ClassVar[bool] = False

    def prepare(self) -> None:
        super().prepare()
        s = self.settings
        model = s.fn if s.fn is not None else resolve_factory(s.factory)(**dict(s.factory_kwargs or {}))
        if not callable(model):
            raise TypeError(f"scorer {self.name!r}: factory {s.factory!r} returned {type(model).__name__}, not a "
                            "function of (input_ids, attention_mask, turn_ids)")
        self.fn: ModelFn = jax.jit(model) if s.jit else model
        self.spread: Spread | None = s.spread if s.spread is not None or s.step_separator is None else "step"
        self.rule = StepRule.parse(s.step_separator)
        self.forwards = 0

    # -- the rows path ---------------------------------------------------------------------------------------

    def score_rows(self, input_ids: np.ndarray, attention_mask: np.ndarray, turn_ids: np.ndarray, *,
                   check: bool = True) -> np.ndarray:
        """Raw (unweighted) float64 token scores ``[B, T]`` of rows ``[B, T]`` (``turn_ids`` -1 off the turns,
        where the result is 0), ``max_batch_size`` rows per model call, placed by ``spread`` over the steps
        where one is set (``place_steps``). ``ValueError`` naming the row for a
        row with more than ``max_turns`` turns, and for a non-finite score unless ``check=False`` (the
        runner's paths fail only the rows that hold one: ``weighted_rows``).

        Args:
            check: Whether a non-finite score raises (``False``: the runner's paths fail only the rows that hold one).
        """
        rows, width = turn_ids.shape
        out = np.zeros((rows, width), np.float64)
        live = attention_mask.astype(bool) | (turn_ids >= 0)
        order, lengths, ascending = chunk_order(live, np.flatnonzero(live.any(axis=1)), self.settings.bucket)
        for chunk in row_chunks(input_ids, attention_mask, turn_ids, order, lengths, self.max_batch_size,
                                self.settings.bucket, ascending=ascending):
            if self.settings.output == "turns":
                assert self.settings.max_turns is not None
                too_many = np.flatnonzero(chunk.turns.max(axis=1) >= self.settings.max_turns)
                if too_many.size:
                    raise ValueError(f"scorer {self.name!r}: row {int(chunk.rows[too_many[0]])} has more turns "
                                     f"than max_turns={self.settings.max_turns}")
            out[chunk.at, :chunk.cut] = self.chunk_scores(chunk)
        if self.spread is not None:
            out = place_steps(out, input_ids, turn_ids, self.rule, self.spread)
        bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
        if bad.size and check:
            raise ValueError(f"scorer {self.name!r}: the model returned non-finite scores on row {int(bad[0])}")
        return out

    def chunk_scores(self, chunk: RowChunk) -> np.ndarray:
        """The model's raw scores of one chunk's rows, ``[rows, cut]`` in the model's float dtype (float64 for
        one that returns integers), 0 off the turns (``output="turns"``: each turn's column spread over its
        tokens): one call of the model (``max_batch_size`` rows, the chunk's bucketed width). Placing by
        ``spread`` is the caller's (``place_steps``, over whole rows).

        Args:
            chunk: One model call's rows (``RowChunk``).
        """
        return self._on_turns(chunk, self._fetch(self._call(chunk.ids, chunk.mask, chunk.turns), chunk.ids.shape))

    def _on_turns(self, chunk: RowChunk, scores: np.ndarray) -> np.ndarray:
        """``chunk_scores`` from the call's output on the host (``_fetch``'s): the chunk's rows and columns, each
        turn's column spread over its tokens for ``output="turns"``, 0 off the turns."""
        count = chunk.rows.size
        turns = chunk.turns[:count, :chunk.cut]
        if self.settings.output == "turns":
            last = (self.settings.max_turns or 1) - 1
            scores = np.take_along_axis(scores[:count], np.clip(turns, 0, last), axis=1)
        else:
            scores = scores[:count, :chunk.cut]
        return np.where(turns >= 0, scores, scores.dtype.type(0))

    def _call(self, ids: np.ndarray, mask: np.ndarray, turns: np.ndarray) -> Any:
        """One call of the model, its output as the model returns it (a jitted model's is computed
        asynchronously: ``_fetch`` waits for it)."""
        self.forwards += 1
        return self.fn(ids, mask, turns)

    def _fetch(self, result: Any, shape: tuple[int, ...]) -> np.ndarray:
        """A call's output on the host, checked against the rows' ``shape``; float64 for integer scores.
        (``np.asarray``, not ``jax.device_get``: one array needs no pytree walk, 15-30 us a call here.)"""
        scores = np.asarray(result)
        expected = (shape[0], self.settings.max_turns) if self.settings.output == "turns" else tuple(shape)
        if scores.shape != expected:
            raise ValueError(f"scorer {self.name!r}: the model returned shape {scores.shape} for rows of shape "
                             f"{tuple(shape)}, expected {expected} (output={self.settings.output!r})")
        return scores if scores.dtype.kind == "f" else scores.astype(np.float64)

    # -- the branches path -----------------------------------------------------------------------------------

    async def evaluate_batch(self, items: Sequence[tuple[Sequence[Interaction], Mapping[str, Any]]]  # type: ignore[override]
                             ) -> list[dict[str, Any]]:
        layouts = [(turns, concat_spans(turns)) for turns, _ in items]
        width = max(spans[-1][1] for _, spans in layouts)
        ids = np.zeros((len(items), width), np.int64)
        mask = np.zeros((len(items), width), np.int32)
        turn_ids = np.full((len(items), width), -1, np.int32)
        for row, (turns, spans) in enumerate(layouts):
            leaf = turns[-1]
            length = spans[-1][1]
            ids[row, :length] = np.concatenate([leaf.input_tokens, leaf.output_tokens])
            mask[row, :length] = 1
            for k, (start, stop) in enumerate(spans):
                turn_ids[row, start:stop] = k
        # The loop stays free; a row's non-finite scores fail that branch alone (the runner's validation).
        scores = await anyio.to_thread.run_sync(functools.partial(self.score_rows, check=False), ids, mask, turn_ids)
        return [{turn.interaction_id: scores[row, start:stop] for turn, (start, stop) in zip(turns, spans)}
                for row, (turns, spans) in enumerate(layouts)]


def token_logprobs(logits: Any, input_ids: Any) -> jax.Array:
    """``[B, L]`` each position's token's log-prob given the tokens before it, from a causal model's logits
    ``[B, L, V]`` (position ``t``'s logits predict token ``t + 1``): ``log_softmax(logits[:, t - 1])[ids[:, t]]``,
    0 at position 0 (no context); ``prm_jax.losses.logprobs_on_timesteps`` (its argument checks too) moved
    one position on. What a ``TeacherModelScorer``'s function returns.

    Args:
        logits: ``[B, L, V]`` a causal model's logits (position ``t``'s predict token ``t + 1``).

    Example:
        >>> logits = np.log(np.array([[[0.5, 0.5], [0.9, 0.1], [0.5, 0.5]]], np.float32))
        >>> [round(float(x), 4) for x in prm_jax.scorers.token_logprobs(logits, np.array([[0, 1, 0]]))[0]]
        [0.0, -0.6931, -0.1054]
    """
    on_timesteps = logprobs_on_timesteps(logits, input_ids)
    return jnp.concatenate([jnp.zeros_like(on_timesteps[:, :1]), on_timesteps[:, :-1]], axis=1)


def teacher_rewards(who: str, turns: Sequence[Interaction], teacher: Sequence[np.ndarray],
                    reward_min: float | None, reward_max: float | None) -> dict[str, np.ndarray]:
    """On-policy distillation's dense reward of each output token of each turn, ``log pi_T(y_t) - log
    pi_S(y_t)`` (``teacher``: each turn's teacher log-probs of its output tokens; the student's are the
    turn's ``output_logprobs``, which it must have), clipped to ``[reward_min, reward_max]`` where set: the one
    rule of the teacher scorers (``TeacherModelScorer``, ``prm_jax.scorers.TeacherLogprobScorer``). A branch
    whose first turn has no prompt token is refused: its first generated token is the branch's first token, of
    which a teacher has no log-prob (no context to condition on)."""
    if turns and len(turns[0].input_tokens) == 0 and len(turns[0].output_tokens) > 0:
        raise ValueError(f"scorer {who!r}: turn {turns[0].interaction_id!r} has no prompt token, so its first "
                         "generated token is the branch's first token and the teacher has no log-prob of it (a "
                         "log-prob is of a token given the ones before it); give the turn's input_tokens at "
                         "least one token (the prompt, or the tokenizer's BOS as the student saw it)")
    out: dict[str, np.ndarray] = {}
    for turn, logprobs in zip(turns, teacher):
        if turn.output_logprobs is None:
            raise ValueError(f"scorer {who!r}: turn {turn.interaction_id!r} has no output_logprobs (the student's "
                             "log-probs of its tokens: the distillation reward is the teacher's log-prob less the "
                             "student's)")
        reward = np.asarray(logprobs, np.float64) - np.asarray(turn.output_logprobs, np.float64)
        if reward_min is not None or reward_max is not None:
            reward = np.clip(reward, reward_min, reward_max)
        out[turn.interaction_id] = reward
    return out


# The two teachers' clip of a token's reward (``teacher_rewards``), declared once for both records.
REWARD_MIN_DOC = "The lower clip of a token's reward ``log pi_T - log pi_S``; ``None``: not clipped below."
REWARD_MAX_DOC = ("The upper clip of a token's reward; ``None``: not clipped above (with ``reward_min``, "
                  "``reward_min < reward_max``).")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherModelSettings(ModelSettings):
    reward_min: float | None = setting(None, doc=REWARD_MIN_DOC)
    reward_max: float | None = setting(None, doc=REWARD_MAX_DOC)
    refused: ClassVar[Mapping[tuple[str, ...], str]] = {
        ("output", "spread", "step_separator", "max_turns"): "are not settings of a teacher (each output token "
                                                             "gets its own reward)"}

    def check(self) -> None:
        super().check()
        reward_bounds(self.reward_min, self.reward_max)


class TeacherModelScorer(ModelScorer):
    """On-policy distillation's teacher as a JAX model on the trainer's device: ``fn(input_ids,
    attention_mask, turn_ids) -> [B, L]``, each position's token's log-prob under the teacher given the
    tokens before it (``token_logprobs(logits, input_ids)`` forms it from a causal model's logits). Each
    output token's score is the distillation reward ``log pi_T(y_t) - log pi_S(y_t)`` (``teacher_rewards``:
    the turn's ``output_logprobs`` are the student's), clipped to ``[reward_min, reward_max]`` where set, as
    ``prm_jax.scorers.TeacherLogprobScorer`` scores with a served teacher. ``score_arrays`` scores it
    through interactions (their ``output_logprobs`` from its ``logprobs``), never on the rows path, which
    has no student log-probs.

    Example:
        >>> def teacher(input_ids, attention_mask, turn_ids):     # the teacher's log-prob of each token given the ones before
        ...     return np.full(input_ids.shape, -0.5, np.float32)
        ...
        >>> turn = prm_jax.Interaction("t0", [1], [2, 3], output_logprobs=[-1.0, -0.25])
        >>> with prm_jax.BlockingRunner(scorers=[prm_jax.scorers.TeacherModelScorer(teacher, jit=False)]) as runner:
        ...     _ = runner.run([turn])
        ...
        >>> turn.token_rewards.tolist()                          # log pi_T - log pi_S
        [0.5, -0.25]
    """

    name = "teacher_model"
    reads_logprobs: ClassVar[bool] = True

    settings_class = TeacherModelSettings
    async def evaluate_batch(self, items: Sequence[tuple[Sequence[Interaction], Mapping[str, Any]]]  # type: ignore[override]
                             ) -> list[dict[str, Any]]:
        scored = await super().evaluate_batch(items)
        return [teacher_rewards(self.name, turns, [per_turn[turn.interaction_id] for turn in turns],
                                self.settings.reward_min, self.settings.reward_max)
                for (turns, _), per_turn in zip(items, scored)]


class RowChunk(NamedTuple):
    """One model call's rows (``row_chunks``): ``rows``, their indices in the batch, copied up to column ``cut``
    into ``[max_batch_size, width]`` int32 buffers (``width`` the chunk's length rounded up to its bucket;
    rows and columns past the copy hold 0, and -1 in ``turns``); ``at`` indexes them in the batch (a slice
    where they are consecutive: copied without a gather)."""

    rows: np.ndarray
    at: Any
    cut: int
    ids: np.ndarray
    mask: np.ndarray
    turns: np.ndarray


def row_lengths(live: np.ndarray) -> np.ndarray:
    """``[B]`` each row's length: its last live position + 1, 0 for a row with none."""
    width = live.shape[1]
    return np.where(live.any(axis=1), width - np.argmax(live[:, ::-1], axis=1), 0)


def chunk_order(live: np.ndarray | None, rows: np.ndarray, bucket: int | str, *, lengths: np.ndarray | None = None,
                span: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray | int, bool]:
    """The order in which ``rows`` (the rows to score; ``live``: ``[B, T]`` bool, the positions a model must
    read) are chunked, and the lengths that set each chunk's width (its longest row's, rounded up to
    ``bucket``): by length (stable, so rows of one length keep their order), as a hand-written loop sorts them
    so each chunk is padded near its own rows' length, with a length per row of the batch; as given when every
    row falls in one bucket (sorting would narrow no chunk, and consecutive rows are copied without a gather),
    which a look at the last bucket's columns tells without measuring each row, with one length for every
    chunk (an ``int``). The third value: whether the order is ``rows``' own (``rows`` increasing:
    ``row_chunks``' ``ascending``). ``lengths`` (``[B]``, each row's last live position + 1, where the caller has
    them: the native survey): read instead of ``live``; ``span`` (the longest and shortest of them, where the
    caller has those and ``rows`` are every row of length above 0: ``plan_rows``): no pass over them."""
    if span is not None and lengths is not None:
        batch, end = lengths.shape[0], span[0]
    elif lengths is not None:
        batch, end = lengths.shape[0], int(lengths.max()) if lengths.size else 0
    elif live is not None:
        columns = np.flatnonzero(live.any(axis=0))
        batch, end = live.shape[0], int(columns[-1]) + 1 if columns.size else 0
    else:
        raise ValueError("chunk_order needs live or lengths")
    if rows.size == 0:
        return rows, lengths if lengths is not None else np.zeros(batch, np.int64), True
    padded = bucket_width(end, bucket)
    below = padded // 2 if bucket == "pow2" else padded - int(bucket)  # (lengths above it share the bucket)
    if lengths is None:
        assert live is not None
        if end and bool(np.asarray(live[:, below:end].any(axis=1))[rows].all()):
            return rows, end, True
        lengths = row_lengths(live) if live.shape[1] else np.zeros(batch, np.int64)
    elif end and (span[1] > below if span is not None else bool((lengths[rows] > below).all())):
        return rows, end, True
    return rows[np.argsort(lengths[rows], kind="stable")], lengths, False


class ChunkSlot(NamedTuple):
    """Where one model call's rows go (``chunk_slots``): ``rows`` (their indices in the batch), ``at`` (a slice
    where they are consecutive), the call's width ``padded`` (its longest row's length rounded up to the
    bucket) and ``cut``, the columns copied (``min(padded, T)``)."""

    rows: np.ndarray
    at: Any
    padded: int
    cut: int


def chunk_slots(order: np.ndarray, lengths: np.ndarray | int, size: int, bucket: int | str, width: int, *,
                ascending: bool = False) -> Iterator[ChunkSlot]:
    """``order``'s rows ``size`` at a time (``ChunkSlot``), each call padded to its longest row's length
    (``lengths``: ``[B]``, or one length for every call, ``chunk_order``'s) rounded up to ``bucket``; a call whose
    rows all have length 0 is skipped. ``ascending``: ``order`` holds distinct rows in increasing order
    (``chunk_order``'s unsorted case), so a chunk spanning as many rows as it holds is a slice. ``width``: the
    arrays' ``T``."""
    count = order.size
    begins = range(0, count, size)
    # Each chunk's longest row in one pass, and each length's bucket once (a chunk of 8 rows is a few us of
    # work: no numpy call per chunk but the slice of its members).
    if isinstance(lengths, np.ndarray):
        longest = np.maximum.reduceat(lengths[order], begins).tolist() if count else []
    else:
        longest = [lengths] * len(begins)
    widths = {length: bucket_width(length, bucket) for length in set(longest) if length}
    for begin, length in zip(begins, longest):
        if length == 0:
            continue
        members = order[begin:begin + size]
        at: Any = members
        if ascending:
            first, last = int(members[0]), int(members[-1])
            at = slice(first, last + 1) if last - first == members.size - 1 else members
        yield ChunkSlot(members, at, widths[length], min(widths[length], width))


def row_chunks(input_ids: np.ndarray, attention_mask: np.ndarray | None, turn_ids: np.ndarray, order: np.ndarray,
               lengths: np.ndarray | int, size: int, bucket: int | str, *, ascending: bool = False,
               valid: np.ndarray | None = None) -> Iterator[RowChunk]:
    """The model calls of ``order``'s rows, ``size`` at a time (``RowChunk``), each padded to its longest row's
    length rounded up to ``bucket`` (``chunk_slots``); rows of length 0 are skipped. ``attention_mask``
    ``None``: every position attends. ``valid`` (``[B, T]`` bool): the positions whose turn ids are read, -1
    written elsewhere (``score_arrays``: a token without attention is never scored); default: the ids as
    given, those below -1 written -1 (the model's ``turn_ids`` are -1 off the turns)."""
    for members, rows, padded, cut in chunk_slots(order, lengths, size, bucket, turn_ids.shape[1],
                                                  ascending=ascending):
        count = members.size
        shape = (size, padded)
        ids, mask, turns = np.zeros(shape, np.int32), np.zeros(shape, np.int32), np.full(shape, -1, np.int32)
        ids[:count, :cut] = input_ids[rows, :cut]
        if attention_mask is None:
            mask[:count, :cut] = 1
        else:
            mask[:count, :cut] = attention_mask[rows, :cut]
        turns[:count, :cut] = turn_ids[rows, :cut]
        np.maximum(turns[:count, :cut], -1, out=turns[:count, :cut])
        if valid is not None:
            np.copyto(turns[:count, :cut], -1, where=~valid[rows, :cut])
        yield RowChunk(members, rows, cut, ids, mask, turns)


def weighted_rows(scorer: ModelScorer, raw: np.ndarray, rows: Sequence[int]) -> tuple[np.ndarray, dict[int, str]]:
    """``weight * raw`` as float32, as ``weighted_rewards`` gives each turn (``weighted_float32``; float32
    scores of weight 1 are already that, and are not copied), and for each row (``rows``: the rows of ``raw``
    in the caller's numbering) whose raw score or weighted reward is not finite in float32, the message naming
    the scorer and the row: only those rows fail."""
    if raw.dtype == np.float32 and scorer.weight == 1.0:
        weighted = raw
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            _, weighted = weighted_float32(raw.astype(np.float64), scorer.weight)
    errors: dict[int, str] = {}
    if np.isfinite(weighted).all():
        return weighted, errors
    for k in np.flatnonzero(~np.isfinite(weighted).all(axis=1)).tolist():
        what = ("the model returned non-finite scores" if not np.isfinite(raw[k]).all() else
                f"reward * weight ({scorer.weight}) is non-finite")
        errors[int(rows[k])] = f"scorer {scorer.name!r} on row {int(rows[k])}: {what}"
    return weighted, errors
