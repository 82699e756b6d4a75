"""`LLMConfig`: the one place a job says which backend/model to use and how hard to push it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


class Endpoint(BaseModel):
    """One OpenAI-compatible server of the model; a config lists several to spread its requests."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True, frozen=True)

    base_url: str
    weight: float = Field(1.0, gt=0, description="share of traffic relative to the others, at equal load")
    max_concurrency: int | None = Field(None, ge=1, description="its capacity; default: the config's")
    # Name of the environment variable with this server's key; default: the config's api_key_env.
    api_key_env: str | None = None

    def api_key(self, default_env: str | None) -> str | None:
        name = self.api_key_env or default_env
        return os.environ.get(name) if name else None


class Price(BaseModel):
    """What the model's tokens cost, in US dollars per million tokens (for usage and cost reports)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_per_million: float = Field(ge=0)
    completion_per_million: float = Field(ge=0)


class LLMConfig(BaseModel):
    # hide_input_in_errors: a key pasted into the config by mistake must not be echoed back
    # inside a ValidationError message.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True, frozen=True)

    backend: Literal["openai", "llamacpp", "vllm", "transformers", "fake"] = "openai"
    model: str = "default"
    base_url: str | None = None
    # Several servers of the same model instead of one base_url (openai backend): requests go to
    # the one with the most free capacity; one that keeps failing is taken out and probed back in.
    endpoints: list[Endpoint] | None = Field(None, min_length=1)
    endpoint_failures: int = Field(3, ge=1, description="consecutive failures that take an endpoint out")
    endpoint_probe_s: float = Field(5.0, gt=0, description="wait before an endpoint taken out is tried again")
    endpoint_probe_max_s: float = Field(60.0, gt=0, description="longest wait (it doubles per failed probe)")
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

    # Token truth per model call (prompt and completion ids, completion logprobs) in each step's usage:
    # "auto" where the backend is known to give them (local engines, the fake server, a vLLM server
    # whose /models says so); "on" asks any OpenAI-compatible server (hosted APIs may refuse the
    # fields); "off" records none.
    token_ids: Literal["auto", "on", "off"] = "auto"

    cache_path: str | None = None
    ledger_path: str | None = None
    # Prices per million tokens; without them a remote model's cost is reported as unknown (local
    # engines cost 0 unless priced here).
    price: Price | None = None

    # Local engines (llamacpp / vllm / transformers).
    model_path: str | None = None
    n_ctx: int = 2048
    n_threads: int | None = None
    # transformers: the chat template (a TRL template name, a .jinja file or the text; default: the model's own)
    # and the device (default: cuda where there is one, else cpu).
    chat_template: str | None = None
    device: str | None = None

    @model_validator(mode="after")
    def _check_bounds(self) -> LLMConfig:
        if self.min_concurrency > self.max_concurrency:
            raise ValueError("min_concurrency must be <= max_concurrency")
        if self.endpoints is not None:
            if self.backend != "openai":
                raise ValueError(f"endpoints are for the openai backend, not {self.backend}")
            if self.base_url is not None:
                raise ValueError("give base_url or endpoints, not both")
            urls = [e.base_url.rstrip("/") for e in self.endpoints]
            if len(set(urls)) != len(urls):
                raise ValueError("endpoints repeat a base_url")
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

    def endpoint_list(self) -> list[Endpoint]:
        """The servers requests go to: `endpoints`, or the one `base_url` (None: the backend's default)."""
        if self.endpoints is not None:
            return list(self.endpoints)
        return [Endpoint(base_url=self.base_url or "", max_concurrency=self.max_concurrency)]

    def api_keys(self) -> list[str]:
        """Every key this config may send (to redact them all from errors and logs)."""
        keys = [self.api_key()] + [e.api_key(self.api_key_env) for e in self.endpoints or ()]
        return [k for k in keys if k]
