"""An MCP server (stdio) whose one tool answers with as many characters as asked: a tool that dumps."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("big-result", log_level="WARNING")


@server.tool()
async def report(size: int) -> str:
    """A report of `size` characters."""
    return ("0123456789abcdef" * (size // 16 + 1))[:size]


if __name__ == "__main__":
    server.run()
