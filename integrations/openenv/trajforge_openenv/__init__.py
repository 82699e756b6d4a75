"""A trajforge world as an OpenEnv environment, served with OpenEnv's own classes (`openenv.core`).

`trajforge envs serve --config FILE` starts this server (`python -m trajforge_openenv`) from its own venv and holds
the world itself; each OpenEnv session (a WebSocket of `EnvClient`, or an HTTP MCP session) is an instance of
`TrajforgeEnvironment`, which holds one connection to the world's Unix socket: one trajforge session, its episodes
isolated from every other's. Actions are OpenEnv's MCP actions: `ListToolsAction` lists the world's tools (the
message tool `respond` last), `CallToolAction` takes one action; its `metadata` may carry the model's token ids
(`prompt_ids`, `completion_ids`, `logprobs`), which the episode's record keeps. `reset(task=ID | index=N | seed=S,
model=NAME)` opens an episode: the user's request and the world's first observation, and the system prompt offered
to the agent (`list_tools` gives the tools). Observations carry the reward (the world's own evaluation) and `done` when the episode ends.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import (CallToolAction, CallToolObservation, ListToolsAction,
                                               ListToolsObservation, Tool, ToolError, ToolErrorType)
from openenv.core.env_server.types import EnvironmentMetadata, Observation, State
from pydantic import Field

SOCKET: dict[str, str] = {}  # the world's socket path, set by main()
TOKEN_KEYS = ("prompt_ids", "completion_ids", "logprobs", "tokenizer")


class TrajforgeObservation(Observation):
    """What reset gives: the episode's opening and what the agent needs to act."""

    text: str = Field(description="the user's request and the world's first observation")
    system_prompt: str = Field(description="the system prompt offered to the agent (how to act, the world's policy)")
    task: Optional[str] = None


class World:
    """One connection to the world's socket: requests and answers, one JSON line each."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.file = self.sock.makefile("rwb")
        self.lock = threading.Lock()

    def request(self, **body: Any) -> dict[str, Any]:
        with self.lock:
            self.file.write(json.dumps(body).encode() + b"\n")
            self.file.flush()
            line = self.file.readline()
        if not line:
            raise RuntimeError("the trajforge world closed the connection")
        return json.loads(line)

    def close(self) -> None:
        try:
            self.file.close()
            self.sock.close()
        except OSError:
            pass


class TrajforgeEnvironment(Environment):
    """A session of the served world (see the module doc)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.world = World(SOCKET["path"])
        info = self.world.request(op="info")
        self.tools = [Tool(name=t["name"], description=t.get("description") or "", input_schema=t.get("parameters") or {})
                      for t in info["tools"]]
        self.tasks = info["tasks"]
        self.env_name = info["env"]
        self._state = State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        answer = self.world.request(op="reset", task=kwargs.get("task"), index=kwargs.get("index"), seed=seed,
                                    model=kwargs.get("model"))
        if not answer["ok"]:
            raise ValueError(answer["error"])
        self._state = State(episode_id=episode_id or answer.get("task"), step_count=0, task=answer.get("task"))
        return TrajforgeObservation(text=answer["text"], system_prompt=answer["system_prompt"],
                                    task=answer.get("task"), done=answer["done"], reward=answer.get("reward"),
                                    metadata=_metadata(answer))

    def step(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        if isinstance(action, ListToolsAction):
            return ListToolsObservation(tools=self.tools)
        if not isinstance(action, CallToolAction):
            raise ValueError(f"{type(action).__name__}: this environment takes list_tools and call_tool actions")
        tokens = {k: action.metadata[k] for k in TOKEN_KEYS if k in action.metadata} or None
        answer = self.world.request(op="step", tool=action.tool_name, arguments=action.arguments, tokens=tokens)
        if not answer["ok"]:
            return CallToolObservation(tool_name=action.tool_name, error=ToolError(
                error_type=ToolErrorType.INVALID_ARGS, message=answer["error"]))
        self._state = State(episode_id=self._state.episode_id, step_count=answer.get("actions", 0),
                            task=answer.get("task"), record=answer.get("record"))
        return CallToolObservation(tool_name=action.tool_name, result=answer["text"], done=answer["done"],
                                   reward=answer.get("reward"), metadata=_metadata(answer))

    @property
    def state(self) -> State:
        answer = self.world.request(op="state")
        return State(episode_id=self._state.episode_id, step_count=answer["state"].get("actions", 0),
                     **{k: v for k, v in answer["state"].items() if k != "actions"})

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=f"trajforge-{self.env_name}", version="0.1.0",
                                   description=f"trajforge's {self.env_name} world: {len(self.tasks)} tasks")

    # OpenEnv's task API (GET /{env}/splits, POST /{env}/tasks ...): the config's tasks, one split.
    def list_splits(self) -> list[str]:
        return ["tasks"]

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return self.tasks

    def num_tasks(self, split: str) -> int:
        return len(self.tasks)

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        return self.tasks[index]

    def close(self) -> None:
        self.world.close()


def _metadata(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k not in ("ok", "text", "done", "reward", "system_prompt") and v is not None}


def main(argv: list[str] | None = None) -> None:
    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app

    parser = argparse.ArgumentParser(prog="trajforge_openenv", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="the world's Unix socket (trajforge envs serve opens it)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=8)
    args = parser.parse_args(argv)
    SOCKET["path"] = args.socket
    app = create_fastapi_app(TrajforgeEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=args.max_sessions,
                             env_name="trajforge", reset_observation_cls=TrajforgeObservation)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
