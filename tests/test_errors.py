"""Issue 57.9: one documented exception hierarchy. Every error a caller can catch is a class of
``prm_jax.errors`` (a ``PRMJaxError``, and still the built-in exception it was), its older import paths name
the same class, and the command line's exit statuses are the classes' declared ones."""

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import prm_jax
from prm_jax import errors
from prm_jax.app import _cli as cli

# What each error was before issue 57.9 (and must stay: a handler written for these still applies), and what a
# later one is (SandboxError, issue 58).
BUILT_IN = {"ConfigError": ValueError, "ConfigFileError": ValueError, "InputError": ValueError,
            "OutputFolderError": ValueError, "NotScorableError": ValueError, "NoTextError": ValueError,
            "TemplateError": ValueError, "RunnerClosedError": RuntimeError, "PrefixRuleError": RuntimeError,
            "RetryError": RuntimeError, "ServiceError": RuntimeError, "RequestFailed": RuntimeError,
            "SandboxError": RuntimeError,
            "ScoreError": Exception, "NoGroupAccepted": Exception}
# The older paths (namespaces and modules users imported them from), each the same class.
OLDER_PATHS = {"prm_jax.config": ("ConfigError", "ConfigFileError"),
               "prm_jax.runtime": ("RunnerClosedError", "RetryError"), "prm_jax.app.sessions": ("InputError",)}
# Exceptions defined elsewhere that no caller meets: the command line's own (it returns an exit status: the
# errors it prints come from prm_jax.errors or say so), the session reader's (raised as an InputError) and the
# code scorer's harness' (raised inside the sandbox, in the harness' own process: a test's failure there).
INTERNAL = {"prm_jax.app._cli.CLIError", "prm_jax.app._cli.Interrupted", "prm_jax.app.sessions.FieldError",
            "prm_jax.scorers._harness.Unearned"}


def error_classes():
    for info in pkgutil.walk_packages(prm_jax.__path__, "prm_jax."):
        if info.name.startswith(("prm_jax.integrations.", "prm_jax.native.")):  # (optional extras; no errors)
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name
                    and not name.startswith("_")):
                yield f"{info.name}.{name}", value


def test_every_error_a_caller_can_catch_is_declared_in_prm_jax_errors():
    defined = dict(error_classes())
    outside = sorted(path for path in defined if not path.startswith("prm_jax.errors.") and path not in INTERNAL)
    assert outside == [], f"declare these in prm_jax.errors (or name why a caller never meets them): {outside}"
    public = {name for name in errors.__all__ if inspect.isclass(getattr(errors, name))}
    assert public == {path.rsplit(".", 1)[1] for path in defined if path.startswith("prm_jax.errors.")}
    assert public - {"PRMJaxError"} == set(BUILT_IN)


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_each_error_is_a_prm_jax_error_and_the_built_in_it_was(name):
    error = getattr(errors, name)
    assert issubclass(error, errors.PRMJaxError) and issubclass(error, BUILT_IN[name])
    assert errors.RequestFailed.__mro__.index(errors.RetryError) < errors.RequestFailed.__mro__.index(RuntimeError)


def test_the_older_import_paths_name_the_same_classes():
    for module, names in OLDER_PATHS.items():
        for name in names:
            assert getattr(importlib.import_module(module), name) is getattr(errors, name), f"{module}.{name}"


def test_the_command_lines_exit_statuses_are_the_declared_ones(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor: {adv_norm: {eps: -1.0}}\n")
    code = cli.main(["score", "--config", str(bad), "--input", str(tmp_path / "none.jsonl"),
                     "--output", str(tmp_path / "out")])
    assert code == errors.ConfigError.exit_status == errors.ConfigFileError.exit_status == cli.CLIError.exit_status
    assert "actor.adv_norm.eps" in capsys.readouterr().err
    sessions = tmp_path / "sessions.jsonl"
    sessions.write_text('{"session_key": "a", "interactions": []}\n')
    data = Path(prm_jax.__file__).parent / "data"
    code = cli.main(["score", "--config", str(data / "demo_config.yaml"), "--input", str(sessions),
                     "--output", str(tmp_path / "out2"), "--no-progress"])
    assert code == errors.InputError.exit_status and f"{sessions}:1:" in capsys.readouterr().err
    help_text = " ".join(cli.EXIT_STATUSES.split())
    assert f"{errors.NoGroupAccepted.exit_status} no group accepted" in help_text
    assert f"{errors.ScoreError.exit_status} bad input" in help_text


def test_the_table_the_docs_render_has_a_row_for_each_error():
    rows = errors.described()
    assert [row[0] for row in rows] == [name for name in errors.__all__ if inspect.isclass(getattr(errors, name))]
    assert all(when and cli_does for _, _, when, cli_does in rows)
    by_name = {row[0]: row for row in rows}
    assert by_name["RequestFailed"][1] == "RetryError" and by_name["InputError"][1] == "ValueError"
    assert by_name["NoGroupAccepted"][3].startswith("exit 1")
