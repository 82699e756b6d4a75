"""A small MCP server to learn from and test with: a key-value store with one namespace per state key.

    python envs/mcp/kvstore_server.py                       # stdio
    python envs/mcp/kvstore_server.py --http --port 8000    # streamable HTTP on 127.0.0.1:8000/mcp
    python envs/mcp/kvstore_server.py --latency 0.02        # every call waits 20 ms, like a remote API

It imports only the MCP SDK, so it runs as a script from any directory.

It shows what makes a server a good environment: every tool takes a `state_key` (the environment
hides it from the agent and fills in one per episode, so episodes never see each other's
changes), read-only tools say so (`readOnlyHint`), `reset` starts a namespace afresh, and
`digest` returns a hash of a namespace's state, so the DB criterion compares states exactly.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

READ = ToolAnnotations(readOnlyHint=True)


def build(latency_s: float = 0.0) -> MCPServer:
    server = MCPServer("kvstore", instructions="A key-value store. Keys are short names, values are strings.",
                       log_level="WARNING")
    stores: dict[str, dict[str, str]] = {}

    async def store(state_key: str) -> dict[str, str]:
        if latency_s:
            await asyncio.sleep(latency_s)
        return stores.setdefault(state_key, {"greeting": "hello"})

    @server.tool(annotations=READ)
    async def get(key: str, state_key: str = "default") -> str:
        """The value stored under a key."""
        values = await store(state_key)
        if key not in values:
            raise ToolError(f"no key {key!r}")
        return values[key]

    @server.tool(annotations=READ)
    async def list_keys(state_key: str = "default") -> list[str]:
        """All keys, sorted."""
        return sorted(await store(state_key))

    @server.tool()
    async def put(key: str, value: str, state_key: str = "default") -> str:
        """Store a value under a key (replacing any value it had)."""
        if not key:
            raise ToolError("a key cannot be empty")
        (await store(state_key))[key] = value
        return f"stored {key}"

    @server.tool()
    async def delete(key: str, state_key: str = "default") -> str:
        """Remove a key."""
        values = await store(state_key)
        if values.pop(key, None) is None:
            raise ToolError(f"no key {key!r}")
        return f"deleted {key}"

    @server.tool()
    async def reset(state_key: str = "default") -> str:
        """Start a namespace afresh."""
        stores.pop(state_key, None)
        await store(state_key)
        return "reset"

    @server.tool(annotations=READ)
    async def digest(state_key: str = "default") -> dict[str, Any]:
        """A hash of a namespace's state."""
        values = await store(state_key)
        return {"sha256": hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest(), "keys": len(values)}

    return server


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds every call waits (a remote API's latency)")
    args = ap.parse_args(argv)
    server = build(args.latency)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
