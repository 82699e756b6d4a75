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
# rich fixes a console's width for good when COLUMNS is set as the console is made: made now, without
# it, the CLI's consoles follow the COLUMNS each test gives (whichever test imports them first).
os.environ.pop("COLUMNS", None)
import flows.console  # noqa: E402,F401


@pytest.fixture(scope="session")
def adp_dir() -> Path:
    return ADP_DIR


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-full", action="store_true", default=False,
        help="run the full reliability suite (10 kill points per job, >= 10k fuzz cases) instead of its fast subset",
    )
