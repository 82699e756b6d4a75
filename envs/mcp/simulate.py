"""A simulation of a real MCP server: its tools and policy, copied into the LLM-simulated environment.

    env: simulated
    env_config:
      from_mcp: {server: {command: [my-mcp-server]}, exclude: [admin_reset], policy: policy.md}
      llm: {...}

`from_mcp` takes the settings of the `mcp` environment; the simulated environment gets the tools
the agent would see on the real server (same filtering, hidden arguments removed) and its policy,
so a run on the simulation and a run on the real server can be compared. The server is asked
once per process for each distinct `from_mcp` block.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from envs.mcp.config import MCPConfig, load_policy
from envs.mcp.env import agent_tools
from envs.mcp.server import ServerSession

_LISTED: dict[str, list[dict[str, Any]]] = {}
_LOCK = threading.Lock()


async def _list_tools(config: MCPConfig) -> list[dict[str, Any]]:
    session = ServerSession(config.server, start_timeout_s=config.start_timeout_s, number=1, fixtures=config.fixtures)
    await session.start()
    try:
        listed = await session.list_tools()
    finally:
        await session.close()
    return [t.model_dump(mode="json", exclude_none=True) for t in agent_tools(config, listed)]


def _in_own_loop(config: MCPConfig) -> list[dict[str, Any]]:
    """Run the listing on a loop of its own: the caller may be sync code inside a running loop."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["tools"] = asyncio.run(_list_tools(config))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=run, name="mcp-list-tools")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["tools"]


def simulated_from_mcp(env_config: dict[str, Any]) -> dict[str, Any]:
    """`env_config` with `from_mcp` replaced by the server's `tools` and `policy` (given ones win)."""
    settings = dict(env_config)
    config = MCPConfig.parse(settings.pop("from_mcp"))
    key = json.dumps(config.model_dump(mode="json"), sort_keys=True)
    with _LOCK:
        if key not in _LISTED:
            _LISTED[key] = _in_own_loop(config)
    settings.setdefault("tools", _LISTED[key])
    if settings.get("policy") is None:
        settings["policy"] = load_policy(config.policy) or ""
    return settings
