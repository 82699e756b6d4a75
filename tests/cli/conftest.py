"""Fixtures of the CLI tests."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest


@pytest.fixture()
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp directory of the commands run in this process: the test's own (a failing `envs check` keeps
    its folder of server logs; the suite leaves none in /tmp)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder
