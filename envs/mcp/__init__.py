"""Any Model Context Protocol server as an environment (`env: mcp`)."""

from envs.mcp.config import ConfigError, MCPConfig
from envs.mcp.env import MCPEnv

__all__ = ["ConfigError", "MCPConfig", "MCPEnv"]
