"""The tables the guides include (``{include} <name>.inc``), each rendered at every docs build from the code's
own declarations, never pasted: conf.py calls ``write``; tests/test_doc_tables.py holds each include to its
source. The ``.inc`` files are build outputs (ignored by git)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: The public namespaces of ``prm_jax`` (each an ``__all__``): the API pages (conf.py), the public-API table,
#: the boundary tests (tests/test_public_api.py).
NAMESPACES = ("config", "kernels", "kernels.gae_lambda", "runtime", "credit", "estimators", "losses", "filters",
              "scorers", "errors", "audit")
#: Public modules that are not namespaces of names, in the public-API table too (the tunix integration has its
#: own guide: its learners need the tunix extra).
DOCUMENTED_MODULES = ("app.sessions",)
SOURCES = Path(__file__).resolve().parent.parent / "prm_jax"
SHORT = 120  # the most characters of a name's line in the public-API table


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]], *, linked: str = "") -> str:
    """A Markdown table: the first cell of each row as code (``linked``: a module whose object the cell names,
    linked to its page in the API reference), ``|`` escaped in the others."""
    cell = lambda text: text.replace("|", "\\|")
    first = (lambda name: f"{{py:obj}}`~{linked}.{name}`") if linked else (lambda name: f"`{name}`")
    return "\n".join(["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
                      *("| " + " | ".join([first(row[0]), *map(cell, row[1:])]) + " |" for row in rows)])


def errors() -> str:
    from prm_jax.errors import described

    return markdown(("error", "also a", "raised when", "on the command line"), described())


def session_format() -> str:
    from prm_jax.app.sessions import format_table

    return markdown(("key", "", "JSON type", "values", "what it is", "in the batch"), format_table())


def refusals() -> str:
    from prm_jax.config import refusals_markdown

    return refusals_markdown()


def public_api() -> str:
    """Each public namespace (and documented module): its first sentence, then one short line a name, the
    first sentence of the name's docstring (a constant's ``#:`` comment). A name without one is an error:
    the docs build fails, naming it."""
    sections = []
    for namespace in (*NAMESPACES, *DOCUMENTED_MODULES):
        module = importlib.import_module(f"prm_jax.{namespace}")
        rows = [(name, summary(f"prm_jax.{namespace}.{name}", getattr(module, name))) for name in module.__all__]
        linked = f"prm_jax.{namespace}" if namespace in NAMESPACES else ""  # (the API reference's pages)
        sections.append(f"## `prm_jax.{namespace}`\n\n{short_line(inspect.getdoc(module) or '')}\n\n"
                        + markdown(("name", "what it is"), rows, linked=linked))
    return "\n\n".join(sections)


def summary(path: str, obj: Any) -> str:
    """The short line of the public name ``path``: its docstring's first sentence (``short_line``), or for a
    constant or a type alias, the ``#:`` comment above its assignment in the package's sources."""
    own = callable(obj) and str(getattr(obj, "__module__", "")).startswith("prm_jax")  # (jitted ones too)
    text = (inspect.getdoc(obj) or "") if own else attribute_doc(path.rsplit(".", 1)[1])
    if not text.strip():
        raise ValueError(f"{path} has no description (a docstring, or a '#:' comment above a constant)")
    return short_line(text)


def attribute_doc(name: str) -> str:
    """The ``#:`` comment of the top-level assignment of ``name`` in the package's sources (``alias_docs``)."""
    return alias_docs().get(name, "")


@functools.cache
def alias_docs() -> dict[str, str]:
    """Every name given a ``#:`` documentation comment at a module's top level in the package (constants, and
    type aliases such as ``ErrorPolicy``: a ``Literal`` has no docstring of its own), with the comment's text:
    the comment lines right above ``name = ...`` or ``name: type = ...``, as Sphinx reads them."""
    found: dict[str, str] = {}
    for source in sorted(SOURCES.rglob("*.py")):
        lines = source.read_text().splitlines()
        for k, line in enumerate(lines):
            match = re.match(r"([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)", line)
            if not match or k == 0 or not lines[k - 1].startswith("#:"):
                continue
            start = k
            while start > 0 and lines[start - 1].startswith("#:"):
                start -= 1
            found.setdefault(match.group(1), " ".join(text[2:].strip() for text in lines[start:k]).strip())
    return found


@functools.cache
def glossary() -> dict[str, str]:
    """``docs/parameters.py``'s ``GLOSSARY``: the parameters that mean one thing wherever they stand."""
    spec = importlib.util.spec_from_file_location("parameters", Path(__file__).resolve().parent / "parameters.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.GLOSSARY)


SECTIONS = ("Args:", "Arguments:", "Parameters:", "Keyword Args:", "Attributes:")


def entries(doc: str | None) -> dict[str, str]:
    """The parameters a Google-style docstring describes, with their sentences: its ``Args`` (or
    ``Attributes``) entries, each ``name: sentence`` (or ``name (type): sentence``, or ``a, b: sentence`` for
    several) one indent under the section's line, continuation lines deeper."""
    found: dict[str, str] = {}
    lines = (doc or "").expandtabs().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() not in SECTIONS:
            i += 1
            continue
        indent = len(lines[i]) - len(lines[i].lstrip())
        i += 1
        entry, names = None, []
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
            line = lines[i]
            depth = len(line) - len(line.lstrip())
            match = re.match(r"\s*((?:\*{0,2}\w+\s*,\s*)*\*{0,2}\w+)\s*(\([^)]*\))?\s*:(.*)$", line)
            if match and (entry is None or depth <= entry):
                entry = depth
                names = [name.strip().lstrip("*") for name in match.group(1).split(",")]
                for name in names:  # (grouped names, "advantages, loss_mask: ...", share the sentence)
                    found[name] = match.group(3).strip()
            elif names and line.strip():
                for name in names:
                    found[name] = f"{found[name]} {line.strip()}"
            i += 1
    return {name: sentence for name, sentence in found.items() if sentence}


def described(doc: str | None) -> set[str]:
    """The names ``entries`` finds."""
    return set(entries(doc))


def parameters_of(obj: Any) -> list[str]:
    """The parameters a user passes to a public callable (a class's: its constructor's), ``*args`` and
    ``**kwargs`` by their names, without ``self``; none for an enumeration (its members are the values, not its
    arguments)."""
    import enum

    if inspect.isclass(obj) and (issubclass(obj, enum.Enum) or getattr(obj, "_is_protocol", False)):
        return []  # (an enumeration's members are its values; a protocol is implemented, never called)
    if not (inspect.isclass(obj) or inspect.isroutine(obj) or isinstance(obj, functools.partial)
            or hasattr(obj, "__wrapped__")):
        return []  # (a type alias: Literal[...], a union)
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    return [p.name for p in signature.parameters.values() if p.name not in ("self", "cls")]


def own_docstring(obj: Any) -> str:
    """A callable's docstring and, for a class, its constructor's (where autodoc reads both)."""
    doc = inspect.getdoc(obj) or ""
    init = obj.__dict__.get("__init__") if inspect.isclass(obj) else None
    if init is not None and getattr(init, "__doc__", None):
        doc += "\n\n" + (inspect.getdoc(init) or "")
    return doc


def declared_docs(obj: Any) -> dict[str, str]:
    """Parameter sentences a declaration already holds: a settings record's fields
    (``prm_jax.runtime.Settings``), an ``Interaction``'s optional fields (``TURN_FIELDS``' ``doc``, the session
    format's sentences too)."""
    from prm_jax.runtime import TURN_FIELDS, Interaction, Settings

    if inspect.isclass(obj) and issubclass(obj, Settings):
        return obj.docs()
    if obj is Interaction:
        return {field.name: field.doc[0].upper() + field.doc[1:] + "." for field in TURN_FIELDS if field.doc}
    return {}


#: Callables whose parameters are another's, described there once: the docs give them that one's sentences.
SAME_PARAMETERS = {"prm_jax.runtime.empty_batch": "prm_jax.runtime.batch_spec",
                   "prm_jax.runtime.BlockingRunner.run_many": "prm_jax.runtime.PRMRunner.run_many",
                   "prm_jax.runtime.BlockingRunner.run": "prm_jax.runtime.PRMRunner.run"}


def borrowed_docs(path: str) -> dict[str, str]:
    """The sentences ``SAME_PARAMETERS`` lends ``path`` (its twin's own ``Args``)."""
    twin = SAME_PARAMETERS.get(path)
    if twin is None:
        return {}
    module, _, rest = twin.partition(".runtime.")
    obj: Any = importlib.import_module(f"{module}.runtime")
    for part in rest.split("."):
        obj = getattr(obj, part)
    return entries(own_docstring(obj))


def parameter_sentences(obj: Any, path: str = "") -> dict[str, str]:
    """The sentences the docs give the parameters a callable (at ``path``) leaves out of its own docstring: a
    declaration's (``declared_docs``), else its twin's (``SAME_PARAMETERS``), else the glossary's
    (``docs/parameters.py``)."""
    told = described(own_docstring(obj))
    declared = {**glossary(), **borrowed_docs(path), **declared_docs(obj)}
    return {p: declared[p] for p in parameters_of(obj) if p not in told and p in declared}


def public_callables() -> list[tuple[str, Any]]:
    """Every public callable, by its public path: each namespace's (and documented module's) ``__all__``
    names that are classes or functions (not data, not type aliases)."""
    out = []
    for namespace in (*NAMESPACES, *DOCUMENTED_MODULES):
        module = importlib.import_module(f"prm_jax.{namespace}")
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isroutine(obj) or hasattr(obj, "__wrapped__"):
                out.append((f"prm_jax.{namespace}.{name}", obj))
    return out


def documented_methods(cls: type) -> dict[str, Any]:
    """The methods a class's API page documents: its own public ones (the page's ``:members:``)."""
    fields = getattr(cls, "__dataclass_fields__", {})  # (a field's default may be a function: not a method)
    return {name: getattr(cls, name) for name, raw in vars(cls).items()
            if not name.startswith("_") and name not in fields
            and (isinstance(raw, (staticmethod, classmethod)) or inspect.isfunction(raw))}


def undescribed_parameters() -> dict[str, list[str]]:
    """Each public callable's parameters (a public class's documented methods' too) that neither its
    docstring, nor a declaration (``declared_docs``), nor the glossary (``docs/parameters.py``: a name that
    means one thing wherever it stands) describes: the docs build fails on any (conf.py), and so does
    tests/test_doc_tables.py."""
    missing: dict[str, list[str]] = {}
    for path, obj in documented_callables():
        told = described(own_docstring(obj)) | parameter_sentences(obj, path).keys()
        lacking = [p for p in parameters_of(obj) if p not in told]
        if lacking:
            missing[path] = lacking
    return missing


def stray_entries() -> dict[str, list[str]]:
    """Each public callable's (and documented method's) ``Args`` entries that name no parameter of it: a
    sentence written beside the wrong callable, or left behind by a rename. The docs build fails on any."""
    stray: dict[str, list[str]] = {}
    for path, obj in documented_callables():
        extra = sorted(described(own_docstring(obj)) - set(parameters_of(obj)))
        if extra:
            stray[path] = extra
    return stray


def documented_callables() -> list[tuple[str, Any]]:
    """Every public callable and every documented method of a public class, by path."""
    out = []
    for path, obj in public_callables():
        out.append((path, obj))
        if inspect.isclass(obj):
            out += [(f"{path}.{name}", method) for name, method in documented_methods(obj).items()]
    return out


def without_example() -> list[str]:
    """The public callables whose docstring holds no runnable example (``>>>``; the docs build runs them as
    doctests): the docs build fails on any (conf.py), and so does tests/test_doc_tables.py."""
    return [path for path, obj in public_callables() if ">>>" not in own_docstring(obj)]


def short_line(text: str) -> str:
    """A docstring's first sentence as one Markdown line of at most ``SHORT`` characters (cut at a word
    boundary, with an ellipsis), reStructuredText's double backticks as Markdown's."""
    paragraph = " ".join(text.strip().split("\n\n")[0].split()).replace("``", "`")
    match = re.match(r"(.+?[.!?])(?:\s|$)", paragraph)
    line = match.group(1) if match else paragraph
    if len(line) > SHORT:
        line = line[:SHORT - 2].rsplit(" ", 1)[0].rstrip(",;:(") + " …"
    if line.count("`") % 2:  # (a cut inside code: close it)
        line = line[:-2] + "` …" if line.endswith(" …") else line + "`"
    return line


def steps() -> str:
    """The credit-assignment guide's table of ``compute_advantages``' steps: what each stage may be (the modes
    of the declared stages and the registered estimators) and the batch keys it reads (their declarations)."""
    from prm_jax.estimators import STAGE_SPECS, registered

    def modes(kind: str) -> list[Any]:
        return [spec for spec in STAGE_SPECS if spec.kind == kind]

    def keys(specs: Sequence[Any], *first: str) -> str:
        readers: dict[str, list[str]] = {key: [] for key in first}
        for spec in specs:
            for key in (*spec.reads, *getattr(spec, "may_read", ())):
                readers.setdefault(key, []).append(spec.mode)
        return ", ".join(f"`{key}`" + (f" ({', '.join(who)})" if who else "") for key, who in readers.items())

    def listed(specs: Sequence[Any]) -> str:
        return ", ".join(f"`{spec.mode}`" for spec in specs)

    credit = [spec for spec in registered() if spec.mode is not None]
    after = [spec for spec in credit if spec.kl == "after"]
    summed = [spec for spec in credit if spec.kl == "rewards"]
    owners = [spec for spec in credit if spec.owns_process_rewards]
    rows = [
        ("1", "outcome reward", "overlong penalty, bias, scaling, clip (`reward_clip`, AReaL's 20 by default: the "
         "row's whole outcome reward, a sum of reward functions included, is clipped to `+-20` after bias and "
         "scaling; verl clips nothing, so a summed reward above 20 surprises there); then `reward_norm`: "
         f"{listed(modes('reward_norm'))} (`normalize`: AReaL's `NormConfig`; `decoupled`: GDPO over the outcome "
         "and `reward_sources [B, K]`)", keys(modes("reward_norm"), "rewards")),
        ("2", "timesteps", "the rollout's arrays shifted onto next-token timesteps; the old log-probs are "
         "`prox_logprobs` where given, else the shifted `logprobs`; `P` is the shifted `token_rewards`",
         "`loss_mask`, `attention_mask`, `logprobs`, `prox_logprobs`, `values`, `token_rewards`"),
        ("3", "process rewards `P`", f"`process_reward_transform`: {listed(modes('process_reward_transform'))}",
         keys(modes("process_reward_transform"), "turn_ids")),
        ("4", "KL rewards", "the KL estimate (`kl_estimator`) clamped to `+-kl_clamp` (AReaL's 10; tunix uses 5) "
         "before `-kl_ctl` scales it", "`ref_logprobs`"),
        ("5", "where the outcome and `P` go", "the outcome reward at the last trained timestep (0 on truncated rows "
         "under `mask_no_eos_with_zero`); `P` kept for shaping (`token_rewards_as_adv: true`) or folded into the "
         "rewards", "`is_truncated`"),
        ("6-7", "advantages and returns", "GAE (`gae_timestep_unit: token \\| turn`), or `credit_assignment`: "
         f"{listed(after)} (each replaces GAE; the KL rewards are added to its advantages), {listed(summed)} (the "
         "KL rewards in the rewards they sum)", keys(credit)),
        ("8", "`adv_norm`", "AReaL's `NormConfig` over the advantages on the trained timesteps",
         "(the advantages of step 7)" + (f"; {keys(modes('adv_norm'))}" if any(s.reads for s in modes("adv_norm"))
                                         else "")),
        ("9", "shaping", f"`advantage_shaping` with `P`: {listed(modes('advantage_shaping'))}"
         + (f"; not under {listed(owners)} (its returns already hold `P`)" if owners else ""),
         "(the advantages of step 8, `P` of step 5)"),
    ]
    return "\n".join(["| step | stage | choices | batch keys it reads |", "| --- | --- | --- | --- |",
                      *(f"| {' | '.join(row)} |" for row in rows)])


def code_settings() -> str:
    """``CodeExecutionScorer``'s settings (the limits' record flat among them, the transport's left to the
    served scorers' table): each key, its default and its sentence, from the declarations."""
    import inspect as inspect_module

    from prm_jax.scorers._code_execution import CodeExecutionSettings
    from prm_jax.scorers._http import Transport

    transport = set(Transport.keys())
    docs = CodeExecutionSettings.docs()
    rows = [(p.name, f"`{p.default!r}`" if p.default is not inspect_module.Parameter.empty else "required",
             " ".join(docs[p.name].split()))
            for p in CodeExecutionSettings.parameters() if p.name not in transport]
    return markdown(("setting", "default", "what it is"), rows)


# Each include of the guides, and what renders it.
def audit_verdicts(entries: Sequence[tuple[str, Any, str]] | None = None) -> str:
    """The auditor's verdicts, a row a mode of ``entries`` (default: every built-in mode,
    ``prm_jax.audit.BUILT_IN``; the audit runs at every docs build, about a minute), a column a problem."""
    from prm_jax.audit import SUITE, built_in_table

    rows = [(name, f"`{aggregation}`", *cells) for name, aggregation, cells in built_in_table(entries=entries)]
    return markdown(("mode", "loss_agg_mode", *(f"`{p.name}`" for p in SUITE)), rows)


def turn_baselines() -> str:
    """The auditor's verdict on the two per-turn baselines, side by side (the credit guide's table): ``turn_rloo``
    and verl RFC #7244's per-turn-index form."""
    from prm_jax.audit import BUILT_IN

    return audit_verdicts([entry for entry in BUILT_IN if "per-turn" in entry[0]])


def audit_problems() -> str:
    """The auditor's problems: each one's name, what it tests and the known failure it is aimed at
    (``prm_jax.audit.SUITE``)."""
    from prm_jax.audit import SUITE

    return markdown(("problem", "what it tests", "the known failure it is aimed at"),
                    [(p.name, p.tests, p.failure) for p in SUITE])


TABLES: dict[str, Callable[[], str]] = {"errors-table.inc": errors, "session-format-table.inc": session_format,
                                        "refusals-table.inc": refusals, "public-api-table.inc": public_api,
                                        "steps-table.inc": steps, "code-settings-table.inc": code_settings,
                                        "audit-table.inc": audit_verdicts, "audit-problems-table.inc": audit_problems,
                                        "turn-baselines-table.inc": turn_baselines}


def write(folder: Path) -> None:
    """Each of ``TABLES`` into ``folder`` (rewritten only where its text changed)."""
    for name, render in TABLES.items():
        page, text = folder / name, render() + "\n"
        if not page.exists() or page.read_text() != text:
            page.write_text(text)
