"""`make_llm(config)`: the same job switches backend by configuration alone."""

from __future__ import annotations

from typing import Any

from backends.base import LLM
from backends.config import LLMConfig


def make_llm(config: LLMConfig | dict[str, Any], **kwargs: Any) -> LLM:
    """Build the backend named in `config`; heavy engines are imported only here, on demand."""
    if isinstance(config, dict):
        config = LLMConfig.from_yaml(config)
    if config.backend == "openai":
        from backends.openai_backend import OpenAILLM

        return OpenAILLM(config, **kwargs)
    if config.backend == "fake":
        from backends.fake_backend import FakeLLM

        return FakeLLM(config, **kwargs)
    if config.backend == "llamacpp":
        from backends.llamacpp_backend import LlamaCppLLM

        return LlamaCppLLM(config, **kwargs)
    if config.backend == "transformers":
        from backends.transformers_backend import TransformersLLM

        return TransformersLLM(config, **kwargs)
    if config.backend == "vllm":
        from backends.vllm_backend import VLLMLLM

        return VLLMLLM(config, **kwargs)
    raise ValueError(f"unknown backend {config.backend!r}")
