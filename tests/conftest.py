"""Test-session setup: offline libraries, scratch homes, the shared sample data."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Real ADP sample records ship in the repository (provenance: samples/README.md).
ADP_DIR = REPO / "samples" / "adp"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def adp_dir() -> Path:
    return ADP_DIR
