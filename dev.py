#!/usr/bin/env python3
"""Set-up and entry commands that need only Python 3 and pip.

  python3 dev.py demo    create .venv, install prm-jax, run `prm-jax demo` (the main job)
  python3 dev.py test    create .venv, install prm-jax with its test extras, run the test suite
  python3 dev.py bench   create .venv, install, run the CPU benchmarks

Extra arguments are passed on (to pytest for ``test``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"


def _python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _ensure_env(extras: str) -> Path:
    python = _python()
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = VENV / f".installed-{extras or 'base'}"
    sources = [ROOT / "pyproject.toml"]
    if not stamp.exists() or any(s.stat().st_mtime > stamp.stat().st_mtime for s in sources):
        target = f"{ROOT}[{extras}]" if extras else str(ROOT)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "-e", target], check=True)
        stamp.touch()
    return python


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "bench"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        python = _ensure_env("")
        return subprocess.run([str(python), "-m", "prm_jax.app.cli", "demo", *rest], cwd=ROOT).returncode
    python = _ensure_env("test")
    if command == "test":
        return subprocess.run([str(python), "-m", "pytest", *rest], cwd=ROOT).returncode
    return subprocess.run([str(python), "benchmarks/bench_advantages.py", *rest], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
