"""Issue 55.13: a user-facing message names public paths only. A user-facing error named the private
``prm_jax.kernels._estimator_registry.register_estimator``; every raised message template (and every warning's) is
read here, and none may name a private module or attribute (``x._y``)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "prm_jax"
# (``rollout._version`` is AReaL's config key, spelled with its underscore: a key, not a private path)
PRIVATE = __import__("re").compile(r"[A-Za-z0-9_]\._(?!version\b)[A-Za-z]")


def message_texts(node):
    """The literal text of the strings inside ``node`` (an f-string's fixed parts; what braces hold is code)."""
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            yield child.value


def messages(tree):
    """What a user may read: raised expressions, and the arguments of every call that builds an error, a
    value check's message or a warning (``...Error(...)``, ``...Check(...)``, ``.error(...)``, ``warn(...)``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            yield node.lineno, node.exc
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name.endswith(("Error", "Check", "error", "warn")):
                for argument in [*node.args, *(k.value for k in node.keywords)]:
                    yield node.lineno, argument


def test_no_raised_or_warned_message_names_a_private_path():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for line, expression in messages(tree):
            found += [f"{path.relative_to(PACKAGE.parent)}:{line}: {text!r}" for text in message_texts(expression)
                      if PRIVATE.search(text)]
    assert not found, "\n".join(found)


def test_the_check_finds_the_issues_example():
    tree = ast.parse('raise ValueError(f"register it with prm_jax.kernels._estimator_registry.register_estimator({x})")')
    assert [text for _, e in messages(tree) for text in message_texts(e) if PRIVATE.search(text)]
