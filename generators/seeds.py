"""Load seed trajectories from dataset directories or ADP-standardized JSON / JSONL files."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import orjson

from converters.adp import from_adp
from schemas.models import Trajectory
from schemas.store import MANIFEST, Dataset


def _adp_records(path: Path) -> Iterator[object]:
    text = path.read_bytes()
    if path.suffix == ".jsonl":
        for line in text.splitlines():
            if line.strip():
                yield orjson.loads(line)
        return
    data = orjson.loads(text)
    yield from data if isinstance(data, list) else [data]


def load_seeds(paths: list[str]) -> list[Trajectory]:
    """All trajectories from `paths` (a trajforge dataset directory, or an ADP JSON/JSONL file)."""
    seeds: list[Trajectory] = []
    for spec in paths:
        path = Path(spec)
        if (path / MANIFEST).exists():
            seeds.extend(Dataset.open(path).iter_records())
        elif path.is_file():
            source = path.parent.name or "adp"
            seeds.extend(from_adp(record, source) for record in _adp_records(path))
        else:
            raise FileNotFoundError(f"seed input {spec}: not a dataset directory or an ADP JSON/JSONL file")
    return seeds
