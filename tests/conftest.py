"""Test-session setup: offline libraries, scratch homes, the shared sample data."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The ADP samples ship beside the repository (../shared/data); tests use them as fixtures.
SHARED_DATA = Path(os.environ.get("TRAJFORGE_SHARED_DATA", REPO.parent / "shared" / "data"))
ADP_DIR = SHARED_DATA / "adp"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def adp_dir() -> Path:
    if not ADP_DIR.is_dir():
        pytest.fail(f"ADP sample data not found at {ADP_DIR} (set TRAJFORGE_SHARED_DATA)")
    return ADP_DIR
