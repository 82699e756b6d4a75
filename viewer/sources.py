"""What `trajforge view DIR...` shows: dataset directories and exports, found at or below each DIR.

A DIR is a dataset directory (it has `_manifest.json`), an export (`data/train-*.parquet` or
`.jsonl`, as `trajforge export` writes), or a folder that holds some: a pipeline's output root
(`<root>/<stage>/<name>`) shows every stage's dataset and every export in it. Hidden and `_`
folders (Prefect's home, caches) are not searched. Shard files are read from the manifest on each
request, so a dataset a job is still writing shows the units finished so far.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from schemas.store import MANIFEST, Dataset, StoreError

SEARCH_DEPTH = 3
EXPORT_PATTERNS = ("train-*.parquet", "train-*.jsonl")


class ViewError(Exception):
    """Nothing to show at a path, or a request the data cannot answer; the message is one line."""


def first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def unreadable(path: Path, exc: Exception) -> ViewError:
    return ViewError(f"{path}: a shard cannot be read ({first_line(exc)})")


@dataclass(frozen=True)
class Source:
    """One dataset directory or export the page shows."""

    name: str
    path: Path
    kind: Literal["dataset", "export"]
    # An export's format (from its card.json), when known.
    format: str | None = None

    def dataset(self) -> Dataset:
        try:
            return Dataset.open(self.path)
        except StoreError as exc:
            raise ViewError(str(exc)) from None

    def export_files(self) -> list[Path]:
        """The export's shard files; one that links outside the export directory is refused."""
        data = self.path / "data"
        files = sorted(f for pattern in EXPORT_PATTERNS for f in data.glob(pattern))
        root = self.path.resolve()
        for file in files:
            if root not in file.resolve().parents:
                raise ViewError(f"{file}: links to {file.resolve()}, outside the export directory")
        return files


def _export_format(path: Path) -> str | None:
    try:
        return json.loads((path / "card.json").read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        return None


def _classify(path: Path, name: str) -> Source | None:
    if (path / MANIFEST).is_file():
        try:
            Dataset.open(path)
        except StoreError as exc:
            raise ViewError(str(exc)) from None
        return Source(name, path, "dataset")
    if (path / "data").is_dir() and any(next((path / "data").glob(p), None) for p in EXPORT_PATTERNS):
        return Source(name, path, "export", _export_format(path))
    return None


def _search(root: Path, label: str, depth: int) -> list[Source]:
    if depth == 0:
        return []
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    except OSError:
        return []
    found: list[Source] = []
    for child in children:
        name = f"{label}/{child.name}" if label else child.name
        source = _classify(child, name)
        found.extend([source] if source else _search(child, name, depth - 1))
    return found


def discover(paths: list[Path]) -> list[Source]:
    """The sources at or below each path, in the order given; ViewError when a path holds none."""
    sources: list[Source] = []
    seen: set[Path] = set()
    for path in paths:
        if not path.exists():
            raise ViewError(f"{path}: no such directory")
        if not path.is_dir():
            raise ViewError(f"{path}: not a directory")
        label = os.path.normpath(str(path))
        direct = _classify(path, label)
        found = [direct] if direct else _search(path, label, SEARCH_DEPTH)
        if not found:
            raise ViewError(f"{path}: no trajforge dataset (_manifest.json) or export (data/train-*) at or below it")
        for source in found:
            key = source.path.resolve()
            if key not in seen:
                seen.add(key)
                sources.append(source)
    return sources
