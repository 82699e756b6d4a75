"""Task sources: where the tasks of a run come from, chosen by the `tasks:` block of a config.

    tasks: {source: env, n: 8, seed: 0}                  # the environment's own generator
    tasks: {source: jsonl, path: tasks.jsonl}             # one Task (or {"instruction": ...}) per line
    tasks: {source: tau2, path: .../tasks.json, split: train}
    tasks: {source: miniwob, options: {tasks: [click-*], seeds: 3}}   # MiniWoB++ pages (browser env)
    tasks: {source: sites, path: site_tasks.jsonl}          # any site (browser env)

Every source yields `Task`s for one environment, in a stable order (a re-run sees the same ids);
`ids` keeps only the named ones, `n` caps how many. Sources are registered by name
(`register_task_source`), so a package can add its own. Paths may name a file inside an installed
Python package as `pkg://<package>/<path>`: looked up in the world's own Python first where it has
one (an MCP server run from its venv: `load_tasks(..., interpreter)`), then in trajforge's.

A source whose benchmark has a test split also registers how to read it (`register_held_out`):
tau2's test tasks, MiniWoB's test seeds, the tasks of a JSONL file marked `metadata.split: test`
(which generation refuses unless `allow_test_split`). `held_out_tasks` reads them, for the
decontamination stage (pipelines/decontam.py).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
from dataclasses import dataclass
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


class NoTaskGenerator(TaskFileError, NotImplementedError):
    """The `env` task source of a world without a generator: a config without `tasks:` (methods that can do
    without example tasks catch NotImplementedError, the CLI reports a TaskFileError in one line)."""


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
    probes: dict[str, int] = Field(default_factory=dict, description=(
        "task id -> reference calls expected to fail (a lookup of a wrong email first): `envs check` "
        "counts failing reference calls beyond these against the environment (tasks may also say goal.probes)"))


TaskLoader = Callable[[TaskSourceConfig, str, "Environment | None"], Iterator[Task]]
_SOURCES: dict[str, TaskLoader] = {}
# source -> (its config, env name) -> the benchmark's test tasks, or None when this config's data has no test split.
HeldOutLoader = Callable[[TaskSourceConfig, str], "list[Task] | None"]
_HELD_OUT: dict[str, HeldOutLoader] = {}
TEST_SPLIT = "test"


def register_task_source(name: str) -> Callable[[TaskLoader], TaskLoader]:
    def _register(fn: TaskLoader) -> TaskLoader:
        _SOURCES[name] = fn
        return fn

    return _register


def register_held_out(name: str) -> Callable[[HeldOutLoader], HeldOutLoader]:
    """Register how source `name` reads its benchmark's test split."""
    def _register(fn: HeldOutLoader) -> HeldOutLoader:
        _HELD_OUT[name] = fn
        return fn

    return _register


def held_out_tasks(config: TaskSourceConfig, env_name: str) -> list[Task] | None:
    """The test-split tasks of the benchmark behind `config` (all of them, whatever `split`, `ids`, `n`
    say), or None when its source has no test split."""
    _load_plugins()
    loader = _HELD_OUT.get(config.source)
    return None if loader is None else loader(config, env_name)


def task_sources() -> list[str]:
    _load_plugins()
    return sorted(_SOURCES)


def load_tasks(config: TaskSourceConfig, env_name: str, env: Environment | None = None,
               interpreter: Interpreter | None = None) -> list[Task]:
    """The tasks `config` names for environment `env_name` (`env`: a started env, for generators);
    `pkg://` paths resolve in `interpreter`'s environment first (the world's own, e.g. a server's venv)."""
    _load_plugins()
    if interpreter is not None:
        config = _resolved(config, interpreter)
    loader = _SOURCES.get(config.source)
    if loader is None:
        raise TaskFileError(f"unknown task source {config.source!r}; known: {', '.join(sorted(_SOURCES))}")
    wanted = set(config.ids) if config.ids is not None else None
    tasks: list[Task] = []
    for task in loader(config, env_name, env):
        if wanted is not None and task.id not in wanted:
            continue
        if task.id in config.probes:
            task = task.model_copy(update={"metadata": {**task.metadata, "probes": config.probes[task.id]}})
        tasks.append(task)
        if config.n is not None and len(tasks) >= config.n:
            break
    if wanted is not None:
        missing = sorted(wanted - {t.id for t in tasks})
        if missing:
            raise TaskFileError(f"task ids not in the {config.source} source: {', '.join(missing[:5])}")
    return tasks


@dataclass(frozen=True)
class Interpreter:
    """A Python environment other than trajforge's (an MCP server's own venv): its interpreter and the
    environment variables it runs with."""

    python: str
    env: tuple[tuple[str, str], ...] = ()


def resolve_path(path: str, interpreter: Interpreter | None = None) -> Path:
    """A filesystem path; `pkg://package/sub/path` names a file inside an installed package: installed
    in `interpreter`'s environment (looked at first, where given) or in trajforge's own."""
    if path.startswith("pkg://"):
        package, _, rest = path[len("pkg://"):].partition("/")
        found = _foreign_package_dir(package, interpreter) if interpreter is not None else None
        found = found or _own_package_dir(package)
        if found is None:
            where = f"in {interpreter.python} nor in trajforge's" if interpreter is not None else "in trajforge's"
            raise TaskFileError(f"{path}: package {package!r} is not installed ({where} environment)")
        return Path(found) / rest
    return Path(path)


def _own_package_dir(package: str) -> str | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # a dotted name whose parent is missing
        return None
    return list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None


_FIND_PACKAGE = ("import importlib.util, sys\n"
                 "s = importlib.util.find_spec(sys.argv[1])\n"
                 "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')")


@functools.lru_cache(maxsize=64)
def _foreign_package_dir(package: str, interpreter: Interpreter) -> str | None:
    """The package's folder as `interpreter` imports it (run once per package and interpreter)."""
    try:
        done = subprocess.run([interpreter.python, "-c", _FIND_PACKAGE, package], env=dict(interpreter.env),
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else ""
    return found if found and os.path.isdir(found) else None


def _resolved(config: TaskSourceConfig, interpreter: Interpreter) -> TaskSourceConfig:
    """`config` with its `pkg://` paths (path, options.split_file) resolved in `interpreter`'s environment."""
    update: dict[str, Any] = {}
    if config.path and config.path.startswith("pkg://"):
        update["path"] = str(resolve_path(config.path, interpreter))
    split_file = config.options.get("split_file")
    if isinstance(split_file, str) and split_file.startswith("pkg://"):
        update["options"] = {**config.options, "split_file": str(resolve_path(split_file, interpreter))}
    return config.model_copy(update=update) if update else config


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
    try:
        tasks = env.generate_tasks(config.n or 8, seed=config.seed)
    except NotImplementedError as exc:
        raise NoTaskGenerator(f"{exc}: the config needs a tasks: block, e.g. tasks: {{source: jsonl, path: tasks.jsonl}}"
                            " (docs/environments.md, Task sources)") from None
    yield from tasks


@register_task_source("jsonl")
def _from_jsonl(config: TaskSourceConfig, env_name: str, env: Environment | None) -> Iterator[Task]:
    if not config.path:
        raise TaskFileError("the jsonl task source needs a path")

    tasks = list(jsonl_tasks(config.path, _jsonl_task(env_name)))
    test = [t.id for t in tasks if t.metadata.get("split") == TEST_SPLIT]
    if test and not config.allow_test_split:
        raise TaskFileError(f"{config.path}: {len(test)} task(s) marked metadata.split: test ({', '.join(test[:3])}"
                            f"{', ...' if len(test) > 3 else ''}); training data from test tasks is refused unless "
                            "asked for (--allow-test-split, or tasks.allow_test_split: true)")
    yield from tasks


def _jsonl_task(env_name: str) -> Callable[[int, Any], Task]:
    def make(n: int, row: Any) -> Task:
        if not isinstance(row, dict) or not isinstance(row.get("instruction"), str):
            raise ValueError("a task needs an 'instruction' string")
        row.setdefault("id", f"task-{n:04d}")
        row.setdefault("env", env_name)
        return Task.model_validate(row)

    return make


@register_held_out("jsonl")
def _jsonl_held_out(config: TaskSourceConfig, env_name: str) -> list[Task] | None:
    if not config.path:
        return None
    test = [t for t in jsonl_tasks(config.path, _jsonl_task(env_name)) if t.metadata.get("split") == TEST_SPLIT]
    return test or None


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
