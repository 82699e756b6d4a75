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
from backends.errors import EngineCrashed
from backends.config import LLMConfig
from schemas.models import Filtered, FilterDecision, Pair, Provenance, Quarantined, Trajectory
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
    self_report: bool = Field(False, description="the judge also reads the agent's thoughts (its own account of the "
                                                 "episode); default: only what the world showed (filters.world_view)")


class RoleModel(BaseModel):
    """A model for one role beside the acting one: a teacher that corrects, a student that is scored."""

    model_config = ConfigDict(extra="forbid")

    llm: LLMConfig | None = Field(None, description="the role's model; when unset the method says what stands in")


@dataclass(frozen=True)
class Role:
    """A part a model plays in a method beside the acting one: a judge, a teacher, a task writer.

    `fields` are the config's model fields (`judge`, `teacher`, ...) that may play it, tried in
    order; with none of them set the acting model plays it, which the run warns about once, says in
    its summary and records in every record it writes (`details["roles"]`, `details["actor_roles"]`),
    unless the paper itself has the acting model play it (`by_design` says why; still recorded)."""

    name: str
    does: str
    fields: tuple[str, ...] = ("judge",)
    by_design: str | None = None


def same_model(a: LLMConfig, b: LLMConfig) -> bool:
    """Whether two configs name the same weights (settings such as temperature or limits aside)."""
    def where(c: LLMConfig) -> tuple[Any, ...]:
        urls = tuple(sorted(e.base_url.rstrip("/") for e in c.endpoint_list()))
        return c.backend, c.model, c.model_path, urls
    return where(a) == where(b)


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
    # Who played each role beside the acting model (`GenerationMethod.roles_report`).
    roles: dict[str, Any] = field(default_factory=dict)
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
        self.roles = other.roles or self.roles
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
            "roles": self.roles,
            "usage": self.usage,
            "llm": self.llm,
            "report": self.report,
        }


class GenerationMethod(ABC):
    """A method: a config model, `tasks()` built from it, and an async `run_task`."""

    name: ClassVar[str]
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    templates: ClassVar[tuple[str, ...]] = ()
    # The parts models play beside the acting one (see `Role`); `roles_in_use` picks those a config uses.
    roles: ClassVar[tuple[Role, ...]] = ()

    def __init__(self, config: MethodConfig, llm: LLM):
        self.config = config
        self.llm = llm
        # The models of the config's role fields that are set (`judge`, `teacher`, ...), made by the runner
        # (`make_role_models`); a role none of whose fields is set is played by the acting model.
        self.field_models: dict[str, LLM] = {}
        self._warned_roles: set[str] = set()

    @property
    def judge_model(self) -> LLM | None:
        """The configured judge model (None: unset)."""
        return self.field_models.get("judge")

    @judge_model.setter
    def judge_model(self, llm: LLM | None) -> None:
        if llm is None:
            self.field_models.pop("judge", None)
        else:
            self.field_models["judge"] = llm

    def roles_in_use(self) -> list[Role]:
        """The roles this config has models play (a method whose roles depend on its settings narrows them)."""
        return list(self.roles)

    def _role(self, name: str) -> Role:
        for role in self.roles_in_use():
            if role.name == name:
                return role
        return Role(name, name)

    def role_field(self, name: str) -> str | None:
        """The config field whose model plays role `name` (None: the acting model plays it)."""
        return next((f for f in self._role(name).fields if f in self.field_models), None)

    def model_for(self, name: str) -> LLM:
        """The model that plays role `name`: its configured model, else (warned once per run) the acting model."""
        role = self._role(name)
        found = self.role_field(name)
        if found is not None:
            return self.field_models[found]
        if role.by_design is None and name not in self._warned_roles:
            self._warned_roles.add(name)
            hint = " or ".join(f"{f}.llm" for f in role.fields) or "another model"
            log.warning("%s: the %s (%s) is the acting model itself (%s); set %s to use another",
                        self.name, name, role.does, self.llm.model_name, hint)
        return self.llm

    def model_name_for(self, name: str) -> str:
        """The model of role `name` as `backend:model` (without warning), for the verdicts records carry."""
        found = self.role_field(name)
        return (self.field_models[found] if found is not None else self.llm).model_name

    @property
    def judge_llm(self) -> LLM:
        """The model that grades: the configured judge, else (with one warning per run) the acting model."""
        return self.model_for("judge")

    @property
    def judge_name(self) -> str:
        """The grading model as `backend:model`, for the verdicts records carry."""
        return self.model_name_for("judge")

    def roles_report(self) -> dict[str, dict[str, Any]]:
        """Who plays each role in use: `{role: {model, played_by, field, by_design}}`; `played_by` is `actor`
        (the acting model itself), `same model` (a role model of the same weights, its own settings) or `own model`."""
        out: dict[str, dict[str, Any]] = {}
        for role in self.roles_in_use():
            found = self.role_field(role.name)
            if found is None:
                played, model = "actor", self.llm.model_name
            else:
                llm = self.field_models[found]
                played = "same model" if same_model(llm.config, self.llm.config) else "own model"
                model = llm.model_name
            out[role.name] = {"model": model, "played_by": played, "field": found,
                              **({"by_design": role.by_design} if role.by_design and found is None else {})}
        return out

    def _stamp_roles(self, record: Trajectory, report: dict[str, dict[str, Any]]) -> None:
        """Record who played this method's roles in `record` (beside roles an earlier method recorded)."""
        if not report:
            return
        roles = {**(record.details.get("roles") or {}), **{k: v["model"] for k, v in report.items()}}
        actor = set(record.details.get("actor_roles") or ()) | {k for k, v in report.items() if v["played_by"] != "own model"}
        record.details["roles"] = roles
        record.details["actor_roles"] = sorted(actor & set(roles))

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

        summary.roles = self.roles_report()
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
        except (asyncio.CancelledError, EngineCrashed):  # the engine died: no later task can run either
            raise
        except Exception as exc:  # one broken task must not stop the run; it is quarantined
            result = TaskResult()
            result.fail(task.id, f"generate:{self.name}", f"{type(exc).__name__}: {exc}", task.model_dump(mode="json"))
            return result

    def _commit(self, output: Dataset, results: list[tuple[TaskSpec, TaskResult]], summary: RunSummary) -> None:
        with output.unit(f"{self.name}-{uuid.uuid4().hex[:12]}") as unit:
            unit.meta["task_ids"] = [task.id for task, _ in results]
            usage = empty_totals()
            roles = summary.roles
            for _, result in results:
                for record in [*result.trajectories, *(item.record for item in result.filtered)]:
                    self._stamp_roles(record, roles)
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


def describe_role(info: dict[str, Any]) -> str:
    """Who played a role (an entry of `roles_report`), in words for run summaries."""
    played, model = info.get("played_by"), info.get("model")
    if played == "actor":
        why = f"the paper's design: {info['by_design']}" if info.get("by_design") else "no model of its own is set"
        return f"the acting model itself ({model}; {why})"
    if played == "same model":
        return f"the acting model's weights with settings of its own ({model}, {info.get('field')}.llm)"
    return f"{model} ({info.get('field')}.llm)"


def role_fields(config: MethodConfig) -> list[str]:
    """The config's model fields that are set (`judge`, `teacher`, `student`, ...): `{llm: ...}` blocks."""
    return [name for name in type(config).model_fields
            if isinstance(getattr(config, name), (JudgeConfig, RoleModel)) and getattr(config, name).llm is not None]


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
