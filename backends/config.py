"""`LLMConfig`: the one place a job says which backend/model to use and how hard to push it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


class LLMConfig(BaseModel):
    # hide_input_in_errors: a key pasted into the config by mistake must not be echoed back
    # inside a ValidationError message.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True, frozen=True)

    backend: Literal["openai", "llamacpp", "vllm", "fake"] = "openai"
    model: str = "default"
    base_url: str | None = None
    # Name of the environment variable holding the key; the key itself never lives here.
    api_key_env: str | None = "OPENAI_API_KEY"
    # HTTP transport of the openai backend: the lean built-in client (fast path) or the official SDK.
    transport: Literal["http", "openai"] = "http"

    max_concurrency: int = Field(32, ge=1, description="initial and maximum in-flight requests")
    min_concurrency: int = Field(1, ge=1)
    concurrency_increase_after: int = Field(16, ge=1, description="successes before +1 slot")
    request_timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(5, ge=0)
    backoff_base_s: float = Field(0.5, ge=0)
    backoff_max_s: float = Field(30.0, ge=0)
    structured_attempts: int = Field(3, ge=1, description="answers tried per structured() call")

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: list[str] | None = None

    cache_path: str | None = None
    ledger_path: str | None = None

    # Local engines (llamacpp / vllm).
    model_path: str | None = None
    n_ctx: int = 2048
    n_threads: int | None = None

    @model_validator(mode="after")
    def _check_bounds(self) -> LLMConfig:
        if self.min_concurrency > self.max_concurrency:
            raise ValueError("min_concurrency must be <= max_concurrency")
        return self

    @classmethod
    def from_yaml(cls, source: str | Path | dict[str, Any]) -> LLMConfig:
        """Accept a YAML file path, a YAML string, or an already-parsed dict."""
        if isinstance(source, dict):
            data = source
        elif isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and os.path.exists(source)):
            data = yaml.safe_load(Path(source).read_text())
        else:
            data = yaml.safe_load(source)
        if isinstance(data, dict) and "llm" in data and isinstance(data["llm"], dict):
            data = data["llm"]
        return cls.model_validate(data or {})

    def sampling_params(self) -> dict[str, Any]:
        params = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "stop": self.stop,
        }
        return {k: v for k, v in params.items() if v is not None}

    def api_key(self) -> str | None:
        """Read the key at use time so it is never part of the model's state or repr."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None
