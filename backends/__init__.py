"""LLM access layer: one async interface over OpenAI-compatible servers and local engines.

Import-light on purpose: heavy engines (llama_cpp, vllm) load only when their backend is built.
"""

from backends.base import LLM
from backends.config import LLMConfig
from backends.errors import LLMRequestError
from backends.registry import make_llm
from backends.types import ChatRequest, Completion, ToolCall, Usage

__all__ = [
    "LLM",
    "LLMConfig",
    "LLMRequestError",
    "ChatRequest",
    "Completion",
    "ToolCall",
    "Usage",
    "make_llm",
]
