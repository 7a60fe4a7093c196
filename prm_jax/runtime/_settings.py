"""A scorer's settings, declared once: a frozen record whose fields are the constructor's keyword arguments.

A record is a frozen, keyword-only dataclass deriving from ``Settings``. Each field is declared with
``setting(default, doc=..., example=...)``: its type, its default, one sentence saying what it is (the
docs' parameter table and the class docstring's ``Args`` are generated from it) and, for a required
field, an example value (the docs' and the tests' way to build the scorer). Its ``check`` method holds
every rule over the values; building the record runs it, so checking a config entry (``validate_kwargs``,
what ``validate-config`` calls) and building the scorer are one step, and no setting is written twice.

A field whose type is itself a record (a served scorer's ``Transport``) is *flat* to the user: its keys are
the scorer's keyword arguments beside the others (``request_timeout=...``), and the field's default is
that record with the scorer's own defaults (a teacher waits 120 s a request, a judge 30 s).

A scorer class declares ``settings_class = ItsSettings``; ``BaseScorer.__init_subclass__`` then gives it
a constructor whose signature is the record's fields (flattened) followed by the base class's own
(``weight``, ``enabled``, ``max_batch_size``, ...), which builds ``self.settings`` and passes the rest up.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from prm_jax._validation import short_repr

NO_EXAMPLE = object()
DOC = "doc"
EXAMPLE = "example"

_R = TypeVar("_R", bound="Settings")


def setting(default: Any = dataclasses.MISSING, *, doc: str, example: Any = NO_EXAMPLE) -> Any:
    """A record field: its default (none: required), one sentence (``doc``: what it is, its unit or range,
    what its default means) and, for a required field, an example value.

    Args:
        default: The field's default; none: the field is required.
        doc: One sentence: what it is, its unit or range, what its default means.
        example: For a required field, an example value (the docs' and the tests' way to build the record).

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass(frozen=True, kw_only=True)
        ... class Budget(prm_jax.runtime.Settings):
        ...     tokens: int = prm_jax.runtime.setting(doc="The budget, in tokens.", example=128)
        ...
        >>> Budget.docs(), Budget.examples(), Budget.build({"tokens": 64})
        ({'tokens': 'The budget, in tokens.'}, {'tokens': 128}, Budget(tokens=64))
    """
    if not doc or not doc.strip():
        raise ValueError("a setting needs its sentence (doc)")
    metadata = {DOC: doc, EXAMPLE: example}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """The base of every settings record (see the module docstring).

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass(frozen=True, kw_only=True)
        ... class Budget(prm_jax.runtime.Settings):
        ...     tokens: int = prm_jax.runtime.setting(128, doc="The budget, in tokens, >= 1.")
        ...     def check(self):
        ...         if self.tokens < 1:
        ...             raise ValueError(f"tokens must be >= 1, got {self.tokens}")
        ...
        >>> Budget.build({"tokens": 64}).tokens
        64
        >>> try:
        ...     Budget.build({"tokens": 0})
        ... except ValueError as err:
        ...     print(err)
        ...
        tokens must be >= 1, got 0
    """

    # Fields given by position, in this order (the required ones by default: ``OpenAIJudgeScorer(url, model)``).
    positional: ClassVar[tuple[str, ...] | None] = None
    # Keywords a user may bring from a kindred scorer that this one refuses, with the reason (said, not
    # "unexpected keyword").
    refused: ClassVar[Mapping[tuple[str, ...], str]] = {}

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Every rule over the values: ``ValueError`` or ``TypeError`` naming the setting. Override it."""

    @classmethod
    def declared(cls) -> tuple[dataclasses.Field[Any], ...]:
        return dataclasses.fields(cls)

    @classmethod
    def nested(cls) -> dict[str, type[Settings]]:
        """The fields that are records themselves (flat to the user), by name."""
        out = {}
        for field in cls.declared():
            default = field.default
            if isinstance(default, Settings):
                out[field.name] = type(default)
        return out

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """Every keyword the record takes, flattened, in declaration order."""
        return tuple(p.name for p in cls.parameters())

    @classmethod
    def taken(cls) -> tuple[dataclasses.Field[Any], ...]:
        """The fields a user sets (a subclass's ``refused`` fields keep their defaults)."""
        refused = {name for names in cls.refused for name in names}
        return tuple(f for f in cls.declared() if f.name not in refused)

    @classmethod
    def parameters(cls) -> list[inspect.Parameter]:
        """The record as keyword parameters (flattened; a nested record's defaults are the field's)."""
        nested = cls.nested()
        order = cls.positional_names()
        out: list[inspect.Parameter] = []
        for field in cls.taken():
            if field.name in nested:
                default_record = field.default
                out.extend(p.replace(default=getattr(default_record, p.name)) for p in nested[field.name].parameters())
                continue
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if field.name in order else inspect.Parameter.KEYWORD_ONLY
            default = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
            out.append(inspect.Parameter(field.name, kind, default=default, annotation=field.type))
        return out

    @classmethod
    def positional_names(cls) -> tuple[str, ...]:
        if cls.positional is not None:
            return cls.positional
        return tuple(f.name for f in cls.declared() if f.default is dataclasses.MISSING and f.name not in cls.nested())

    @classmethod
    def docs(cls) -> dict[str, str]:
        """Each keyword's sentence, flattened."""
        nested = cls.nested()
        out: dict[str, str] = {}
        for field in cls.taken():
            out.update(nested[field.name].docs() if field.name in nested else {field.name: field.metadata[DOC]})
        return out

    @classmethod
    def examples(cls) -> dict[str, Any]:
        """The declared example of each required keyword (what builds the record with defaults elsewhere)."""
        return {f.name: f.metadata[EXAMPLE] for f in cls.declared()
                if f.default is dataclasses.MISSING and f.metadata.get(EXAMPLE, NO_EXAMPLE) is not NO_EXAMPLE}

    @classmethod
    def split(cls, args: Sequence[Any], kwargs: Mapping[str, Any], who: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(args, kwargs)`` of a constructor call as the record's keywords and the rest (the base class's).

        Args:
            args: The constructor's positional arguments (the record's ``positional`` fields, in order).
            kwargs: Its keyword arguments.
            who: How errors name the scorer.
        """
        names = cls.positional_names()
        if len(args) > len(names):
            raise TypeError(f"{who} takes at most {len(names)} positional arguments ({', '.join(names)}), got "
                            f"{len(args)}")
        own = dict(zip(names, args))
        twice = sorted(set(own) & set(kwargs))
        if twice:
            raise TypeError(f"{who} got {twice} both by position and by keyword")
        for names_refused, reason in cls.refused.items():
            given = sorted(set(kwargs) & set(names_refused))
            if given:
                raise ValueError(f"{who}: {given} {reason}")
        keys = set(cls.keys())
        own.update((k, v) for k, v in kwargs.items() if k in keys)
        return own, {k: v for k, v in kwargs.items() if k not in keys}

    @classmethod
    def build(cls: type[_R], values: Mapping[str, Any], who: str = "") -> _R:
        """The record from flat keywords (a nested record gets its own keys over the field's default);
        ``TypeError`` naming a missing or unknown keyword, the record's checks for the values.

        Args:
            values: The record's keywords, flat (a nested record's keys beside the others).
            who: How errors name the scorer; empty: not named.
        """
        prefix = f"{who}: " if who else ""
        nested = cls.nested()
        keys = set(cls.keys())
        unknown = sorted(set(values) - keys)
        if unknown:
            raise TypeError(f"{prefix}unexpected keyword arguments {short_repr(unknown)} (it takes "
                            f"{sorted(keys)})")
        missing = [f.name for f in cls.declared() if f.default is dataclasses.MISSING and f.name not in values]
        if missing:
            raise TypeError(f"{prefix}missing required arguments {missing}")
        own: dict[str, Any] = {}
        for field in cls.declared():
            if field.name in nested:
                inner = {k: values[k] for k in nested[field.name].keys() if k in values}
                default: Any = field.default
                own[field.name] = dataclasses.replace(default, **inner) if inner else default
            elif field.name in values:
                own[field.name] = values[field.name]
        return cls(**own)


def base_parameters(cls: type, stop: type, start: type | None = None) -> tuple[list[inspect.Parameter], bool]:
    """The named parameters a class's constructor chain accepts (from ``start`` in its MRO, by default the
    class itself), following ``**kwargs`` up the MRO (a class that forwards them passes the rest to its
    parent) to ``stop``, and whether the chain stays open (a constructor without a readable signature, or
    ``**kwargs`` past ``stop``)."""
    seen: dict[str, inspect.Parameter] = {}
    mro = cls.__mro__
    for klass in mro[mro.index(start):] if start is not None else mro:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            parameters = list(inspect.signature(init).parameters.values())[1:]
        except (TypeError, ValueError):
            return list(seen.values()), True
        for p in parameters:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in seen:
                seen[p.name] = p
        if klass is stop or not any(p.kind is p.VAR_KEYWORD for p in parameters):
            return list(seen.values()), False
    return list(seen.values()), True


def _base_init(cls: type) -> type:
    """The first class above ``cls`` with a constructor of its own that is not a settings constructor (a
    subclass that declares another record replaces its parent's, never builds both)."""
    for klass in cls.__mro__[1:]:
        init = klass.__dict__.get("__init__")
        if init is not None and not hasattr(init, "settings_record"):
            return klass
    return object


def settings_constructor(cls: type, record: type[Settings], base_defaults: Mapping[str, Any],
                         stop: type) -> Callable[..., None]:
    """The constructor of a class that declares ``record``: builds ``self.settings`` from the record's
    keywords (positional ones too), passes the rest (with ``base_defaults`` under them) to the next
    constructor up that is not a settings constructor, calls ``self.prepare()`` (what the scorer builds from
    its settings: a client, a model), and carries the signature both make up (what
    ``inspect``, the docs and ``validate-config``'s unknown-key check read)."""
    base = _base_init(cls)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        who = f"scorer {getattr(type(self), 'name', type(self).__name__)!r}"
        own, rest = record.split(args, kwargs, who)
        self.settings = record.build(own, who)
        base.__init__(self, **{**base_defaults, **rest})  # type: ignore[misc]
        self.prepare()

    own = record.parameters()
    names = {p.name for p in own}
    inherited, _ = base_parameters(cls, stop, start=base)
    rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, default=base_defaults.get(p.name, p.default))
            for p in inherited if p.name not in names]
    by_name = {p.name: p for p in own}
    positional = [by_name[name] for name in record.positional_names()]
    keywords = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    __init__.__signature__ = inspect.Signature([self_parameter, *positional, *keywords, *rest])  # type: ignore[attr-defined]
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    __init__.__doc__ = f"Builds the scorer from its settings (``{record.__name__}``) and the base class's arguments."
    __init__.settings_record = record  # type: ignore[attr-defined]
    return __init__


def args_section(record: type[Settings]) -> str:
    """The record's fields as a Google-style ``Args:`` section (its sentences, generated: never pasted)."""
    lines = ["Args:"]
    for name, doc in record.docs().items():
        lines.append(f"    {name}: {doc}")
    return "\n".join(lines)
