"""Sphinx configuration of prm-jax's documentation site (``python3 dev.py docs``).

The guides are Markdown (MyST); the API reference is generated from the docstrings (autodoc, autosummary,
napoleon for the Google-style ``Args:`` sections): one page per public name of each namespace, the names
read from each namespace's ``__all__`` (the one declaration of the public surface). Each page lists the
parameters and the return type from the signature's annotations (``autodoc_typehints = "description"``),
shows defaults as written in the source (not their reprs), and ends with the docstring of the module that
defines the name (``defining_module``: the rules it states once for all its names). The build runs with
``-W``: any warning fails it, a broken internal link included (MyST's missing cross-references), and so
does a public name without a docstring of its own (``check_coverage``).

The theme is furo: maintained, responsive (a mobile layout, a content column that grows with the window),
an in-page table of contents, light and dark, with no dependency beyond Sphinx, Beautiful Soup and
Pygments. sphinx-book-theme (optax's, flax's, JAX's) was the other candidate: its 1.4.0 pins
pydata-sphinx-theme to exactly 0.20.0, so the docs environment would follow two themes' release cycles.
sphinx-copybutton puts a copy button on every code block (the prompts of ``>>>`` examples left out);
sphinx-design draws the landing page's cards. Inline code in the guides that names a public object
(```compute_advantages```, ```prm_jax.scorers.MathVerifyScorer```) links to its API page (``link_names``);
intersphinx resolves Python's, numpy's, JAX's and httpx's names from inventories written here
(``external_inventories``: the build has no network).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import shutil
import sys
from pathlib import Path

import jupyter_server_mathjax

import prm_jax

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # (docs/doc_tables.py: the namespaces, and the tables the guides include)
import doc_tables  # noqa: E402

project = "prm-jax"
release = version = prm_jax.__version__
copyright = "2026, the prm-jax authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon",
              "sphinx.ext.mathjax", "sphinx.ext.doctest", "sphinx.ext.intersphinx", "sphinx_copybutton",
              "sphinx_design"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
autosummary_generate = True
# A class's page: its docstring and its documented members (autosummary's default template added tables of
# every member, one empty description cell for each field without a docstring of its own).
templates_path = ["_templates"]
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
# Signatures without annotations (short); each parameter's annotation in the page's parameter list instead,
# every parameter listed (documented or not) with the return type; ``ArrayLike`` by its name, not spelled
# out a dozen types long; defaults as the source writes them (``config=AdvantageConfig()``, not its repr).
autodoc_typehints = "description"
autodoc_typehints_description_target = "all"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_type_aliases = {"ArrayLike": "jax.typing.ArrayLike"}
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# A record's ``Attributes`` (an output's fields) as one field list, not as attribute entries that repeat the
# members autodoc documents.
napoleon_use_ivar = True
html_theme = "furo"
html_title = f"prm-jax {release}"
html_css_files = ["prm-jax.css"]
html_js_files = ["prm-jax.js"]
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
doctest_global_setup = "import numpy as np\nimport prm_jax"
# MathJax from the docs extra (jupyter-server-mathjax ships MathJax 2), copied into _static: the maths render
# without a network (and the browser check runs offline).
html_static_path = [str(Path(jupyter_server_mathjax.__file__).parent / "static"), "_static"]
mathjax_path = "MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"  # (the config the package ships)
# It ships the STIX-Web fonts only (no TeX fonts, no image fonts): HTML-CSS output with those.
# MyST marks the text tex2jax_ignore and the maths "math" (MathJax 3's option); MathJax 2's is tex2jax's.
# Its font-loading test declares a blank font at url('about:blank'), which Chromium refuses with a console
# error (a CORS error for every page); local() names a font that never exists: the same blank, no request.
mathjax2_config = {"HTML-CSS": {"availableFonts": ["STIX-Web"], "preferredFont": "STIX-Web", "webFont": "STIX-Web",
                                "imageFont": None,
                                "styles": {"@font-face": {"font-family": "MathJax_Blank",
                                                          "src": "local('MathJax_Blank')"}}},
                   "tex2jax": {"processClass": "tex2jax_process|mathjax_process|math|output_area",
                               "ignoreClass": "tex2jax_ignore|mathjax_ignore"}}


def public_names() -> dict[str, list[str]]:
    return {ns: list(importlib.import_module(f"prm_jax.{ns}").__all__) for ns in doc_tables.NAMESPACES}


def write_api_pages() -> None:
    """``api/<namespace>.rst``: an autosummary of the namespace's ``__all__`` (generated, not kept by hand);
    the pages autosummary wrote for names that are gone are removed first."""
    shutil.rmtree(HERE / "api" / "_generated", ignore_errors=True)
    for ns, names in public_names().items():
        module = importlib.import_module(f"prm_jax.{ns}")
        summary = (inspect.getdoc(module) or "").split("\n\n")[0]
        lines = [f"prm_jax.{ns}", "=" * len(f"prm_jax.{ns}"), "", summary, "", f".. currentmodule:: prm_jax.{ns}", "",
                 ".. autosummary::", "   :toctree: _generated", "", *(f"   {name}" for name in names), ""]
        page = HERE / "api" / f"{ns}.rst"
        text = "\n".join(lines)
        if not page.exists() or page.read_text() != text:
            page.write_text(text)


alias_docs = doc_tables.alias_docs  # (the '#:' comments: one reader for the site and the guides' tables)


def alias_comments() -> set[str]:
    return set(alias_docs())


def fill_summaries(app, doctree) -> None:
    """An API index's summary table gives a data name (``BATCH_SCHEMA``, ``ErrorPolicy``) the first sentence
    of its ``#:`` comment (autosummary reads a docstring, which data has none of), so no cell is empty."""
    from docutils import nodes

    if not app.env.docname.startswith("api/"):
        return
    docs = alias_docs()
    for row in doctree.findall(nodes.row):
        entries = list(row.findall(nodes.entry))
        if len(entries) != 2 or entries[1].astext().strip():
            continue
        name = entries[0].astext().split("(")[0].strip().rsplit(".", 1)[-1]
        if name in docs:
            first = docs[name].split(". ")[0].rstrip(".") + "."
            entries[1] += nodes.paragraph(text=first)


def undocumented() -> list[str]:
    """Public names whose object has no docstring of its own (an inherited one does not count)."""
    commented = alias_comments()
    missing = []
    for ns, names in public_names().items():
        module = importlib.import_module(f"prm_jax.{ns}")
        for name in names:
            value = getattr(module, name)
            if inspect.isclass(value):
                own = value.__dict__.get("__doc__")
            elif inspect.isroutine(value) or isinstance(value, functools.partial) or hasattr(value, "__wrapped__"):
                own = getattr(value, "__doc__", None)
            else:  # data and type aliases: their #: comment
                own = name if name in commented else None
            if not (own or "").strip():
                missing.append(f"prm_jax.{ns}.{name}")
    return missing


def check_coverage(app) -> None:
    """The build fails on a public name without a docstring of its own, on a public callable without a runnable
    example (``doc_tables.without_example``), on an ``Args`` entry that names no parameter
    (``doc_tables.stray_entries``), and on a parameter of a public
    callable (a class's: its constructor's, a config record's fields) that nothing describes: neither its
    docstring's ``Args``, nor a declaration (a settings record's field, a turn field), nor the glossary of
    ``docs/parameters.py`` (``doc_tables.undescribed_parameters``)."""
    from sphinx.errors import ExtensionError

    missing = undocumented()
    if missing:
        raise ExtensionError(f"public names without a docstring of their own: {missing}")
    lacking = doc_tables.without_example()
    if lacking:
        raise ExtensionError(f"public callables without a runnable example (an 'Example:' with >>> lines, run as a "
                             f"doctest): {lacking}")
    stray = doc_tables.stray_entries()
    if stray:
        raise ExtensionError(f"Args entries that name no parameter of their callable: {stray}")
    undescribed = doc_tables.undescribed_parameters()
    if undescribed:
        listed = "; ".join(f"{name}: {', '.join(params)}" for name, params in undescribed.items())
        raise ExtensionError(f"parameters without a sentence (give each one in the callable's Args, or a name "
                             f"that means one thing everywhere in docs/parameters.py): {listed}")


def describe_parameters(app, what, name, obj, options, lines) -> None:
    """Each parameter of a public callable gets its own ``:param:`` line: grouped entries (``advantages,
    loss_mask: ...``) are split, and a parameter the docstring does not describe gets its declaration's
    sentence or the glossary's (``doc_tables.parameter_sentences``)."""
    owner = name.rsplit(".", 1)[0]
    public = name in app.env.prm_public_paths or (what == "method" and owner in app.env.prm_public_paths)
    if not public or what not in ("class", "function", "method", "exception"):
        return
    takes = set(doc_tables.parameters_of(obj))
    out: list[str] = []
    i = 0
    while i < len(lines):
        field = re.match(r"^:ivar ([\w*\\]+):", lines[i])
        if field and field.group(1) in takes:  # (a record's Attributes are its constructor's parameters)
            lines[i] = ":param" + lines[i][len(":ivar"):]
        match = re.match(r"^:param ([\w*]+(?:, [\w*]+)+):(.*)$", lines[i])
        if not match:
            out.append(lines[i])
            i += 1
            continue
        body = [match.group(2)]
        i += 1
        while i < len(lines) and lines[i].startswith(" "):
            body.append(lines[i])
            i += 1
        for each in match.group(1).split(", "):
            out += [f":param {each}:{body[0]}", *body[1:]]
    told = {m.group(1).replace("\\", "").lstrip("*") for line in out
            for m in [re.match(r"^:(?:param|ivar) (?:[^:]+ )?([\w*\\]+):", line)] if m}
    extra = [f":param {param}: {sentence}" for param, sentence in doc_tables.parameter_sentences(obj, name).items()
             if param not in told]
    fields = [k for k, line in enumerate(out) if re.match(r"^:(?:param|type|ivar|vartype) ", line)]
    if extra and fields:  # (into the one field list the docstring's own Args made)
        end = fields[-1] + 1
        while end < len(out) and out[end].startswith(" "):
            end += 1
        out[end:end] = extra
    elif extra:
        while out and not out[-1].strip():
            out.pop()
        out += ["", *extra, ""]
    lines[:] = out


# Python's, numpy's, JAX's and httpx's names the API pages and guides refer to, with their pages on those
# sites: written as Sphinx inventories at build time (``external_inventories``), since the build runs without
# a network; intersphinx links the names through them.
EXTERNAL = {
    "python": ("https://docs.python.org/3/", {
        "py:class": {name: "library/functions.html#$" for name in ("float", "int", "bool", "object")}
        | {name: "library/stdtypes.html#$" for name in ("str", "dict", "list", "tuple", "set", "bytes")}
        | {f"collections.abc.{name}": "library/collections.abc.html#$"
           for name in ("Mapping", "Sequence", "Callable", "Iterable", "Iterator", "Awaitable", "AsyncIterator")}
        | {"pathlib.Path": "library/pathlib.html#$", "os.PathLike": "library/os.html#$",
           "concurrent.futures.ProcessPoolExecutor": "library/concurrent.futures.html#$"},
        "py:exception": {name: "library/exceptions.html#$" for name in (
            "ValueError", "TypeError", "RuntimeError", "TimeoutError", "ImportError", "KeyError", "ExceptionGroup")},
        "py:data": {"typing.Any": "library/typing.html#$", "typing.Literal": "library/typing.html#$",
                    "None": "library/constants.html#$"},
    }),
    "numpy": ("https://numpy.org/doc/stable/", {
        "py:class": {"numpy.ndarray": "reference/generated/numpy.ndarray.html#$",
                     "numpy.dtype": "reference/generated/numpy.dtype.html#$",
                     "numpy.float32": "reference/arrays.scalars.html#$",
                     "numpy.float64": "reference/arrays.scalars.html#$"},
    }),
    "jax": ("https://docs.jax.dev/en/latest/", {
        "py:class": {"jax.Array": "_autosummary/jax.Array.html#$", "jax.sharding.Mesh": "_autosummary/$.html#$",
                     "jax.sharding.NamedSharding": "_autosummary/$.html#$"},
        "py:data": {"jax.typing.ArrayLike": "jax.typing.html#$"},
        "py:function": {"jax.jit": "_autosummary/jax.jit.html#$", "jax.lax.scan": "_autosummary/jax.lax.scan.html#$",
                        "jax.grad": "_autosummary/jax.grad.html#$"},
    }),
    "httpx": ("https://www.python-httpx.org/", {
        "py:class": {"httpx.AsyncClient": "api/#asyncclient", "httpx.Response": "api/#response"},
    }),
}
INVENTORIES = HERE / "_build" / "inventories"


def external_inventories() -> dict[str, tuple[str, str]]:
    """Writes ``EXTERNAL`` as one Sphinx inventory (format 2) per site; returns ``intersphinx_mapping``."""
    import zlib

    INVENTORIES.mkdir(parents=True, exist_ok=True)
    mapping = {}
    for site, (base, roles) in EXTERNAL.items():
        lines = [f"{name} {role} 1 {uri.replace('$.html', name + '.html')} -"
                 for role, names in roles.items() for name, uri in names.items()]
        path = INVENTORIES / f"{site}.inv"
        header = f"# Sphinx inventory version 2\n# Project: {site}\n# Version: \n" \
                 "# The remainder of this file is compressed using zlib.\n"
        path.write_bytes(header.encode() + zlib.compress(("\n".join(lines) + "\n").encode()))
        mapping[site] = (base, str(path))
    return mapping


intersphinx_mapping = external_inventories()


def public_index() -> dict[str, str]:
    """Each public name by the ways a guide writes it (``compute_advantages``, ``kernels.compute_advantages``,
    ``prm_jax.kernels.compute_advantages``, with or without ``()``) -> its documented path; a short name two
    namespaces share is left out (ambiguous). ``prm_jax``'s own re-exports point to their namespace."""
    full, short_count, public = {}, {}, public_names()
    for ns, names in public.items():
        for name in names:
            path = f"prm_jax.{ns}.{name}"
            full[path] = path
            full[f"{ns}.{name}"] = path
            short_count[name] = short_count.get(name, 0) + 1
            full.setdefault(f"prm_jax.{name}", path)
    for ns, names in public.items():
        for name in names:
            if short_count[name] == 1:
                full.setdefault(name, f"prm_jax.{ns}.{name}")
    for _, roles in EXTERNAL.values():  # Python's, numpy's, JAX's and httpx's (through intersphinx)
        for names in roles.values():
            for name in names:
                if "." in name:
                    full.setdefault(name, name)
                    if name.startswith("numpy."):
                        full.setdefault("np." + name.removeprefix("numpy."), name)
    return full


def link_names(app, doctree) -> None:
    """Inline code in the guides that names a public object becomes a link to its API page (a cross-reference
    that resolves quietly: text that is not a documented object stays text)."""
    from docutils import nodes
    from sphinx import addnodes

    if not app.env.docname.startswith(("guides/", "getting-started", "index", "development")):
        return
    index = app.env.prm_public_index
    for literal in list(doctree.findall(nodes.literal)):
        if isinstance(literal.parent, (nodes.reference, addnodes.pending_xref)):
            continue
        text = literal.astext().strip()
        target = index.get(text.removesuffix("()"))
        if target is None:
            continue
        xref = addnodes.pending_xref("", refdomain="py", reftype="obj", reftarget=target, refexplicit=True,
                                     refwarn=False, refdoc=app.env.docname)
        literal.replace_self(xref)
        xref += literal


def defining_module(app, what, name, obj, options, lines) -> None:
    """A public name's page ends with the docstring of the module that defines it: the rules that module states
    once for all its names (pages said "see the module docstring", which the site never showed)."""
    if name not in app.env.prm_public_paths:
        return
    module_name = getattr(obj, "__module__", None)
    if not module_name or not module_name.startswith("prm_jax.") or module_name == name.rsplit(".", 1)[0]:
        return
    module = importlib.import_module(module_name)
    doc = inspect.getdoc(module)
    if not doc:
        return
    path = module_name.replace(".", "/") + ".py"
    body = doc.splitlines() if _clean_rst(doc) else ["::", "", *(f"    {line}" for line in doc.splitlines())]
    lines += ["", f".. rubric:: From the module that defines it (``{path}``)", "", *body, ""]


def _clean_rst(text: str) -> bool:
    """Whether ``text`` parses as reStructuredText without a warning (a module docstring laid out as plain text,
    aligned columns for instance, is shown as written instead)."""
    import io

    from docutils import nodes
    from docutils.core import publish_doctree

    doctree = publish_doctree(text, settings_overrides={"report_level": 5, "halt_level": 5,
                                                        "warning_stream": io.StringIO()})
    return not any(message["level"] >= 2 for message in doctree.findall(nodes.system_message))


write_api_pages()

doc_tables.write(HERE / "guides")


LONG_DEFAULT = 60  # a default whose repr runs longer is shown by name (a long constant: ":meta hide-value:")


class _Named:
    """A long default as its signature shows it: its type's name, with ``()`` where it is that type's own
    default, ``(...)`` otherwise (issue 57.10: ``ExperimentConfig``'s signature printed 873 characters)."""

    def __init__(self, value: object) -> None:
        try:
            plain = type(value)() == value
        except Exception:
            plain = False
        self.text = f"{type(value).__name__}({'' if plain else '...'})"

    def __repr__(self) -> str:
        return self.text


def short_defaults(app, what, name, obj, options, signature, return_annotation):
    """``autodoc-process-signature``: a signature whose defaults' reprs run long (a dataclass's generated
    ``__init__`` has no source to preserve them from) is printed with those defaults named (``_Named``)."""
    if signature is None or len(signature) <= 2 * LONG_DEFAULT or not callable(obj):
        return None
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    if not any(p.default is not p.empty and len(repr(p.default)) > LONG_DEFAULT for p in sig.parameters.values()):
        return None
    params = [p.replace(annotation=p.empty, default=_Named(p.default) if p.default is not p.empty
                        and len(repr(p.default)) > LONG_DEFAULT else p.default)
              for p in sig.parameters.values() if p.name != "self"]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty)), return_annotation


def drop_long_values(app, doctree) -> None:
    """``doctree-read``: a constant's or an attribute's value whose repr runs long (``BATCH_SCHEMA = ...`` ran to
    5,039 characters) is left out of its signature: the name stands for it, and its page and the guides'
    tables say what it holds."""
    from sphinx import addnodes

    for signature in doctree.findall(addnodes.desc_signature):
        for annotation in list(signature.findall(addnodes.desc_annotation)):
            text = annotation.astext().strip()
            if text.startswith("=") and len(text) > LONG_DEFAULT:
                annotation.parent.remove(annotation)


def setup(app) -> None:
    app.connect("doctree-read", drop_long_values)
    app.connect("autodoc-process-signature", short_defaults)
    app.connect("builder-inited", check_coverage)

    def remember(app) -> None:
        app.env.prm_public_index = public_index()
        app.env.prm_public_paths = set(app.env.prm_public_index.values())

    app.connect("builder-inited", remember)
    app.connect("doctree-read", link_names)
    app.connect("doctree-read", fill_summaries)
    app.connect("autodoc-process-docstring", describe_parameters)
    app.connect("autodoc-process-docstring", defining_module)
