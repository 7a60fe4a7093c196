"""Agent trajectories: interactions (turns), session trees, branches and their concat export.

An ``Interaction`` is one model call. A session is a tree of interactions linked by ``parent_id``; a
branch is one root-to-leaf chain, parent before child. The concat export turns a branch into one token
sequence, the leaf's ``input_tokens + output_tokens``, in which every turn's output span is trained on:

  loss_mask      1 on every turn's output span, 0 on prompt and gap (user/tool) tokens
  logprobs       behaviour log-prob of token j at position j, 0 elsewhere
  turn_ids       the turn's index k (0-based, root first) on its output span, -1 elsewhere
  token_rewards  each turn's vector on its output span, 0 elsewhere (absent when no turn has one)

Every child's ``input_tokens`` must start with its parent's ``input_tokens + output_tokens``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, get_args

import numpy as np

from prm_jax._validation import FLOAT32_MAX, short_repr
from prm_jax.kernels._schema import (
    BATCH_SCHEMA,
    MODEL_OUTPUT_KEYS,
    Bounds,
    is_anchor_id,
)

StopReason = Literal["stop", "length"]
STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)
MAX_TOKEN_ID = 2**31 - 1  # batches hold token ids as int32
TOKEN_ID_RANGE = f"[0, {MAX_TOKEN_ID}]"


def stray_token_id(ids: Sequence[int] | np.ndarray) -> int | None:
    """The one token-id rule (ids in ``TOKEN_ID_RANGE``: batches hold them as int32): ``None`` when every id
    of ``ids`` keeps it, else the offending id (the lowest when one is negative, else the highest)."""
    if isinstance(ids, np.ndarray):
        if not ids.size:
            return None
        if ids.dtype.kind == "i" and ids.dtype.itemsize >= 4 and int(
                ids.view(f"u{ids.dtype.itemsize}").max()) <= MAX_TOKEN_ID:
            return None  # (one pass: a negative int32 or int64 read unsigned is above any token id)
        low, high = int(ids.min()), int(ids.max())
    else:
        if not len(ids):
            return None
        low, high = min(ids), max(ids)
    return low if low < 0 else high if high > MAX_TOKEN_ID else None


def _tokens(name: str, value: Any, interaction_id: str) -> np.ndarray | None:
    if value is None:
        return None
    array = np.asarray(value)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"interaction {interaction_id!r}: {name} must be a 1-D sequence of token ids, got "
                         f"dtype {array.dtype} shape {array.shape}")
    array = array.astype(np.int64, copy=False)  # keeps views (shared branch buffers) as they are
    stray = stray_token_id(array)
    if stray is not None:
        raise ValueError(f"interaction {interaction_id!r}: {name} must hold token ids in {TOKEN_ID_RANGE} "
                         f"(int32), got {stray}")
    return array


def finite_value(value: Any) -> float:
    """The rule of ``reward`` and ``step_reward``: a finite number (not a bool) that is finite in float32, the
    dtype batches store it in (3.5e38 would be inf there), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"must be a finite number or None, got {short_repr(value)}")
    try:
        ok = math.isfinite(value)
    except OverflowError:  # an integer beyond a float's range (e.g. 400 digits)
        ok = False
    if not ok:
        raise ValueError(f"must be finite, got {short_repr(value)}")
    number = float(value)
    if abs(number) > FLOAT32_MAX:
        raise ValueError(f"must be finite in float32 (|value| <= {FLOAT32_MAX:.4g}), got {short_repr(value)}")
    return number


def finite_vector(value: Any) -> np.ndarray:
    """The rule of every per-token number (``output_logprobs``, ``token_rewards``, the PRM and reference
    log-probs): numbers, finite as given and as float32, the dtype they are stored in."""
    try:
        array = np.asarray(value)
        if array.dtype.kind not in "iuf":
            array = np.asarray(value, np.float64)
    except OverflowError:  # an integer beyond a float's range
        raise ValueError("must be finite, got a number beyond float64's range") from None
    with np.errstate(over="ignore"):
        out = array.astype(np.float32)
    if not np.isfinite(out).all():  # every non-finite input is non-finite here too: one check
        bad = array[~np.isfinite(out)][0].item()
        raise ValueError(f"must be finite, got {short_repr(bad)}" if not math.isfinite(bad)
                         else f"must be finite in float32, got {short_repr(bad)}")
    return out


def _bounds(batch_key: str) -> Bounds:
    bounds = BATCH_SCHEMA[batch_key].bounds
    assert bounds is not None, batch_key
    return bounds


def bounded_vector(bounds: Bounds) -> Callable[[Any], np.ndarray]:
    """The rule of a per-token field whose batch key declares a range (``BATCH_SCHEMA``'s ``bounds``):
    ``finite_vector``'s, then within it."""
    def rule(value: Any) -> np.ndarray:
        out = finite_vector(value)
        outside = bounds.outside(out)
        if outside.any():
            raise ValueError(f"must be {bounds.text}, got {short_repr(out[outside][0].item())}")
        return out

    return rule


def anchor_value(value: Any) -> int:
    """The rule of ``anchor_id``: a 64-bit integer, signed or unsigned (-1: none)."""
    if not is_anchor_id(value):
        raise ValueError("must be a 64-bit integer (signed or unsigned, in [-2**63, 2**64 - 1]; -1: none) "
                         f"or None, got {short_repr(value)}")
    return int(value)


def _parent_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string or None")
    return value


def _stop_reason(value: Any) -> str:
    if value not in STOP_REASONS:  # (worded without the key: the caller names the turn and the field)
        raise ValueError(f"must be one of {STOP_REASONS}, got {short_repr(value)}")
    return value


# A turn field's type in the JSON session format (``prm_jax.app.sessions`` maps each kind to its decoder's
# type): the kinds, not the fields, are what the readers declare.
JsonKind = Literal["id", "numbers", "logprobs", "messages", "stop_reason", "number", "integer"]


@dataclasses.dataclass(frozen=True)
class TurnField:
    """One optional field of a turn, declared once: its value rule (raises ``ValueError``; the value as
    stored), its value when absent, its JSON kind in the session format (``json``) and the batch key it is
    packed into (``batch_key``: a ``BATCH_SCHEMA`` key, or None). ``Interaction`` runs the rules on
    construction (its attribute of each name must exist: checked at import); the JSONL readers
    (``prm_jax.app.sessions``) run the same rules on the decoded values, typed by ``json``; the concat
    export and the packer carry every field whose batch key the schema packs as a model output.
    ``vector``: a per-token field, one entry per output token. ``doc``: what it is, for the session format's
    page (``prm_jax.app.sessions.format_table``); ``becomes``: what it becomes in the batch where that is
    not its ``batch_key`` alone."""

    name: str
    rule: Any          # Callable[[Any], Any] | None: None keeps the value as given
    absent: Any = None
    vector: bool = False
    json: JsonKind = "number"
    batch_key: str | None = None
    doc: str = ""
    becomes: str = ""


#: Every optional field of a turn, one row each (its value rule, JSON kind and batch key; the token lists and the
#: id are the turn's identity, checked apart).
TURN_FIELDS: tuple[TurnField, ...] = (
    TurnField("parent_id", _parent_id, json="id",
              doc="the turn this one continues (its inputs start with that turn's inputs and outputs); null or "
                  "absent: a root", becomes="the rows: one trajectory per leaf, its turns concatenated"),
    TurnField("output_logprobs", finite_vector, vector=True, json="logprobs", batch_key="logprobs",
              doc="the policy's log-prob of each output token when it was sampled"),
    TurnField("messages", tuple, (), json="messages",
              doc="the chat so far, as the scorers read it (`ctx[\"messages\"]`)", becomes="(read by scorers)"),
    TurnField("output_messages", tuple, (), json="messages",
              doc="the turn's reply as messages (a judge reads its text)", becomes="(read by scorers)"),
    TurnField("stop_reason", _stop_reason, "stop", json="stop_reason",
              doc="why generation stopped; `length` marks a truncated turn",
              becomes="`is_truncated` (the leaf's)"),
    TurnField("reward", finite_value,
              doc="the outcome reward: required on each interaction `ready` names (default: every leaf), "
                  "optional on the others", becomes="`rewards` (group-normalized as configured)"),
    TurnField("token_rewards", finite_vector, vector=True, json="numbers", batch_key="token_rewards",
              doc="process rewards already given (the scorers' are added)"),
    TurnField("anchor_id", anchor_value, json="integer",
              doc="GiGPO's anchor state of the turn (turns of one group with one anchor share a step baseline)",
              becomes="`anchor_ids`"),
    TurnField("step_reward", finite_value, doc="GiGPO's reward of the step the turn took",
              becomes="`turn_rewards`, `turn_reward_mask`"),
    TurnField("output_prm_logprobs", finite_vector, vector=True, json="logprobs", batch_key="prm_logprobs",
              doc="an implicit PRM's log-prob of each output token (PRIME)"),
    TurnField("output_ref_logprobs", finite_vector, vector=True, json="logprobs", batch_key="ref_logprobs",
              doc="the reference model's log-prob of each output token (the KL penalty, PRIME)"),
    TurnField("output_sum_pi_squared", bounded_vector(_bounds("sum_pi_squared")), vector=True,
              json="numbers", batch_key="sum_pi_squared",
              doc="the sum over the vocabulary of pi_v^2 of each output token's distribution (OTB)"),
    TurnField("output_teacher_logprobs", finite_vector, vector=True, json="logprobs", batch_key="teacher_logprobs",
              doc="a teacher's log-prob of each output token (on-policy distillation)"),
)
# The turn field each per-token model output of the schema is packed from (every such key has one).
MODEL_OUTPUT_FIELDS: dict[str, str] = {field.batch_key: field.name for field in TURN_FIELDS
                                       if field.batch_key in MODEL_OUTPUT_KEYS}
_unlinked = sorted(set(MODEL_OUTPUT_KEYS) - set(MODEL_OUTPUT_FIELDS)) + sorted(
    field.batch_key for field in TURN_FIELDS if field.batch_key is not None and field.batch_key not in BATCH_SCHEMA)
if _unlinked:
    raise RuntimeError(f"batch keys without their turn field (or turn fields naming no batch key): {_unlinked}")
VECTOR_FIELDS: tuple[str, ...] = tuple(field.name for field in TURN_FIELDS if field.vector)


def check_vector_lengths(interaction_id: str, output_len: int | None, *vectors: np.ndarray | None) -> None:
    """Every per-token vector (``VECTOR_FIELDS``, in that order) has one entry per output token."""
    for name, vector in zip(VECTOR_FIELDS, vectors):
        if vector is not None and (output_len is None or vector.shape != (output_len,)):
            raise ValueError(f"interaction {interaction_id!r}: {name} must have shape ({output_len or 0},), got "
                             f"{vector.shape}")


def root_first(leaf_id: str, parent_of: Any) -> list[str]:
    """The ids of the chain ending at ``leaf_id``, root first, walking ``parent_of(id)`` (``None`` at a root;
    ``KeyError`` for an id not in the session): the one chain walk. ``ValueError`` on a parent cycle or a
    missing parent."""
    chain, seen, node = [], set(), leaf_id
    while True:
        if node in seen:
            raise ValueError(f"interaction {node!r} is on a parent cycle")
        seen.add(node)
        chain.append(node)
        try:
            parent = parent_of(node)
        except KeyError:
            raise ValueError(f"interaction {chain[-2]!r} has parent {node!r}, which is not in the session") from None
        if parent is None:
            return chain[::-1]
        node = parent


_IMMUTABLE = (str, bytes, int, float, bool, complex, type(None))


def _readonly_view(array: np.ndarray) -> np.ndarray:
    if array.base is not None and not array.flags.writeable:
        return array  # a read-only view cannot be made writeable again (numpy refuses): share it as it is
    view = array.view()
    view.setflags(write=False)
    return view


_IMMUTABLE_TYPES = frozenset(_IMMUTABLE)


def freeze(value: Any) -> Any:
    """A read-only deep copy: mappings become ``MappingProxyType``, sequences tuples, arrays read-only."""
    kind = type(value)
    if kind in _IMMUTABLE_TYPES:
        return value
    # Chat messages are plain dicts and lists of strings: exact types first, without the isinstance chain.
    if kind is dict:
        return types.MappingProxyType({k: v if type(v) in _IMMUTABLE_TYPES else freeze(v) for k, v in value.items()})
    if kind is tuple or kind is list:
        return tuple([v if type(v) in _IMMUTABLE_TYPES else freeze(v) for v in value])
    if isinstance(value, _IMMUTABLE):
        return value
    if isinstance(value, np.ndarray):
        out = value.copy()
        out.setflags(write=False)
        return out
    if isinstance(value, (dict, types.MappingProxyType)) or isinstance(value, Mapping):
        return types.MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(freeze(v) for v in value)
    return copy.deepcopy(value)


def thaw(value: Any) -> Any:
    """``freeze``'s inverse for pickling (to a scorer's worker process): ``MappingProxyType`` becomes a dict,
    recursively; everything else stays as it is."""
    if isinstance(value, types.MappingProxyType):
        return {k: thaw(v) for k, v in value.items()}
    if type(value) is tuple:
        return tuple(thaw(v) for v in value)
    return value


@dataclasses.dataclass(eq=False)
class Interaction:
    """One model call (a turn).

    ``input_tokens``/``output_tokens`` are token ids; an interaction without them is message-only and
    cannot be scored. ``token_rewards`` is float32 ``[output_len]``; ``reward`` the optional outcome.

    Args:
        interaction_id: The turn's id, unique within its session.
        input_tokens: The token ids the model read for this call (the prompt, earlier turns, tool outputs).
        output_tokens: The token ids it generated.

    Example:
        >>> turn = prm_jax.Interaction("t0", [1, 2], [3, 4, 5], reward=1.0)
        >>> turn.output_len, turn.input_tokens.tolist(), turn.reward
        (3, [1, 2], 1.0)
    """

    interaction_id: str
    input_tokens: Any
    output_tokens: Any
    _: dataclasses.KW_ONLY
    parent_id: str | None = None
    output_logprobs: Any = None
    messages: Sequence[Mapping[str, Any]] = ()
    output_messages: Sequence[Mapping[str, Any]] = ()
    stop_reason: str = "stop"
    reward: float | None = None
    token_rewards: Any = None
    anchor_id: int | None = None     # the environment state this turn acted on (GiGPO step groups)
    step_reward: float | None = None  # the turn's step reward for GiGPO (else its process rewards' sum)
    output_prm_logprobs: Any = None  # per output token: an implicit PRM's log-probs (PRIME)
    output_ref_logprobs: Any = None  # per output token: the reference model's log-probs (PRIME, KL)
    output_sum_pi_squared: Any = None  # per output token: sum_v pi_v^2 of its distribution (OTB)
    output_teacher_logprobs: Any = None  # per output token: a teacher's log-probs (on-policy distillation)

    def __post_init__(self):
        if not isinstance(self.interaction_id, str) or not self.interaction_id:
            raise ValueError(f"interaction_id must be a non-empty string, got {self.interaction_id!r}")
        iid = self.interaction_id
        for field in TURN_FIELDS:  # the table's rules, as the JSONL readers run them
            value = getattr(self, field.name)
            if value is not None and field.rule is not None:
                try:
                    setattr(self, field.name, field.rule(value))
                except (ValueError, TypeError) as err:
                    raise ValueError(f"interaction {iid!r}: {field.name} {err}") from None
        if self.parent_id == iid:
            raise ValueError(f"interaction {iid!r} is its own parent")
        self.input_tokens = _tokens("input_tokens", self.input_tokens, iid)
        self.output_tokens = _tokens("output_tokens", self.output_tokens, iid)
        if (self.input_tokens is None) != (self.output_tokens is None):
            raise ValueError(f"interaction {iid!r}: input_tokens and output_tokens must both be given or both be None")
        check_vector_lengths(iid, self.output_len if self.output_tokens is not None else None,
                             *(getattr(self, name) for name in VECTOR_FIELDS))

    @classmethod
    def prevalidated(cls, interaction_id: str, input_tokens: np.ndarray, output_tokens: np.ndarray,
                     **fields: Any) -> Interaction:
        """An interaction built WITHOUT checks, from fields a reader has already validated by the rules of
        ``__post_init__`` (token ids int64 arrays in range, vectors float32 of the output's length and
        finite, numbers finite, messages tuples), e.g. once per branch with vectorized checks. (It was
        ``checked``, a name that promised the checks it skips.)

        Args:
            interaction_id: The turn's id.
            input_tokens: int64 ``[n]`` input token ids, validated.
            output_tokens: int64 ``[m]`` output token ids, validated.
            fields: The other fields, each validated by its ``TURN_FIELDS`` rule.
        """
        turn = object.__new__(cls)
        turn.__dict__.update(_DEFAULTS, interaction_id=interaction_id, input_tokens=input_tokens,
                             output_tokens=output_tokens, **fields)
        return turn

    @property
    def output_len(self) -> int:
        return 0 if self.output_tokens is None else int(self.output_tokens.shape[0])

    @property
    def token_backed(self) -> bool:
        return self.output_tokens is not None

    @property
    def turn_index(self) -> int | None:
        """The turn's index in its branch (0 for the root turn), on what a scorer receives (the runner sets
        it: ``row{b}/t{k}`` of ``score_arrays`` is turn ``k``); ``None`` on an interaction not being scored."""
        return self.__dict__.get("_turn_index")

    def readonly(self, turn_index: int | None = None) -> Interaction:
        """What a scorer sees: every field immutable (read-only array views, frozen messages), no copy of the
        token arrays (nothing writes into them: scoring replaces ``token_rewards``), and ``turn_index``. The
        frozen messages are built on first read (most scorers read tokens only), once per interaction.

        Args:
            turn_index: The turn's index in its branch, as scorers see it; ``None``: not set.
        """
        view = object.__new__(ReadOnlyInteraction)
        state = object.__getattribute__(view, "__dict__")
        _share_state(self, state)
        for name in _MESSAGE_FIELDS:
            del state[name]  # read through ReadOnlyInteraction's properties, from the source's cache
        state["_source"] = self
        state["_turn_index"] = turn_index
        return view

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (for a scorer's worker process) without the frozen-message cache, messages thawed."""
        state = {k: v for k, v in self.__dict__.items() if k != "_frozen_cache"}
        for name in _MESSAGE_FIELDS:
            if name in state:
                state[name] = thaw(state[name])
        return state

    def _frozen(self, name: str) -> Any:
        """The frozen messages, built once per interaction (scorers of every branch share them); rebuilt
        when the field was assigned a new value."""
        cache = self.__dict__.setdefault("_frozen_cache", {})
        value = self.__dict__[name]
        if name not in cache or cache[name][0] is not value:
            cache[name] = (value, freeze(value))
        return cache[name][1]

    def clone(self) -> Interaction:
        """A copy whose ``token_rewards`` and containers are its own; arrays shared as read-only views."""
        twin = object.__new__(type(self))
        state = twin.__dict__
        _share_state(self, state)
        if state["token_rewards"] is not None:
            state["token_rewards"] = self.token_rewards.copy()
        frozen = {name: self._frozen(name) for name in _MESSAGE_FIELDS}
        state.update(frozen, _frozen_cache={name: (value, value) for name, value in frozen.items()})
        return twin


_ARRAY_FIELDS = ("input_tokens", "output_tokens", *VECTOR_FIELDS)
_MESSAGE_FIELDS = ("messages", "output_messages")


_ATTRIBUTES = {field.name for field in dataclasses.fields(Interaction)}
if any(field.name not in _ATTRIBUTES for field in TURN_FIELDS):  # a row of TURN_FIELDS needs its attribute
    raise RuntimeError(f"TURN_FIELDS names fields Interaction lacks: "
                       f"{[field.name for field in TURN_FIELDS if field.name not in _ATTRIBUTES]}")


def _share_state(turn: Interaction, state: dict[str, Any]) -> None:
    """Fills ``state`` with the turn's attributes, arrays as read-only views, other mutable values frozen."""
    state.update(turn.__dict__)
    for name, value in state.items():
        if name in _ARRAY_FIELDS:
            if value is not None:
                state[name] = _readonly_view(value)
        elif name not in _MESSAGE_FIELDS and name != "_frozen_cache" and not isinstance(value, _IMMUTABLE):
            state[name] = freeze(value)


_DEFAULTS = {field.name: field.default for field in dataclasses.fields(Interaction)
             if field.default is not dataclasses.MISSING}


class ReadOnlyInteraction(Interaction):
    """What scorers receive: setting an attribute raises ``AttributeError``."""

    @property
    def messages(self) -> Any:  # type: ignore[override]
        return self.__dict__["_source"]._frozen("messages")

    @property
    def output_messages(self) -> Any:  # type: ignore[override]
        return self.__dict__["_source"]._frozen("output_messages")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """A view pickles as its source and is rebuilt read-only on the other side (a worker process)."""
        return _readonly_of, (self.__dict__["_source"], self.__dict__.get("_turn_index"))

    def __setattr__(self, name, value):
        raise AttributeError(f"interaction {self.interaction_id!r} is read-only for scorers (tried to set {name!r})")

    def __delattr__(self, name):
        raise AttributeError(f"interaction {self.interaction_id!r} is read-only for scorers")


def _readonly_of(source: Interaction, turn_index: int | None = None) -> Interaction:
    return source.readonly(turn_index)


@dataclasses.dataclass(frozen=True)
class BranchSequence:
    """The concat export of one branch (numpy, unpadded).

    Args:
        leaf_id: The id of the branch's last turn.
        input_ids: ``[L]`` the branch's tokens: the leaf's input and output tokens.
        loss_mask: ``[L]`` 1 on the tokens the policy generated (every turn's output), 0 elsewhere.
        logprobs: ``[L]`` the policy's log-probs of the generated tokens, 0 elsewhere.
        turn_ids: ``[L]`` each generated token's turn index in the branch, -1 elsewhere.
        token_rewards: ``[L]`` the committed process rewards on the generated tokens (0 elsewhere), or ``None`` where
            no turn has any.
        reward: The branch's outcome reward (its leaf's), or ``None``.
        is_truncated: Whether the leaf stopped at its length limit (``stop_reason: length``).
        interaction_ids: The branch's turns' ids, root first.
        anchor_ids: Each turn's GiGPO anchor id (``None``: none), root first.
        step_rewards: Each turn's GiGPO step reward (``None``: none), root first.
        model_outputs: The turns' per-token model outputs (``output_prm_logprobs``, ...) on the branch's tokens, by
            batch key.

    Example:
        >>> cache = prm_jax.InteractionCache([prm_jax.Interaction("t0", [1], [2, 3]),
        ...                                   prm_jax.Interaction("t1", [1, 2, 3, 7], [8], parent_id="t0", reward=1.0)])
        ...
        >>> branch = cache.to_sequence("t1")
        >>> branch.input_ids.tolist(), branch.loss_mask.tolist(), branch.turn_ids.tolist(), branch.reward
        ([1, 2, 3, 7, 8], [0, 1, 1, 0, 1], [-1, 0, 0, -1, 1], 1.0)
    """

    leaf_id: str
    input_ids: np.ndarray      # [L] int64
    loss_mask: np.ndarray      # [L] int32
    logprobs: np.ndarray       # [L] float32
    turn_ids: np.ndarray       # [L] int32
    token_rewards: np.ndarray | None  # [L] float32, or None when no turn has token rewards
    reward: float | None       # the leaf's outcome reward
    is_truncated: bool         # the leaf stopped at the length limit
    interaction_ids: tuple[str, ...]
    anchor_ids: tuple[int | None, ...] = ()      # per turn, root first
    step_rewards: tuple[float | None, ...] = ()  # per turn, root first
    # Each per-token model output some turn has (MODEL_OUTPUT_FIELDS: prm_logprobs, ref_logprobs, ...), by its
    # batch key: [L] float32 on positions, NaN on a turn without it.
    model_outputs: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = dict(input_ids=self.input_ids, loss_mask=self.loss_mask, logprobs=self.logprobs,
                   turn_ids=self.turn_ids, is_truncated=self.is_truncated)
        if self.token_rewards is not None:
            out["token_rewards"] = self.token_rewards
        if self.reward is not None:
            out["reward"] = self.reward
        return out


def require_token_backed(chain: Sequence[Interaction], error: type[ValueError] = ValueError) -> None:
    """Every turn carries token ids: concat export and scoring read them."""
    for turn in chain:
        if not turn.token_backed:
            raise error(f"interaction {turn.interaction_id!r} is not token-backed (no token ids): "
                        "concat export and scoring need token-backed interactions")


def require_scorable(chain: Sequence[Interaction], error: type[ValueError] = ValueError) -> None:
    """Every turn can be scored: token-backed, with at least one output token (a score is per output token)."""
    require_token_backed(chain, error)
    for turn in chain:
        if turn.output_len == 0:
            raise error(f"interaction {turn.interaction_id!r} has no output tokens: there is nothing to score")


def concat_spans(chain: Sequence[Interaction]) -> list[tuple[int, int]]:
    """The concat rule, checked: every turn is token-backed and every child's ``input_tokens`` start with its
    parent's ``input_tokens + output_tokens``. Returns each turn's output span ``(start, stop)`` in the
    branch's token sequence (the leaf's ``input_tokens + output_tokens``). The one home of the rule (the
    JSONL reader's fast path checks the same on the raw bytes; a differential test holds it to this)."""
    if not chain:
        raise ValueError("a branch needs at least one interaction")
    require_token_backed(chain)
    for parent, child in zip(chain, chain[1:]):
        prefix = np.concatenate([parent.input_tokens, parent.output_tokens])
        if child.input_tokens.shape[0] < prefix.shape[0] or not np.array_equal(
                child.input_tokens[:prefix.shape[0]], prefix):
            raise ValueError(f"interaction {child.interaction_id!r}: input_tokens must start with its parent "
                             f"{parent.interaction_id!r}'s input_tokens + output_tokens (concat export)")
    return [(turn.input_tokens.shape[0], turn.input_tokens.shape[0] + turn.output_len) for turn in chain]


def turn_spans(turn_ids: np.ndarray, row: int = 0) -> list[tuple[int, int]]:
    """The inverse of ``stitch``'s turn ids: ``[(start, end)]`` of turns 0, 1, ... in one row of ``turn_ids``
    (``k`` on turn ``k``'s positions, each turn one contiguous run, -1 elsewhere); ``ValueError`` naming
    ``row`` otherwise."""
    positions = np.flatnonzero(turn_ids >= 0)
    if positions.size == 0:
        return []
    ids = turn_ids[positions]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    run_ids = ids[starts]
    if not np.array_equal(run_ids, np.arange(run_ids.size)):
        raise ValueError(f"turn_ids of row {row} must number its turns 0, 1, 2, ... in order, each turn one "
                         f"contiguous run of tokens; got runs with ids {run_ids.tolist()}")
    ends = np.r_[starts[1:], positions.size]
    spans = [(int(positions[a]), int(positions[b - 1]) + 1) for a, b in zip(starts, ends)]
    for k, (start, end) in enumerate(spans):
        if end - start != ends[k] - starts[k]:
            raise ValueError(f"turn {k} of row {row} is not contiguous: its tokens span positions {start}..{end - 1} "
                             "with other tokens between them")
    return spans


def turn_counts(turn_ids: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """``turn_spans``' rule over a whole ``[B, T]`` batch at once (no Python loop over rows): ``[B]`` int64,
    each row's number of turns (0: none); a row that breaks the rule raises ``turn_spans``' own ``ValueError``.
    ``valid`` (``[B, T]`` bool, default ``turn_ids >= 0``): the positions that hold a turn's token (the
    caller's ``turn_ids >= 0`` under its attention mask), so no masked copy of the ids is made.

    The rule as counts: a run starts at a valid position whose left neighbour is not valid or holds another
    id; a row keeps the rule exactly when its runs' ids, in order, are 0, 1, 2, ... (each turn one
    contiguous run, numbered in order). A few whole-batch passes over contiguous buffers (issue 56.6: on a GPU
    the host path's cost is all there is beside the model)."""
    ids = np.asarray(turn_ids)
    rows = ids.shape[0]
    present = ids >= 0 if valid is None else np.asarray(valid, bool)
    if ids.size == 0:
        return np.zeros(rows, np.int64)
    flat_ids, flat_valid = ids.reshape(-1), np.ascontiguousarray(present).reshape(-1)
    starts = flat_valid.copy()
    starts[1:] &= ~flat_valid[:-1] | (flat_ids[1:] != flat_ids[:-1])
    starts.reshape(ids.shape)[:, 0] = present[:, 0]  # (a row's first position does not continue the row before)
    at = np.flatnonzero(starts)  # (one entry a run: few)
    counts = np.bincount(at // ids.shape[1], minlength=rows)
    offsets = np.cumsum(counts) - counts  # where each row's runs begin among all runs
    run_ids = flat_ids[at]
    wrong = np.flatnonzero(run_ids != np.arange(run_ids.size) - np.repeat(offsets, counts))
    if wrong.size:
        row = int(np.searchsorted(offsets, wrong[0], side="right") - 1)
        turn_spans(np.where(present[row], ids[row], -1), row)  # (raises, naming the row and what is wrong)
        raise AssertionError(f"turn_counts and turn_spans disagree on row {row}")  # (unreachable: one rule)
    return counts


def stitch(chain: Sequence[Interaction]) -> BranchSequence:
    """Concat export of a root-to-leaf chain (see the module docstring).

    Args:
        chain: A root-to-leaf chain of turns, each continuing the one before it.

    Example:
        >>> cache = prm_jax.InteractionCache([prm_jax.Interaction("t0", [1], [2, 3]),
        ...                                   prm_jax.Interaction("t1", [1, 2, 3, 7], [8], parent_id="t0", reward=1.0)])
        ...
        >>> prm_jax.runtime.stitch(cache.chain("t1")).input_ids.tolist()
        [1, 2, 3, 7, 8]
    """
    spans = concat_spans(chain)
    leaf = chain[-1]
    input_ids = np.concatenate([leaf.input_tokens, leaf.output_tokens])
    length = input_ids.shape[0]
    loss_mask = np.zeros(length, np.int32)
    logprobs = np.zeros(length, np.float32)
    turn_ids = np.full(length, -1, np.int32)
    has_rewards = any(turn.token_rewards is not None for turn in chain)
    token_rewards = np.zeros(length, np.float32) if has_rewards else None
    for k, (turn, (start, stop)) in enumerate(zip(chain, spans)):
        span = slice(start, stop)
        loss_mask[span] = 1
        turn_ids[span] = k
        if turn.output_logprobs is not None:
            logprobs[span] = turn.output_logprobs
        if turn.token_rewards is not None and token_rewards is not None:
            token_rewards[span] = turn.token_rewards
    return BranchSequence(leaf.interaction_id, input_ids, loss_mask, logprobs, turn_ids, token_rewards, leaf.reward,
                          leaf.stop_reason == "length", tuple(turn.interaction_id for turn in chain),
                          tuple(turn.anchor_id for turn in chain), tuple(turn.step_reward for turn in chain),
                          {key: values for key, name in MODEL_OUTPUT_FIELDS.items()
                           if (values := _on_positions(chain, spans, name, length)) is not None})


def _on_positions(chain: Sequence[Interaction], spans: list[tuple[int, int]], name: str,
                  length: int) -> np.ndarray | None:
    """A per-token model output of the turns on their output spans (0 elsewhere), NaN on the span of a turn
    without it (never a silent 0: a stage that reads it refuses the NaN, one that does not ignores it);
    ``None`` when no turn has it."""
    if all(getattr(turn, name) is None for turn in chain):
        return None
    out = np.zeros(length, np.float32)
    for turn, (start, stop) in zip(chain, spans):
        values = getattr(turn, name)
        out[start:stop] = np.nan if values is None else values
    return out


class InteractionCache:
    """A session: interactions by id, linked into a tree by ``parent_id``.

    Args:
        interactions: The session's turns, in any order (each ``parent_id`` must be among them).

    Example:
        >>> cache = prm_jax.InteractionCache([
        ...     prm_jax.Interaction("t0", [1], [2, 3]),
        ...     prm_jax.Interaction("t1", [1, 2, 3, 7], [8], parent_id="t0", reward=1.0)])
        >>> branch = cache.to_sequence("t1")               # the leaf's branch: the turns from its root
        >>> cache.leaves(), branch.interaction_ids, branch.input_ids.tolist()
        (['t1'], ('t0', 't1'), [1, 2, 3, 7, 8])
    """

    def __init__(self, interactions: Iterable[Interaction] = ()):
        self._items: dict[str, Interaction] = {}
        for interaction in interactions:
            self.add(interaction)

    def add(self, interaction: Interaction) -> None:
        if not isinstance(interaction, Interaction):
            raise TypeError(f"interaction must be an Interaction, got {type(interaction).__name__}")
        if interaction.interaction_id in self._items:
            raise ValueError(f"interaction {interaction.interaction_id!r} is already in the cache")
        self._items[interaction.interaction_id] = interaction

    def get(self, interaction_id: str) -> Interaction:
        """The interaction of that id (``KeyError`` naming it where there is none).

        Args:
            interaction_id: The turn's id.
        """
        try:
            return self._items[interaction_id]
        except KeyError:
            raise KeyError(f"no interaction {interaction_id!r} in the cache") from None

    def remove(self, interaction_id: str) -> Interaction:
        """Removes the interaction of that id and returns it.

        Args:
            interaction_id: The turn's id.
        """
        return self._items.pop(interaction_id)

    def __contains__(self, interaction_id: object) -> bool:
        return interaction_id in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self._items.values())

    def chain(self, leaf_id: str) -> list[Interaction]:
        """Root-to-leaf interactions ending at ``leaf_id``; a cycle or a missing parent is a ``ValueError``."""
        self.get(leaf_id)  # KeyError for an unknown leaf
        items = self._items
        return [items[i] for i in root_first(leaf_id, lambda iid: items[iid].parent_id)]

    def leaves(self) -> list[str]:
        parents = {i.parent_id for i in self._items.values() if i.parent_id is not None}
        leaves = [iid for iid in self._items if iid not in parents]
        if self._items and not leaves:
            raise ValueError("the session has no leaf: its parent links form a cycle")
        return leaves

    def branches(self) -> list[list[Interaction]]:
        """Every root-to-leaf chain, in insertion order of the leaves, parent before child."""
        branches = [self.chain(leaf) for leaf in self.leaves()]
        covered = {i.interaction_id for branch in branches for i in branch}
        stray = [iid for iid in self._items if iid not in covered]
        if stray:
            raise ValueError(f"interactions {stray} are on a parent cycle")
        return branches

    def clone_chain(self, leaf_id: str) -> InteractionCache:
        """A new cache holding copies of the chain ending at ``leaf_id`` that scoring cannot reach back from.

        Scoring replaces ``token_rewards`` (never writes into arrays), so each clone gets its own
        ``token_rewards`` copy and its own containers, while token ids and log-probs are shared as read-only
        views, and messages as their frozen form (no deep copy of a branch's whole conversation per clone).
        The clones remember their session (``session_key``): within one ``run_many``, a scorer that declares
        ``prefix_determined`` scores a turn shared by several of the session's clones once.
        """
        clones = [turn.clone() for turn in self.chain(leaf_id)]
        for turn in clones:  # the session the clone came from: a prefix-determined scorer shares its score
            turn.__dict__["_origin"] = self.session_key  # (with the session's other clones, never beyond)
        return InteractionCache(clones)

    @property
    def session_key(self) -> str:
        """A key unique to this session (to this cache object), given to its clones."""
        key = self.__dict__.get("_session_key")
        if key is None:
            key = self.__dict__["_session_key"] = uuid.uuid4().hex
        return key

    def to_sequence(self, leaf_id: str) -> BranchSequence:
        return stitch(self.chain(leaf_id))
