"""Scoring a trainer's token arrays: ``[B, T]`` rows to scorer inputs, process rewards back to ``[B, T]``.

A trainer holds padded token arrays and turn ids, not sessions. ``chains_from_arrays`` turns each real row
into the chain of interactions a scorer reads (turn ``k`` = the row's tokens with turn id ``k``, its input
= every token before them), sharing the row's token buffer instead of copying prefixes;
``token_rewards_from_chains`` writes the committed rewards back onto the same positions; ``score_arrays``
does both around ``PRMRunner.run_many``. No ``InteractionCache`` and no ``pack_branches``: the trainer's
own arrays stay the batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, overload

import anyio
import numpy as np

from prm_jax._validation import integer_dtype
from prm_jax.kernels._shaping import warn_gvpo_without_penalty
from prm_jax.native._ffi import (
    SURVEY_NOT_BINARY,
    SURVEY_OUTSIDE,
    SURVEY_STRAY,
    HostRows,
    PlannedRows,
    chunk_rows,
    host_rows,
    plan_rows,
    scores_placer,
    survey_rows,
)
from prm_jax.runtime._context import METADATA_KEY, check_metadata
from prm_jax.runtime._model_scorer import RowChunk, chunk_order, chunk_slots, row_chunks, weighted_rows
from prm_jax.runtime._runner import (
    NOT_SCORER_FAILURES,
    PRMRunner,
    RunnerClosedError,
    error_text,
    guarded_progress,
)
from prm_jax.runtime._steps import place_steps
from prm_jax.runtime._trajectory import TOKEN_ID_RANGE, Interaction, stray_token_id, turn_counts, turn_spans


def scored_turn_ids(turn_ids: Any, attention_mask: Any = None) -> np.ndarray:
    """The turn ids that scoring reads: ``turn_ids`` where ``attention_mask`` is set, -1 elsewhere (a token
    without attention, padding, is never scored nor rewarded, whatever id it carries)."""
    ids = _integers("turn_ids", turn_ids)
    if attention_mask is None:
        return ids
    mask = np.asarray(attention_mask)
    _same_shape("attention_mask", mask, ids.shape)
    return np.where(mask.astype(bool), ids, -1)


class _Rows(NamedTuple):
    """A trainer's arrays as the row path reads them (``_checked_rows``, ``_surveyed_rows``)."""

    tokens: np.ndarray  # [B, T] int, token ids in TOKEN_ID_RANGE
    turn_ids: np.ndarray  # [B, T] int, as given
    attention: np.ndarray | None  # [B, T] bool or integers, read as nonzero; None: every position attends
    valid: np.ndarray | None  # [B, T] bool: a turn's token (turn id >= 0, with attention); None: not formed
    outside: bool  # whether some turn id >= 0 lies outside the attention mask (then not read)

    def turn_tokens(self) -> np.ndarray:
        """``valid``, formed here where the checks did not form it (the native survey writes no ``[B, T]``)."""
        if self.valid is not None:
            return self.valid
        present = self.turn_ids >= 0
        return present if self.attention is None else present & (self.attention != 0)


def _checked_rows(input_ids: Any, turn_ids: Any, attention_mask: Any) -> _Rows:
    """The checks of a trainer's arrays, once for both paths (``chains_from_arrays``, the row path): integer
    ``[B, T]`` token ids in ``TOKEN_ID_RANGE`` and turn ids of their shape, an attention mask of it; no masked
    copy of the turn ids is made (``valid`` says where they are read)."""
    tokens = _integers("input_ids", input_ids)
    if tokens.ndim != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {tokens.shape}")
    ids = _integers("turn_ids", turn_ids)
    _same_shape("turn_ids", ids, tokens.shape)
    stray = stray_token_id(tokens)
    if stray is not None:
        raise ValueError(f"input_ids must hold token ids in {TOKEN_ID_RANGE}, got {stray}")
    valid = ids >= 0
    if attention_mask is None:
        return _Rows(tokens, ids, None, valid, False)
    mask = np.asarray(attention_mask)
    _same_shape("attention_mask", mask, ids.shape)
    attention = mask if mask.dtype == bool else mask != 0
    present = np.count_nonzero(valid)
    valid &= attention
    return _Rows(tokens, ids, attention, valid, np.count_nonzero(valid) != present)


def _numpy_rows(input_ids: Any, turn_ids: Any, attention_mask: Any) -> tuple[_Rows, np.ndarray]:
    """The row path's checks by numpy's passes (``_checked_rows``, then ``turn_counts``: their errors, in their
    order), with ``[B]`` each row's number of turns."""
    rows_in = _checked_rows(input_ids, turn_ids, attention_mask)
    assert rows_in.valid is not None
    return rows_in, turn_counts(rows_in.turn_ids, rows_in.valid)


def _surveyed_rows(input_ids: Any, turn_ids: Any, attention_mask: Any) -> tuple[_Rows, np.ndarray, np.ndarray | None]:
    """The row path's checks, ``_checked_rows``' and ``turn_counts``' (their errors, in their order), with ``[B]``
    each row's number of turns and, from the native survey, each row's length (last attended position + 1).
    One native pass where the library is at hand and the arrays are C-contiguous integers (``survey_rows``:
    nothing ``[B, T]`` is written), else numpy's passes; a batch the survey finds wrong is checked again
    with numpy, which raises the error by its one rule."""
    tokens, ids = np.asarray(input_ids), np.asarray(turn_ids)
    mask = None if attention_mask is None else np.asarray(attention_mask)
    surveyed = survey_rows(tokens, ids, mask)
    if surveyed is None or surveyed[0] & SURVEY_STRAY or bool((surveyed[1] < 0).any()):
        return (*_numpy_rows(input_ids, turn_ids, attention_mask), None)
    flags, counts, lengths = surveyed
    attention = mask if mask is None or not flags & SURVEY_NOT_BINARY else mask != 0
    return _Rows(tokens, ids, attention, None, bool(flags & SURVEY_OUTSIDE)), counts, lengths


def _planned_rows(input_ids: Any, turn_ids: Any, attention_mask: Any) -> tuple[_Rows, HostRows, PlannedRows] | None:
    """The row path's first step where its checks are made as the rows are copied (``_fused_chunks``: one
    ``ModelScorer``, arrays the native host functions take, ``host_rows``): the arrays, as ``_Rows`` and for the
    host functions, and each row's length (``plan_rows``: the mask read back from each row's end, with the
    span of the lengths); a row of length 0, never copied, has its tokens checked here. ``None`` elsewhere (the
    caller surveys the rows first: ``_surveyed_rows``)."""
    tokens, ids = np.asarray(input_ids), np.asarray(turn_ids)
    mask = None if attention_mask is None else np.asarray(attention_mask)
    host = host_rows(tokens, ids, mask)
    if host is None:
        return None
    plan = plan_rows(host)
    if plan.flags & SURVEY_STRAY:
        _raise_row_error(tokens, ids, mask)
    return _Rows(tokens, ids, mask, None, False), host, plan


def _raise_row_error(tokens: np.ndarray, ids: np.ndarray, mask: np.ndarray | None) -> None:
    """The error of arrays a native check found wrong, raised by numpy's checks (``_numpy_rows``: one rule, one
    message, the first row in the batch's order)."""
    _numpy_rows(tokens, ids, mask)
    raise AssertionError("the native checks of score_arrays' rows found an error numpy's checks do not")


def _fused_chunks(host: HostRows, plan: PlannedRows, scored: np.ndarray, counts: np.ndarray, size: int,
                  bucket: int | str) -> list[RowChunk]:
    """``row_chunks``' chunks of the rows ``scored`` (``chunk_order``'s plan by ``plan``'s lengths; ``plan``'s span
    read where ``scored`` are every row of length above 0), with the rows' checks made as they are copied, every
    chunk in one native pass (``chunk_rows``: each array read once, as a hand-written loop's copies read it;
    issue 56.6), each row's number of turns written into ``counts``; a wrong row raises numpy's error
    (``_raise_row_error``) before any chunk is returned. A row with attention and no turn is found only as it is
    copied: where there is one, the rest are planned and copied again (the chunks are then the survey's, row
    for row)."""
    lengths = plan.lengths
    span = (plan.longest, plan.shortest) if scored.size == plan.scored else None
    for _ in range(2):
        order, chunk_lengths, ascending = chunk_order(None, scored, bucket, lengths=lengths, span=span)
        slots = list(chunk_slots(order, chunk_lengths, size, bucket, host.tokens.shape[1], ascending=ascending))
        if not slots:
            return []
        members = np.concatenate([slot.rows for slot in slots]) if len(slots) > 1 else slots[0].rows
        flags, flat_ids, flat_mask, flat_turns, found = chunk_rows(
            host, members, [slot.rows.size for slot in slots], [slot.padded for slot in slots], size)
        fewest = int(found.min())
        if flags & SURVEY_STRAY or fewest < 0:
            _raise_row_error(host.tokens, host.turn_ids, host.attention)
        counts[members] = found
        if fewest > 0:
            break
        scored, span = np.sort(members[found > 0]), None  # (then every row has a turn: one more pass at most)
    if len({slot.padded for slot in slots}) == 1:  # (one width: each block a view of one reshape, no slicing)
        padded = slots[0].padded
        ids, mask, turns = (flat.reshape(len(slots), size, padded) for flat in (flat_ids, flat_mask, flat_turns))
        return [RowChunk(members, at, cut, ids[c], mask[c], turns[c])
                for c, (members, at, _, cut) in enumerate(slots)]
    out, offset = [], 0
    for members, at, padded, cut in slots:
        block = slice(offset, offset + size * padded)
        out.append(RowChunk(members, at, cut, *(flat[block].reshape(size, padded)
                                                 for flat in (flat_ids, flat_mask, flat_turns))))
        offset += size * padded
    return out


def chains_from_arrays(input_ids: Any, turn_ids: Any, *, attention_mask: Any = None, logprobs: Any = None,
                       rewards: Any = None, row_ids: Sequence[str] | None = None) -> list[list[Interaction] | None]:
    """One chain of interactions per row (``None`` for a padding row or a row without turns).

    Args:
      input_ids: ``[B, T]`` int token ids.
      turn_ids: ``[B, T]`` int, the turn of each generated token (0, 1, ... in order, each turn contiguous),
        -1 elsewhere (``turn_ids_from_spans`` builds it from spans); ids where ``attention_mask`` is 0 are
        not read (``scored_turn_ids``).
      attention_mask: ``[B, T]``; a row with none is padding. Default: every row is real.
      logprobs: ``[B, T]`` behaviour log-probs of the tokens, given to scorers as ``output_logprobs``.
      rewards: ``[B]`` outcome rewards, set on each row's last turn.
      row_ids: names of the rows (interaction ids are ``f"{row_id}/t{k}"``); default ``row{b}``.

    Example:
        >>> chains = prm_jax.runtime.chains_from_arrays(np.array([[1, 2, 3, 4, 5]]), np.array([[-1, 0, 0, -1, 1]]))
        >>> [(turn.interaction_id, turn.input_tokens.tolist(), turn.output_tokens.tolist()) for turn in chains[0]]
        [('row0/t0', [1], [2, 3]), ('row0/t1', [1, 2, 3, 4], [5])]
    """
    checked = _checked_rows(input_ids, turn_ids, attention_mask)
    tokens, rows = checked.tokens, checked.tokens.shape[0]
    ids = np.where(checked.turn_tokens(), checked.turn_ids, -1)  # (turn_spans reads each row's ids >= 0)
    real: np.ndarray = (np.ones(rows, bool) if checked.attention is None else
                        np.asarray(checked.attention.any(axis=1)))
    logp = None
    if logprobs is not None:
        logp = np.asarray(logprobs)
        _same_shape("logprobs", logp, tokens.shape)
        logp = logp.astype(np.float32)
    outcome = None
    if rewards is not None:
        outcome = np.asarray(rewards)
        _same_shape("rewards", outcome, (rows,))
        outcome = outcome.astype(np.float64)
    names = [f"row{b}" for b in range(rows)] if row_ids is None else list(row_ids)
    if len(names) != rows:
        raise ValueError(f"row_ids has {len(names)} names for {rows} rows")
    chains: list[list[Interaction] | None] = []
    for b in range(rows):
        spans = turn_spans(ids[b], b) if real[b] else []
        if not spans:
            chains.append(None)
            continue
        row = tokens[b].astype(np.int64)  # one buffer per row: every turn's input is a view of it
        chain: list[Interaction] = []
        for k, (start, end) in enumerate(spans):
            chain.append(Interaction(
                f"{names[b]}/t{k}", row[:start], row[start:end], parent_id=chain[-1].interaction_id if chain else None,
                output_logprobs=None if logp is None else logp[b, start:end],
                reward=float(outcome[b]) if outcome is not None and k == len(spans) - 1 else None))
        chains.append(chain)
    return chains


def _integers(name: str, value: Any) -> np.ndarray:
    """An integer array: float token ids (7.7) were truncated to 7 by a cast."""
    array = np.asarray(value)
    integer_dtype(name, array.dtype)
    return array


def _same_shape(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    """Exactly ``shape``: a transposed ``[T, B]`` array was reshaped into ``[B, T]`` (scrambled, silently)."""
    if array.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (input_ids' [B, T] or [B]), got {array.shape}")


def call_checks(input_ids: Any, on_error: Any, metadata: Any) -> list[dict[str, Any]] | None:
    """``score_arrays``' checks of its call, before anything is scored (its async form and
    ``BlockingRunner``'s row path): ``on_error``, and ``metadata`` against the rows (``row_metadata``)."""
    if on_error not in ("raise", "mask"):
        raise ValueError(f"on_error must be 'raise' or 'mask', got {on_error!r}")
    return row_metadata(metadata, np.shape(input_ids)[0]) if np.ndim(input_ids) >= 1 else None


def refuse_closed(runner: PRMRunner) -> None:
    """The row path's refusal of a closed runner (the interactions' path has ``run_many``'s)."""
    if runner.closed:
        raise RunnerClosedError("PRMRunner is closed: score_arrays is rejected once aclose() has started")


def count_failures(runner: PRMRunner, failures: list[Any]) -> None:
    """Each failure ``score_rows_now`` listed, counted against its scorer, on the runner's loop."""
    for scorer in failures:
        runner.count_failure(scorer)


def _first_failure(group: BaseExceptionGroup, scored: list[int]) -> BaseException:
    """``on_error="raise"``: the failure that stopped the batch, the scorer's own error (its notes name the
    scorer and the turn, ``row{b}/t{k}``), with a note naming its row; not the group of the cancelled rest."""
    leaves = [e for e in _leaves(group) if isinstance(e, Exception)]
    first = next((e for e in leaves if hasattr(e, "prm_branch")), leaves[0] if leaves else group)
    branch = getattr(first, "prm_branch", None)
    if branch is not None:
        first.add_note(f"score_arrays: row {scored[branch]} of input_ids failed; the batch was stopped (pass "
                        "on_error='mask' to keep the other rows)")
    return first


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for error in group.exceptions:
        out.extend(_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    return out


def row_models(runner: PRMRunner) -> list[Any] | None:
    """The runner's enabled scorers when every one scores whole rows of arrays (``ModelScorer.score_rows``)
    and none reads the student's log-probs (a teacher, ``reads_logprobs``): then ``score_arrays`` hands them
    the arrays, chunk by chunk, and builds no interactions."""
    enabled = [scorer for scorer in runner.scorers if scorer.enabled]
    if runner.active and enabled and all(callable(getattr(scorer, "score_rows", None))
                                         and not getattr(scorer, "reads_logprobs", False) for scorer in enabled):
        return enabled
    return None


async def _score_rows(runner: PRMRunner, models: list[Any], input_ids: Any, turn_ids: Any, attention_mask: Any,
                      on_error: OnError, per_turn: bool,
                      progress: Callable[[int, int], None] | None) -> np.ndarray | ScoredArrays:
    """``score_arrays`` for a runner of ``ModelScorer``s: ``score_rows_now`` in one call on a worker thread (one
    hop a call, not one a chunk: on a GPU the host path is all there is beside the model, issue 56.6), its
    progress reported back on the loop, its scorers' failures counted there."""
    refuse_closed(runner)
    failures: list[Any] = []
    report = None if progress is None else (lambda done, total: anyio.from_thread.run_sync(progress, done, total))
    try:
        return await anyio.to_thread.run_sync(functools.partial(
            score_rows_now, models, input_ids, turn_ids, attention_mask, on_error, per_turn, report, failures,
            runner.shaping_mode))
    finally:
        count_failures(runner, failures)


def score_rows_now(models: list[Any], input_ids: Any, turn_ids: Any, attention_mask: Any, on_error: OnError,
                   per_turn: bool, progress: Callable[[int, int], Any] | None, failures: list[Any],
                   shaping_mode: str | None) -> np.ndarray | ScoredArrays:
    """The row path of ``score_arrays`` (every enabled scorer a ``ModelScorer``, ``row_models``), synchronous
    in the calling thread: the same numbers as the interactions' path (``weight * raw`` in float32 per scorer,
    summed in config order), a failed chunk failing its rows; each failure's scorer is appended to
    ``failures`` (the caller counts them on the runner's loop). ``BlockingRunner.score_arrays`` calls it in the
    trainer's own thread."""
    # One scorer: the rows checked as they are copied into its chunks (_fused_chunks); else checked first.
    planned = _planned_rows(input_ids, turn_ids, attention_mask) if len(models) == 1 and not per_turn else None
    if planned is None:
        rows_in, counts, lengths = _surveyed_rows(input_ids, turn_ids, attention_mask)  # (every row's turns, as chains)
        scored = np.flatnonzero(counts)
        turns = int(counts.max()) if counts.size else 0
    else:
        rows_in, host, plan = planned
        lengths = plan.lengths
        counts = np.zeros(lengths.shape, np.int64)  # (filled as the chunks are made)
        scored, turns = np.flatnonzero(lengths), 0  # (turns: the width of per_turn's tables, not made here)
    tokens, attention = rows_in.tokens, rows_in.attention
    rows = tokens.shape[0]
    failed = np.zeros(rows, bool)
    errors: dict[int, str] = {}
    total: np.ndarray | None = None
    per_scorer: dict[str, np.ndarray] = {}
    live = None if lengths is not None else attention if attention is not None else np.ones(tokens.shape, bool)
    # Turn ids outside the attention mask are not read: written -1 in the chunks (only where there are any).
    outside = rows_in.turn_tokens() if rows_in.outside else None
    for scorer in models:
        report = progress if scorer is models[-1] else None
        if planned is None:
            order, chunk_lengths, ascending = chunk_order(live, scored, scorer.settings.bucket, lengths=lengths)
            chunks: Iterable[RowChunk] = row_chunks(tokens, attention, rows_in.turn_ids, order, chunk_lengths,
                                                    scorer.max_batch_size, scorer.settings.bucket,
                                                    ascending=ascending, valid=outside)
        else:
            chunks = _fused_chunks(host, plan, scored, counts, scorer.max_batch_size, scorer.settings.bucket)
        weighted, means, chunk_errors = _score_chunks(scorer, chunks, tokens.shape, counts, turns, on_error,
                                                      per_turn, report)
        for row, message in chunk_errors.items():
            failed[row] = True
            errors.setdefault(row, message)
            failures.append(scorer)
        if total is None:
            total = weighted
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                total = (total + weighted).astype(np.float32)
        if per_turn:
            per_scorer[scorer.name] = means.astype(np.float32)
    if total is None:
        total = np.zeros(tokens.shape, np.float32)
    if len(models) > 1:  # (one scorer's rows were checked as they came: weighted_rows)
        finite: np.ndarray = np.isfinite(total.sum(axis=1, dtype=np.float64))
        for row in [row for row in scored.tolist() if not failed[row] and not finite[row]]:
            message = (f"the committed token rewards of row {row} would be non-finite (the float32 sum over "
                       f"scorers {[scorer.name for scorer in models]} overflows); nothing was committed")
            if on_error == "raise":
                raise ValueError(message)
            failed[row], errors[row] = True, f"ValueError: {message}"
    if errors:  # (NaN on a failed row's turns: formed once, the survey formed no [B, T] mask)
        failed_rows = np.flatnonzero(failed)
        total[failed_rows] = np.where(rows_in.turn_tokens()[failed_rows], np.float32(np.nan), np.float32(0.0))
    if on_error == "raise" and not per_turn:
        if shaping_mode == "gvpo" and counts.any() and not (total < 0).any():  # (counts: the fused path's too)
            warn_gvpo_without_penalty(stacklevel=3)
        return total
    if shaping_mode == "gvpo" and (~failed).any() and not (total[~failed] < 0).any():
        warn_gvpo_without_penalty(stacklevel=3)
    out = ScoredArrays(total, failed, errors)
    if not per_turn:
        return out
    return out._replace(**_turn_tables(per_scorer, failed, {row: int(counts[row]) for row in scored.tolist()},
                                       (rows, turns)))


def _score_chunks(scorer: Any, chunks: Iterable[RowChunk], shape: tuple[int, ...], counts: np.ndarray, turns: int,
                  on_error: OnError, per_turn: bool,
                  report: Callable[[int, int], Any] | None) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """One ``ModelScorer``'s ``chunks`` of the scored rows of ``[B, T]`` arrays (``shape``), synchronously: its weighted
    rewards ``[B, T]`` float32 (0 off the turns), its per-turn means ``[B, K]`` (``per_turn``) and the rows
    that failed with their message (each counts against the scorer). A failed chunk fails its rows
    (``on_error="mask"``) or raises with a note naming them; a row with a non-finite score fails alone. The
    model is called on every chunk before any output is read (``_calls``), so the device computes while the
    host builds the next chunks. A model's float32 token scores of weight 1, placed as they come (no
    ``spread``) and without ``per_turn``, are written straight onto the turns' positions (every chunk in one
    native pass where the library is at hand: ``ScoresPlacer``) and checked for finiteness once for the batch
    (issue 56.6: on a GPU the host path is all there is beside the model)."""
    weighted = np.zeros(shape, np.float32)
    means = np.zeros((shape[0], turns), np.float64)
    errors: dict[int, str] = {}
    done = 0
    direct = (scorer.settings.output == "tokens" and scorer.spread is None and scorer.weight == 1.0
              and not per_turn)
    written: list[Any] = []  # the chunks written straight, not yet checked for finiteness
    placer = scores_placer(weighted) if direct else None  # (None: numpy writes them)
    unchecked = False  # whether one of them may hold a non-finite score (the placer says which do not)

    def commit(chunk: Any, chunk_weighted: np.ndarray, bad: dict[int, str]) -> None:
        if bad and on_error == "raise":
            raise ValueError(next(iter(bad.values())))
        if bad:  # only the rows with a non-finite score fail
            positions = {row: k for k, row in enumerate(chunk.rows.tolist())}
            for row, message in bad.items():
                errors.setdefault(row, f"ValueError: {message}")
                chunk_weighted[positions[row]] = 0.0
        weighted[chunk.at, :chunk.cut] = chunk_weighted

    def check_written() -> None:
        nonlocal unchecked
        if placer is not None:  # (the chunks the placer holds written first, in one native pass)
            unchecked |= placer.place()
        if written and unchecked and not np.isfinite(weighted).all():
            for chunk in written:
                chunk_weighted = weighted[chunk.at, :chunk.cut]
                commit(chunk, chunk_weighted, weighted_rows(scorer, chunk_weighted, chunk.rows.tolist())[1])
        written.clear()
        unchecked = False

    calls = _calls(scorer, chunks, counts, stop_at_error=on_error == "raise")
    total = sum(chunk.rows.size for chunk, _ in calls)
    for chunk, pending in calls:
        count, cut = chunk.rows.size, chunk.cut
        try:
            if isinstance(pending, Exception):
                raise pending
            scores = scorer._fetch(pending, chunk.ids.shape)
            straight = direct and scores.dtype == np.float32
            if not straight:
                raw = scorer._on_turns(chunk, scores)
                if scorer.spread is not None:
                    raw = place_steps(raw, chunk.ids[:count, :cut], chunk.turns[:count, :cut], scorer.rule,
                                      scorer.spread, rows=chunk.rows.tolist())
                chunk_weighted, bad = weighted_rows(scorer, raw, chunk.rows.tolist())
        except Exception as err:
            if on_error == "raise":
                check_written()  # (an earlier chunk's non-finite row is the first failure)
                err.add_note(f"score_arrays: rows {chunk.rows.tolist()} of input_ids (one call of scorer "
                              f"{scorer.name!r}) failed")
                raise
            for row in chunk.rows.tolist():
                errors.setdefault(row, error_text(err))
        else:
            if straight:
                if placer is None or not placer.add(scores, chunk.turns, chunk.rows, cut):
                    on_turns = chunk.turns[:count, :cut] >= 0  # (-1 off the turns: row_chunks)
                    if isinstance(chunk.at, slice):
                        np.copyto(weighted[chunk.at, :cut], scores[:count, :cut], where=on_turns)
                    else:
                        weighted[chunk.at, :cut] = np.where(on_turns, scores[:count, :cut], np.float32(0))
                    unchecked = True
                written.append(chunk)
            else:
                check_written()
                commit(chunk, chunk_weighted.copy() if bad and chunk_weighted is raw else chunk_weighted, bad)
            if per_turn:
                product = raw.astype(np.float64) * scorer.weight
                on_turn_ids = chunk.turns[:count, :cut]
                for k in range(turns):
                    on_turn = on_turn_ids == k
                    seen = on_turn.sum(axis=1)
                    means[chunk.at, k] = np.where(seen > 0, (product * on_turn).sum(axis=1) / np.maximum(seen, 1),
                                                    0.0)
        done += count
        if report is not None:
            report(done, total)
    check_written()
    return weighted, means, errors


def _calls(scorer: Any, chunks: Iterable[RowChunk], counts: np.ndarray, stop_at_error: bool) -> list[tuple[Any, Any]]:
    """Each of ``chunks`` (``row_chunks``, ``_fused_chunks``) with the model's output for it, the model called on
    every chunk before any output is read (a jitted model's outputs are computed asynchronously), or the error
    that refused the chunk: a row beyond ``max_turns`` (``output="turns"``), or the call's own;
    ``stop_at_error``: no chunk is called after one that failed (``on_error="raise"`` stops there)."""
    out: list[tuple[Any, Any]] = []
    for chunk in chunks:
        try:
            if scorer.settings.output == "turns" and int(counts[chunk.rows].max()) > scorer.settings.max_turns:
                row = int(chunk.rows[int(np.argmax(counts[chunk.rows] > scorer.settings.max_turns))])
                raise ValueError(f"scorer {scorer.name!r}: row {row} has more turns than "
                                 f"max_turns={scorer.settings.max_turns}")
            out.append((chunk, scorer._call(chunk.ids, chunk.mask, chunk.turns)))
        except Exception as err:
            out.append((chunk, err))
            if stop_at_error:
                break
    return out


def _turn_tables(per_scorer: dict[str, np.ndarray], failed: np.ndarray, turns_of: Mapping[int, int],
                 shape: tuple[int, int]) -> dict[str, Any]:
    """``ScoredArrays``' per-turn fields from each scorer's ``[B, K]`` table: their sum, NaN on failed rows
    (in each table too), and which turns exist (``turns_of``: a scored row's number of turns)."""
    total = np.zeros(shape, np.float32)
    for table in per_scorer.values():
        total += table
        table[failed] = np.nan
    total[failed] = np.nan
    exists = np.zeros(shape, bool)
    for row, count in turns_of.items():
        exists[row, :count] = not failed[row]
    return {"turn_scores": total, "per_scorer": per_scorer, "turn_mask": exists}


ROW_KEY = "row"  # the context entry score_arrays adds: the row of the arrays a branch was built from


def row_metadata(metadata: Sequence[Mapping[str, Any] | None] | None, rows: int) -> list[dict[str, Any]] | None:
    """``score_arrays``' ``metadata``: one entry per row of ``input_ids`` (``None``: no metadata for that
    row), each under ``check_metadata``'s rule (a session's ``metadata``), named ``metadata[b]``."""
    if metadata is None:
        return None
    if isinstance(metadata, (Mapping, str, bytes)) or not isinstance(metadata, Sequence):
        raise ValueError(f"metadata must be a list of one mapping (or None) per row of input_ids ({rows}), got "
                         f"{type(metadata).__name__}")
    if len(metadata) != rows:
        raise ValueError(f"metadata has {len(metadata)} entries for {rows} rows of input_ids")
    return [check_metadata({} if m is None else dict(m) if isinstance(m, Mapping) else m, f"metadata[{b}]")
            for b, m in enumerate(metadata)]


def _row_contexts(ctx: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None, rows: int,
                  scored: list[int], metadata: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each scored row's context: the caller's (one mapping for all rows, or one per row) plus
    ``ctx["row"]``, the row's index in the arrays (what a scorer reads the caller's per-row entries by), and
    ``ctx["metadata"]``, the row's ``metadata`` (``{}`` without it, unless the caller's ctx sets the key)."""
    if ctx is None or isinstance(ctx, Mapping):
        per_row: list[Mapping[str, Any] | None] = [ctx] * rows
        named = "ctx"
    else:
        per_row = list(ctx)
        if len(per_row) != rows:
            raise ValueError(f"ctx must be one mapping, or one entry per row of input_ids ({rows}), got "
                             f"{len(per_row)} entries")
        named = "ctx[{b}]"
    out = []
    for b in scored:
        entry = dict(per_row[b] or {})
        if ROW_KEY in entry:
            raise ValueError(f"{named.format(b=b)}[{ROW_KEY!r}] is set by score_arrays (each row's index); use "
                             "another key")
        if metadata is not None and METADATA_KEY in entry:
            raise ValueError(f"{named.format(b=b)}[{METADATA_KEY!r}] and metadata= both give row {b}'s metadata: "
                             "pass it once (metadata=)")
        entry[ROW_KEY] = b
        if metadata is not None or METADATA_KEY not in entry:
            entry[METADATA_KEY] = metadata[b] if metadata is not None else {}
        out.append(entry)
    return out


def _masked(token_rewards: np.ndarray, turn_ids: np.ndarray, scored: list[int], results: list[Any],
            runner: PRMRunner) -> ScoredArrays:
    failed = np.zeros(token_rewards.shape[0], bool)
    errors: dict[int, str] = {}
    for row, result in zip(scored, results):
        if isinstance(result, NOT_SCORER_FAILURES):
            raise result
        if isinstance(result, Exception):
            failed[row], errors[row] = True, error_text(result)
    token_rewards[failed[:, None] & (turn_ids >= 0)] = np.nan
    if runner.shaping_mode == "gvpo" and (~failed).any() and not (token_rewards[~failed] < 0).any():
        warn_gvpo_without_penalty(stacklevel=3)
    return ScoredArrays(token_rewards, failed, errors)


def _turn_scores(chains: list[list[Interaction] | None], scored: list[int], results: list[Any],
                 failed: np.ndarray) -> dict[str, Any]:
    """``turn_scores`` and ``per_scorer`` from what each row's run committed (``PRMTurnResult.reward``)."""
    turns = max((len(chain) for chain in chains if chain), default=0)
    per_scorer: dict[str, np.ndarray] = {}
    for row, result in zip(scored, results):
        if isinstance(result, Exception):
            continue
        chain = chains[row]
        assert chain is not None
        index = {turn.interaction_id: k for k, turn in enumerate(chain)}
        for turn_result in result:
            table = per_scorer.setdefault(turn_result.scorer, np.zeros((len(chains), turns), np.float32))
            table[row, index[turn_result.interaction_id]] += turn_result.reward
    return _turn_tables(per_scorer, failed, {row: len(chains[row] or ()) for row in scored}, (len(chains), turns))


def token_rewards_from_chains(chains: Sequence[Sequence[Interaction] | None], turn_ids: Any) -> np.ndarray:
    """``[B, T]`` float32: each turn's committed ``token_rewards`` on its positions, 0 elsewhere.

    Args:
        chains: One scored chain of turns per row (``None`` for a row without one).

    Example:
        >>> turn_ids = np.array([[-1, 0, 0, -1, 1]])
        >>> chains = prm_jax.runtime.chains_from_arrays(np.array([[1, 2, 3, 4, 5]]), turn_ids)
        >>> with prm_jax.BlockingRunner(scorers=[prm_jax.scorers.LengthBudgetScorer(max_output_tokens=1)]) as runner:
        ...     _ = runner.run(chains[0])
        ...
        >>> prm_jax.runtime.token_rewards_from_chains(chains, turn_ids).tolist()
        [[0.0, 0.0, 0.0, 0.0, 1.0]]
    """
    ids = np.asarray(turn_ids)
    out = np.zeros(ids.shape, np.float32)
    for b, chain in enumerate(chains):
        if not chain:
            continue
        values = [t.token_rewards if t.token_rewards is not None else np.zeros(t.output_len, np.float32)
                  for t in chain]
        out[b, ids[b] >= 0] = np.concatenate(values)
    return out


class ScoredArrays(NamedTuple):
    """``score_arrays(..., on_error="mask")`` or ``per_turn=True``: what scored, which rows a scorer failed on,
    and (``per_turn``) the per-turn scores. A failed row holds NaN (never a silent 0).

    Attributes:
        failed: ``[B]`` bool: the rows a scorer failed on (their turn positions hold NaN).
        errors: Each failed row's error, in words, by row.
        turn_scores: ``[B, K]`` each turn's weighted reward summed over scorers (``per_turn=True``); else ``None``.
        per_scorer: Each scorer's weighted contribution ``[B, K]`` (``per_turn=True``); else ``None``.
        turn_mask: ``[B, K]`` bool: the turns a row has (``per_turn=True``); else ``None``.

    Example:
        >>> with prm_jax.BlockingRunner(scorers=[prm_jax.scorers.LengthBudgetScorer(max_output_tokens=1)]) as runner:
        ...     out = runner.score_arrays(np.array([[1, 2, 3, 4]]), np.array([[-1, 0, -1, 1]]), per_turn=True)
        ...
        >>> out.token_rewards.tolist(), out.turn_scores.tolist(), out.failed.tolist()
        ([[0.0, 1.0, 0.0, 1.0]], [[1.0, 1.0]], [False])
    """

    token_rewards: np.ndarray  # [B, T] float32; NaN on a failed row's turn positions
    failed: np.ndarray         # [B] bool: rows a scorer failed on (drop them from the loss or the group)
    errors: dict[int, str]     # failed row -> "ExceptionType: message"
    turn_scores: np.ndarray | None = None  # [B, K] each turn's weighted reward, summed over scorers
    per_scorer: dict[str, np.ndarray] | None = None  # scorer name -> [B, K] its weighted contribution
    turn_mask: np.ndarray | None = None  # [B, K] bool: the turns that exist and were scored

    def scorer_means(self) -> dict[str, float]:
        """``{"process/<scorer>/mean": ...}``: each scorer's mean weighted turn reward over the scored turns
        (``per_turn=True``), for a trainer's log beside ``compute_advantages``' diagnostics."""
        if self.per_scorer is None or self.turn_mask is None:
            raise ValueError("scorer_means needs score_arrays(..., per_turn=True)")
        count = max(int(self.turn_mask.sum()), 1)
        return {f"process/{name}/mean": float(np.where(self.turn_mask, table, 0.0).sum()) / count
                for name, table in sorted(self.per_scorer.items())}


OnError = Literal["raise", "mask"]


@overload
async def score_arrays(runner: PRMRunner, input_ids: Any, turn_ids: Any, *, attention_mask: Any = ...,
                       logprobs: Any = ..., rewards: Any = ...,
                       ctx: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = ...,
                       metadata: Sequence[Mapping[str, Any] | None] | None = ...,
                       limit: int | None = ..., is_eval: bool = ..., on_error: Literal["raise"] = ...,
                       per_turn: Literal[False] = ..., progress: Callable[[int, int], None] | None = ...) -> np.ndarray: ...


@overload
async def score_arrays(runner: PRMRunner, input_ids: Any, turn_ids: Any, *, attention_mask: Any = ...,
                       logprobs: Any = ..., rewards: Any = ...,
                       ctx: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = ...,
                       metadata: Sequence[Mapping[str, Any] | None] | None = ...,
                       limit: int | None = ..., is_eval: bool = ..., on_error: Literal["mask"],
                       per_turn: bool = ..., progress: Callable[[int, int], None] | None = ...) -> ScoredArrays: ...


@overload
async def score_arrays(runner: PRMRunner, input_ids: Any, turn_ids: Any, *, attention_mask: Any = ...,
                       logprobs: Any = ..., rewards: Any = ...,
                       ctx: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = ...,
                       metadata: Sequence[Mapping[str, Any] | None] | None = ...,
                       limit: int | None = ..., is_eval: bool = ..., on_error: OnError = ...,
                       per_turn: Literal[True], progress: Callable[[int, int], None] | None = ...) -> ScoredArrays: ...


async def score_arrays(runner: PRMRunner, input_ids: Any, turn_ids: Any, *, attention_mask: Any = None,
                       logprobs: Any = None, rewards: Any = None,
                       ctx: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
                       metadata: Sequence[Mapping[str, Any] | None] | None = None,
                       limit: int | None = 64, is_eval: bool = False, on_error: OnError = "raise",
                       per_turn: bool = False,
                       progress: Callable[[int, int], None] | None = None) -> np.ndarray | ScoredArrays:
    """Scores every real row with ``runner`` (a ``PRMRunner``) and returns ``token_rewards [B, T]`` float32.

    ``ctx`` is one mapping for every row or one per row (padding rows' entries are ignored); each row's
    scorers also find ``ctx["row"]``, its index in the arrays, and its turns are named ``row{b}/t{k}``
    (``interaction.turn_index`` is ``k``). ``metadata``: one JSON object (or ``None``) per row, each row's
    scorers' ``ctx["metadata"]`` (read-only; a session's ``metadata`` and its rule: ``check_metadata``). Rows are
    scored concurrently, at most ``limit`` at a time. ``on_error="raise"`` (default): the first failure
    stops the batch and is raised as the scorer raised it, its notes naming the scorer, the turn
    (``row{b}/t{k}``) and the row. ``on_error="mask"``: every row is scored, a row whose scoring failed
    commits nothing (a row is all or nothing) and is returned as failed, and the result is a
    ``ScoredArrays(token_rewards, failed [B], errors)``; a failed row's turn positions hold NaN, so a
    trainer that forgets the mask gets an error from ``compute_advantages``, not a silent 0. Errors that
    are not a scorer's (the runner closed, a row that cannot be scored) are raised either way, as is a
    cancellation. ``per_turn=True`` returns a ``ScoredArrays`` with ``turn_scores [B, K]`` (each turn's
    weighted reward, the mean over its tokens, summed over scorers: GiGPO's ``turn_rewards``) and
    ``per_scorer`` (each scorer's weighted contribution ``[B, K]``, for logging); ``K`` is the most turns of
    a row, turns a row does not have are 0, a failed row's are NaN. ``progress(done, total)`` is called as
    rows finish.

    Args:
        rewards: ``[B]`` outcome rewards the scorers see as each row's last turn's ``reward``; ``None``: none.
        ctx: The scorers' context: one mapping for every row, or one per row.
        metadata: One JSON object (or ``None``) per row: the row's scorers' ``ctx["metadata"]``.
        limit: The most rows scored at once, >= 1; ``None``: every row at once.
        on_error: ``raise`` (the first failure stops the batch) or ``mask`` (failed rows returned as failed).
        per_turn: Whether the per-turn scores come back too (a ``ScoredArrays``).
        progress: Called as ``progress(done, total)`` as rows finish; ``None``: not called.

    Example:
        >>> import anyio
        >>> class NoNines(prm_jax.BaseScorer):
        ...     name = "no_nines"
        ...     async def evaluate(self, interaction, ctx):
        ...         if 9 in interaction.output_tokens:
        ...             raise ValueError("a nine")
        ...         return 1.0
        ...
        >>> async def main():
        ...     async with prm_jax.PRMRunner(scorers=[NoNines()]) as runner:
        ...         return await prm_jax.score_arrays(runner, np.array([[1, 2, 3], [1, 9, 9]]),
        ...                                           np.array([[-1, 0, 0]] * 2), on_error="mask")
        ...
        >>> out = anyio.run(main)
        >>> out.failed.tolist(), out.token_rewards[0].tolist()
        ([False, True], [0.0, 1.0, 1.0])
    """
    checked = call_checks(input_ids, on_error, metadata)
    models = row_models(runner)
    if models is not None:
        return await _score_rows(runner, models, input_ids, turn_ids, attention_mask, on_error, per_turn,
                                 guarded_progress(progress))
    chains = chains_from_arrays(input_ids, turn_ids, attention_mask=attention_mask, logprobs=logprobs,
                                rewards=rewards)
    scored = [b for b, chain in enumerate(chains) if chain]
    branches = [chain for chain in chains if chain]
    ctx = _row_contexts(ctx, len(chains), scored, checked)
    try:
        results = await runner.run_many(branches, ctx, limit=limit, is_eval=is_eval,
                                        return_exceptions=on_error == "mask", progress=progress)
    except ExceptionGroup as group:
        raise _first_failure(group, scored) from None
    ids = scored_turn_ids(turn_ids, attention_mask)
    token_rewards = token_rewards_from_chains(chains, ids)
    if on_error == "mask" or per_turn:
        out = _masked(token_rewards, ids, scored, results, runner)
        return out._replace(**_turn_scores(chains, scored, results, out.failed)) if per_turn else out
    # A jitted trainer never sees compute_advantages' eager warning: the host side says it here.
    if runner.shaping_mode == "gvpo" and scored and not (token_rewards < 0).any():
        warn_gvpo_without_penalty(stacklevel=2)
    return token_rewards
