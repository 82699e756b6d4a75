"""Any trajforge world as a TRL environment: `GRPOTrainer(..., environment_factory=TrajforgeEnvironments(CONFIG))`.

TRL (1.16, `environment_factory`) builds one environment per rollout with the factory, calls its `reset(**row)`
with the dataset row and appends the string it returns to the prompt's last message, offers the environment's
public methods to the model as tools (each method's signature and docstring become the tool's JSON Schema), calls
them as the model asks, and scores the rollout with `get_reward()`. Here the methods are the world's tools (a
browser's actions, an MCP server's tools) and the message tool (`respond`: a message to the user, or the final
answer), each call one action of an episode of the `rollout` method through the one episode loop
(training/driven.py); `reset` opens an episode of the row's `task` (else the task with the fewest episodes) and
returns its opening (the user's request, a first page); `get_reward` ends the episode where it stands and returns
the world's own evaluation. Every episode is a trajectory in the dataset `output`.

    envs = TrajforgeEnvironments("configs/browser_miniwob.yaml", output="out/trl-episodes")
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=envs.dataset(),
                          environment_factory=envs)
    trainer.train()
    envs.close()

TRL runs sync methods on its own thread; the world is async and lives on an event loop of its own (one thread),
which every environment of the factory shares (one MCP server pool, one browser). TRL reads a tool's schema from
Python type hints: strings, numbers, booleans, enums (as `Literal`), lists of those and nullable ones keep their
shape; a nested object becomes `dict` (its properties are not shown to the model).
"""

from __future__ import annotations

import asyncio
import inspect
import keyword
import re
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Coroutine, Literal, Optional, TypeVar, Union

from schemas.models import Tool
from training.driven import MESSAGE_TOOL, DrivenSession, DrivenWorld

T = TypeVar("T")
RESERVED = ("reset", "get_reward")
_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict,
                            "array": list, "null": type(None)}


class TrajforgeEnvironments:
    """The factory TRL calls for each rollout's environment, over one rollout config's world."""

    def __init__(self, config: str | Path | dict[str, Any], output: str | Path, *,
                 message_tool: str = MESSAGE_TOOL, model: str | None = None) -> None:
        data = _read_config(config)
        self.model = model
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="trajforge-envs", daemon=True)
        self._thread.start()
        self.world = DrivenWorld(data, output, driver="trl", message_tool=message_tool)
        try:
            self.run(self.world.start())
            self.environment_class = environment_class(self)
        except BaseException:
            self.close()
            raise

    def __call__(self) -> Any:
        return self.environment_class(self)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the world's event loop and wait for it."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result()

    def dataset(self, repeat: int = 1) -> Any:
        """A `datasets.Dataset` for GRPOTrainer: each task `repeat` times, its prompt the system prompt offered to
        the agent and an empty user message (`reset` fills it with the episode's opening), its `task` column the
        task's id."""
        import datasets

        system = self.world.system_prompt()
        rows = [task.id for task in self.world.tasks for _ in range(repeat)]
        return datasets.Dataset.from_dict({
            "prompt": [[{"role": "system", "content": system}, {"role": "user", "content": ""}] for _ in rows],
            "task": rows})

    def close(self) -> dict[str, Any]:
        """End running episodes, stop the world, mark the dataset complete; its counts."""
        counts: dict[str, Any] = {}
        if self._loop.is_running():
            try:
                counts = self.run(self.world.close())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=30)
        return counts


def environment_class(envs: TrajforgeEnvironments) -> type:
    """The class of the factory's environments: `reset`, `get_reward`, and a method per tool of the world."""

    def __init__(self: Any, owner: TrajforgeEnvironments) -> None:
        self._envs = owner
        self._session: DrivenSession = owner.world.session(owner.model)

    def reset(self: Any, **row: Any) -> str:
        """Start an episode of the row's task (`task`); the user's request and the world's first observation."""
        return self._envs.run(self._session.reset(task=row.get("task"))).text

    def get_reward(self: Any) -> float | None:
        """End the episode where it stands; the world's evaluation (None where the episode failed)."""
        turn = self._envs.run(self._session.end())
        return turn.reward if turn is not None else None

    namespace: dict[str, Any] = {"__init__": __init__, "reset": reset, "get_reward": get_reward,
                                 "__doc__": f"An episode of {envs.world.config.env} tasks (trajforge)."}
    for tool in envs.world.tools():
        namespace[tool.name] = tool_method(tool)
    return type("TrajforgeEnvironment", (), namespace)


def tool_method(tool: Tool) -> Callable[..., str]:
    """A method that makes one call of `tool`, with the signature and Google docstring TRL reads its schema from."""
    if tool.name in RESERVED or tool.name.startswith("_"):
        raise ValueError(f"tool {tool.name!r}: TRL reserves that name for the environment itself; leave the tool out "
                         "(env_config.exclude) to train with TRL")
    name = tool.name
    schema = tool.parameters or {}
    properties: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    described = []
    for arg, spec in properties.items():
        if not arg.isidentifier() or keyword.iskeyword(arg) or arg == "self":
            raise ValueError(f"tool {name!r}: argument {arg!r} cannot be a Python parameter, which TRL needs")
        hint = python_type(spec if isinstance(spec, dict) else {})
        optional = arg not in required
        annotations[arg] = Optional[hint] if optional else hint
        parameters.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, annotation=annotations[arg],
                                            default=None if optional else inspect.Parameter.empty))
        described.append(f"    {arg}: {_one_line(spec.get('description') or spec.get('title') or f'the {arg}')}"
                         if isinstance(spec, dict) else f"    {arg}: the {arg}")

    def call(self: Any, **arguments: Any) -> str:
        return self._envs.run(self._session.step(name, arguments)).text

    call.__name__ = call.__qualname__ = name
    call.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    call.__annotations__ = annotations
    summary = _one_line(tool.description or f"The {name} tool.")
    call.__doc__ = summary + ("\n\nArgs:\n" + "\n".join(described) if described else "")
    return call


def python_type(spec: dict[str, Any]) -> Any:
    """The type hint whose JSON Schema (transformers' get_json_schema) is closest to `spec`."""
    if isinstance(spec.get("enum"), list) and spec["enum"] and all(
            isinstance(v, (str, int, float, bool)) for v in spec["enum"]):
        return Literal[tuple(spec["enum"])]  # type: ignore[valid-type]
    options = spec.get("anyOf") or spec.get("oneOf")
    if isinstance(options, list) and options:
        return _union([python_type(o) for o in options if isinstance(o, dict)])
    kind = spec.get("type")
    if isinstance(kind, list):
        return _union([python_type({**spec, "type": k}) for k in kind])
    if kind == "array":
        items = spec.get("items")
        return list[python_type(items)] if isinstance(items, dict) and items else list
    return _SCALARS.get(kind, Any) if isinstance(kind, str) else Any


def _union(types: list[Any]) -> Any:
    unique = list(dict.fromkeys(types))
    if not unique:
        return Any
    return unique[0] if len(unique) == 1 else Union[tuple(unique)]  # type: ignore[return-value]


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", str(text)).strip()


def _read_config(config: str | Path | dict[str, Any]) -> dict[str, Any]:
    if isinstance(config, dict):
        return config
    import yaml

    try:
        data = yaml.safe_load(Path(config).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{config}: cannot read the config ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{config}: a config is a YAML mapping")
    return data
