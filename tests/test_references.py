"""Issue 55.15: the docs are the project's own. Guides, docstrings and comments cited files a user does not
have (``CREDIT.md``, ``CREDIT2.md``, ``LOSSES.md``, "SPEC 3", ``../shared/...`` links) and a module that does
not exist (``runtime.lifecycle``). Every tracked text file is read here: no reference to those files, every
``prm_jax.<module>[.<name>]`` it names resolves, and every repository path it names exists."""

import importlib
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (".py", ".md", ".cc", ".h", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini")
OUTSIDE = re.compile(r"(?:CREDIT2?|LOSSES|SPEC|STYLE|DEVELOPERS)\.md|\.\./shared\b|\bSPEC (?:section )?\d|\bthe SPEC\b")
DOTTED = re.compile(r"\bprm_jax(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PATH = re.compile(r"(?<![\w/.-])(?:prm_jax|tests|benchmarks|examples|docs|\.ci)/[\w./-]*[\w]"
                  r"\.(?:py|md|sh|yaml|cc|h|jsonl|toml)\b")


def tracked():
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / name for name in names if name.endswith(TEXT) and (ROOT / name).is_file()]


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    obj, k = None, len(parts)
    while k:  # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:k]))
            break
        except ModuleNotFoundError as err:
            if err.name and not err.name.startswith("prm_jax"):  # it exists; an optional dependency is missing
                return True
            k -= 1
        except ImportError:
            k -= 1
    if obj is None:
        return False
    for name in parts[k:]:
        try:
            obj = getattr(obj, name)
        except ModuleNotFoundError:  # a name built on first use from an optional dependency (tunix's)
            return True
        except AttributeError:
            return False
    return True


def test_no_file_cites_a_document_the_repository_does_not_hold():
    found = [f"{path.relative_to(ROOT)}:{n}: {m.group(0)}" for path in tracked() if path.name != "test_references.py"
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) for m in OUTSIDE.finditer(line)]
    assert not found, "\n".join(found)


# Names that are gone, said to be gone where the public API guide lists its renames (CHANGELOG.md, the history,
# names what was there when it was written), and the old lambda module a config's dotted path still resolves.
FORMER = {"prm_jax.gae", "prm_jax.TrajectoryStore", "prm_jax.kernels.lambda_fn", "prm_jax.kernels.pipeline",
          "prm_jax.kernels.advantages", "prm_jax.kernels.parallel", "prm_jax.kernels.sequence_parallel",
          "prm_jax.kernels.recurrence", "prm_jax.kernels.turns"}


def test_every_module_a_file_names_exists():
    names = {(m.group(0).rstrip("."), path.name) for path in tracked()
             if path.name not in ("test_references.py", "CHANGELOG.md")
             for text in [path.read_text(errors="replace")] for m in DOTTED.finditer(text)
             if not m.group(0).endswith(".html") and "NoSuch" not in m.group(0)}
    missing = sorted(f"{name} ({where})" for name, where in names
                     if not resolves(name) and not any(name == f or name.startswith(f + ".") for f in FORMER))
    assert not missing, missing
    for name in FORMER - {"prm_jax.kernels.lambda_fn"}:
        assert not resolves(name), f"{name} is said to be gone but resolves"


def test_every_repository_path_a_file_names_exists():
    found = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in tracked() if path.name != "test_references.py"
             for text in [path.read_text(errors="replace")] for m in PATH.finditer(text)
             if not (ROOT / m.group(0)).exists() and "AReaL" not in text[max(0, m.start() - 12):m.start()]]
    assert not found, "\n".join(found)


def test_the_checks_find_the_issues_examples():
    assert OUTSIDE.search("see ../shared/CREDIT2.md 3") and OUTSIDE.search("(SPEC 3, AReaL's v1)")
    assert not resolves("prm_jax.runtime.lifecycle.Lifecycle") and resolves("prm_jax.runtime._lifecycle.Lifecycle")
