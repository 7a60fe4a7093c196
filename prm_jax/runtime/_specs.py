"""Scorer specs: resolving a config entry's dotted path to a ``BaseScorer`` subclass and checking everything
start-up would reject (constructor arguments, names, the scorer's own ``validate_kwargs`` and
``validate_prm_config``), without building a scorer; and the PRM section a runner is built from."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from prm_jax._validation import short_repr
from prm_jax.config._experiment import ExperimentConfig, PRMConfig, PRMSection, ScorerSpec, section_shaping
from prm_jax.kernels._shaping import ShapingConfig
from prm_jax.runtime._scoring import EXECUTOR_SETTINGS, BaseScorer, SyncScorer
from prm_jax.runtime._settings import base_parameters


def resolve_scorer_class(path: str) -> type[BaseScorer]:
    """Imports ``package.module.ClassName``; the class must subclass ``BaseScorer``.

    Args:
        path: The class's dotted path ``package.module.ClassName``.

    Example:
        >>> prm_jax.runtime.resolve_scorer_class("prm_jax.scorers.MathVerifyScorer").name
        'math_verify'
    """
    if not isinstance(path, str) or not path:
        raise ValueError(f"scorer path must be a non-empty dotted import path, got {path!r}")
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"scorer path {path!r} must be 'package.module.ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        missing = isinstance(err, ModuleNotFoundError) and err.name is not None and module_name.startswith(err.name)
        cwd = os.getcwd()
        searched = (f"the current folder {cwd} and sys.path" if cwd in sys.path or "" in sys.path
                    else f"sys.path, which does not hold the current folder {cwd}")
        where = (f" (looked in {searched}; a module of your own: run from its folder, or add that folder to "
                 "PYTHONPATH)") if missing else ""
        raise ValueError(f"scorer path {path!r}: cannot import module {module_name!r}: {err}{where}") from err
    try:
        cls = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"scorer path {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, BaseScorer)):
        raise TypeError(f"scorer path {path!r} names {cls!r}, which is not a BaseScorer subclass")
    return cls


RESERVED_KWARGS = ("weight", "enabled", "timeout")


def _constructor_arguments(cls: type[BaseScorer]) -> tuple[set[str], set[str], bool]:
    """Keyword names a scorer class's constructor chain accepts (``base_parameters``: ``**kwargs`` followed
    up the MRO to ``BaseScorer``), those its most derived constructor requires, and whether it is open."""
    parameters, open_ = base_parameters(cls, BaseScorer)
    first = next((k.__dict__["__init__"] for k in cls.__mro__ if "__init__" in k.__dict__), None)
    try:
        own = list(inspect.signature(first).parameters.values())[1:] if first is not None else []
    except (TypeError, ValueError):
        own = []
    required = {p.name for p in own if p.default is p.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {p.name for p in parameters}, required, open_


def check_scorer_specs(section: PRMSection | PRMConfig | ExperimentConfig,
                       borrowed: Sequence[BaseScorer] = ()) -> list[type[BaseScorer]]:
    """Everything start-up would reject, found without building a scorer (they may open clients).

    Imports each entry's class, binds its ``kwargs`` against the constructor chain, checks the class
    ``name`` (set, unique across entries and ``borrowed`` instances) and calls the optional classmethod hook
    ``validate_prm_config(prm_section)`` (AReaL's per-scorer check; it sees ``enabled``,
    ``advantage_shaping`` and ``scorers``). Returns the entries' classes. Raises ``ValueError``/``TypeError``
    naming the entry.

    Args:
        section: The PRM section to check (a ``PRMSection``, a ``PRMConfig`` or an ``ExperimentConfig``).
        borrowed: Scorer instances the runner will also run (their names count against the entries').

    Example:
        >>> section = prm_jax.config.PRMConfig.from_mapping({"scorers": [{"path": "prm_jax.scorers.LengthBudgetScorer"}]})
        >>> [cls.__name__ for cls in prm_jax.runtime.check_scorer_specs(section)]
        ['LengthBudgetScorer']
    """
    if isinstance(section, ExperimentConfig):
        section = section.prm_section
    elif isinstance(section, PRMConfig):
        section = PRMSection(section.enabled, ShapingConfig(), section.scorers)
    classes: list[type[BaseScorer]] = []
    names: dict[str, str] = {}
    for i, entry in enumerate(section.scorers):
        where = f"rollout.agent.prm.scorers[{i}]"
        cls = _check_spec(entry, where, section)
        _claim_name(names, cls.name, where)
        classes.append(cls)
    for i, scorer in enumerate(borrowed):
        if not isinstance(scorer, BaseScorer):
            raise TypeError(f"scorers[{i}] must be a BaseScorer instance, got {type(scorer).__name__}")
        _claim_name(names, scorer.name, f"scorers[{i}] (borrowed)")
    return classes


def enabled_scorer_names(config: ExperimentConfig) -> list[str]:
    """The ``name`` of each enabled scorer entry, in the config's order (GDPO's source columns)."""
    classes = check_scorer_specs(config)
    return [cls.name for entry, cls in zip(config.prm.scorers, classes) if entry.enabled]


def _check_spec(entry: ScorerSpec, where: str, section: PRMSection) -> type[BaseScorer]:
    cls = resolve_scorer_class(entry.path)
    if not isinstance(cls.name, str) or not cls.name:
        raise ValueError(f"{where}: scorer class {entry.path} has no class-level name")
    try:
        cls.check_kind()
    except TypeError as err:
        raise TypeError(f"{where}: {entry.path}: {err}") from None
    reserved = [k for k in RESERVED_KWARGS if k in entry.kwargs]
    if reserved:
        raise ValueError(f"{where}.kwargs: {reserved} belong to the entry itself, not to kwargs")
    accepted, required, open_ = _constructor_arguments(cls)
    unknown = sorted(set(entry.kwargs) - accepted)
    if unknown and not open_:
        raise ValueError(f"{where}.kwargs: {entry.path} does not accept {short_repr(unknown)} (it accepts "
                         f"{sorted(accepted - {'weight', 'enabled'})})")
    missing = sorted(required - set(entry.kwargs) - {"weight", "enabled"})
    if missing:
        raise ValueError(f"{where}.kwargs: {entry.path} needs {missing}")
    try:
        if issubclass(cls, SyncScorer):  # the executor's settings (executor, max_workers, the ray settings)
            cls.validate_executor(**{k: v for k, v in entry.kwargs.items() if k in EXECUTOR_SETTINGS})
        cls.validate_kwargs(**entry.kwargs)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}.kwargs: {entry.path}: {err}") from None
    hook = getattr(cls, "validate_prm_config", None)
    if hook is not None:
        try:
            hook(section)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{where}: {entry.path} rejects this PRM config: {err}") from None
    return cls


def _claim_name(names: dict[str, str], name: str, where: str) -> None:
    if name in names:
        raise ValueError(f"{where}: scorer name {name!r} is already used by {names[name]}; names must be "
                         "unique within a runner")
    names[name] = where


def as_section(config: Any, borrowed: Sequence[BaseScorer]) -> PRMSection:
    """The PRM section a runner is built from; with only borrowed scorers, PRM is enabled."""
    if isinstance(config, ExperimentConfig):
        return config.prm_section
    if isinstance(config, Mapping):
        if "rollout" in config or "actor" in config:
            return ExperimentConfig.from_mapping(config).prm_section
        prm = PRMConfig.from_mapping(config)  # (a prm section: its advantage_shaping honoured, as in the full shape)
        return PRMSection(prm.enabled, section_shaping(config), prm.scorers)
    if isinstance(config, PRMConfig):
        return PRMSection(config.enabled, ShapingConfig(), config.scorers)
    if config is None:
        return PRMSection(bool(borrowed), ShapingConfig(), ())
    raise TypeError(f"config must be a PRMConfig, an ExperimentConfig or a mapping, got {type(config).__name__}")
