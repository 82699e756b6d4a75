"""What every generation method shares: its config model, its per-task result, and the `run` loop.

A method turns tasks into trajectories (and possibly preference pairs). `run` drives any
method the same way: bounded concurrency, results committed to the shard store in units of
a few tasks (the unit records which task ids it covers), so a killed run resumes by task id
with nothing lost and nothing twice; LLM calls go through the layer's request cache in the
output directory, so a re-run repeats no completed call.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import json
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field

from backends.base import LLM
from backends.config import LLMConfig
from schemas.models import Filtered, FilterDecision, Pair, Provenance, Quarantined, Trajectory
from schemas.store import Dataset


def trajforge_version() -> str:
    try:
        return importlib.metadata.version("trajforge")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def template_hash(*templates: str) -> str:
    """A short hash of the prompt templates a method used, for provenance."""
    return hashlib.sha256("\x00".join(templates).encode()).hexdigest()[:16]


class MethodConfig(BaseModel):
    """Settings every method has; each method's config model extends it."""

    model_config = ConfigDict(extra="forbid")

    method: str
    llm: LLMConfig = Field(default_factory=lambda: LLMConfig(backend="llamacpp", max_tokens=256))
    concurrency: int = Field(8, ge=1, description="tasks in flight at once")
    unit_tasks: int = Field(16, ge=1, description="tasks per committed unit (the resume granularity)")
    seed: int = 0
    cache: bool = Field(True, description="cache LLM responses in the output directory")

    def output_hash(self) -> str:
        """Hash of what determines the output; throughput knobs are left out on purpose."""
        data = self.model_dump(mode="json", exclude={"concurrency", "unit_tasks", "cache"})
        data["llm"] = {k: v for k, v in data["llm"].items() if k not in _LLM_RUNTIME_KEYS}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


_LLM_RUNTIME_KEYS = {
    "max_concurrency", "min_concurrency", "concurrency_increase_after", "request_timeout_s", "max_retries",
    "backoff_base_s", "backoff_max_s", "cache_path", "ledger_path", "api_key_env", "base_url", "n_threads",
    "endpoints", "endpoint_failures", "endpoint_probe_s", "endpoint_probe_max_s",
}


class TaskSpec(BaseModel):
    """A unit of generation work; methods subclass or use `payload` for their inputs."""

    model_config = ConfigDict(extra="allow")

    id: str
    instruction: str = ""
    payload: dict[str, Any] = Field(default_factory=dict)


@dataclass
class TaskResult:
    """What one task produced. Nothing is dropped silently: rejects go to `filtered` or `quarantined`."""

    trajectories: list[Trajectory] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)
    filtered: list[Filtered] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def reject(self, trajectory: Trajectory, check: str, reason: str) -> None:
        self.filtered.append(Filtered(record=trajectory, decision=FilterDecision(filter=check, reason=reason)))

    def fail(self, task_id: str, stage: str, error: str, raw: Any) -> None:
        self.quarantined.append(
            Quarantined(
                id=f"{stage}/{task_id}/{len(self.quarantined)}",
                stage=stage,
                error=error,
                raw=raw if isinstance(raw, str) else json.dumps(raw, default=str),
                location=f"task {task_id}",
                created_at=datetime.now(timezone.utc),
            )
        )


@dataclass
class RunSummary:
    method: str
    tasks: int = 0
    skipped: int = 0
    processed: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    llm: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "tasks": self.tasks,
            "skipped_done": self.skipped,
            "processed": self.processed,
            "counts": dict(self.counts),
            "rejected_by_reason": dict(self.reasons),
            "llm": self.llm,
        }


class GenerationMethod(ABC):
    """A method: a config model, `tasks()` built from it, and an async `run_task`."""

    name: ClassVar[str]
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    templates: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: MethodConfig, llm: LLM):
        self.config = config
        self.llm = llm

    @abstractmethod
    def tasks(self) -> Iterable[TaskSpec]:
        """The method's tasks, deterministic for the config (so a re-run sees the same ids)."""

    @abstractmethod
    async def run_task(self, task: TaskSpec) -> TaskResult:
        """Produce the result of one task; may raise, which quarantines the task."""

    def prepare(self, output: Dataset) -> None:
        """Look at what earlier runs wrote to `output` before new tasks start (e.g. for dedup)."""

    def provenance(self, task_id: str, *, parents: Iterable[str] = (), seed: int | None = None) -> Provenance:
        return Provenance(
            method=self.name,
            model=f"{self.config.llm.backend}:{self.config.llm.model}",
            prompt_template_hash=template_hash(*self.templates) if self.templates else None,
            seed=self.config.seed if seed is None else seed,
            task_id=task_id,
            parent_ids=list(parents),
            trajforge_version=trajforge_version(),
            created_at=datetime.now(timezone.utc),
        )

    async def run(self, tasks: Iterable[TaskSpec], output: Dataset, *, progress: Any = None) -> RunSummary:
        """Run `tasks` into `output`, skipping tasks a finished unit already covers."""
        done = {tid for unit in output.finished_units().values() for tid in unit.get("meta", {}).get("task_ids", [])}
        self.prepare(output)
        summary = RunSummary(self.name)
        pending: list[TaskSpec] = []
        for task in tasks:
            summary.tasks += 1
            if task.id in done:
                summary.skipped += 1
            else:
                pending.append(task)
        if progress is not None:
            progress.start(total=summary.tasks, completed=summary.skipped)
        buffer: list[tuple[TaskSpec, TaskResult]] = []
        queue: Iterator[TaskSpec] = iter(pending)
        lock = asyncio.Lock()

        async def worker() -> None:
            for task in queue:  # a shared iterator: each worker pulls the next task
                result = await self._safe_run(task)
                async with lock:
                    buffer.append((task, result))
                    summary.processed += 1
                    if progress is not None:
                        progress.advance()
                    if len(buffer) >= self.config.unit_tasks:
                        self._commit(output, buffer, summary)
                        buffer.clear()

        await asyncio.gather(*(worker() for _ in range(self.config.concurrency)))
        if buffer:
            self._commit(output, buffer, summary)
        summary.llm = self.llm.stats.as_dict()
        return summary

    async def _safe_run(self, task: TaskSpec) -> TaskResult:
        try:
            return await self.run_task(task)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one broken task must not stop the run; it is quarantined
            result = TaskResult()
            result.fail(task.id, f"generate:{self.name}", f"{type(exc).__name__}: {exc}", task.model_dump(mode="json"))
            return result

    def _commit(self, output: Dataset, results: list[tuple[TaskSpec, TaskResult]], summary: RunSummary) -> None:
        with output.unit(f"{self.name}-{uuid.uuid4().hex[:12]}") as unit:
            unit.meta["task_ids"] = [task.id for task, _ in results]
            for _, result in results:
                unit.write_many("trajectories", result.trajectories)
                unit.write_many("pairs", result.pairs)
                unit.write_many("filtered", result.filtered)
                unit.write_many("quarantine", result.quarantined)
                unit.counts.update(result.counts)
                for item in result.filtered:
                    summary.reasons[f"{item.decision.filter}: {item.decision.reason.split(':')[0]}"] += 1
                for item in result.quarantined:
                    summary.reasons[f"{item.stage}: {item.error.split(':')[0]}"] += 1
            unit.counts["tasks"] += len(results)
            summary.counts.update(unit.counts)


def llm_config_for(config: MethodConfig, output: Path) -> LLMConfig:
    """The method's LLM config with the cache and failure ledger placed in the output directory."""
    updates: dict[str, Any] = {}
    if config.cache and config.llm.cache_path is None:
        updates["cache_path"] = str(output / "_llm_cache.sqlite")
    if config.llm.ledger_path is None:
        updates["ledger_path"] = str(output / "_llm_ledger.jsonl")
    return config.llm.model_copy(update=updates)
