"""The plan: the stage records ``compute_advantages`` runs, and the registries of the declared stage kinds.

``prm_jax.config.AdvantageConfig`` (AReaL's keys, validated) resolves into an ``AdvantagePlan`` once; the
pipeline runs the stages the plan holds and tests no config flag. The configurable stages declare
themselves (an estimator with an ``EstimatorSpec``, the others with a ``StageSpec``); what a plan reads,
whether it reads turns and which diagnostics its stages write come from those declarations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, get_args

import jax

from prm_jax.kernels._estimator_contract import EstimatorSpec, EstimatorStage
from prm_jax.kernels._estimator_registry import estimator_for
from prm_jax.kernels._kl import KL_CLAMP, KLEstimator
from prm_jax.kernels._normalization import ADV_NORM, DECOUPLED_NORM, OUTCOME_NORM, DecoupledNorm, NormConfig
from prm_jax.kernels._platform import lowering_platform
from prm_jax.kernels._progress import PROGRESS_TRANSFORM, ProgressTransform
from prm_jax.kernels._pure import MIN_FORM_TRANSFORM, MinFormTransform
from prm_jax.kernels._recurrence import GAEMethod, ScanStrategy, resolve_strategy
from prm_jax.kernels._schema import MODEL_OUTPUT_KEYS
from prm_jax.kernels._shaping import SHAPINGS, ShapingConfig
from prm_jax.kernels._stage import DeclaredStage, StageSpec
from prm_jax.kernels._token_gae import TokenGAE

TimestepUnit = Literal["token", "turn"]
TIMESTEP_UNITS: tuple[TimestepUnit, ...] = get_args(TimestepUnit)

# The declared stage kinds other than the estimator, by their config key's mode.
#: ``actor.reward_norm``: AReaL's ``NormConfig`` fields (mode ``normalize``) or ``{mode: decoupled}``.
REWARD_NORMS: dict[str, StageSpec] = {spec.mode: spec for spec in (OUTCOME_NORM, DECOUPLED_NORM)}
#: ``actor.process_reward_transform``.
PROCESS_TRANSFORMS: dict[str, StageSpec] = {spec.mode: spec for spec in (MIN_FORM_TRANSFORM, PROGRESS_TRANSFORM)}
#: Every declared stage other than the estimators, in the order the pipeline runs their kinds.
STAGE_SPECS: tuple[StageSpec, ...] = (*REWARD_NORMS.values(), *PROCESS_TRANSFORMS.values(), ADV_NORM,
                                      *SHAPINGS.values())
#: The prefixes of the declared stages' diagnostics (each estimator declares its own).
STAGE_DIAGNOSTICS: tuple[str, ...] = tuple(spec.diagnostics for spec in STAGE_SPECS if spec.diagnostics is not None)

ProcessTransform = MinFormTransform | ProgressTransform


@dataclasses.dataclass(frozen=True)
class OverlongPenalty:
    """DAPO's overlong reward penalty: ``min(-(len - (max_new_tokens - overlong_tokens)) / overlong_tokens
    * factor, 0)`` added to the outcome reward.

    Args:
        max_new_tokens: The generation budget the penalty measures against.
        overlong_tokens: The ramp, in tokens: rows longer than ``max_new_tokens - overlong_tokens`` are penalized.
        factor: The penalty at the full ramp (``overlong_penalty_factor``).

    Example:
        >>> config = prm_jax.AdvantageConfig(overlong_reward_penalty=True, overlong_tokens=4, overlong_penalty_factor=1.0,
        ...                                  max_new_tokens=16)
        ...
        >>> config.plan.outcome.overlong
        OverlongPenalty(max_new_tokens=16, overlong_tokens=4, factor=1.0)
    """

    max_new_tokens: int
    overlong_tokens: int
    factor: float


@dataclasses.dataclass(frozen=True)
class OutcomeStage:
    """Step 1: the ``[B]`` outcome rewards: overlong penalty, bias, scaling, clip, optional normalization.

    Args:
        bias: Added to each outcome reward (``reward_bias``).
        scaling: Multiplies it after the bias (``reward_scaling``).
        clip: It is clipped to ``[-clip, clip]`` (``reward_clip``).
        norm: The outcome normalization (``NormConfig`` or ``DecoupledNorm``), or ``None``.
        overlong: DAPO's overlong penalty (``OverlongPenalty``), or ``None``.

    Example:
        >>> prm_jax.AdvantageConfig(reward_bias=-0.5, reward_scaling=2.0).plan.outcome
        OutcomeStage(bias=-0.5, scaling=2.0, clip=20.0, norm=None, overlong=None)
    """

    bias: float = 0.0
    scaling: float = 1.0
    clip: float = 20.0
    norm: NormConfig | DecoupledNorm | None = None
    overlong: OverlongPenalty | None = None


@dataclasses.dataclass(frozen=True)
class KLStage:
    """Step 4: ``-kl_ctl * clamp(kl, -clamp, clamp)`` on active timesteps (AReaL's clamp: 10).

    Args:
        kl_ctl: The penalty's coefficient (``AdvantageConfig.kl_ctl``).
        estimator: ``k1``, ``k2`` or ``k3`` (``AdvantageConfig.kl_estimator``).
        clamp: The estimate's clamp, > 0 (``AdvantageConfig.kl_clamp``).

    Example:
        >>> prm_jax.AdvantageConfig(kl_ctl=0.05, kl_estimator="k3").plan.kl
        KLStage(kl_ctl=0.05, estimator='k3', clamp=10.0)
    """

    kl_ctl: float = 0.1
    estimator: KLEstimator = "k1"
    clamp: float = KL_CLAMP


@dataclasses.dataclass(frozen=True)
class TaskRewardStage:
    """Step 5: where the outcome reward goes; ``mask_truncated`` (``mask_no_eos_with_zero``) zeroes it
    and the process rewards of truncated rows; ``fold_process`` folds uniform per-turn process rewards
    into the rewards (``token_rewards_as_adv=False``) instead of keeping them for shaping.

    Args:
        mask_truncated: Whether truncated rows get outcome 0 and their process rewards zeroed
            (``mask_no_eos_with_zero``).
        fold_process: Whether uniform per-turn process rewards are folded into GAE's rewards
            (``token_rewards_as_adv=False``).

    Example:
        >>> prm_jax.AdvantageConfig(mask_no_eos_with_zero=True).plan.task
        TaskRewardStage(mask_truncated=True, fold_process=False)
    """

    mask_truncated: bool = False
    fold_process: bool = False


@dataclasses.dataclass(frozen=True)
class LambdaFunction:
    """AReaL's dynamic λ: a jittable ``fn(GAELambdaContext, **kwargs) -> [B]`` (``gae_lambda``), with the
    timestep unit whose lengths it reads.

    Args:
        fn: The jittable λ function, ``fn(GAELambdaContext, **kwargs) -> [B]``.
        kwargs: Its keyword arguments, as sorted ``(name, value)`` pairs (hashable).
        name: The dotted path it was named by (for messages and the plan's identity).
        unit: ``token`` or ``turn``: the unit whose lengths the context gives it.

    Example:
        >>> plan = prm_jax.AdvantageConfig(gae_lambda="prm_jax.kernels.gae_lambda.vapo_length_adaptive_gae",
        ...                                gae_lambda_kwargs={"alpha": 0.05}).plan
        ...
        >>> plan.lam.name, dict(plan.lam.kwargs), plan.lam.unit
        ('prm_jax.kernels.gae_lambda.vapo_length_adaptive_gae', {'alpha': 0.05}, 'token')
    """

    fn: Callable[..., jax.Array]
    kwargs: tuple[tuple[str, Any], ...]
    name: str
    unit: TimestepUnit = "token"


def transform_mode(transform: ProcessTransform | None) -> str | None:
    """The ``process_reward_transform.mode`` of a transform record (``None`` for none)."""
    return None if transform is None else transform.spec.mode


@dataclasses.dataclass(frozen=True)
class AdvantagePlan:
    """A resolved, validated configuration: the stages ``compute_advantages`` runs, in order.

    Hashable: it is the static argument of the jitted pipeline, so equal plans never retrace. Build it
    with ``prm_jax.config.AdvantageConfig(...).plan`` (AReaL's keys, validated) rather than by hand.
    ``shaping`` is ``None`` when the process rewards are folded or unused; ``check_turn_ids`` says the
    turn ids must follow AReaL's rules (turn-level GAE or a λ function).

    Args:
        outcome: Step 1, the outcome rewards (``OutcomeStage``: overlong penalty, bias, scaling, clip, normalization).
        kl: Step 4, the KL penalty (``KLStage``).
        task: Step 5, where the outcome and the process rewards go (``TaskRewardStage``).
        process_transform: Step 3, the process rewards' transform (``MinFormTransform``, ``ProgressTransform``), or
            ``None``.
        discount: γ of the estimator's recurrence, in [0, 1].
        lam: λ of GAE: a float in [0, 1], or a ``LambdaFunction`` giving one per row.
        estimator: Steps 6-7, the estimator's record (``TokenGAE``, ``TurnGAE``, a credit record).
        adv_norm: Step 8, the advantages' normalization (``NormConfig``), or ``None``.
        shaping: Step 9, the shaping by process rewards (``ShapingConfig``), or ``None`` (folded or unused).
        gae_method: How the GAE recurrence is computed (``AdvantageConfig.gae_method``'s values).
        max_turns: The most turns a row holds, for turn-level estimators; ``None``: the width ``T``.
        check_turn_ids: Whether the turn ids must follow AReaL's rules (turn-level GAE or a λ function).
        check_values: The value checks: ``True``, ``"callback"`` or ``False`` (``AdvantageConfig.check_values``).
        strategy: The backend choices resolved before tracing (``ScanStrategy``); ``None``: resolved per call.

    Example:
        >>> plan = prm_jax.AdvantageConfig(gae_lambda=0.95, adv_norm={"mean_level": "batch"}).plan
        >>> [spec.kind for spec, _ in plan.stages], plan.lam
        (['adv_norm', 'advantage_shaping'], 0.95)
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

    def with_strategy(self, batch: Mapping[str, Any], *, platform: str | None = None) -> AdvantagePlan:
        """This plan with its strategy resolved for ``batch`` (kept when it holds one already): the static
        record the jitted pipeline runs. ``gamma * lam == 1`` is known before tracing only for one float λ.
        ``platform`` (``cuda``, ``rocm``, ``tpu``, ``cpu``) resolves the backend choices for the platform a
        program will be lowered for instead of this process's default backend: ``compute_advantages(batch,
        plan.with_strategy(batch, platform="cuda"))`` exported with ``jax.export`` from a CPU host holds the
        GPU's methods and no CPU kernel.

        Args:
            batch: The batch the plan will run on (its keys and widths decide the backend choices).
            platform: The platform the program will be lowered for (``cpu``, ``cuda``, ``rocm``, ``tpu``); ``None``:
                this process's default backend.
        """
        unit_discount = ("gae_lambda" not in batch and not isinstance(self.lam, LambdaFunction)
                         and self.discount * self.lam == 1.0)
        if self.strategy is not None:
            if self.strategy.gae == "cumsum" and not unit_discount:
                raise ValueError("the plan's strategy runs the GAE as a cumulative sum (ScanStrategy.gae='cumsum'),"
                                 " which is exact only for gamma * lam == 1: not for this plan and batch")
            return self
        with contextlib.nullcontext() if platform is None else lowering_platform(platform):
            return _with_strategy(self, resolve_strategy(self.gae_method, unit_discount=unit_discount,
                                                         sharded=jax.device_count() > 1))

    @property
    def estimator_spec(self) -> EstimatorSpec:
        """The declaration of ``estimator`` (``prm_jax.kernels._estimator_registry``)."""
        return estimator_for(self.estimator)

    @property
    def stages(self) -> tuple[tuple[StageSpec, Any], ...]:
        """The configured stages other than the estimator, each with its declaration, in the order they run:
        the outcome's normalization (step 1), the process transform (3), the advantages' normalization (8),
        the shaping (9). A record names its own declaration (``DeclaredStage.spec``); ``adv_norm``'s record is
        a ``NormConfig`` like ``reward_norm``'s, so its slot names its declaration (``ADV_NORM``)."""
        records: tuple[DeclaredStage | None, ...] = (self.outcome.norm, self.process_transform)
        declared = [(stage.spec, stage) for stage in records if stage is not None]
        if self.adv_norm is not None:
            declared.append((ADV_NORM, self.adv_norm))
        if self.shaping is not None:
            declared.append((self.shaping.spec, self.shaping))
        return tuple(declared)

    def stages_of(self, kind: str) -> tuple[tuple[StageSpec, Any], ...]:
        """The configured stages of one kind (``StageSpec.kind``), with their declarations: none or one.

        Args:
            kind: A stage kind (``StageSpec.kind``, its config key): ``reward_norm``, ``process_reward_transform``,
                ``adv_norm`` or ``advantage_shaping``.
        """
        return tuple((spec, stage) for spec, stage in self.stages if spec.kind == kind)

    @property
    def reads(self) -> tuple[str, ...]:
        """The batch keys a stage of this plan needs or reads when present, beyond the required ones and the
        rollout's (``prm_jax.kernels._schema``): what a caller packs. Each stage's declared keys (the
        estimator's, GDPO's ``reward_sources``, progress's ``token_reward_mask``); the reference log-probs
        for a KL reward."""
        declared = [key for spec, _ in self.stages for key in spec.reads]
        kl = ("ref_logprobs",) if self.kl.kl_ctl != 0 else ()
        return tuple(dict.fromkeys((*self.estimator_spec.batch_keys, *declared, *kl)))

    @property
    def model_outputs_read(self) -> tuple[str, ...]:
        """The per-token model outputs a stage reads (``ref_logprobs``: the KL reward when ``kl_ctl != 0``, and
        the estimators that declare them, as PRIME; ``prm_logprobs``: PRIME). One that is read must be there
        on every trained timestep (finite); one that is not read may hold anything (NaN where a session had
        none): the schema's model outputs (``MODEL_OUTPUT_KEYS``) in the order this plan reads them."""
        return tuple(key for key in self.reads if key in MODEL_OUTPUT_KEYS)

    def reads_turns(self, batch: Mapping[str, Any]) -> bool:
        """Whether a stage reads the batch's turns (then their ids are checked): turn-level GAE or a λ
        function (``check_turn_ids``), an estimator that declares them, or process rewards a turn-level
        transform reads or that are folded per turn.

        Args:
            batch: The batch the plan runs on.
        """
        transform = self.process_transform
        with_process = "token_rewards" in batch and (
            self.task.fold_process or (transform is not None and transform.spec.turns(transform)))
        return self.check_turn_ids or with_process or self.estimator_spec.reads_turns

    def turn_slots(self, batch: Mapping[str, Any], width: int) -> int | None:
        """The bound on turn ids where turns index ``[B, K]`` slots (the estimator's ``turn_slots``: GiGPO's
        per-turn inputs, the tree's ``node_ids``), turn-level GAE's ``max_turns``; ``None`` where turns are
        only counted in order.

        Args:
            batch: The batch the plan runs on.
            width: The batch's width ``T``.
        """
        spec = self.estimator_spec
        if spec.turn_slots is not None:
            return spec.turn_slots(batch, self.num_turns(width))
        return self.num_turns(width) if self.check_turn_ids else None

    def num_turns(self, width: int) -> int:
        """The turn slots a row may use: ``max_turns``, else the width.

        Args:
            width: The batch's width ``T``.
        """
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


@functools.lru_cache(maxsize=256)
def _with_strategy(plan: AdvantagePlan, strategy: ScanStrategy) -> AdvantagePlan:
    """``plan`` holding ``strategy``: one object per pair, so a call that resolves to the plan of the call
    before finds its program by identity (a new copy cost ``jit`` a field-by-field comparison, ~20 us)."""
    return dataclasses.replace(plan, strategy=strategy)
