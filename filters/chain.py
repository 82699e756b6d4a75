"""A chain of filters built from a config list, applied in order to each record.

Outcome per record: kept (with the record as modified by the chain), filtered (the first
filter that dropped it, its reason and score), or quarantined (a filter raised; stage
"judge" for a judge without a valid answer, "filter" for anything else).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from backends.errors import EngineCrashed
from filters.base import Filter, FilterConfigError, FilterFactory, JudgeFailed, build_filter, is_async
from schemas.models import Trajectory

DEFAULT_CONCURRENCY = 32


@dataclass(slots=True)
class Outcome:
    status: Literal["kept", "filtered", "quarantined"]
    record: Trajectory
    filter: str | None = None
    reason: str | None = None
    score: float | None = None
    stage: str | None = None


def load_config(source: str | Path | list[Any] | dict[str, Any]) -> list[dict[str, Any]]:
    """The filter list from a YAML file, a YAML string, a list, or a dict with a `filters` key."""
    data: Any = source
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and Path(source).exists()):
        data = yaml.safe_load(Path(source).read_text())
    elif isinstance(source, str):
        data = yaml.safe_load(source)
    if isinstance(data, dict):
        data = data.get("filters")
    if not isinstance(data, list) or not all(isinstance(x, dict) and "name" in x for x in data):
        raise FilterConfigError("a filter config is a list of {name: ..., options...} entries (or {filters: [...]})")
    return data


def config_digest(specs: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(specs, sort_keys=True, default=str).encode()).hexdigest()


class Chain:
    def __init__(self, specs: list[dict[str, Any]], concurrency: int = DEFAULT_CONCURRENCY,
                 factories: dict[str, FilterFactory] | None = None) -> None:
        self.specs = specs
        self.filters: list[Filter] = [build_filter(s, factories) for s in specs]
        names = [f.name for f in self.filters]
        if len(set(names)) != len(names):
            raise FilterConfigError(f"filter names repeat ({names}); give repeats a distinct `as:` name")
        self.has_async = any(is_async(f) for f in self.filters)
        self.concurrency = concurrency

    def run_sync(self, record: Trajectory) -> Outcome:
        """For chains with no async filter (no event loop needed)."""
        current = record
        for f in self.filters:
            try:
                d = f.decide(current)
            except Exception as exc:  # a filter bug must not lose the record
                return Outcome("quarantined", current, f.name, f"{f.name}: {type(exc).__name__}: {exc}", stage="filter")
            if not d.keep:
                return Outcome("filtered", d.record, f.name, d.reason or "dropped", d.score)
            current = d.record
        return Outcome("kept", current)

    async def run(self, record: Trajectory) -> Outcome:
        current = record
        for f in self.filters:
            try:
                d = (await f.decide(current)) if is_async(f) else f.decide(current)  # type: ignore[misc]
            except JudgeFailed as exc:
                return Outcome("quarantined", current, f.name, str(exc), stage="judge")
            except EngineCrashed:  # the judge's engine died: the run stops, resumable
                raise
            except Exception as exc:
                return Outcome("quarantined", current, f.name, f"{f.name}: {type(exc).__name__}: {exc}", stage="filter")
            if not d.keep:
                return Outcome("filtered", d.record, f.name, d.reason or "dropped", d.score)
            current = d.record
        return Outcome("kept", current)

    async def run_batch(self, records: list[Trajectory]) -> list[Outcome]:
        """Outcomes in input order; at most `concurrency` records in flight (each may wait on judges)."""
        gate = asyncio.Semaphore(self.concurrency)

        async def one(r: Trajectory) -> Outcome:
            async with gate:
                return await self.run(r)

        return list(await asyncio.gather(*(one(r) for r in records)))

    async def aclose(self) -> None:
        for f in self.filters:
            close = getattr(f, "aclose", None)
            if close is not None:
                await close()
