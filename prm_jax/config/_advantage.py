"""``actor``: the advantage settings with AReaL's names and defaults, resolved into the kernels' plan.

``AdvantageConfig`` is what a YAML file or a trainer writes; it validates every field (errors name the
key) and resolves once into a hashable ``prm_jax.kernels.AdvantagePlan``, the stages
``compute_advantages`` runs. The kernels never see these keys: AReaL's ``credit_assignment: {mode:
gigpo}``, the dotted-path λ functions (imported here, when the config is built) and the flags that choose
a stage (``gae_timestep_unit``, ``token_rewards_as_adv``, ``credit_assignment``) end here.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax

from prm_jax._validation import (
    ConfigError,
    boolean,
    finite_number,
    from_mapping,
    imported_callable,
    integer,
    one_of,
    short_repr,
)
from prm_jax.kernels import gae_lambda
from prm_jax.kernels._estimator_contract import EstimatorStage
from prm_jax.kernels._estimator_registry import credit_modes, estimator_for, registered
from prm_jax.kernels._kl import KL_CLAMP, KL_ESTIMATORS, KLEstimator
from prm_jax.kernels._normalization import DecoupledNorm, NormConfig
from prm_jax.kernels._plan import (
    PROCESS_TRANSFORMS,
    REWARD_NORMS,
    TIMESTEP_UNITS,
    AdvantagePlan,
    KLStage,
    LambdaFunction,
    OutcomeStage,
    OverlongPenalty,
    ProcessTransform,
    TaskRewardStage,
    TimestepUnit,
    transform_mode,
)
from prm_jax.kernels._recurrence import DEFAULT_BLOCK_SIZE, GAE_METHODS, GAEMethod
from prm_jax.kernels._shaping import ShapingConfig, ShapingMode
from prm_jax.kernels._token_gae import TokenGAE
from prm_jax.kernels._turns import TurnGAE

AREAL_LAMBDA_MODULE = "areal.trainer.ppo.lambda_fn"
# Where the built-in λ functions may be named from: AReaL's module, ours, and ours before issue 21
# renamed it (configs written then keep working).
BUILTIN_LAMBDA_MODULES = (AREAL_LAMBDA_MODULE, gae_lambda.__name__, "prm_jax.kernels.lambda_fn")


def resolve_lambda(path: str) -> Callable[..., jax.Array]:
    """The λ function a dotted path names (AReaL's built-in paths map to ``prm_jax.kernels.gae_lambda``).

    Args:
        path: A dotted path ``package.module.function`` (AReaL's built-in paths included).

    Example:
        >>> fn = prm_jax.config.resolve_lambda("prm_jax.kernels.gae_lambda.constant_gae_lambda")
        >>> fn.__name__
        'constant_gae_lambda'
    """
    if not isinstance(path, str) or not path:
        raise ValueError(f"gae_lambda must be a float or a non-empty dotted path, got {path!r}")
    module_name, _, name = path.rpartition(".")
    if module_name in BUILTIN_LAMBDA_MODULES and name in gae_lambda.BUILTIN:
        return gae_lambda.BUILTIN[name]
    return imported_callable("gae_lambda path", path)


def _checked_lambda(path: str, kwargs: Mapping[str, Any]) -> Callable[..., jax.Array]:
    """Resolves ``path`` and binds ``kwargs`` to its signature; built-ins also check their values."""
    fn = resolve_lambda(path)
    try:
        inspect.signature(fn).bind(None, **kwargs)
    except TypeError as err:
        raise ValueError(f"gae_lambda_kwargs do not fit {path}: {err}") from None
    except ValueError:
        pass  # no signature to read (a builtin or C function): checked when it runs
    if fn in gae_lambda.KWARG_CHECKS:
        gae_lambda.KWARG_CHECKS[fn](**kwargs)
    return fn


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """Actor settings of the advantage pipeline, with AReaL's field names and defaults.

    Hashable, and resolved once into ``.plan`` (an ``AdvantagePlan``), the static argument of the jitted
    pipeline: equal configs never retrace. ``gae_lambda`` is a float, or (AReaL's dynamic λ) a dotted path
    to a jittable function of the rows' lengths with ``gae_lambda_kwargs`` (see
    ``prm_jax.kernels.gae_lambda``; AReaL's built-in paths work). ``reward_norm`` is AReaL's actor-side
    outcome normalization (unbiased std, eps 1e-5 by default); the export's ``normalize_rewards`` is the
    proxy-side one (population std + 1e-8): use one, not both. Beyond AReaL: ``gae_method``/
    ``gae_block_size`` choose the scan, ``max_turns`` bounds turns per row for turn-level GAE (default
    ``T``), ``check_values=False`` skips the value checks on the hot path (their reductions and the device
    sync).

    Args:
        discount: γ, the discount of the GAE recurrence, in [0, 1] (AReaL's ``discount``; default 1).
        gae_lambda: λ of GAE in [0, 1] (default 1), or a dotted path to a jittable λ function of the rows' lengths
            (AReaL's dynamic λ; ``prm_jax.kernels.gae_lambda``'s functions, AReaL's paths too).
        gae_lambda_kwargs: Keyword arguments of a λ function named by ``gae_lambda`` (a mapping; ignored for a float).
        kl_ctl: The KL penalty's coefficient: each timestep's reward gets ``-kl_ctl * KL`` (finite; 0 turns it off).
        kl_estimator: The per-token KL estimate: ``k1`` (``logp - ref``), ``k2`` (``(logp - ref)^2 / 2``) or ``k3``.
        kl_clamp: The KL estimate is clamped to ``[-kl_clamp, kl_clamp]`` (> 0; AReaL's 10).
        reward_bias: Added to each outcome reward before scaling (finite; default 0).
        reward_scaling: Multiplies each outcome reward after the bias (finite; default 1).
        reward_clip: The outcome reward is clipped to ``[-reward_clip, reward_clip]`` after bias and scaling (>= 0;
            20).
        mask_no_eos_with_zero: Whether a truncated row (no EOS) gets outcome reward 0 and its token rewards are zeroed
            (AReaL's key); ``process_weighted`` shaping refuses it.
        token_rewards_as_adv: ``True`` (default): process rewards shape the advantages after GAE
            (``advantage_shaping``); ``False``: each turn's uniform reward is folded once into GAE's rewards (additive
            shaping only).
        gae_timestep_unit: ``token`` (GAE over timesteps, default) or ``turn`` (AReaL's turn-level GAE over each row's
            turns).
        reward_norm: Outcome normalization before GAE: ``None`` (none), AReaL's ``NormConfig`` fields (a mapping or a
            record), or ``{"mode": "decoupled", ...}`` (GDPO's ``DecoupledNorm``).
        adv_norm: Advantage normalization after GAE (``NormConfig`` fields, a mapping or a record); ``None``: none.
        advantage_shaping: How process rewards reshape the advantages: ``ShapingConfig`` fields, a mapping ``{"mode":
            "additive" | "gvpo" | "process_weighted", ...}`` or a record.
        overlong_reward_penalty: Whether DAPO's overlong penalty is added to the outcome (needs the next three).
        overlong_tokens: The penalty's ramp, in tokens (>= 1): rows longer than ``max_new_tokens - overlong_tokens``
            are penalized.
        overlong_penalty_factor: The penalty at the full ramp (>= 0): ``-factor`` for a row of ``max_new_tokens``
            tokens.
        max_new_tokens: The generation budget the penalty measures against (>= ``overlong_tokens``).
        gae_method: How the GAE recurrence is computed: ``auto`` (chosen per backend), ``scan``, ``associative``,
            ``blocked``, ``cumsum`` (needs γλ = 1), ``native`` (the CPU kernel) or ``pallas``; every method gives the
            same numbers.
        gae_block_size: Timesteps per block of the ``blocked`` method, >= 1.
        max_turns: The most turns a row holds, for turn-level estimators (>= 1); ``None``: the width ``T``.
        check_values: The value checks: ``True`` (counted, and raised eagerly outside ``jit``), ``"callback"`` (raised
            from inside ``jit`` through a host callback) or ``False`` (skipped on the hot path).
        credit_assignment: The estimator: ``None`` (GAE of ``gae_timestep_unit``), a credit record (``GiGPOConfig``,
            ``TreeCredit``, ``PureCredit``, ``PrimeCredit``, ``OTBCredit``, ...) or a mapping ``{"mode": name,
            **fields}`` naming a registered one: ``gigpo``, ``tree``, ``pure``, ``prime``, ``reinforce_pp``,
            ``reinforce_pp_baseline``, ``otb``.
        process_reward_transform: A transform of the process rewards before they are used: ``None``, a record
            (``MinFormTransform``, ``ProgressTransform``) or ``{"mode": "min_form" | "progress", ...}``.
        diagnostics: Whether ``AdvantageOutput.diagnostics`` gathers each stage's statistics (means, minima, maxima).

    Example:
        >>> config = prm_jax.AdvantageConfig(kl_ctl=0.0, gae_lambda=0.95,
        ...                                  advantage_shaping={"mode": "process_weighted"})
        >>> config.plan.shaping.mode, config.gae_lambda
        ('process_weighted', 0.95)
    """

    discount: float = 1.0
    gae_lambda: float | str = 1.0
    gae_lambda_kwargs: Any = ()
    kl_ctl: float = 0.1
    kl_estimator: KLEstimator = "k1"
    kl_clamp: float = KL_CLAMP
    reward_bias: float = 0.0
    reward_scaling: float = 1.0
    reward_clip: float = 20.0
    mask_no_eos_with_zero: bool = False
    token_rewards_as_adv: bool = True
    gae_timestep_unit: TimestepUnit = "token"
    reward_norm: NormConfig | DecoupledNorm | None = None
    adv_norm: NormConfig | None = None
    advantage_shaping: ShapingConfig = ShapingConfig()
    overlong_reward_penalty: bool = False
    overlong_tokens: int | None = None
    overlong_penalty_factor: float | None = None
    max_new_tokens: int | None = None
    gae_method: GAEMethod = "auto"
    gae_block_size: int = DEFAULT_BLOCK_SIZE
    max_turns: int | None = None
    check_values: bool | Literal["callback"] = True
    credit_assignment: EstimatorStage | None = None  # GiGPO, tree, PURE, PRIME or a registered estimator's
    process_reward_transform: ProcessTransform | None = None
    diagnostics: bool = False

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        set_("discount", finite_number("discount", self.discount, minimum=0.0, maximum=1.0))
        if isinstance(self.gae_lambda, str):
            set_("gae_lambda_kwargs", _frozen_kwargs(self.gae_lambda_kwargs))
            try:
                _checked_lambda(self.gae_lambda, dict(self.gae_lambda_kwargs))
            except (ValueError, TypeError) as err:
                raise ConfigError("gae_lambda", f"({self.gae_lambda}): {err}") from None
        else:
            set_("gae_lambda", finite_number("gae_lambda", self.gae_lambda, minimum=0.0, maximum=1.0))
            set_("gae_lambda_kwargs", ())  # ignored for a float, as in AReaL
        set_("kl_ctl", finite_number("kl_ctl", self.kl_ctl))
        set_("kl_clamp", finite_number("kl_clamp", self.kl_clamp, positive=True))
        set_("reward_bias", finite_number("reward_bias", self.reward_bias))
        set_("reward_scaling", finite_number("reward_scaling", self.reward_scaling))
        set_("reward_clip", finite_number("reward_clip", self.reward_clip, minimum=0.0))
        one_of("kl_estimator", self.kl_estimator, KL_ESTIMATORS, config=True)
        if not (self.check_values is True or self.check_values is False or self.check_values == "callback"):
            raise ConfigError("check_values", f"must be true, false or 'callback', got {short_repr(self.check_values)}")
        for key in ("mask_no_eos_with_zero", "token_rewards_as_adv", "overlong_reward_penalty", "diagnostics"):
            boolean(key, getattr(self, key))
        one_of("gae_timestep_unit", self.gae_timestep_unit, TIMESTEP_UNITS, config=True)
        set_("reward_norm", _reward_norm(self.reward_norm))
        set_("adv_norm", _norm(self.adv_norm, "adv_norm"))
        set_("advantage_shaping", shaping_config(self.advantage_shaping))
        set_("credit_assignment", _credit_assignment(self.credit_assignment))
        set_("process_reward_transform", _transform(self.process_reward_transform))
        one_of("gae_method", self.gae_method, GAE_METHODS, config=True)
        if self.gae_method == "cumsum" and (isinstance(self.gae_lambda, str)
                                            or self.discount * self.gae_lambda != 1.0):
            raise ConfigError("gae_method", "'cumsum' needs discount * gae_lambda == 1 (a float gae_lambda)")
        for refusal in refused_pairs():
            if refusal.when(self):
                raise refusal.error()
        integer("gae_block_size", self.gae_block_size, minimum=1)
        if self.max_turns is not None:
            integer("max_turns", self.max_turns, minimum=1)
        if self.overlong_reward_penalty:
            try:
                overlong = integer("overlong_tokens", self.overlong_tokens, minimum=1)
                integer("max_new_tokens", self.max_new_tokens, minimum=overlong)
            except ConfigError as err:
                raise ConfigError(err.key, f"{err.problem} (with overlong_reward_penalty)") from None
            set_("overlong_penalty_factor", finite_number("overlong_penalty_factor",
                                                          self.overlong_penalty_factor, minimum=0.0))

    @functools.cached_property
    def plan(self) -> AdvantagePlan:
        """The stages this config runs (built once per config object)."""
        lam: float | LambdaFunction
        if isinstance(self.gae_lambda, str):
            lam = LambdaFunction(resolve_lambda(self.gae_lambda), self.gae_lambda_kwargs, self.gae_lambda,
                                 self.gae_timestep_unit)
        else:
            lam = self.gae_lambda
        overlong = None
        if self.overlong_reward_penalty:  # validated: all three are set with the penalty on
            assert self.max_new_tokens is not None and self.overlong_tokens is not None
            assert self.overlong_penalty_factor is not None
            overlong = OverlongPenalty(self.max_new_tokens, self.overlong_tokens, self.overlong_penalty_factor)
        estimator: EstimatorStage
        if self.credit_assignment is not None:
            estimator = self.credit_assignment
        elif self.gae_timestep_unit == "turn":
            estimator = TurnGAE()
        else:
            estimator = TokenGAE(self.gae_block_size)
        owns_process = estimator_for(estimator).owns_process_rewards
        return AdvantagePlan(
            outcome=OutcomeStage(self.reward_bias, self.reward_scaling, self.reward_clip, self.reward_norm, overlong),
            kl=KLStage(self.kl_ctl, self.kl_estimator, self.kl_clamp),
            task=TaskRewardStage(self.mask_no_eos_with_zero, fold_process=not self.token_rewards_as_adv
                                 and not owns_process),
            process_transform=self.process_reward_transform,
            discount=self.discount, lam=lam, estimator=estimator, adv_norm=self.adv_norm,
            # An estimator that owns the process rewards (PURE puts them into its returns) is not shaped with
            # them too: that would count them twice.
            shaping=self.advantage_shaping if self.token_rewards_as_adv and not owns_process else None,
            gae_method=self.gae_method, max_turns=self.max_turns,
            check_turn_ids=self.gae_timestep_unit == "turn" or isinstance(lam, LambdaFunction),
            check_values=self.check_values, diagnostics=self.diagnostics)

    def shaping_variants(self, modes: Sequence[ShapingMode]) -> tuple[list[ShapingConfig], dict[str, str]]:
        """This config's shaping under each of ``modes``, and ``{mode: "n/a: why"}`` for the modes it rules
        out (for ``compute_advantage_variants``): the refusals of ``refused_pairs()``.

        Args:
            modes: The shaping modes to build (``additive``, ``gvpo``, ``process_weighted``).
        """
        shapings: list[ShapingConfig] = []
        refused: dict[str, str] = {}
        for mode in modes:
            shaping = dataclasses.replace(self.advantage_shaping, mode=mode)
            try:
                dataclasses.replace(self, advantage_shaping=shaping)
                shapings.append(shaping)
            except ConfigError as err:
                refused[mode] = f"n/a: {err}"
        return shapings, refused


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Two settings of the ``actor`` section that ``AdvantageConfig`` refuses together: ``first`` and ``second``
    are ``(key, values)``, a key as written (``credit_assignment.mode``) and the values that clash.

    Args:
        first: One setting of the pair: ``(key, values)``, the key as written (``credit_assignment.mode``) and the
            values that clash.
        second: The other setting, in the same form.
        why: The reason in words, part of the error message.

    Example:
        >>> refusal = prm_jax.config.refused_pairs()[0]
        >>> refusal.first[0], refusal.second[0]
        ('gae_timestep_unit', 'credit_assignment.mode')
    """

    first: tuple[str, tuple[Any, ...]]
    second: tuple[str, tuple[Any, ...]]
    why: str

    def when(self, config: AdvantageConfig) -> bool:
        """Whether ``config`` holds the pair.

        Args:
            config: The ``AdvantageConfig`` being checked.
        """
        return all(setting(config, key) in values for key, values in (self.first, self.second))

    def error(self) -> ConfigError:
        """The error naming both keys."""
        (key, _), (other, _) = self.first, self.second
        return ConfigError(key, f"{_shown(self.first[1])} cannot be combined with {other} {_shown(self.second[1])}: "
                                f"{self.why}")


def _shown(values: tuple[Any, ...]) -> str:
    words = [str(v).lower() if isinstance(v, bool) else f"'{v}'" for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def setting(config: AdvantageConfig, key: str) -> Any:
    """The value of an ``actor`` key as written (``credit_assignment.mode``: the mode's name, or None)."""
    if key == "credit_assignment.mode":
        return None if config.credit_assignment is None else estimator_for(config.credit_assignment).mode
    if key == "process_reward_transform.mode":
        return transform_mode(config.process_reward_transform)
    if key == "process_reward_transform.level":
        return getattr(config.process_reward_transform, "level", None)
    if key == "advantage_shaping.mode":
        return config.advantage_shaping.mode
    return getattr(config, key)


# The pairs of settings the pipeline refuses, declared once: an estimator's own (its EstimatorSpec's ``units``
# and ``refused_with``, so a plug-in's refusals come with its registration) and the rows below, between
# settings no estimator owns. AdvantageConfig raises the first that applies, shaping_variants reads them,
# tests/kernels/test_matrix.py generates every combination of estimator, process transform, reward
# normalization and shaping mode against them, and the guides' table is rendered from them
# (refusals_markdown; a test holds the guide to it). Every other pair is computed, and tested.
#: The pairs of settings refused at configuration that no estimator declares (``refused_pairs()`` adds the
#: estimators' own).
SETTING_REFUSALS: tuple[Refusal, ...] = (
    Refusal(("process_reward_transform.mode", ("progress",)), ("advantage_shaping.mode", ("process_weighted",)),
            "progress rewards are signed differences, and process_weighted weighs advantages by a score in [0, 1]"),
    Refusal(("process_reward_transform.level", ("token",)), ("token_rewards_as_adv", (False,)),
            "folding takes one reward per turn (uniform over it), and token-level progress differs per timestep"),
    Refusal(("token_rewards_as_adv", (False,)), ("advantage_shaping.mode", ("gvpo", "process_weighted")),
            "these modes shape with direct process rewards, which folding puts into GAE instead"),
    Refusal(("mask_no_eos_with_zero", (True,)), ("advantage_shaping.mode", ("process_weighted",)),
            "AReaL refuses it: the zeroed process rewards of a truncated row would zero its positive advantages"),
)


def refused_pairs() -> tuple[Refusal, ...]:
    """Every pair of settings refused at configuration (each names both keys and why), from the registry: the
    credit modes that replace GAE (``units`` without ``turn``) with ``gae_timestep_unit: turn``, each
    registered estimator's ``refused_with``, then ``SETTING_REFUSALS``.

    Example:
        >>> pairs = prm_jax.config.refused_pairs()
        >>> [(p.first, p.second) for p in pairs if p.first[0] == "mask_no_eos_with_zero"]
        [(('mask_no_eos_with_zero', (True,)), ('advantage_shaping.mode', ('process_weighted',)))]
    """
    specs = [spec for spec in registered() if spec.mode is not None]
    rows: list[Refusal] = []
    replacing = tuple(spec.mode for spec in specs if "turn" not in spec.units)
    ignoring = [spec.mode for spec in specs if "turn" in spec.units]
    if replacing:
        rows.append(Refusal(("gae_timestep_unit", ("turn",)), ("credit_assignment.mode", replacing),
                            "these replace GAE, so the turn unit means nothing there"
                            + (f" ({', '.join(map(str, ignoring))}, AReaL's own key, accepts and ignores it)"
                               if ignoring else "")))
    rows += [Refusal(("credit_assignment.mode", (spec.mode,)), (key, tuple(values)), why)
             for spec in specs for key, values, why in spec.refused_with]
    return (*rows, *SETTING_REFUSALS)


def refusals_markdown() -> str:
    """The guides' table of ``refused_pairs()`` (Markdown).

    Example:
        >>> print(prm_jax.config.refusals_markdown().splitlines()[0])
        | setting | refused with | why |
    """
    rows = ["| setting | refused with | why |", "| --- | --- | --- |"]
    rows += [f"| `{r.first[0]}: {_shown(r.first[1])}` | `{r.second[0]}: {_shown(r.second[1])}` | {r.why} |"
             for r in refused_pairs()]
    return "\n".join(rows)


def _norm(value: Any, where: str) -> NormConfig | None:
    """``None`` (no normalization), a ``NormConfig`` or a mapping of its fields."""
    return None if value is None else from_mapping(NormConfig, value, where)


def shaping_config(value: Any, where: str = "advantage_shaping") -> ShapingConfig:
    """A ``ShapingConfig`` or a mapping of its fields (``None``: the defaults)."""
    return from_mapping(ShapingConfig, value, where)


def _by_mode(value: Any, key: str, modes: Mapping[str, type]) -> Any:
    """``None``, an instance of one of ``modes``' classes, or ``{mode: name, **fields}``."""
    if value is None or isinstance(value, tuple(modes.values())):
        return value
    names = " | ".join(modes)
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"must be a mapping with mode: {names}, got {type(value).__name__}")
    fields = dict(value)
    mode = fields.pop("mode", None)
    if mode not in modes:
        raise ConfigError(f"{key}.mode", f"must be one of {names}, got {short_repr(mode)}")
    return from_mapping(modes[mode], fields, key)


def _credit_assignment(value: Any) -> EstimatorStage | None:
    """``None``, a credit record or ``{mode: gigpo | tree | pure | prime, ...}`` (AReaL's ``{mode: gigpo}``)."""
    return _by_mode(value, "credit_assignment", credit_modes())


def _transform(value: Any) -> ProcessTransform | None:
    return _by_mode(value, "process_reward_transform", {mode: spec.stage for mode, spec in PROCESS_TRANSFORMS.items()})


def _reward_norm(value: Any) -> NormConfig | DecoupledNorm | None:
    """AReaL's ``NormConfig`` fields, or ``{mode: decoupled, weights, eps}`` (GDPO)."""
    if isinstance(value, Mapping) and "mode" in value:
        return _by_mode(value, "reward_norm", {mode: spec.stage for mode, spec in REWARD_NORMS.items()
                                               if spec.stage is not NormConfig})
    return value if isinstance(value, DecoupledNorm) else _norm(value, "reward_norm")


def _frozen_kwargs(kwargs: Any) -> tuple[tuple[str, Any], ...]:
    """``gae_lambda_kwargs`` as sorted ``(name, value)`` pairs, so the config stays hashable."""
    if kwargs is None:
        return ()
    items = kwargs.items() if isinstance(kwargs, Mapping) else kwargs
    try:
        pairs = tuple(sorted((str(k), v) for k, v in items))
        hash(pairs)
    except (TypeError, ValueError):
        raise ConfigError("gae_lambda_kwargs", "must be a mapping of names to hashable values (numbers, strings), "
                                               f"got {short_repr(kwargs)}") from None
    return pairs
