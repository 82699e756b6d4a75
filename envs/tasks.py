"""Task sources: where the tasks of a run come from, chosen by the `tasks:` block of a config.

    tasks: {source: env, n: 8, seed: 0}                  # the environment's own generator
    tasks: {source: jsonl, path: tasks.jsonl}             # one Task (or {"instruction": ...}) per line
    tasks: {source: tau2, path: .../tasks.json, split: train}
    tasks: {source: miniwob, options: {tasks: [click-*], seeds: 3}}   # MiniWoB++ pages (browser env)
    tasks: {source: sites, path: site_tasks.jsonl}          # any site (browser env)

Every source yields `Task`s for one environment, in a stable order (a re-run sees the same ids);
`ids` keeps only the named ones, `n` caps how many. Sources are registered by name
(`register_task_source`), so a package can add its own. Paths may name a file inside an installed
Python package as `pkg://<package>/<path>`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envs.base import Task

if TYPE_CHECKING:
    from envs.base import Environment

MAX_TASKS_FILE_BYTES = 256 * 1024 * 1024
TEST_SPLIT = "test"
# A run's task count is bounded: task generators build their lists whole, and nobody means 10^12.
MAX_TASKS = 1_000_000


class TaskFileError(ValueError):
    """A tasks file that cannot be used; the message names the file (and line)."""


class NoSplits(TaskFileError):
    """A split was asked of a source that has none (tau2 without a split file)."""


class TaskSourceConfig(BaseModel):
    """The `tasks:` block of a method or env-check config."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field("env", description="env (the environment's generator), jsonl, tau2, or a registered source")
    path: str | None = Field(None, description="file of the source (jsonl, tau2 tasks.json); pkg://package/path allowed")
    n: int | None = Field(None, ge=1, le=MAX_TASKS, description="at most this many tasks (env: how many to generate, default 8)")
    seed: int = Field(0, description="seed of a task generator")
    ids: list[str] | None = Field(None, description="keep only these task ids")
    split: str | None = Field(None, description="a named split of the source (tau2: train / test)")
    allow_test_split: bool = Field(False, description="allow generating from a benchmark's test split")
    options: dict[str, Any] = Field(default_factory=dict, description="source-specific settings")


TaskLoader = Callable[[TaskSourceConfig, str, "Environment | None"], Iterator[Task]]
_SOURCES: dict[str, TaskLoader] = {}


def register_task_source(name: str) -> Callable[[TaskLoader], TaskLoader]:
    def _register(fn: TaskLoader) -> TaskLoader:
        _SOURCES[name] = fn
        return fn

    return _register


def task_sources() -> list[str]:
    _load_plugins()
    return sorted(_SOURCES)


def load_tasks(config: TaskSourceConfig, env_name: str, env: Environment | None = None) -> list[Task]:
    """The tasks `config` names for environment `env_name` (`env`: a started env, for generators)."""
    _load_plugins()
    loader = _SOURCES.get(config.source)
    if loader is None:
        raise TaskFileError(f"unknown task source {config.source!r}; known: {', '.join(sorted(_SOURCES))}")
    wanted = set(config.ids) if config.ids is not None else None
    tasks: list[Task] = []
    for task in loader(config, env_name, env):
        if wanted is not None and task.id not in wanted:
            continue
        tasks.append(task)
        if config.n is not None and len(tasks) >= config.n:
            break
    if wanted is not None:
        missing = sorted(wanted - {t.id for t in tasks})
        if missing:
            raise TaskFileError(f"task ids not in the {config.source} source: {', '.join(missing[:5])}")
    return tasks


def resolve_path(path: str) -> Path:
    """A filesystem path; `pkg://package/sub/path` names a file inside an installed package."""
    if path.startswith("pkg://"):
        package, _, rest = path[len("pkg://"):].partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise TaskFileError(f"{path}: package {package!r} is not installed")
        return Path(list(spec.submodule_search_locations)[0]) / rest
    return Path(path)


def read_text(path: str) -> str:
    """A task file's text, bounded in size (a tasks file is never gigabytes; /dev/zero is not one)."""
    p = resolve_path(path)
    try:
        if not p.is_file():
            raise TaskFileError(f"{path}: not a regular file")
        with p.open("rb") as f:
            data = f.read(MAX_TASKS_FILE_BYTES + 1)
    except OSError as exc:
        raise TaskFileError(f"{path}: cannot read tasks file ({exc.strerror or exc})") from None
    if len(data) > MAX_TASKS_FILE_BYTES:
        raise TaskFileError(f"{path}: larger than {MAX_TASKS_FILE_BYTES // 2**20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFileError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None


@register_task_source("env")
def _from_env(config: TaskSourceConfig, env_name: str, env: Environment | None) -> Iterator[Task]:
    if env is None:
        raise TaskFileError(f"the env task source needs the {env_name} environment")
    yield from env.generate_tasks(config.n or 8, seed=config.seed)


@register_task_source("jsonl")
def _from_jsonl(config: TaskSourceConfig, env_name: str, env: Environment | None) -> Iterator[Task]:
    if not config.path:
        raise TaskFileError("the jsonl task source needs a path")

    def make(n: int, row: Any) -> Task:
        if not isinstance(row, dict) or not isinstance(row.get("instruction"), str):
            raise ValueError("a task needs an 'instruction' string")
        row.setdefault("id", f"task-{n:04d}")
        row.setdefault("env", env_name)
        return Task.model_validate(row)

    yield from jsonl_tasks(config.path, make)


def jsonl_tasks(path: str, make: Callable[[int, Any], Task]) -> Iterator[Task]:
    """The tasks of a JSONL file, `make(line number, parsed line)` building each one.

    A line that is not JSON, that `make` rejects (ValueError, pydantic's ValidationError) or that
    repeats a task id stops the load with one line naming the file, the line and the problem.
    """
    seen: set[str] = set()
    for n, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskFileError(f"{path}:{n}: not JSON ({exc.msg})") from None
        try:
            task = make(n, row)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "task"
            raise TaskFileError(f"{path}:{n}: {where}: {first['msg']}") from None
        except ValueError as exc:
            raise TaskFileError(f"{path}:{n}: {exc}") from None
        if task.id in seen:
            raise TaskFileError(f"{path}:{n}: duplicate task id {task.id!r}")
        seen.add(task.id)
        yield task


# Sources that live in their own modules; they register on import.
_PLUGINS: tuple[str, ...] = ("envs.tau2", "envs.browser.miniwob", "envs.browser.sites")


def _load_plugins() -> None:
    for module in _PLUGINS:
        importlib.import_module(module)
