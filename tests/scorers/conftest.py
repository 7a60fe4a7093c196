"""The scorer tests' shared fixtures."""

from __future__ import annotations

import uuid

import pytest

PLANTED_KEY = "PRM_JAX_PLANTED_KEY"


@pytest.fixture
def planted_secret(monkeypatch, tmp_path) -> str:
    """Issue 58.5's secret: an API key in this process's environment (``PLANTED_KEY``) and the same key in a
    file under a ``$HOME`` of the test's own (``$HOME/.secret``), for code in a sandbox to look for."""
    secret = f"sk-planted-{uuid.uuid4().hex}"
    monkeypatch.setenv(PLANTED_KEY, secret)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".secret").write_text(secret)
    monkeypatch.setenv("HOME", str(home))
    return secret
