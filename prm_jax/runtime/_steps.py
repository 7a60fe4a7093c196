"""Steps inside a turn: the step rule of the step-scoring PRMs (``PoolingPRMScorer``, ``ModelScorer``) and
where a step's score lands on the turn's tokens (``spread``).

A process reward model scores *steps*: Qwen2.5-Math-PRM reads a solution split into steps with its step tag
after each, math-shepherd reads the tag standing in the text at each step's end. A scorer's step rule,
``step_separator``, says where a turn's output splits:

- ``None`` (the default): the whole turn is one step (``steps: turn``);
- one or more separators, each a token-id sequence (``[[271]]``, ``[[198, 198], [271]]``): a step ends after
  each occurrence of a separator in the turn's output (scanned left to right, occurrences never overlap, the
  longest separator first where several start at one position; the separator's tokens belong to the step
  they end) and at the end of the turn's output. Two separators in a row make a step of the separator alone
  (an "empty" step still gets its own score); a separator at the very end of the output ends the last step
  there (one step end, never two in a row);
- a separator equal to the PRM's step tag (``[[step_tag_id]]``, math-shepherd's layout): the tag already
  stands in the text, every occurrence ends a step, nothing is inserted, and the end of the turn is a step
  end only where the tag stands there. Tokens after a turn's last tag belong to no step: they get 0.

``spread`` places each step's score on the turn's output tokens:

- ``step``: every token of a step gets the step's score (tokens in no step get 0);
- ``step_end``: the score sits on the step's last token, 0 elsewhere (the layout PURE and PRIME read);
- ``turn``: the turn's last step's score on every token of the turn (one step per turn: the turn's score);
- ``tokens``: the turn's last step's score divided evenly among the turn's tokens (summing to it).

A turn without a step (math-shepherd layout, no tag in its output) gets 0 under every spread. To give a
credit assignment that works on steps (PURE's min-form) the steps of a batch, ``step_turn_ids`` renumbers a
batch's ``turn_ids`` so that every step is a turn of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np

from prm_jax._validation import one_of, short_repr
from prm_jax.runtime._trajectory import turn_spans

Spread = Literal["turn", "tokens", "step", "step_end"]
SPREADS: tuple[Spread, ...] = get_args(Spread)


@dataclasses.dataclass(frozen=True)
class StepRule:
    """Where a turn's output splits into steps (the module docstring): ``separators`` (empty: one step per
    turn); ``tag_in_text``: the separator is the PRM's step tag, standing in the text (math-shepherd).

    Args:
        separators: Token sequences that end a step inside a turn's output; empty: one step per turn.
        tag_in_text: Whether the separator is the PRM's step tag, standing in the text (math-shepherd).

    Example:
        >>> rule = prm_jax.runtime.StepRule.parse([[271]])
        >>> rule.ends([5, 271, 6, 7, 271, 8])
        [2, 5, 6]
    """

    separators: tuple[tuple[int, ...], ...] = ()
    tag_in_text: bool = False

    @classmethod
    def parse(cls, step_separator: Any, step_tag_id: int | None = None) -> StepRule:
        """``step_separator`` (``None`` or a list of token-id lists) as a rule; ``ValueError`` naming it. A
        separator equal to ``[step_tag_id]`` is the tag-in-text layout and must be the only one.

        Args:
            step_separator: Token sequences that end a step (``[[271]]``), ``[[step_tag_id]]`` for a tag in the text,
                or ``None`` (one step per turn).
            step_tag_id: The PRM's step tag id; ``None``: no tag (a model scorer's rule).
        """
        if step_separator is None:
            return cls()
        what = "step_separator must be null (one step per turn) or a list of separators, each a non-empty list of "
        if not isinstance(step_separator, (list, tuple)) or not step_separator:
            raise ValueError(what + f"token ids ([[271]], [[198, 198], [271]]), got {short_repr(step_separator)}")
        separators = []
        for separator in step_separator:
            if (not isinstance(separator, (list, tuple)) or not separator
                    or not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0
                               for t in separator)):
                raise ValueError(what + f"token ids >= 0 ([[271]], not [271]), got {short_repr(separator)} in "
                                        f"{short_repr(step_separator)}")
            separators.append(tuple(int(t) for t in separator))
        tag_in_text = step_tag_id is not None and (step_tag_id,) in separators
        if tag_in_text and len(set(separators)) > 1:
            raise ValueError(f"step_separator {short_repr(step_separator)}: the separator [{step_tag_id}] is the "
                             "step tag standing in the text (math-shepherd); it cannot be combined with other "
                             "separators, after which a tag would be inserted")
        # The longest first where several start at one position, so [198, 198] wins over [198].
        ordered = tuple(sorted(set(separators), key=lambda s: (-len(s), s)))
        return cls(ordered, tag_in_text)

    @property
    def per_turn(self) -> bool:
        return not self.separators

    def ends(self, tokens: Sequence[int] | np.ndarray) -> list[int]:
        """The step ends (exclusive, increasing) of one turn's output ``tokens``.

        Args:
            tokens: A turn's output token ids.
        """
        length = len(tokens)
        if self.per_turn:
            return [length] if length else []
        ids = np.asarray(tokens).tolist() if isinstance(tokens, np.ndarray) else list(tokens)
        ends: list[int] = []
        position = 0
        firsts = {separator[0] for separator in self.separators}
        while position < length:
            if ids[position] in firsts:
                for separator in self.separators:
                    size = len(separator)
                    if tuple(ids[position:position + size]) == separator:
                        position += size
                        ends.append(position)
                        break
                else:
                    position += 1
            else:
                position += 1
        if not self.tag_in_text and length and (not ends or ends[-1] != length):
            ends.append(length)
        return ends


def spread_steps(scores: Sequence[float], ends: Sequence[int], length: int, spread: Spread) -> float | np.ndarray:
    """One turn's rewards from its steps' ``scores`` (one per step end in ``ends``) over its ``length`` output
    tokens, by ``spread`` (the module docstring): a number for ``turn`` (broadcast by the runner), else a
    float64 array of ``length``."""
    last = float(scores[-1]) if len(scores) else 0.0
    if spread == "turn":
        return last
    if spread == "tokens":
        return np.full(length, last / length if length else 0.0)
    out = np.zeros(length)
    start = 0
    for score, end in zip(scores, ends):
        if spread == "step":
            out[start:end] = score
        else:
            out[end - 1] = score
        start = end
    return out


def check_spread(spread: Any) -> Spread:
    """``spread`` when it is one of ``SPREADS``; else ``ValueError`` naming it."""
    return one_of("spread", spread, SPREADS)


def step_turn_ids(input_ids: Any, turn_ids: Any, step_separator: Any, step_tag_id: int | None = None) -> np.ndarray:
    """``turn_ids`` ``[B, T]`` (on positions: ``k`` on turn ``k``'s output tokens, -1 elsewhere) renumbered so
    that every step of every turn (by the rule ``step_separator``, as the scorer split them) is a turn of its
    own, numbered 0, 1, ... along the row; tokens after a turn's last step (the tag-in-text layout) form one
    more turn. Give it to ``compute_advantages`` as ``turn_ids`` for a credit assignment that works on steps
    (PURE's min-form over step ends). Returns ``[B, T]`` int32; ``ValueError`` for a bad rule or shapes.

    >>> import numpy as np
    >>> from prm_jax.runtime import step_turn_ids
    >>> ids = np.array([[1, 21, 271, 22, 3, 23]])        # a prompt token, a turn of two steps, a tool, a turn
    >>> turns = np.array([[-1, 0, 0, 0, -1, 1]])
    >>> step_turn_ids(ids, turns, [[271]]).tolist()
    [[-1, 0, 0, 1, -1, 2]]

    Args:
        step_separator: The scorer's step separators (``[[271]]``), as the scorer's setting.
        step_tag_id: The PRM's step tag id, where the separator is the tag in the text; ``None``: none.
    """
    rule = StepRule.parse(step_separator, step_tag_id)
    ids, turns = np.asarray(input_ids), np.asarray(turn_ids)
    if ids.shape != turns.shape or ids.ndim != 2:
        raise ValueError(f"input_ids {ids.shape} and turn_ids {turns.shape} must be [B, T] of one shape")
    out = np.full(turns.shape, -1, np.int32)
    for row in range(turns.shape[0]):
        step = 0
        for start, stop in turn_spans(turns[row], row):
            cuts = [0, *rule.ends(ids[row, start:stop])]
            if cuts[-1] != stop - start:
                cuts.append(stop - start)
            for begin, end in zip(cuts, cuts[1:]):
                out[row, start + begin:start + end] = step
                step += 1
    return out


def place_steps(scores: np.ndarray, input_ids: np.ndarray, turn_ids: np.ndarray, rule: StepRule,
                spread: Spread, rows: Sequence[int] | None = None) -> np.ndarray:
    """A model's token scores ``[B, T]`` read at each step's last token (the step's score, where a causal PRM
    has read the whole step) and placed by ``spread`` over each turn's tokens (``turn_ids`` on positions);
    0 off the turns. ``ModelScorer``'s step rule (parsed without a step tag): nothing is inserted, and a
    turn's end always ends a step. ``rows``: the rows' numbers in errors (default 0, 1, ...).

    Args:
        scores: ``[B, T]`` the model's token scores.
        rule: Where steps end (``StepRule``).
        spread: How a step's score is placed on its tokens: ``step``, ``step_end``, ``turn`` or ``tokens``.
        rows: The rows' numbers, for errors; ``None``: 0, 1, ...

    Example:
        >>> scores = np.array([[0.0, 0.2, 0.9, 0.4, 0.7]])
        >>> rule = prm_jax.runtime.StepRule.parse([[9]])
        >>> ids, turn_ids = np.array([[1, 5, 9, 6, 7]]), np.array([[-1, 0, 0, 0, 0]])
        >>> prm_jax.runtime.place_steps(scores, ids, turn_ids, rule, "step_end").tolist()
        [[0.0, 0.0, 0.9, 0.0, 0.7]]
    """
    out = np.zeros(scores.shape, np.float64)
    for row in range(scores.shape[0]):
        for start, stop in turn_spans(turn_ids[row], row if rows is None else rows[row]):
            ends = rule.ends(input_ids[row, start:stop])  # (a rule without a tag ends a step at the turn's end)
            steps = [scores[row, start + end - 1] for end in ends]
            out[row, start:stop] = spread_steps(steps, ends, stop - start, spread)
    return out
