"""The floors import only downward (kernels, native <- config <- runtime, scorers <- app, integrations), and
``import prm_jax`` loads no application code (issue 21: ``__init__`` imported the YAML loader from ``prm_jax.app``)."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "prm_jax"
FLOORS = {"kernels": 0, "native": 0, "config": 1, "runtime": 2, "scorers": 2, "app": 3, "integrations": 3}


def floor_of(module: str) -> int | None:
    parts = module.split(".")
    return FLOORS.get(parts[1]) if len(parts) > 1 and parts[0] == "prm_jax" else None


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def test_every_floor_imports_only_downward():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = "prm_jax." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        own = floor_of(module)
        if own is None:  # prm_jax/__init__.py, validation.py: below or beside every floor
            continue
        upward += [f"{module} imports {name}" for name in imports(path)
                   if (floor_of(name) or 0) > own]
    assert upward == []


def test_import_prm_jax_loads_no_application_code():
    code = "import sys, prm_jax; print(sorted(m for m in sys.modules if m.startswith('prm_jax.app')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_the_kernels_load_pallas_only_when_its_gae_runs():
    # Issue 56.4: the Pallas GAE imports jax.experimental.pallas (its Mosaic and Triton bindings) on first use,
    # not with the library; a process that never asks for method="pallas" never loads it.
    code = ("import sys, numpy as np, prm_jax; prm_jax.kernels.gae(np.ones((1, 3), np.float32), None, "
            "np.ones((1, 3), bool)); before = 'jax._src.pallas' in sys.modules; "
            "prm_jax.kernels.gae(np.ones((1, 3), np.float32), None, np.ones((1, 3), bool), method='pallas'); "
            "print(before, 'jax._src.pallas' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True"]
