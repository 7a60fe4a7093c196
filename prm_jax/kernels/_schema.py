"""The batch schema: every key ``compute_advantages`` reads, declared once.

Each key's shape relation (``B`` rows, ``T`` positions or timesteps, ``K`` turn slots, ``G`` groups, ``N``
tree nodes), whether it lies on positions (rollout side, shifted by the pipeline) or timesteps (model
outputs), its dtype class, where it must be finite, its padding value and which argument of
``prm_jax.runtime.pack_branches`` builds it. Derived from this table: ``compute_advantages``' key lists and
shape checks and the padding of an empty batch (``prm_jax.kernels._advantages``), ``batch_spec`` /
``empty_batch`` / ``pack_branches``' keys, dtypes and fill values (``prm_jax.runtime._batching``), and
which keys the command line packs for a plan (the keys its stages read: ``AdvantagePlan.reads``).
Who reads a key is declared by its reader: an estimator's ``EstimatorSpec.reads``, a stage's ``reads``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

Shape = Literal["BT", "B", "BK", "G", "N"]
DTypeClass = Literal["float", "int", "mask"]
# Where a float key must be finite: on trained timesteps; on every real row; where a stage reads it (its
# reader's own check); NaN allowed as "missing" (GDPO's reward sources: a scorer that did not score).
Finite = Literal["trained", "rows", "reader", "nan_is_missing", "none"]
# The pack_branches argument that adds a key (None: always; "": never packed, the trainer's or the CLI's).
Packed = Literal["always", "token_rewards", "per_turn", "model_outputs", "sessions", "never"]

SHAPE_TEXT: dict[Shape, str] = {"BT": "[B, T]", "B": "[B]", "BK": "[B, K]", "G": "[G]", "N": "[N]"}

#: How far above its bound a served log-prob (0) or probability (a sum of them: 1) may be: inference engines
#: round a log-prob of ~0 to tiny positive values.
LOGPROB_SLACK = 1e-6
PROBABILITY_SLACK = 1e-6


@dataclasses.dataclass(frozen=True)
class Bounds:
    """A key's declared range, ``[low, high]`` (the slack for a server's rounding included), and what its
    values are, for messages. Every reader of the key checks it from here: the session readers
    (``prm_jax.runtime._trajectory.TURN_FIELDS``), the pipeline where a stage reads the key, the credit
    kernels' own arguments."""

    low: float
    high: float
    text: str

    def outside(self, values: Any) -> Any:
        """The entries of ``values`` (a host array, a device one, a traced one) outside the range (NaN is not
        outside: the finite rule says so): the one rule of the readers, the pipeline and the kernels."""
        return (values < self.low) | (values > self.high)


LOGPROB = Bounds(-math.inf, LOGPROB_SLACK, "log-probabilities (<= 0)")
PROBABILITY = Bounds(0.0, 1.0 + PROBABILITY_SLACK, "probabilities in [0, 1]")
WEIGHT = Bounds(0.0, math.inf, "weights (>= 0)")


@dataclasses.dataclass(frozen=True)
class BatchKey:
    """One key of the batch: see the module docstring.

    Args:
        name: The key's name in the batch (and in ``batch.npz``).
        shape: Its shape relation: ``BT`` (``[B, T]``), ``B``, ``BK`` (turn slots), ``G`` (groups) or ``N`` (tree
            nodes).
        on: What its axis indexes: ``positions`` (rollout side, shifted by the pipeline), ``timesteps`` (model
            outputs), ``rows``, ``turns``, ``groups`` or ``nodes``.
        dtype: Its dtype class: ``float``, ``int`` or ``mask``.
        finite: Where a float key must be finite: ``trained`` timesteps, every real ``rows``, where its ``reader``
            reads it, ``nan_is_missing`` or ``none``.
        fill: A padding entry's value (padding row, timestep, turn slot or node).
        packed: The ``pack_branches`` argument that adds it (``always``, ``token_rewards``, ``per_turn``,
            ``model_outputs``, ``sessions``; ``never``: the trainer's or the CLI's).
        required: Whether ``compute_advantages`` needs it in every batch.
        like: A key whose shape it must share and that must be there with it; ``None``: none.
        hint: Said after the key's name when it holds NaN where a stage reads it.
        stored: The dtype ``pack_branches`` stores it in, where not its class's own; ``None``: the class's.
        bounds: Its values' declared range (``Bounds``), checked where it is read; ``None``: none declared.

    Example:
        >>> key = prm_jax.kernels.BATCH_SCHEMA["turn_ids"]
        >>> key.shape_text, key.on, key.fill, key.numpy_dtype.__name__
        ('[B, T]', 'positions', -1, 'int32')
    """

    name: str
    shape: Shape
    on: Literal["positions", "timesteps", "rows", "turns", "groups", "nodes"]
    dtype: DTypeClass
    finite: Finite
    fill: float | int | bool        # a padding entry's value (padding row, timestep, turn slot or node)
    packed: Packed = "never"
    required: bool = False
    like: str | None = None         # a key whose shape it must share (and that must be there with it)
    hint: str = ""                  # said when the key holds NaN where a stage reads it
    stored: type | None = None      # the dtype pack_branches stores it in, where not the class's own
    bounds: Bounds | None = None    # its values' range, where one is declared (checked where it is read)

    @property
    def numpy_dtype(self) -> type:
        """The dtype ``pack_branches`` stores it in (float32, int32, bool; the 0/1 masks as int32, AReaL's)."""
        return self.stored or {"float": np.float32, "int": np.int32, "mask": np.bool_}[self.dtype]

    @property
    def shape_text(self) -> str:
        return SHAPE_TEXT[self.shape]


#: Every key of the batch, declared once, in pack_branches' order (its output dict, and so batch.npz,
#: follow it).
BATCH_SCHEMA: Mapping[str, BatchKey] = MappingProxyType({key.name: key for key in (
    BatchKey("input_ids", "BT", "positions", "int", "none", 0, packed="always"),
    BatchKey("attention_mask", "BT", "positions", "mask", "none", 0, packed="always", required=True, stored=np.int32),
    BatchKey("loss_mask", "BT", "positions", "mask", "none", 0, packed="always", required=True, stored=np.int32),
    BatchKey("logprobs", "BT", "positions", "float", "trained", 0.0, packed="always", required=True, bounds=LOGPROB),
    BatchKey("turn_ids", "BT", "positions", "int", "none", -1, packed="always"),
    BatchKey("token_rewards", "BT", "positions", "float", "trained", 0.0, packed="token_rewards"),
    BatchKey("token_reward_mask", "BT", "positions", "mask", "none", False, like="token_rewards"),
    BatchKey("rewards", "B", "rows", "float", "rows", 0.0, packed="always", required=True),
    BatchKey("is_truncated", "B", "rows", "mask", "none", False, packed="always"),
    BatchKey("group_ids", "B", "rows", "int", "none", -1, packed="always"),
    BatchKey("anchor_ids", "BK", "turns", "int", "none", -1, packed="per_turn"),
    BatchKey("turn_rewards", "BK", "turns", "float", "reader", 0.0, packed="per_turn"),
    BatchKey("turn_reward_mask", "BK", "turns", "mask", "none", False, packed="per_turn", like="turn_rewards"),
    BatchKey("prm_logprobs", "BT", "timesteps", "float", "reader", 0.0, packed="model_outputs",
             hint=" (NaN: a turn without PRM log-probs; PRIME reads them)", bounds=LOGPROB),
    BatchKey("ref_logprobs", "BT", "timesteps", "float", "reader", 0.0, packed="model_outputs",
             hint=" (NaN: a turn without reference log-probs; the KL reward and PRIME read them)", bounds=LOGPROB),
    BatchKey("sum_pi_squared", "BT", "timesteps", "float", "reader", 0.0, packed="model_outputs",
             hint=" (NaN: a turn without output_sum_pi_squared; credit_assignment 'otb' reads them)",
             bounds=PROBABILITY),
    # (No stage reads it: the trainer's distillation_rewards and distillation_loss check it where they read it.)
    BatchKey("teacher_logprobs", "BT", "timesteps", "float", "none", 0.0, packed="model_outputs", bounds=LOGPROB),
    BatchKey("rollout_is_weights", "BT", "timesteps", "float", "reader", 1.0,
             hint=" (credit_assignment 'otb' reads them where given)", bounds=WEIGHT),
    BatchKey("node_ids", "BK", "turns", "int", "none", -1, packed="sessions"),
    BatchKey("node_parents", "N", "nodes", "int", "none", -1, packed="sessions"),
    BatchKey("values", "BT", "timesteps", "float", "trained", 0.0),
    BatchKey("prox_logprobs", "BT", "timesteps", "float", "trained", 0.0, bounds=LOGPROB),
    BatchKey("gae_lambda", "B", "rows", "float", "rows", 1.0),  # (its λ step reads every row whenever given)
    BatchKey("reward_sources", "BK", "rows", "float", "nan_is_missing", 0.0),
    BatchKey("group_sizes", "G", "groups", "int", "none", 1),
    BatchKey("group_member_counts", "G", "groups", "int", "none", 1),
)})

# The per-token model outputs a session carries (on timesteps in the batch; NaN where a turn has none).
MODEL_OUTPUT_KEYS: tuple[str, ...] = tuple(name for name, key in BATCH_SCHEMA.items() if key.packed == "model_outputs")
REQUIRED_KEYS: tuple[str, ...] = tuple(name for name, key in BATCH_SCHEMA.items() if key.required)
# The keys the pipeline reads (input_ids is the model's, not the pipeline's).
READ_KEYS: tuple[str, ...] = tuple(name for name in BATCH_SCHEMA if name != "input_ids")


def float_keys(schema: Mapping[str, BatchKey] = BATCH_SCHEMA) -> tuple[str, ...]:
    """The float keys: their dtypes choose the pipeline's accumulation dtype (float64 when one is)."""
    return tuple(name for name, key in schema.items() if key.dtype == "float")


def timestep_checked_keys(schema: Mapping[str, BatchKey] = BATCH_SCHEMA) -> tuple[str, ...]:
    """The float keys on positions or timesteps whose finiteness the pipeline checks on trained timesteps
    (every ``trained`` key; a ``reader`` key where a stage reads it): ``_finite_inputs_checks``."""
    return tuple(name for name, key in schema.items()
                 if key.dtype == "float" and key.on in ("positions", "timesteps") and key.finite in ("trained", "reader"))


_UNCHECKED = [name for name, key in BATCH_SCHEMA.items() if key.finite == "trained" and name not in timestep_checked_keys()]
if _UNCHECKED:
    raise AssertionError(f"keys finite on trained timesteps must lie on positions or timesteps: {_UNCHECKED}")


def described(names: tuple[str, ...]) -> str:
    """``batch['a'] [B, T] and batch['b'] [N]``: what an error asks for."""
    return " and ".join(f"batch[{name!r}] {BATCH_SCHEMA[name].shape_text}" for name in names)


ANCHOR_MIN, ANCHOR_MAX = -(2**63), 2**64 - 1  # any 64-bit id, signed or unsigned


def is_anchor_id(value: object) -> bool:
    """An anchor id: a 64-bit integer, signed or unsigned (not a bool); -1 means "no anchor"."""
    return (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            and bool(ANCHOR_MIN <= value <= ANCHOR_MAX))
