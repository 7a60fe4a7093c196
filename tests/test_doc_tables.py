"""Issue 57.5 (in part) and 57.8/57.9: the tables the guides include are rendered at docs build from the code's
declarations (docs/doc_tables.py), never pasted: each include names a table the build writes, and each table is
its declaration's rendering (the refused pairs, the errors, the session format)."""

import re
from pathlib import Path

from documentation import doc_tables
from plugins import without_plugins

from prm_jax.app.sessions import format_table
from prm_jax.config import refusals_markdown
from prm_jax.errors import described

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_include_of_the_guides_is_a_table_the_build_writes(tmp_path, monkeypatch):
    import prm_jax.audit

    # (the audit table of every built-in mode takes a minute: the docs build renders it whole, and
    # tests/test_audit.py holds its rows; here one mode is enough to show the build writes it)
    monkeypatch.setattr(prm_jax.audit, "BUILT_IN", prm_jax.audit.BUILT_IN[:1])
    tables = doc_tables()
    included = {name for page in DOCS.rglob("*.md") if "_build" not in page.parts
                for name in re.findall(r"```\{include\} ([\w.-]+\.inc)", page.read_text())}
    assert included == set(tables.TABLES), included ^ set(tables.TABLES)
    with without_plugins():  # (the site documents the built-in estimators)
        tables.write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(tables.TABLES)


def test_each_table_is_its_declarations_rendering():
    tables = doc_tables()
    with without_plugins():
        assert tables.TABLES["refusals-table.inc"]() == refusals_markdown()
    errors_table = tables.TABLES["errors-table.inc"]().splitlines()
    assert len(errors_table) == 2 + len(described())
    assert all(f"`{name}`" in line for line, (name, *_) in zip(errors_table[2:], described()))
    session_table = tables.TABLES["session-format-table.inc"]().splitlines()
    assert [line.split(" | ")[0] for line in session_table[2:]] == [f"| `{row[0]}`" for row in format_table()]
    # Issue 58.3: the code scorer's settings, the limits among them, each with its declared default.
    from prm_jax.scorers._code_execution import CodeExecutionSettings
    from prm_jax.scorers._sandbox import Limits

    code_table = tables.TABLES["code-settings-table.inc"]().splitlines()
    keys = [line.split(" | ")[0].removeprefix("| `").removesuffix("`") for line in code_table[2:]]
    assert set(Limits.keys()) <= set(keys) and "sandbox" in keys and "request_timeout" not in keys
    limits = Limits()
    assert all(f"| `{key}` | `{getattr(limits, key)!r}` |" in "\n".join(code_table) for key in Limits.keys())
    assert len(keys) == len(CodeExecutionSettings.keys()) - 8  # (the transport's 8 keys are the served table's)


def test_pack_branches_names_the_model_outputs_the_schema_declares():
    # Issue 57.5: the model outputs pack_branches carries are rendered into its docstring from
    # MODEL_OUTPUT_FIELDS (BATCH_SCHEMA's packed="model_outputs" keys and their turn fields), never pasted.
    import prm_jax
    from prm_jax.runtime._trajectory import MODEL_OUTPUT_FIELDS

    doc = " ".join(prm_jax.pack_branches.__doc__.split())
    assert "MODEL_OUTPUTS" not in doc and len(MODEL_OUTPUT_FIELDS) >= 4
    names = ", ".join(f"``{key}``" for key in list(MODEL_OUTPUT_FIELDS)[:-1])
    assert f"{names} and ``{list(MODEL_OUTPUT_FIELDS)[-1]}``, from the interactions'" in doc
    assert all(f"``{field}``" in doc for field in MODEL_OUTPUT_FIELDS.values())


def test_every_public_parameter_has_a_sentence_and_the_check_names_one_that_has_none(monkeypatch):
    # Issue 57.6: 855 of 1,028 parameter entries on the site had a type and no description. Every parameter of
    # a public callable (a class's constructor, a config record's fields, a documented method's) is described
    # by its docstring's Args, a declaration (a settings record's field, a turn field) or docs/parameters.py's
    # glossary; the docs build fails otherwise (conf.py's check_coverage), naming the callable and the name.
    tables = doc_tables()
    assert tables.undescribed_parameters() == {}
    import prm_jax.losses

    def planted_NoSuch(logprobs, mystery_knob=1.0):
        """A public function whose second parameter nothing describes.

        Args:
            logprobs: Described here.
        """

    monkeypatch.setattr(prm_jax.losses, "planted_NoSuch", planted_NoSuch, raising=False)
    monkeypatch.setattr(prm_jax.losses, "__all__", [*prm_jax.losses.__all__, "planted_NoSuch"])
    assert tables.undescribed_parameters() == {"prm_jax.losses.planted_NoSuch": ["mystery_knob"]}


def test_the_args_reader_reads_google_entries_in_either_indent_and_grouped_names():
    doc = """Summary.

    Args:
      a: first,
        continued: not an entry.
      b, c: two at once.
      d (int): typed.

    Returns:
        e: not a parameter.
    """
    assert doc_tables().described(doc) == {"a", "b", "c", "d"}
    assert doc_tables().described("Summary.\n\nAttributes:\n    x: a field.\n    y:\n") == {"x"}  # (y: no sentence)


def test_every_public_callable_has_a_runnable_example_and_the_check_names_one_without(monkeypatch):
    # Issue 57.7: 36 of 175 public callables had an example. Every one (each namespace's and the session
    # reader's) now holds an "Example:" the docs build runs as a doctest; the build fails on one without.
    tables = doc_tables()
    assert tables.without_example() == []
    import prm_jax.losses

    def bare_NoSuch(logprobs):
        """A public function without an example.

        Args:
            logprobs: Described.
        """

    monkeypatch.setattr(prm_jax.losses, "bare_NoSuch", bare_NoSuch, raising=False)
    monkeypatch.setattr(prm_jax.losses, "__all__", [*prm_jax.losses.__all__, "bare_NoSuch"])
    assert tables.without_example() == ["prm_jax.losses.bare_NoSuch"]


def test_the_examples_of_the_documented_modules_run():
    # The API pages' examples run as the docs build's doctests; a documented module has no API page of its own
    # (prm_jax.app.sessions: the session format's page), so its examples run here.
    import doctest
    import inspect

    import numpy as np

    import prm_jax

    tables = doc_tables()
    ran = 0
    for path, obj in tables.public_callables():
        if path.rsplit(".", 1)[0].removeprefix("prm_jax.") not in tables.DOCUMENTED_MODULES:
            continue
        test = doctest.DocTestParser().get_doctest(inspect.getdoc(obj), {"np": np, "prm_jax": prm_jax}, path, None, 0)
        result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test, out=lambda text: None)
        assert result.failed == 0 and result.attempted > 0, path
        ran += 1
    assert ran == 3


def test_an_args_entry_that_names_no_parameter_is_found(monkeypatch):
    # A review found BatchScorer.evaluate's docstring describing a ``kwargs`` it does not take (the sentence
    # belonged to validate_kwargs): the docs build now fails on such an entry, naming the callable.
    tables = doc_tables()
    assert tables.stray_entries() == {}
    import prm_jax.losses

    def misdescribed_NoSuch(logprobs):
        """A function whose docstring describes a parameter it does not take.

        Args:
            logprobs: Described.
            temperature: Not a parameter of it.

        Example:
            >>> 1
            1
        """

    monkeypatch.setattr(prm_jax.losses, "misdescribed_NoSuch", misdescribed_NoSuch, raising=False)
    monkeypatch.setattr(prm_jax.losses, "__all__", [*prm_jax.losses.__all__, "misdescribed_NoSuch"])
    assert tables.stray_entries() == {"prm_jax.losses.misdescribed_NoSuch": ["temperature"]}
