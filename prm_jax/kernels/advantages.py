"""The fused advantage pipeline: outcome rewards, KL, GAE, normalization and process-reward shaping.

``compute_advantages`` takes a padded batch and returns everything on *timesteps* (see ``alignment``).
Rollout-side arrays (``loss_mask``, ``logprobs``, ``turn_ids``, ``token_rewards``) come on *positions*, as
exported, and are shifted here; model outputs (``values``, ``ref_logprobs``, ``prox_logprobs``) come out
of a forward pass already on timesteps and are not shifted (AReaL's alignment). In order:

1. outcome reward: optional overlong penalty; ``r = clip((r + reward_bias) * reward_scaling, +-reward_clip)``;
   optional ``reward_norm`` over the ``[B]`` vector.
2. shift the rollout-side arrays to timesteps; the shifted mask is ``m``. The old log-probs are the
   recomputed ``prox_logprobs`` when given, else the shifted behaviour ``logprobs``; they and the
   reference log-probs are zeroed where ``m = 0``.
3. ``kl_rewards = -kl_ctl * clamp(kl, -10, 10)`` on active timesteps, 0 at timestep ``seqlen - 1``.
   Without ``ref_logprobs`` the reference log-prob is 0 (AReaL's rule; a warning once per trace when
   ``kl_ctl != 0``).
4. truncation: ``is_truncated`` when given, else ``seqlen == T`` (with a warning: it mislabels a row that
   ends exactly at the padded width). The outcome reward goes to timestep ``max(seqlen - 2, 0)``, or 0
   there for truncated rows under ``mask_no_eos_with_zero``, which also zeroes their process rewards.
5. process rewards ``P = shifted(token_rewards) * m``: kept for shaping (``token_rewards_as_adv``), or
   folded: each turn's uniform reward is added once, at the timestep predicting its last token.
6. GAE (``gae`` or ``turn_gae``) with bootstrap ``V[seqlen - 1]`` on truncated rows; λ is the batch's
   per-row ``gae_lambda``, the config's λ function of the rows' lengths, or its float. At turn level
   the KL rewards are added to the advantages after GAE instead of entering the turn rewards, and
   timesteps outside every turn get advantage 0 (plus their KL reward) and return ``V_t``.
7. ``returns = advantages + values`` before normalization and shaping; ``tot_rewards`` = task rewards
   plus KL rewards (at both levels).
8. optional ``adv_norm`` over active timesteps.
9. shaping with ``P`` (``shaping``); returns and ``tot_rewards`` are never shaped.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, Protocol, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from prm_jax.kernels import _checks
from prm_jax.kernels.alignment import shift_to_next_token
from prm_jax.kernels.estimator import EstimatorSpec, EstimatorStage, finish, row_groups
from prm_jax.kernels.estimators import estimator_for
from prm_jax.kernels.gae_lambda import GAELambdaContext
from prm_jax.kernels.gigpo import host_anchor_ids
from prm_jax.kernels.kl import KLEstimator, kl_rewards
from prm_jax.kernels.normalization import (
    DecoupledNorm,
    GroupLayout,
    NormConfig,
    _decoupled_normalization_core,
    _normalize_core,
    group_ids_check,
    group_layout,
    group_sizes_check,
    member_counts_check,
    segment_moments,
)
from prm_jax.kernels.progress import ProgressTransform, progress_process
from prm_jax.kernels.pure import MinFormTransform, _min_form_core
from prm_jax.kernels.recurrence import GAEMethod, ScanStrategy, resolve_strategy
from prm_jax.kernels.schema import (
    BATCH_SCHEMA,
    MODEL_OUTPUT_KEYS,
    READ_KEYS,
    REQUIRED_KEYS,
    described,
    float_keys,
    timestep_checked_keys,
)
from prm_jax.kernels.shaping import ShapingConfig, _shape_core, process_range_check, warn_gvpo_without_penalty
from prm_jax.kernels.token_gae import TokenGAE
from prm_jax.kernels.turns import (
    TurnSteps,
    any_change_within_turns,
    changes_within_turns,
    first_at_or_after,
    turn_counts,
    turn_ids_check,
    turn_steps,
)

TimestepUnit = Literal["token", "turn"]
TIMESTEP_UNITS: tuple[TimestepUnit, ...] = get_args(TimestepUnit)


class AdvantageOutput(NamedTuple):
    """All ``[B, T]`` float32 on timesteps."""

    advantages: jax.Array
    returns: jax.Array
    kl_rewards: jax.Array
    tot_rewards: jax.Array
    loss_mask: jax.Array  # shifted, 0/1
    logprobs: jax.Array   # shifted, 0 where the shifted loss mask is 0
    # Scalars as arrays: "checks/<name>" violation counts (with check_values), and with
    # ``AdvantageConfig(diagnostics=True)`` the statistics that explain a mode that does not learn.
    diagnostics: dict[str, jax.Array]


# The stages of the pipeline. ``prm_jax.config.AdvantageConfig`` (AReaL's keys, validated) resolves into an
# ``AdvantagePlan`` of these once; the pipeline runs the stages the plan holds and tests no config flag.


@dataclasses.dataclass(frozen=True)
class OverlongPenalty:
    """DAPO's overlong reward penalty: ``min(-(len - (max_new_tokens - overlong_tokens)) / overlong_tokens
    * factor, 0)`` added to the outcome reward."""

    max_new_tokens: int
    overlong_tokens: int
    factor: float


@dataclasses.dataclass(frozen=True)
class OutcomeStage:
    """Step 1: the ``[B]`` outcome rewards: overlong penalty, bias, scaling, clip, optional normalization."""

    bias: float = 0.0
    scaling: float = 1.0
    clip: float = 20.0
    norm: NormConfig | DecoupledNorm | None = None
    overlong: OverlongPenalty | None = None


@dataclasses.dataclass(frozen=True)
class KLStage:
    """Step 3: ``-kl_ctl * clamp(kl, -10, 10)`` on active timesteps."""

    kl_ctl: float = 0.1
    estimator: KLEstimator = "k1"


@dataclasses.dataclass(frozen=True)
class TaskRewardStage:
    """Steps 4-5: where the outcome reward goes; ``mask_truncated`` (``mask_no_eos_with_zero``) zeroes it
    and the process rewards of truncated rows; ``fold_process`` folds uniform per-turn process rewards
    into the rewards (``token_rewards_as_adv=False``) instead of keeping them for shaping."""

    mask_truncated: bool = False
    fold_process: bool = False


@dataclasses.dataclass(frozen=True)
class LambdaFunction:
    """AReaL's dynamic λ: a jittable ``fn(GAELambdaContext, **kwargs) -> [B]`` (``gae_lambda``), with the
    timestep unit whose lengths it reads."""

    fn: Callable[..., jax.Array]
    kwargs: tuple[tuple[str, Any], ...]
    name: str
    unit: TimestepUnit = "token"


# The process transforms of step 5, by their ``process_reward_transform.mode``: declared once (the config's
# parser, its ``setting``, the plan).
ProcessTransform = MinFormTransform | ProgressTransform
PROCESS_TRANSFORMS: dict[str, type[MinFormTransform] | type[ProgressTransform]] = {
    "min_form": MinFormTransform, "progress": ProgressTransform}


def transform_mode(transform: ProcessTransform | None) -> str | None:
    """The ``process_reward_transform.mode`` of a transform record (``None`` for none)."""
    return None if transform is None else next(name for name, cls in PROCESS_TRANSFORMS.items()
                                               if isinstance(transform, cls))


@dataclasses.dataclass(frozen=True)
class AdvantagePlan:
    """A resolved, validated configuration: the stages ``compute_advantages`` runs, in order.

    Hashable: it is the static argument of the jitted pipeline, so equal plans never retrace. Build it
    with ``prm_jax.config.AdvantageConfig(...).plan`` (AReaL's keys, validated) rather than by hand.
    ``shaping`` is ``None`` when the process rewards are folded or unused; ``check_turn_ids`` says the
    turn ids must follow AReaL's rules (turn-level GAE or a λ function).
    """

    outcome: OutcomeStage = OutcomeStage()
    kl: KLStage = KLStage()
    task: TaskRewardStage = TaskRewardStage()
    process_transform: ProcessTransform | None = None
    discount: float = 1.0
    lam: float | LambdaFunction = 1.0
    estimator: EstimatorStage = TokenGAE()
    adv_norm: NormConfig | None = None
    shaping: ShapingConfig | None = ShapingConfig()
    gae_method: GAEMethod = "auto"
    max_turns: int | None = None
    check_turn_ids: bool = False
    check_values: bool | Literal["callback"] = True
    diagnostics: bool = False
    # The backend choices (``ScanStrategy``): ``None`` until ``compute_advantages`` resolves them from
    # ``gae_method``, the batch (a per-row λ) and the devices, before tracing; a plan that holds one is run
    # with it as it is (``with_strategy``).
    strategy: ScanStrategy | None = None

    def with_strategy(self, batch: Mapping[str, Any]) -> AdvantagePlan:
        """This plan with its strategy resolved for ``batch`` (kept when it holds one already): the static
        record the jitted pipeline runs. ``gamma * lam == 1`` is known before tracing only for one float λ."""
        unit_discount = ("gae_lambda" not in batch and not isinstance(self.lam, LambdaFunction)
                         and self.discount * self.lam == 1.0)
        if self.strategy is not None:
            if self.strategy.gae == "cumsum" and not unit_discount:
                raise ValueError("the plan's strategy runs the GAE as a cumulative sum (ScanStrategy.gae='cumsum'),"
                                 " which is exact only for gamma * lam == 1: not for this plan and batch")
            return self
        return _with_strategy(self, resolve_strategy(self.gae_method, unit_discount=unit_discount,
                                                     sharded=jax.device_count() > 1))

    @property
    def estimator_spec(self) -> EstimatorSpec:
        """The declaration of ``estimator`` (``prm_jax.kernels.estimators``)."""
        return estimator_for(self.estimator)

    @property
    def reads(self) -> tuple[str, ...]:
        """The batch keys a stage of this plan needs or reads when present, beyond the required ones and the
        rollout's (``prm_jax.kernels.schema``): what a caller packs. The estimator's own; GDPO's
        ``reward_sources``; the reference log-probs for a KL reward."""
        spec = self.estimator_spec
        stages = (("reward_sources",) if isinstance(self.outcome.norm, DecoupledNorm) else ()) + (
            ("ref_logprobs",) if self.kl.kl_ctl != 0 else ())
        return tuple(dict.fromkeys((*spec.batch_keys, *stages)))

    @property
    def model_outputs_read(self) -> tuple[str, ...]:
        """The per-token model outputs a stage reads (``ref_logprobs``: the KL reward when ``kl_ctl != 0``, and
        the estimators that declare them, as PRIME; ``prm_logprobs``: PRIME). One that is read must be there
        on every trained timestep (finite); one that is not read may hold anything (NaN where a session had
        none): the schema's model outputs (``MODEL_OUTPUT_KEYS``) in the order this plan reads them."""
        return tuple(key for key in self.reads if key in MODEL_OUTPUT_KEYS)

    def num_turns(self, width: int) -> int:
        return self.max_turns or width


class PlanSource(Protocol):
    """Anything that resolves into a plan (``prm_jax.config.AdvantageConfig``)."""

    @property
    def plan(self) -> AdvantagePlan: ...


def as_plan(config: AdvantagePlan | PlanSource) -> AdvantagePlan:
    """The plan of ``config`` (a plan is its own)."""
    plan = config if isinstance(config, AdvantagePlan) else getattr(config, "plan", None)
    if not isinstance(plan, AdvantagePlan):
        raise TypeError(f"config must be an AdvantageConfig or an AdvantagePlan, got {type(config).__name__}")
    return plan


def _outcome_rewards(rewards, sources, raw_active, real_rows, stage: OutcomeStage, groups_of,
                     grpo_groups: GroupLayout | None, checks) -> tuple[jax.Array, dict[str, jax.Array]]:
    dtype = rewards.dtype
    if stage.overlong is not None:
        max_new, tokens, factor = stage.overlong.max_new_tokens, stage.overlong.overlong_tokens, stage.overlong.factor
        response_length = jnp.sum(raw_active.astype(dtype), axis=1)
        exceed = response_length - (max_new - tokens)
        rewards = rewards + jnp.minimum(-exceed / tokens * factor, 0.0)
    rewards = jnp.clip((rewards + stage.bias) * stage.scaling, -stage.clip, stage.clip)
    if isinstance(stage.norm, DecoupledNorm):
        # The batch's GRPO groups, else the whole batch: the rule of every group-wise credit mode.
        return _decoupled_rewards(rewards, sources, real_rows, stage.norm, grpo_groups, checks)
    if stage.norm is not None:
        # Every real row counts (one without generated tokens too, as in AReaL); padding rows (no
        # attention at all) do not, and come out as 0.
        rewards = _normalize_core(rewards[:, None], real_rows[:, None], stage.norm, groups_of(stage.norm))[:, 0]
    return rewards, {}


def _decoupled_rewards(rewards, sources, real_rows, norm: DecoupledNorm, groups: GroupLayout | None,
                       checks) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GDPO: the outcome reward and the batch's ``reward_sources [B, K]`` normalized source by source."""
    columns = rewards[:, None] if sources is None else jnp.concatenate([rewards[:, None], sources], axis=1)
    count = columns.shape[1]
    if norm.weights is not None and len(norm.weights) != count:
        raise ValueError(f"reward_norm.weights has {len(norm.weights)} entries but there are {count} reward sources "
                         "(the outcome reward and batch['reward_sources'] [B, K])")
    weights = jnp.asarray(norm.weights if norm.weights is not None else (1.0,) * count, rewards.dtype)
    row_group, num_groups = row_groups(groups, rewards.shape[0])
    out, missing = _decoupled_normalization_core(columns, weights, real_rows, row_group, num_groups, norm.eps)
    checks.append(_checks.ValueCheck("reward_sources_infinite",
                                     _checks.violations(jnp.isinf(columns) & real_rows[:, None]),
                                     lambda: "batch['reward_sources'] must be finite or NaN (a missing score)"))
    return out, {"decoupled/rows_without_rewards": jnp.sum(missing, dtype=jnp.int32),
                 "decoupled/missing_share": jnp.sum(jnp.isnan(columns) & real_rows[:, None], dtype=jnp.int32).astype(
                     rewards.dtype) / jnp.maximum(jnp.sum(real_rows, dtype=jnp.int32) * count, 1).astype(rewards.dtype)}


def _min_form_turns(process: jax.Array, active: jax.Array, turns: TurnSteps, temperature: float,
                    method: str) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``process_reward_transform: min_form``: each turn's process score (its value at the turn's last
    timestep) becomes its min-form reward over the row's turns, uniform over the turn's timesteps.

    Where every turn's process reward is uniform (a scalar scorer's), each timestep already holds its turn's
    score and takes its reward in place; otherwise each active timestep takes the reward at its own turn's
    end (one masked fill). ``_min_form_core`` computes both from the same per-row weights, so the two give
    the same numbers on uniform turns, and a row's numbers do not depend on which one its batch takes
    (``lax.cond`` runs only the one taken).
    """
    zero = jnp.zeros((), process.dtype)
    ends = turns.ends

    def in_place(_: None) -> jax.Array:
        return _min_form_core(process, ends, temperature, at=active)

    def spread(_: None) -> jax.Array:
        rewards = _min_form_core(process, ends, temperature)  # the min-form reward at each turn end
        return jnp.where(active, first_at_or_after(rewards, ends, method), zero)

    out = lax.cond(any_change_within_turns(process, turns, active, method), spread, in_place, None)
    diagnostics = {"min_form/turns": jnp.sum(ends, dtype=jnp.int32),  # (each turn's reward once: at its end)
                   "min_form/row_sum_mean": jnp.sum(jnp.where(ends, out, zero)) / jnp.maximum(
                       jnp.sum(jnp.any(ends, axis=1), dtype=jnp.int32), 1).astype(out.dtype)}
    return out, diagnostics


def _fold_turn_rewards(process: jax.Array, active: jax.Array, turns: TurnSteps,
                       method: str) -> tuple[jax.Array, _checks.ValueCheck]:
    """Folds uniform per-turn rewards into one reward at each turn's last timestep, with a uniformity check.

    A turn is what ``turn_steps`` says (the active timesteps of one turn id, holes of the loss mask
    included; a run of adjacent active timesteps without ``turn_ids``).
    """
    zero = jnp.zeros((), process.dtype)
    uneven = changes_within_turns(process, turns, active, method)
    count = _checks.violations(uneven)
    row, step = _checks.located(count, lambda: _checks.first_flagged(uneven))
    check = _checks.ValueCheck(
        "turn_rewards_not_uniform", count,
        lambda row, step: "token_rewards_as_adv=False folds one reward per turn into GAE, so token_rewards must "
                          f"be uniform over each turn's generated tokens; row {int(row)} changes value at timestep "
                          f"{int(step)}", row, step)
    return jnp.where(turns.ends, process, zero), check


class Timesteps(NamedTuple):
    """The batch on timesteps: rollout-side arrays shifted, model outputs as given; ``None`` when absent."""

    active: jax.Array               # [B, T] bool, the shifted loss mask m
    logprobs: jax.Array             # [B, T] old log-probs (recomputed ones when given), 0 where m = 0
    ref_logprobs: jax.Array | None  # [B, T] reference log-probs, 0 where m = 0
    turn_ids: jax.Array | None      # [B, T] int32, -1 in the last column
    process: jax.Array | None       # [B, T] process rewards P, 0 where m = 0
    values: jax.Array               # [B, T] (0 without a critic)


def _to_timesteps(batch: Mapping[str, jax.Array], raw_active: jax.Array, dtype) -> Timesteps:
    zero = jnp.zeros((), dtype)
    active = shift_to_next_token(raw_active, fill=False)

    def masked(x):
        return jnp.where(active, x, zero)

    def position_float(key):
        return masked(shift_to_next_token(_checks.as_float(f"batch[{key!r}]", batch[key], dtype)))

    def timestep_float(key):
        return _checks.as_float(f"batch[{key!r}]", batch[key], dtype)

    logprobs = (masked(timestep_float("prox_logprobs")) if "prox_logprobs" in batch
                else position_float("logprobs"))
    return Timesteps(
        active=active, logprobs=logprobs,
        ref_logprobs=masked(timestep_float("ref_logprobs")) if "ref_logprobs" in batch else None,
        turn_ids=(shift_to_next_token(_checks.as_int("batch['turn_ids']", batch["turn_ids"]), fill=-1)
                  if "turn_ids" in batch else None),
        process=position_float("token_rewards") if "token_rewards" in batch else None,
        values=timestep_float("values") if "values" in batch else jnp.zeros(active.shape, dtype))


def _kl(steps: Timesteps, seqlen: jax.Array, stage: KLStage) -> jax.Array:
    """KL rewards; without reference log-probs the reference is 0 (AReaL), so k1 gives ``kl_ctl * logp``.
    With ``kl_ctl = 0`` there is no KL term, and the reference log-probs are not read."""
    if stage.kl_ctl == 0:
        return jnp.zeros_like(steps.logprobs)
    ref = jnp.zeros_like(steps.logprobs) if steps.ref_logprobs is None else steps.ref_logprobs
    kl = kl_rewards(steps.logprobs, ref, steps.active, kl_ctl=stage.kl_ctl, estimator=stage.estimator)
    step = lax.broadcasted_iota(jnp.int32, kl.shape, 1)
    return jnp.where(step == (seqlen - 1)[:, None], jnp.zeros((), kl.dtype), kl)


def _truncation(batch: Mapping[str, jax.Array], seqlen: jax.Array, width: int) -> jax.Array:
    if "is_truncated" in batch:
        return _checks.as_mask("batch['is_truncated']", batch["is_truncated"])
    return seqlen == width  # AReaL's fallback (compute_advantages warns)


def _lambda_context(steps: Timesteps, unit: TimestepUnit, turns: TurnSteps | None) -> GAELambdaContext:
    tokens = jnp.sum(steps.active, axis=1, dtype=jnp.int32)
    counts = jnp.zeros_like(tokens) if turns is None else turn_counts(turns)
    return GAELambdaContext(effective_token_lengths=tokens, turn_counts=counts,
                            timestep_lengths=tokens if unit == "token" else counts)


def _gae_lambda(batch: Mapping[str, jax.Array], steps: Timesteps, plan_lam: float | LambdaFunction, dtype,
                turns: TurnSteps | None, checks: list) -> jax.Array:
    """λ: the batch's per-row ``gae_lambda [B]``, else the plan's function of lengths, else its float."""
    who = "batch['gae_lambda']"
    if "gae_lambda" in batch:
        lam = _checks.as_float(who, batch["gae_lambda"], dtype)
    elif isinstance(plan_lam, LambdaFunction):
        who = f"the λ returned by {plan_lam.name}"
        lam = plan_lam.fn(_lambda_context(steps, plan_lam.unit, turns), **dict(plan_lam.kwargs))
        _checks.check_shape(who, lam, steps.active.shape[:1], "the batch axis")
        lam = _checks.as_float(who, lam, dtype)
    else:
        return jnp.asarray(plan_lam, dtype)
    outside = ~((lam >= 0) & (lam <= 1))  # NaN is outside too
    row, _, value = _checks.first_flagged(outside[:, None], lam[:, None])
    checks.append(_checks.ValueCheck(
        "gae_lambda_out_of_range", _checks.violations(outside),
        lambda row, value: f"per-row gae_lambda must be finite and in [0, 1] ({who}); row {int(row)} has "
                           f"{float(value)!r}", row, value))
    return lam


def _check_batch_shapes(batch: Mapping[str, jax.Array], plan: AdvantagePlan) -> tuple[int, int]:
    """Trace-time checks of every key's dtype class and shape (``BATCH_SCHEMA``) and of the keys the
    estimator needs; returns ``(B, T)``."""
    _checks.check_rank("batch['attention_mask']", batch["attention_mask"], 2)
    shape = np.shape(batch["attention_mask"])
    for name, key in BATCH_SCHEMA.items():
        if name not in batch or name == "attention_mask":
            continue
        where = f"batch[{name!r}]"
        _checks.check_dtype_class(where, batch[name], key.dtype)
        if key.shape == "BT":
            _checks.check_shape(where, batch[name], shape, "attention_mask")
        elif key.shape == "B":
            _checks.check_shape(where, batch[name], shape[:1], "the batch axis")
        elif key.shape in ("G", "N"):
            _checks.check_rank(where, batch[name], 1)
        else:
            _checks.check_rank(where, batch[name], 2)
            if np.shape(batch[name])[0] != shape[0]:
                raise ValueError(f"{where} must be [B, K] with B = {shape[0]}, got {np.shape(batch[name])}")
        if key.like is not None:
            if key.like not in batch:
                raise ValueError(f"{where} goes with batch[{key.like!r}]; it needs them")
            _checks.check_shape(where, batch[name], np.shape(batch[key.like]), f"batch[{key.like!r}]")
    spec = plan.estimator_spec
    missing = tuple(name for name in spec.reads if name not in batch)
    if missing:
        raise ValueError(f"{spec.label} needs {described(spec.reads)}{spec.missing_hint}")
    return shape[0], shape[1]


def _batch_checks(batch: Mapping[str, jax.Array], num_rows: int) -> list[_checks.ValueCheck]:
    """Value checks of the inputs themselves: masks are bool or 0/1, groups add up."""
    checks = [*_checks.mask_check("batch['attention_mask']", batch["attention_mask"]),
              *_checks.mask_check("batch['loss_mask']", batch["loss_mask"])]
    for key in ("is_truncated", "token_reward_mask"):
        if key in batch:
            checks += _checks.mask_check(f"batch[{key!r}]", batch[key])
    if "group_sizes" in batch:
        checks.append(group_sizes_check(batch["group_sizes"], num_rows))
    elif "group_ids" in batch:
        checks.append(group_ids_check(batch["group_ids"], num_rows))
    if "group_member_counts" in batch:
        checks.append(member_counts_check(batch["group_member_counts"]))
    return checks


def _finite_inputs_checks(batch: Mapping[str, jax.Array], steps: Timesteps, last_value: jax.Array,
                          truncated: jax.Array, dtype, plan: AdvantagePlan) -> list[_checks.ValueCheck]:
    """Every float input on positions or timesteps is finite where it is used, by ``BATCH_SCHEMA``'s
    ``finite`` rule, derived from the schema (a key added there is checked with no other change): a
    ``trained`` key on the trained timesteps (a key on positions as the stages read it, shifted to the next
    token), a ``reader`` model output where a stage reads it (``plan.model_outputs_read``; one no stage
    reads may hold anything), and a truncated row's bootstrap value ``V[seqlen - 1]`` (one NaN there would
    reach every advantage through batch normalization). The other keys' rules are kept where they are read:
    ``rows`` by the outcome stage (``batch['rewards']``), a ``reader`` key of turns or rows by its stage
    (GiGPO's ``turn_rewards``, the λ), ``nan_is_missing`` by GDPO's sources."""
    checks = []
    for name in timestep_checked_keys(BATCH_SCHEMA):
        key = BATCH_SCHEMA[name]
        # (values: without a critic the pipeline's zeros, checked all the same, so the diagnostics keep one
        # structure whatever the batch holds)
        if (name not in batch and name != "values") or not (key.finite == "trained" or name in plan.model_outputs_read):
            continue
        array = _checks.as_float(f"batch[{name!r}]", batch[name], dtype) if name in batch else steps.values
        if key.on == "positions":  # as the stages read it: on the next token's timestep
            array = shift_to_next_token(array)
        checks.append(_checks.finite_check(f"batch[{name!r}]", jnp.where(steps.active, array, jnp.zeros((), dtype)),
                                           steps.active, hint=key.hint))
    checks.append(_checks.finite_check("batch['values'] (the bootstrap value V[seqlen - 1] of a truncated row)",
                                       last_value, truncated, key="values_bootstrap"))
    return checks


def outputs_check(advantages: jax.Array, returns: jax.Array, active: jax.Array) -> _checks.ValueCheck:
    """The last check: advantages and returns are finite on trained timesteps, read in one fused pass.

    Every input passed its own checks by then, so a non-finite output is a float32 overflow inside a stage
    (inputs or settings near float32's range, 3.4e38): counted like any check, never returned silently.
    """
    zero = jnp.zeros((), advantages.dtype)
    bad_rows = jnp.isnan(jnp.sum(jnp.where(active, advantages * zero + returns * zero, zero), axis=1))
    count = _checks.violations(bad_rows)

    def locate() -> tuple[jax.Array, ...]:
        bad_advantage = active & ~jnp.isfinite(advantages)
        flags = bad_advantage | (active & ~jnp.isfinite(returns))
        row, step, advantage, ret = _checks.first_flagged(flags, advantages, returns)
        return row, step, jnp.any(bad_advantage), advantage, ret

    row, step, which, advantage, ret = _checks.located(count, locate)
    return _checks.ValueCheck(
        "outputs_not_finite", count,
        lambda row, step, which, advantage, ret: (
            f"compute_advantages computed a non-finite {'advantage' if which else 'return'} "
            f"({float(advantage if which else ret)!r}) at row {int(row)}, timestep {int(step)} from inputs that "
            "passed their checks: a float32 overflow inside a stage (inputs or settings near float32's range, "
            "|x| <= 3.4e38, or sums or squares of them); scale them down. (Or a normalization with eps 0 over a "
            "group of equal values: 0 / 0.)"), row, step, which, advantage, ret)


def _sequence_lengths(attention_mask: jax.Array) -> jax.Array:
    """``seqlen = sum(attention_mask)`` per row, summed as given: no converted copy of the mask."""
    attention = jnp.asarray(attention_mask)
    _checks.check_mask_dtype("batch['attention_mask']", attention)
    if attention.dtype == jnp.bool_:
        return jnp.count_nonzero(attention, axis=1).astype(jnp.int32)
    return jnp.sum(attention, axis=1, dtype=jnp.int32)


def _task_rewards(outcome: jax.Array, process: jax.Array | None, steps: Timesteps, outcome_at: jax.Array,
                  truncated: jax.Array, stage: TaskRewardStage, turns: TurnSteps | None, method: str,
                  checks: list) -> tuple[jax.Array, jax.Array | None, jax.Array]:
    """Steps 4-5: the outcome reward at timestep ``max(seqlen - 2, 0)`` (0 for truncated rows under
    ``mask_no_eos_with_zero``, which also clears their process rewards), plus folded turn rewards; and the
    ``[B]`` outcome every estimator reads (the same zeros: GiGPO, tree, PURE and PRIME honour it too)."""
    zero = jnp.zeros((), outcome.dtype)
    if stage.mask_truncated:
        outcome = jnp.where(truncated, zero, outcome)
        if process is not None:
            process = jnp.where(truncated[:, None], zero, process)
    task = jnp.where(outcome_at, outcome[:, None], zero)
    if process is not None and stage.fold_process:
        assert turns is not None  # the plan reads turns when it folds
        folded, uniform_check = _fold_turn_rewards(process, steps.active, turns, method)
        checks.append(uniform_check)
        task = task + folded
    return task, process, outcome


GRPO_GROUPS = NormConfig("group", "group")
# The prefixes of the diagnostics of stages other than the estimator: GDPO's (reward_norm: {mode: decoupled})
# and min-form's (process_reward_transform); each estimator declares its own (EstimatorSpec.diagnostics).
STAGE_DIAGNOSTICS = ("decoupled/", "min_form/", "progress/")


def _groups_of(batch: Mapping[str, jax.Array], num_rows: int, norm: NormConfig) -> GroupLayout | None:
    if not norm.uses_groups:
        return None
    return group_layout(num_rows, norm, batch.get("group_sizes"), batch.get("group_member_counts"),
                        batch.get("group_ids"))


def _estimator_inputs(spec: EstimatorSpec, batch: Mapping[str, jax.Array], rewards: jax.Array, outcome: jax.Array,
                      process: jax.Array | None, steps: Timesteps, bootstrap: jax.Array, lam: jax.Array,
                      real_rows: jax.Array, groups: GroupLayout | None, gamma: jax.Array, num_turns: int,
                      strategy: ScanStrategy, outcome_at: jax.Array, turns: TurnSteps | None,
                      dtype: Any) -> dict[str, Any]:
    """The inputs ``spec.run`` names (``prm_jax.kernels.estimator.INPUTS``), and only those; its batch holds
    only the keys it declared."""
    declared = spec.batch_keys
    available: dict[str, Callable[[], Any]] = {
        "batch": lambda: {key: batch[key] for key in declared if key in batch},
        "rewards": lambda: rewards, "outcome": lambda: outcome, "process": lambda: process,
        "active": lambda: steps.active, "values": lambda: steps.values, "turn_ids": lambda: steps.turn_ids,
        "ref_logprobs": lambda: steps.ref_logprobs, "bootstrap": lambda: bootstrap, "lam": lambda: lam,
        "gamma": lambda: gamma, "real_rows": lambda: real_rows,
        "row_group": lambda: row_groups(groups, outcome.shape[0])[0],
        "num_groups": lambda: row_groups(groups, outcome.shape[0])[1], "num_turns": lambda: num_turns,
        "strategy": lambda: strategy, "outcome_at": lambda: outcome_at, "turns": lambda: turns,
        "dtype": lambda: dtype}
    return {name: available[name]() for name in spec.inputs}


class _Run(NamedTuple):
    output: AdvantageOutput
    checks: list[_checks.ValueCheck]  # empty without check_values: their reductions are compiled out
    unshaped: jax.Array               # the normalized advantages before shaping
    process: jax.Array | None         # P on timesteps
    active: jax.Array


def _pipeline(batch: Mapping[str, jax.Array], plan: AdvantagePlan) -> _Run:
    strategy = plan.strategy
    assert strategy is not None, "the plan's strategy is resolved before tracing (AdvantagePlan.with_strategy)"
    num_rows, width = _check_batch_shapes(batch, plan)
    dtype = _checks.accumulation_dtype(*(batch[k] for k in float_keys(BATCH_SCHEMA) if k in batch))
    checks = _batch_checks(batch, num_rows)
    seqlen = _sequence_lengths(batch["attention_mask"])
    # A position outside the attention mask is never trained, whatever its loss mask says (padding).
    raw_active = (_checks.as_mask("batch['loss_mask']", batch["loss_mask"])
                  & _checks.as_mask("batch['attention_mask']", batch["attention_mask"]))
    groups_of = functools.partial(_groups_of, batch, num_rows)
    grpo_groups = groups_of(GRPO_GROUPS) if "group_sizes" in batch or "group_ids" in batch else None
    rewards = _checks.as_float("batch['rewards']", batch["rewards"], dtype)
    checks.append(_checks.finite_check("batch['rewards']", rewards))
    sources = (_checks.as_float("batch['reward_sources']", batch["reward_sources"], dtype)
               if "reward_sources" in batch else None)
    outcome, outcome_diagnostics = _outcome_rewards(rewards, sources, raw_active, seqlen > 0, plan.outcome,  # 1
                                                    groups_of, grpo_groups, checks)
    steps = _to_timesteps(batch, raw_active, dtype)                                          # 2
    turns = None
    if _reads_turns(plan, batch):
        turns = turn_steps(steps.active, steps.turn_ids, strategy.general)
        if steps.turn_ids is not None:
            checks.append(turn_ids_check(steps.turn_ids, steps.active, turns, _turn_slots(plan, batch, width)))
    last_value = jnp.take_along_axis(steps.values, jnp.clip(seqlen - 1, 0, width - 1)[:, None], axis=1)[:, 0]
    truncated = _truncation(batch, seqlen, width)
    checks += _finite_inputs_checks(batch, steps, last_value, truncated, dtype, plan)  # the inputs as given
    if plan.process_transform is not None and steps.process is not None:                     # (5, first)
        transform = plan.process_transform
        if isinstance(transform, ProgressTransform):
            scored = (shift_to_next_token(_checks.as_mask("batch['token_reward_mask']", batch["token_reward_mask"]),
                                          fill=False) if "token_reward_mask" in batch else None)
            transformed, transform_diagnostics = progress_process(steps.process, steps.active, turns, scored, outcome,
                                                                  transform, strategy.general)
        else:
            assert turns is not None
            transformed, transform_diagnostics = _min_form_turns(steps.process, steps.active, turns,
                                                                 transform.temperature, strategy.general)
        steps = steps._replace(process=transformed)
        outcome_diagnostics = {**outcome_diagnostics, **transform_diagnostics}
    kl = _kl(steps, seqlen, plan.kl)                                                         # 3
    outcome_at = lax.broadcasted_iota(jnp.int32, steps.active.shape, 1) == jnp.maximum(seqlen - 2, 0)[:, None]
    task, process, outcome = _task_rewards(outcome, steps.process, steps, outcome_at, truncated, plan.task,  # 4-5
                                           turns, strategy.general, checks)
    # A row with attention after its last generated span (a trailing tool message) has its outcome on an
    # untrained timestep, where GAE's masked carry drops it (AReaL's rule): said, not silent.
    off = (seqlen > 0) & ~jnp.any(outcome_at & steps.active, axis=1)
    outcome_diagnostics = {**outcome_diagnostics, "outcome/rows_off_trained_timesteps": jnp.sum(off, dtype=jnp.int32)}
    bootstrap = jnp.where(truncated, last_value, jnp.zeros((), dtype))
    lam = _gae_lambda(batch, steps, plan.lam, dtype, turns, checks)
    spec = plan.estimator_spec
    advantages, returns, step_groups = finish(spec, spec.run(plan.estimator, checks, **_estimator_inputs(  # 6-7
        spec, batch, task + kl if spec.kl == "rewards" else task, outcome, process, steps, bootstrap, lam,
        seqlen > 0, grpo_groups, jnp.asarray(plan.discount, dtype), plan.num_turns(width), strategy, outcome_at,
        turns, dtype)), kl, steps.values)
    if plan.adv_norm is not None:                                                            # 8
        advantages = _normalize_core(advantages, steps.active, plan.adv_norm, groups_of(plan.adv_norm))
    unshaped = advantages
    if process is not None and plan.shaping is not None:                                     # 9
        if plan.shaping.mode == "process_weighted":
            checks.append(process_range_check(process, steps.active))
        advantages = _shape_core(advantages, process, steps.active, plan.shaping)
    checks.append(outputs_check(advantages, returns, steps.active))
    output = AdvantageOutput(advantages=advantages, returns=returns, kl_rewards=kl, tot_rewards=task + kl,
                             loss_mask=steps.active.astype(dtype), logprobs=steps.logprobs,
                             diagnostics={**_diagnostics(advantages, unshaped, process, steps.active, grpo_groups,
                                                         plan), **outcome_diagnostics, **step_groups})
    return _Run(output, checks if plan.check_values else [], unshaped, process, steps.active)


def _reads_turns(plan: AdvantagePlan, batch: Mapping[str, Any]) -> bool:
    """Whether a stage of ``plan`` reads the batch's turns (then their ids are checked)."""
    transform = plan.process_transform
    turn_transform = transform is not None and getattr(transform, "level", "turn") == "turn"
    with_process = "token_rewards" in batch and (turn_transform or plan.task.fold_process)
    return plan.check_turn_ids or with_process or plan.estimator_spec.reads_turns


def _turn_slots(plan: AdvantagePlan, batch: Mapping[str, Any], width: int) -> int | None:
    """The bound on turn ids where turns index ``[B, K]`` slots (the estimator's ``turn_slots``: GiGPO's
    per-turn inputs, the tree's ``node_ids``), turn-level GAE's ``max_turns``; ``None`` where turns are only
    counted in order."""
    spec = plan.estimator_spec
    if spec.turn_slots is not None:
        return spec.turn_slots(batch, plan.num_turns(width))
    return plan.num_turns(width) if plan.check_turn_ids else None


def _diagnostics(advantages: jax.Array, unshaped: jax.Array, process: jax.Array | None, active: jax.Array,
                 groups: GroupLayout | None, plan: AdvantagePlan) -> dict[str, jax.Array]:
    """Scalars that explain a mode that does not learn (``plan.diagnostics``); under ``gvpo`` the share of
    negative process rewards always (the host warns when it is 0: gvpo reads only the sign)."""
    count = jnp.sum(active, dtype=jnp.int32)
    n = jnp.maximum(count, 1).astype(advantages.dtype)

    def share(flags: jax.Array) -> jax.Array:
        return jnp.sum(active & flags, dtype=jnp.int32).astype(advantages.dtype) / n

    gvpo = process is not None and plan.shaping is not None and plan.shaping.mode == "gvpo"
    out = {"process/negative_share": share(process < 0)} if gvpo and process is not None else {}
    if not plan.diagnostics:
        return out
    nonzero = active & (advantages != 0)
    out.update({"active_timesteps": count, "nonzero_advantage_share": share(advantages != 0),
                "shaping_changed_share": share(advantages != unshaped),
                "shaping_sign_flip_share": share(jnp.sign(advantages) * jnp.sign(unshaped) < 0)})
    # Over trained timesteps (0 for each statistic when none trains): population std. Taken on the values
    # scaled by a power of two into [-1, 1] (exact: the same bits where nothing overflows), so that float32
    # sums of huge values, or of their squares, stay finite for finite inputs.
    def stats(prefix: str, x: jax.Array) -> dict[str, jax.Array]:
        zero = jnp.zeros((), x.dtype)
        low = jnp.where(count > 0, jnp.min(jnp.where(active, x, jnp.inf)), zero)
        high = jnp.where(count > 0, jnp.max(jnp.where(active, x, -jnp.inf)), zero)
        _, exponent = jnp.frexp(jnp.maximum(jnp.abs(low), jnp.abs(high)))
        scale = jnp.ldexp(jnp.ones((), x.dtype), exponent)
        moments = segment_moments(x / scale, active, ddof=0)
        return {f"{prefix}/mean": moments.mean * scale, f"{prefix}/std": jnp.sqrt(moments.var) * scale,
                f"{prefix}/min": low, f"{prefix}/max": high}

    out.update(stats("advantages", advantages))
    row_group, num_groups = row_groups(groups, active.shape[0])
    group_active = jax.ops.segment_sum(jnp.sum(active, axis=1, dtype=jnp.int32), row_group, num_segments=num_groups)
    group_nonzero = jax.ops.segment_sum(jnp.sum(nonzero, axis=1, dtype=jnp.int32), row_group, num_segments=num_groups)
    out["groups"] = jnp.sum(group_active > 0, dtype=jnp.int32)
    out["zero_advantage_groups"] = jnp.sum((group_active > 0) & (group_nonzero == 0), dtype=jnp.int32)
    if process is not None:
        out.update({**stats("process", process),
                    "process/negative_share": share(process < 0), "process/zero_share": share(process == 0),
                    "process/positive_share": share(process > 0),
                    "process/outside_unit_share": share(~((process >= 0) & (process <= 1)))})
    return out


@functools.lru_cache(maxsize=256)
def _with_strategy(plan: AdvantagePlan, strategy: ScanStrategy) -> AdvantagePlan:
    """``plan`` holding ``strategy``: one object per pair, so a call that resolves to the plan of the call
    before finds its program by identity (a new copy cost ``jit`` a field-by-field comparison, ~20 us)."""
    return dataclasses.replace(plan, strategy=strategy)


@functools.partial(jax.jit, static_argnames=("plan", "locate"))
def _pipeline_jit(batch, plan, locate=True):
    """The pipeline; ``locate``: with the failed checks' details (``_checks.locating``)."""
    with _checks.locating(locate):
        run = _pipeline(batch, plan)
    return run.output, run.checks


@functools.partial(jax.jit, static_argnames=("plan", "shapings", "locate"))
def _variants_jit(batch, plan, shapings, locate=True):
    """The pipeline, and its normalized advantages under other shapings (one GAE for all), each with
    whether ``process_weighted`` found process rewards outside [0, 1]."""
    with _checks.locating(locate):
        run = _pipeline(batch, plan)
    assert run.process is not None  # compute_advantage_variants needs token_rewards
    shaped = tuple((_shape_core(run.unshaped, run.process, run.active, shaping),
                    process_range_check(run.process, run.active).count > 0 if shaping.mode == "process_weighted"
                    else jnp.zeros((), jnp.bool_)) for shaping in shapings)
    return run.output, run.checks, run.unshaped, shaped


def _warn_about_fallbacks(batch: Mapping[str, Any], plan: AdvantagePlan) -> None:
    if "is_truncated" not in batch:
        warnings.warn("batch has no 'is_truncated'; falling back to seqlen == width, which also marks a "
                      "complete row that exactly fills the padded width as truncated", stacklevel=3)
    if "ref_logprobs" not in batch and plan.kl.kl_ctl != 0:
        warnings.warn("batch has no 'ref_logprobs' but kl_ctl != 0: the KL reward uses a zero reference "
                      "log-prob (AReaL's rule), i.e. it rewards or penalizes the log-probs themselves",
                      stacklevel=3)


def _batch_arrays(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The keys the pipeline reads, lists and scalars as arrays (as everywhere else); host anchor ids wider
    than JAX's integers made dense (exact) first."""
    arrays = {key: batch[key] if isinstance(batch[key], (np.ndarray, jax.Array)) or _checks.is_traced(batch[key])
              else np.asarray(batch[key]) for key in READ_KEYS if batch.get(key) is not None}
    if "anchor_ids" in arrays:
        arrays["anchor_ids"] = host_anchor_ids(arrays["anchor_ids"])
    return arrays


def _padded_if_empty(arrays: dict[str, Any]) -> tuple[dict[str, Any], tuple[int, int] | None]:
    """A batch of no rows (every group filtered) or no timesteps, padded with one padding row (no attention,
    group id -1, or a group of its own) or timestep, and the real ``(B, T)`` to cut the outputs back to;
    ``None`` for a batch with both."""
    shape = np.shape(arrays["attention_mask"])
    if len(shape) != 2 or (shape[0] > 0 and shape[1] > 0):
        return arrays, None
    padded = {}
    for key, value in arrays.items():
        layout, fill = BATCH_SCHEMA[key].shape, BATCH_SCHEMA[key].fill
        xp = np if isinstance(value, np.ndarray) else jnp
        value = xp.asarray(value)
        if shape[0] == 0 and layout in ("BT", "B", "BK") and value.ndim >= 1:
            value = xp.concatenate([value, xp.full((1, *value.shape[1:]), fill, value.dtype)], axis=0)
        elif shape[0] == 0 and layout == "G" and not ("group_ids" in arrays and "group_sizes" not in arrays):
            value = xp.concatenate([value, xp.full((1,), fill, value.dtype)])
        if shape[1] == 0 and layout == "BT" and value.ndim == 2:
            value = xp.concatenate([value, xp.full((value.shape[0], 1), fill, value.dtype)], axis=1)
        padded[key] = value
    return padded, (shape[0], shape[1])


def _cut(output: AdvantageOutput, real: tuple[int, int] | None) -> AdvantageOutput:
    if real is None:
        return output
    rows, width = real
    return output._replace(**{field: getattr(output, field)[:rows, :width] for field in AdvantageOutput._fields
                              if field != "diagnostics"})


def compute_advantages(batch: Mapping[str, Any],
                       config: AdvantagePlan | PlanSource = AdvantagePlan()) -> AdvantageOutput:
    """Advantages and returns for a padded batch, as one fused jitted computation.

    Args:
      batch: mapping with, on positions (raw, as exported, right-padded):
        ``attention_mask [B, T]``, ``loss_mask [B, T]``, ``logprobs [B, T]``, ``rewards [B]``; optionally
        ``token_rewards [B, T]`` and ``turn_ids [B, T]`` int (positions); ``values [B, T]``,
        ``ref_logprobs [B, T]`` and ``prox_logprobs [B, T]`` (timesteps: model outputs);
        ``is_truncated [B]`` bool, ``gae_lambda [B]`` (per-row lambda, overrides the config),
        ``group_sizes [G]`` int (consecutive groups of varying size for group-level normalization) and
        ``group_member_counts [G]`` int (logical rollouts per group when one spans several rows), or
        instead of ``group_sizes`` ``group_ids [B]`` int (a group id per row in ``[0, B)``, -1 for a
        padding row: one shape for any number of groups; ``pack_branches`` emits it). Rows without any
        attention (padding rows) never count in reward normalization. Other keys (``input_ids``, ...)
        are ignored.
      config: ``prm_jax.AdvantageConfig`` (AReaL's keys) or the ``AdvantagePlan`` it resolves to (its
        ``.plan``), a static argument. The default plan is ``AdvantageConfig()``'s.

    Returns:
      ``AdvantageOutput``; see the module docstring for each step. ``output.diagnostics`` holds the
      value checks' violation counts (``"checks/<name>"``, unless ``check_values`` is False) and, with
      ``diagnostics`` on, the statistics listed in the guide 'Calling it from a jitted train step'.

    Raises:
      ValueError: on bad shapes (at trace time), and, when called eagerly with ``check_values`` on, on
        process rewards outside [0, 1] under ``process_weighted``, non-uniform turn rewards when folding,
        ``group_sizes`` that are not positive or do not sum to ``B``, bad ``group_ids``,
        ``group_member_counts`` below 1, a per-row λ outside [0, 1], or turn ids that break AReaL's rules
        (turn-level GAE or a λ function). Under an outer ``jit`` nothing is raised and no host round trip
        is paid: the counts come back in ``output.diagnostics``; ``check_values="callback"`` raises there
        too, from a host callback when the computation runs.
    """
    plan = as_plan(config)
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of arrays, got {type(batch).__name__}")
    missing = [key for key in REQUIRED_KEYS if batch.get(key) is None]
    if missing:
        raise ValueError(f"batch is missing required keys {missing}")
    arrays, real = _padded_if_empty(_batch_arrays(batch))
    _warn_about_fallbacks(arrays, plan)
    resolved = plan.with_strategy(arrays)
    output, checks = _pipeline_jit(arrays, plan=resolved, locate=_locate_first(plan))
    located = lambda: _pipeline_jit(arrays, plan=resolved, locate=True)[1]
    return _cut(_settle_checks(output, checks, plan, located), real)


def _locate_first(plan: AdvantagePlan) -> bool:
    """Whether the first program computes its failed checks' details: only for a host callback, which
    raises from inside it. Otherwise the counts alone (a shorter compile), and a failed check is traced
    again with its details (``_settle_checks``): an error's cost, paid on the error path only."""
    return plan.check_values == "callback"


def _settle_checks(output: AdvantageOutput, checks: list[_checks.ValueCheck], plan: AdvantagePlan,
                   located: Callable[[], list[_checks.ValueCheck]]) -> AdvantageOutput:
    """Eagerly: raise on a failed check (its details from ``located()``, the same program with them), and
    warn once when gvpo sees no negative process reward. Under a trace: the counts go into the diagnostics
    (a host callback raises only with ``check_values='callback'``)."""
    if not plan.check_values:
        return output
    eager = not any(_checks.is_traced(check.count) for check in checks)
    if eager and not _locate_first(plan) and any(bool(check.count) for check in checks):
        checks = located()
    _checks.raise_value_checks(checks, callback=plan.check_values == "callback")
    # (The share is in every run's diagnostics with diagnostics=True: only gvpo's is a reason to warn.)
    negative = output.diagnostics.get("process/negative_share")
    gvpo = plan.shaping is not None and plan.shaping.mode == "gvpo"
    if gvpo and negative is not None and not _checks.is_traced(negative) and float(negative) == 0:
        warn_gvpo_without_penalty(stacklevel=3)
    return output._replace(diagnostics={**output.diagnostics, **_checks.check_counts(checks)})


def compute_advantage_variants(batch: Mapping[str, Any], config: AdvantagePlan | PlanSource,
                               shapings: Sequence[ShapingConfig]) -> tuple[AdvantageOutput, dict[str, jax.Array | str]]:
    """``compute_advantages`` plus the same advantages under other shapings, from one GAE.

    GAE and normalization do not depend on the shaping, so they run once; each of ``shapings`` shapes the
    same normalized advantages. Returns the configured output and ``{"none": unshaped advantages, mode:
    shaped advantages, ...}``; ``process_weighted`` maps to a string saying why when the batch's process
    rewards leave [0, 1]. Needs direct process rewards (``token_rewards`` in the batch and a plan that
    shapes with them). ``AdvantageConfig.shaping_variants`` says which modes a config allows.
    """
    plan = as_plan(config)
    if "token_rewards" not in batch or plan.shaping is None:
        raise ValueError("compute_advantage_variants needs batch['token_rewards'] and token_rewards_as_adv: true")
    arrays, real = _padded_if_empty(_batch_arrays(batch))
    _warn_about_fallbacks(arrays, plan)
    resolved, shapings = plan.with_strategy(arrays), tuple(shapings)
    output, checks, unshaped, extras = _variants_jit(arrays, plan=resolved, shapings=shapings,
                                                     locate=_locate_first(plan))
    located = lambda: _variants_jit(arrays, plan=resolved, shapings=shapings, locate=True)[1]
    output = _cut(_settle_checks(output, checks, plan, located), real)
    cut = (lambda x: x) if real is None else (lambda x: x[:real[0], :real[1]])
    shaped: dict[str, jax.Array | str] = {"none": cut(unshaped)}
    for shaping, (advantages, out_of_range) in zip(shapings, extras):
        shaped[shaping.mode] = ("n/a: process_weighted needs process rewards in [0, 1]" if bool(out_of_range)
                                else cut(advantages))
    return output, shaped
