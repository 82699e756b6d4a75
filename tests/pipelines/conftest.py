"""Fixtures for the pipeline tests: the ADP sample files and records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest


@pytest.fixture(scope="session")
def adp_files(adp_dir: Path) -> list[Path]:
    files = sorted(adp_dir.glob("*/sample_std.json"))
    assert files, f"no sample_std.json under {adp_dir}"
    return files


@pytest.fixture(scope="session")
def adp_records(adp_files: list[Path]) -> list[dict[str, Any]]:
    return [record for file in adp_files for record in orjson.loads(file.read_bytes())]
