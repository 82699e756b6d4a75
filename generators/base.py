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
import logging
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Sized

from pydantic import BaseModel, ConfigDict, Field

from backends.base import LLM
from backends.config import LLMConfig
from schemas.models import Filtered, FilterDecision, Pair, Provenance, Quarantined, Trajectory
from envs.tasks import MAX_TASKS
from schemas.store import Dataset
from schemas.usage import COUNT_PREFIX as USAGE_COUNTS
from schemas.usage import add_totals, as_counts, empty_totals, trajectory_totals, with_usage

log = logging.getLogger("trajforge.generators")




def trajforge_version() -> str:
    try:
        return importlib.metadata.version("trajforge")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def template_hash(*templates: str) -> str:
    """A short hash of the prompt templates a method used, for provenance."""
    return hashlib.sha256("\x00".join(templates).encode()).hexdigest()[:16]


class JudgeConfig(BaseModel):
    """The model that grades (judges, verifiers, teachers' checks); apart from the acting model by choice."""

    model_config = ConfigDict(extra="forbid")

    llm: LLMConfig | None = Field(None, description="the judge's model; default: the method's own model (warned)")
    vision: bool = Field(False, description="the judge's model accepts images: judges of web pages see the screenshots "
                                            "(else their paths and the pages' text, with a warning and a count)")


class RoleModel(BaseModel):
    """A model for one role beside the acting one: a teacher that corrects, a student that is scored."""

    model_config = ConfigDict(extra="forbid")

    llm: LLMConfig | None = Field(None, description="the role's model; when unset the method says what stands in")


class MethodConfig(BaseModel):
    """Settings every method has; each method's config model extends it."""

    model_config = ConfigDict(extra="forbid")
    # Left out of the output hash: they change how a run goes, not what it writes (pydantic's
    # nested `exclude` form; methods extend it).
    runtime_fields: ClassVar[dict[str, Any]] = {"concurrency": True, "unit_tasks": True, "cache": True}

    method: str
    llm: LLMConfig = Field(default_factory=lambda: LLMConfig(backend="llamacpp", max_tokens=256))
    concurrency: int = Field(8, ge=1, description="tasks in flight at once")
    unit_tasks: int = Field(16, ge=1, description="tasks per committed unit (the resume granularity)")
    seed: int = 0
    cache: bool = Field(True, description="cache LLM responses in the output directory")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="the model that grades")

    def output_hash(self) -> str:
        """Hash of what determines the output; throughput knobs are left out on purpose."""
        data = self.model_dump(mode="json", exclude=self.runtime_fields)
        data["llm"] = _hashed_llm(data["llm"])
        for role in data.values():  # judge, teacher, student: {llm: {...}}
            if isinstance(role, dict) and isinstance(role.get("llm"), dict):
                role["llm"] = _hashed_llm(role["llm"])
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


_LLM_RUNTIME_KEYS = {
    "max_concurrency", "min_concurrency", "concurrency_increase_after", "request_timeout_s", "max_retries",
    "backoff_base_s", "backoff_max_s", "cache_path", "ledger_path", "api_key_env", "base_url", "n_threads", "device",
    "endpoints", "endpoint_failures", "endpoint_probe_s", "endpoint_probe_max_s", "price",
}
# Keys added to LLM configs later: hashed only when set, so outputs written before they existed keep their hash.
_LLM_LATER_KEYS = {"chat_template"}


def _hashed_llm(llm: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in llm.items() if k not in _LLM_RUNTIME_KEYS and not (k in _LLM_LATER_KEYS and v is None)}


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
    # What a method measured over the whole output, by name (e.g. a judge's agreement with ground truth).
    report: dict[str, Any] = field(default_factory=dict)
    # The environment the method acted in (None for methods that act in none).
    env: str | None = None
    # The usage of the steps written this run (`schemas.usage` totals of its trajectories, kept or filtered).
    usage: dict[str, Any] = field(default_factory=empty_totals)

    def merge(self, other: RunSummary) -> RunSummary:
        """One summary for several runs of the same method (rounds); the LLM stats are cumulative already."""
        self.tasks += other.tasks
        self.skipped += other.skipped
        self.processed += other.processed
        self.counts.update(other.counts)
        self.reasons.update(other.reasons)
        self.llm = other.llm
        add_totals(self.usage, other.usage)
        return self

    def success_rate(self) -> dict[str, Any] | None:
        """Successes / episodes of this run's episodes (None when the method ran none)."""
        episodes = self.counts.get("episodes", 0)
        if not episodes:
            return None
        successes = self.counts.get("successes", 0)
        return {"method": self.method, "env": self.env, "successes": successes, "episodes": episodes,
                "rate": round(successes / episodes, 4)}

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "env": self.env,
            "tasks": self.tasks,
            "skipped_done": self.skipped,
            "processed": self.processed,
            "counts": dict(self.counts),
            "rejected_by_reason": dict(self.reasons),
            "success_rate": self.success_rate(),
            "usage": self.usage,
            "llm": self.llm,
            "report": self.report,
        }


class GenerationMethod(ABC):
    """A method: a config model, `tasks()` built from it, and an async `run_task`."""

    name: ClassVar[str]
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    templates: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: MethodConfig, llm: LLM):
        self.config = config
        self.llm = llm
        # Set by the runner when the config names a judge model; else judges use the acting model.
        self.judge_model: LLM | None = None
        self._warned_same_judge = False

    @property
    def judge_llm(self) -> LLM:
        """The model that grades: the configured judge, else (with one warning per run) the acting model."""
        if self.judge_model is not None:
            return self.judge_model
        if not self._warned_same_judge:
            self._warned_same_judge = True
            log.warning("%s: the judge is the acting model itself (%s:%s); set judge.llm to grade with another",
                        self.name, self.config.llm.backend, self.config.llm.model)
        return self.llm

    @property
    def judge_name(self) -> str:
        """The grading model as `backend:model`, for the verdicts records carry."""
        cfg = self.judge_llm.config
        return f"{cfg.backend}:{cfg.model}"

    @abstractmethod
    def tasks(self) -> Iterable[TaskSpec]:
        """The method's tasks, deterministic for the config (so a re-run sees the same ids)."""

    @abstractmethod
    async def run_task(self, task: TaskSpec) -> TaskResult:
        """Produce the result of one task; may raise, which quarantines the task."""

    def prepare(self, output: Dataset) -> None:
        """Look at what earlier runs wrote to `output` before new tasks start (e.g. for dedup)."""

    async def setup(self) -> None:
        """Acquire what the tasks need before the first one is read (e.g. load tasks, list a server's tools)."""

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
        await self.setup()
        summary = RunSummary(self.name, env=getattr(self.config, "env", None))
        if progress is not None:
            progress.start(total=len(tasks) if isinstance(tasks, Sized) else None)

        def pending() -> Iterator[TaskSpec]:
            # Streamed: tasks are drawn as workers free up, never held as a whole list.
            for task in tasks:
                summary.tasks += 1
                if task.id in done:
                    summary.skipped += 1
                    if progress is not None:
                        progress.advance()
                    continue
                yield task

        buffer: list[tuple[TaskSpec, TaskResult]] = []
        queue: Iterator[TaskSpec] = pending()
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
            usage = empty_totals()
            for _, result in results:
                for record in [*result.trajectories, *(item.record for item in result.filtered)]:
                    if (totals := trajectory_totals(with_usage(record))) is not None:
                        add_totals(usage, totals)
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
            if usage["calls"]:
                unit.counts.update(as_counts(usage))
            summary.counts.update({k: v for k, v in unit.counts.items() if not k.startswith(USAGE_COUNTS)})
            add_totals(summary.usage, usage)


def llm_config_for(config: MethodConfig, output: Path, role: str = "") -> LLMConfig:
    """The method's LLM config (or a role's: `role="judge"`, "teacher", ...) with cache and ledger in the output directory."""
    llm = config.llm if not role else getattr(config, role).llm
    prefix = f"_{role}" if role else ""
    updates: dict[str, Any] = {}
    if config.cache and llm.cache_path is None:
        updates["cache_path"] = str(output / f"{prefix}_llm_cache.sqlite")
    if llm.ledger_path is None:
        updates["ledger_path"] = str(output / f"{prefix}_llm_ledger.jsonl")
    return llm.model_copy(update=updates)
