"""The fused advantage pipeline: outcome rewards, KL, GAE, normalization and process-reward shaping.

``compute_advantages`` takes a padded batch and returns everything on *timesteps* (see ``alignment``).
Rollout-side arrays (``loss_mask``, ``logprobs``, ``turn_ids``, ``token_rewards``) come on *positions*, as
exported, and are shifted here; model outputs (``values``, ``ref_logprobs``, ``prox_logprobs``) come out
of a forward pass already on timesteps and are not shifted (AReaL's alignment). In order:

1. outcome reward: optional overlong penalty; ``r = clip((r + reward_bias) * reward_scaling, +-reward_clip)``;
   optional ``reward_norm`` over the ``[B]`` vector.
2. shift the rollout-side arrays to timesteps; the shifted mask is ``m``. The old log-probs are the
   recomputed ``prox_logprobs`` when given, else the shifted behaviour ``logprobs``; they and the
   reference log-probs are zeroed where ``m = 0``. The process rewards are ``P = shifted(token_rewards) * m``.
3. optional ``process_reward_transform`` of ``P`` (``min_form``, ``progress``).
4. ``kl_rewards = -kl_ctl * clamp(kl, +-kl_clamp)`` (AReaL's 10) on active timesteps, 0 at timestep ``seqlen - 1``.
   Without ``ref_logprobs`` the reference log-prob is 0 (AReaL's rule; a warning once per trace when
   ``kl_ctl != 0``).
5. truncation: ``is_truncated`` when given, else ``seqlen == T`` (with a warning: it mislabels a row that
   ends exactly at the padded width). The outcome reward goes to timestep ``max(seqlen - 2, 0)``, or 0
   there for truncated rows under ``mask_no_eos_with_zero``, which also zeroes their process rewards.
   ``P`` is kept for shaping (``token_rewards_as_adv``), or folded: each turn's uniform reward is added
   once, at the timestep predicting its last token.
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

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from prm_jax.kernels import _checks
from prm_jax.kernels import _inputs as inputs
from prm_jax.kernels._diagnostics import STATISTICS, diagnostics, outputs_check, statistics_of
from prm_jax.kernels._estimator_contract import finish
from prm_jax.kernels._normalization import GRPO_GROUPS, batch_groups, row_groups
from prm_jax.kernels._plan import AdvantagePlan, PlanSource, as_plan
from prm_jax.kernels._shaping import ShapingConfig, warn_gvpo_without_penalty
from prm_jax.kernels._stage import StageResult, run_stage
from prm_jax.kernels._timesteps import (
    kl_step,
    outcome_rewards,
    sequence_lengths,
    step_lambda,
    task_rewards,
    to_timesteps,
    truncation,
)
from prm_jax.kernels._turns import turn_ids_check, turn_steps


class AdvantageOutput(NamedTuple):
    """All ``[B, T]`` float32 on timesteps.

    Attributes:
        returns: The value targets ``advantages + values``, taken before normalization and shaping.
        kl_rewards: ``-kl_ctl * KL`` on each trained timestep (0 at a row's last timestep and off the mask).
        tot_rewards: The rewards GAE ran on: outcome, KL and folded process rewards (at turn level, the task rewards
            plus the KL rewards).

    Example:
        >>> batch = {"attention_mask": np.ones((1, 4), np.int32), "loss_mask": np.array([[0, 1, 1, 1]], np.int32),
        ...          "logprobs": np.zeros((1, 4), np.float32), "rewards": np.array([1.0], np.float32),
        ...          "is_truncated": np.array([False])}
        ...
        >>> out = prm_jax.compute_advantages(batch, prm_jax.AdvantageConfig(kl_ctl=0.0))
        >>> np.asarray(out.advantages).tolist(), np.asarray(out.loss_mask).tolist()
        ([[1.0, 1.0, 1.0, 0.0]], [[1.0, 1.0, 1.0, 0.0]])
    """

    advantages: jax.Array
    returns: jax.Array
    kl_rewards: jax.Array
    tot_rewards: jax.Array
    loss_mask: jax.Array  # shifted, 0/1
    logprobs: jax.Array   # shifted, 0 where the shifted loss mask is 0
    # Scalars as arrays: "checks/<name>" violation counts (with check_values), the declared stages' own, and
    # with ``AdvantageConfig(diagnostics=True)`` the statistics that explain a mode that does not learn
    # (``prm_jax.kernels._diagnostics``).
    diagnostics: dict[str, jax.Array]


def _given(value: Any) -> Any:
    return value


class _Run(NamedTuple):
    output: AdvantageOutput
    checks: list[_checks.ValueCheck]  # empty without check_values: their reductions are compiled out
    unshaped: jax.Array               # the normalized advantages before shaping
    process: jax.Array | None         # P on timesteps
    active: jax.Array


def _pipeline(batch: Mapping[str, jax.Array], plan: AdvantagePlan) -> _Run:
    strategy = plan.strategy
    assert strategy is not None, "the plan's strategy is resolved before tracing (AdvantagePlan.with_strategy)"
    num_rows, width = inputs.check_shapes(batch, plan)
    dtype = inputs.float_dtype(batch)
    checks = inputs.structure_checks(batch, num_rows)
    stage_diagnostics: dict[str, jax.Array] = {}
    # The stages' named inputs (INPUTS), each a thunk of its value as the steps so far left it: a stage is
    # given exactly the ones its run names (run_stage), each computed only when one does.
    now: dict[str, Callable[[], Any]] = {}

    def give(**values: Any) -> None:
        for name, value in values.items():
            now[name] = functools.partial(_given, value)

    def run(spec: Any, stage: Any) -> StageResult:
        result = run_stage(spec, stage, now, batch)
        checks.extend(result.checks)
        return result

    seqlen = sequence_lengths(batch["attention_mask"])
    # A position outside the attention mask is never trained, whatever its loss mask says (padding).
    raw_active = (_checks.as_mask("batch['loss_mask']", batch["loss_mask"])
                  & _checks.as_mask("batch['attention_mask']", batch["attention_mask"]))
    groups_of = functools.partial(batch_groups, batch, num_rows)
    grpo_groups = groups_of(GRPO_GROUPS) if "group_sizes" in batch or "group_ids" in batch else None
    give(real_rows=seqlen > 0, groups_of=groups_of, grpo_groups=grpo_groups, strategy=strategy, dtype=dtype,
         gamma=jnp.asarray(plan.discount, dtype), num_turns=plan.num_turns(width))
    now["row_group"] = lambda: row_groups(grpo_groups, num_rows)[0]
    now["num_groups"] = lambda: row_groups(grpo_groups, num_rows)[1]
    rewards = _checks.as_float("batch['rewards']", batch["rewards"], dtype)
    checks.append(_checks.finite_check("batch['rewards']", rewards))
    outcome = outcome_rewards(rewards, raw_active, plan.outcome)                              # 1
    give(outcome=outcome)
    for spec, stage in plan.stages_of("reward_norm"):
        result = run(spec, stage)
        outcome = result.value
        give(outcome=outcome)
        stage_diagnostics.update(result.diagnostics)
    steps = to_timesteps(batch, raw_active, dtype)                                           # 2
    turns = None
    if plan.reads_turns(batch):
        turns = turn_steps(steps.active, steps.turn_ids, strategy.general)
        if steps.turn_ids is not None:
            checks.append(turn_ids_check(steps.turn_ids, steps.active, turns, plan.turn_slots(batch, width)))
    last_value = jnp.take_along_axis(steps.values, jnp.clip(seqlen - 1, 0, width - 1)[:, None], axis=1)[:, 0]
    truncated = truncation(batch, seqlen, width)
    checks += inputs.finite_checks(batch, steps.active, steps.values, last_value, truncated, plan)  # as given
    give(active=steps.active, logprobs=steps.logprobs, values=steps.values, turn_ids=steps.turn_ids,
         ref_logprobs=steps.ref_logprobs, process=steps.process, turns=turns)
    for spec, stage in plan.stages_of("process_reward_transform"):                          # 3
        if steps.process is None:
            continue
        result = run(spec, stage)
        steps = steps._replace(process=result.value)
        give(process=steps.process)
        stage_diagnostics.update(result.diagnostics)
    kl = kl_step(steps, seqlen, plan.kl)                                                     # 4
    outcome_at = lax.broadcasted_iota(jnp.int32, steps.active.shape, 1) == jnp.maximum(seqlen - 2, 0)[:, None]
    task, process, outcome = task_rewards(outcome, steps.process, steps, outcome_at, truncated, plan.task,  # 5
                                          turns, strategy.general, checks)
    # A row with attention after its last generated span (a trailing tool message) has its outcome on an
    # untrained timestep, where GAE's masked carry drops it (AReaL's rule): said, not silent.
    off = (seqlen > 0) & ~jnp.any(outcome_at & steps.active, axis=1)
    stage_diagnostics["outcome/rows_off_trained_timesteps"] = jnp.sum(off, dtype=jnp.int32)
    bootstrap = jnp.where(truncated, last_value, jnp.zeros((), dtype))
    lam = step_lambda(batch, steps, plan.lam, dtype, turns, checks)
    estimator = plan.estimator_spec
    give(rewards=task + kl if estimator.kl == "rewards" else task, outcome=outcome, process=process,
         bootstrap=bootstrap, lam=lam, outcome_at=outcome_at)
    advantages, returns, step_groups = finish(estimator, run(estimator, plan.estimator), kl, steps.values)  # 6-7
    for spec, stage in plan.stages_of("adv_norm"):                                           # 8
        give(advantages=advantages)
        result = run(spec, stage)
        advantages = result.value
        stage_diagnostics.update(result.diagnostics)
    unshaped = advantages
    for spec, stage in plan.stages_of("advantage_shaping"):                                  # 9
        if process is None:
            continue
        give(advantages=advantages)
        result = run(spec, stage)
        advantages = result.value
        stage_diagnostics.update(result.diagnostics)
    checks.append(outputs_check(advantages, returns, steps.active))
    output = AdvantageOutput(advantages=advantages, returns=returns, kl_rewards=kl, tot_rewards=task + kl,
                             loss_mask=steps.active.astype(dtype), logprobs=steps.logprobs,
                             diagnostics={**diagnostics(advantages, unshaped, process, steps.active, grpo_groups,
                                                        plan), **stage_diagnostics, **step_groups})
    return _Run(output, checks if plan.check_values else [], unshaped, process, steps.active)


@functools.partial(jax.jit, static_argnames=("plan", "locate"))
def _pipeline_jit(batch, plan, locate=True):
    """The pipeline; ``locate``: with the failed checks' details (``_checks.locating``)."""
    with _checks.locating(locate):
        return _pipeline(batch, plan)[:2]


@functools.partial(jax.jit, static_argnames=("plan", "shapings", "locate"))
def _variants_jit(batch, plan, shapings, locate=True):
    """The pipeline, its normalized advantages unshaped and under other shapings (one GAE for all), each with its
    statistics and whether its shaping's value checks failed."""
    with _checks.locating(locate):
        run = _pipeline(batch, plan)
    assert run.process is not None  # compute_advantage_variants needs token_rewards
    shaped, failed = {"none": run.unshaped}, {"none": jnp.zeros((), jnp.int32)}
    given = {"advantages": lambda: run.unshaped, "process": lambda: run.process, "active": lambda: run.active}
    for shaping in shapings:
        result = run_stage(shaping.spec, shaping, given, batch)
        shaped[shaping.mode] = result.value
        failed[shaping.mode] = sum((check.count for check in result.checks), jnp.zeros((), jnp.int32))
    stats = statistics_of(shaped, run.active)  # (every variant's in few passes)
    return run.output, run.checks, tuple((shaped[mode], {f"advantages/{name}": stats[f"{mode}/{name}"] for name in
                                                         STATISTICS}, failed[mode]) for mode in shaped)


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
      ValueError: on bad shapes (at trace time), and, when called eagerly with ``check_values`` on, on a
        failed value check (non-finite inputs where used, process rewards outside [0, 1] under
        ``process_weighted``, non-uniform turn rewards when folding, bad groups, a per-row λ outside [0, 1],
        turn ids that break AReaL's rules). Under an outer ``jit`` nothing is raised and no host round trip
        is paid: the counts come back in ``output.diagnostics``; ``check_values="callback"`` raises there
        too, from a host callback when the computation runs.

    Example:
        >>> batch = {"attention_mask": np.ones((2, 4), np.int32),
        ...          "loss_mask": np.array([[0, 1, 1, 1], [0, 1, 1, 0]], np.int32),
        ...          "logprobs": np.zeros((2, 4), np.float32), "rewards": np.array([1.0, 0.0], np.float32),
        ...          "is_truncated": np.zeros(2, bool)}
        >>> out = prm_jax.compute_advantages(batch, prm_jax.AdvantageConfig(kl_ctl=0.0))
        >>> np.asarray(out.advantages, np.float64).round(3).tolist()
        [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    """
    plan = as_plan(config)
    arrays, real = inputs.prepared(batch)
    inputs.warn_about_fallbacks(arrays, plan)
    resolved = plan.with_strategy(arrays)
    output, checks = _pipeline_jit(arrays, plan=resolved, locate=_locate_first(plan))
    located = lambda: _pipeline_jit(arrays, plan=resolved, locate=True)[1]
    return _cut(_settle_checks(output, checks, plan, located), real)


def _locate_first(plan: AdvantagePlan) -> bool:
    """Whether the first program computes failed checks' details: only for a host callback (else the counts
    alone, a shorter compile, and a failed check is traced again with them: paid on the error path only)."""
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
    output = _checks.raise_value_checks(checks, output, callback=plan.check_values == "callback")
    # (The share is in every run's diagnostics with diagnostics=True: only gvpo's is a reason to warn.)
    negative = output.diagnostics.get("process/negative_share")
    gvpo = plan.shaping is not None and plan.shaping.mode == "gvpo"
    if gvpo and negative is not None and not _checks.is_traced(negative) and float(negative) == 0:
        warn_gvpo_without_penalty(stacklevel=3)
    merged = _checks.Diagnostics(dict.items(output.diagnostics))  # (read without warning: not the user's read)
    dict.update(merged, _checks.check_counts(checks))
    return output._replace(diagnostics=merged)


def compute_advantage_variants(batch: Mapping[str, Any], config: AdvantagePlan | PlanSource,
                               shapings: Sequence[ShapingConfig]) -> tuple[AdvantageOutput, dict[str, AdvantageOutput | str]]:
    """``compute_advantages`` plus the same advantages unshaped and under other shapings, from one GAE.

    GAE and normalization do not depend on the shaping, so they run once; each of ``shapings`` shapes the
    same normalized advantages. Returns the configured output and ``{"none": ..., mode: ..., ...}``: each
    the configured output with its advantages replaced and its ``diagnostics`` holding only their
    statistics (``advantages/{mean,std,min,max}`` over trained timesteps, ``prm_jax.kernels._diagnostics``);
    a mode whose shaping's value checks fail (``process_weighted`` on process rewards outside [0, 1]) maps
    to a string saying why. Needs direct process rewards (``token_rewards`` in the batch and a plan that
    shapes with them). ``AdvantageConfig.shaping_variants`` says which modes a config allows.

    Args:
        batch: The padded batch ``compute_advantages`` takes (``BATCH_SCHEMA``'s keys), with ``token_rewards``.
        config: The configuration: an ``AdvantagePlan``, an ``AdvantageConfig`` or a mapping of its fields.
        shapings: The shapings to compute besides the configured one (``ShapingConfig`` records, one a mode).

    Example:
        >>> batch = {"attention_mask": np.ones((1, 4), np.int32), "loss_mask": np.array([[0, 1, 1, 1]], np.int32),
        ...          "logprobs": np.zeros((1, 4), np.float32), "rewards": np.array([1.0], np.float32),
        ...          "is_truncated": np.array([False])}
        ...
        >>> batch["token_rewards"] = np.array([[0.0, 0.0, -0.5, -0.5]], np.float32)
        >>> config = prm_jax.AdvantageConfig(kl_ctl=0.0)
        >>> out, variants = prm_jax.kernels.compute_advantage_variants(batch, config, [prm_jax.ShapingConfig("gvpo")])
        >>> sorted(variants), np.asarray(variants["none"].advantages).tolist(), np.asarray(out.advantages).tolist()
        (['gvpo', 'none'], [[1.0, 1.0, 1.0, 0.0]], [[1.0, 0.5, 0.5, 0.0]])
    """
    plan = as_plan(config)
    if "token_rewards" not in batch or plan.shaping is None:
        raise ValueError("compute_advantage_variants needs batch['token_rewards'] and token_rewards_as_adv: true")
    arrays, real = inputs.prepared(batch)
    inputs.warn_about_fallbacks(arrays, plan)
    resolved, shapings = plan.with_strategy(arrays), tuple(shapings)
    output, checks, variants = _variants_jit(arrays, plan=resolved, shapings=shapings, locate=_locate_first(plan))
    located = lambda: _variants_jit(arrays, plan=resolved, shapings=shapings, locate=True)[1]
    output = _cut(_settle_checks(output, checks, plan, located), real)
    shaped: dict[str, AdvantageOutput | str] = {}
    for mode, (advantages, stats, failed) in zip(("none", *(s.mode for s in shapings)), variants):
        shaped[mode] = (f"n/a: {mode} needs process rewards in [0, 1]" if bool(failed) else
                        _cut(output._replace(advantages=advantages, diagnostics=stats), real))
    return output, shaped
