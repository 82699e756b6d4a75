"""Files an episode's observations point to (page screenshots, images a tool returned).

Records never hold pixels or blobs: the bytes go to a file under the run's output directory and
the observation keeps its path relative to it, `<kind>/<task>/<episode>/<n><suffix>`, so a
dataset directory moved elsewhere still resolves them.
"""

from __future__ import annotations

import re
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def episode_dir(kind: str, task_id: str, episode_key: str) -> Path:
    """The folder (relative to the output directory) of an episode's files of one kind."""
    return Path(kind) / _UNSAFE.sub("_", task_id) / episode_key.rsplit("/", 1)[-1]


class EpisodeFiles:
    """Numbered files of one episode under `root`; `write` returns the path a record keeps."""

    def __init__(self, root: Path, kind: str, task_id: str, episode_key: str) -> None:
        self.root = root
        self.dir = episode_dir(kind, task_id, episode_key)
        self.written = 0

    def write(self, data: bytes, suffix: str) -> str:
        self.written += 1
        relative = self.dir / f"{self.written:03d}{suffix}"
        target = self.root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return relative.as_posix()
