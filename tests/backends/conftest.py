"""Fixtures for the LLM layer tests: an in-process fake server and clients pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from backends import LLM, LLMConfig, make_llm
from backends.fake_server import FakeServer, FakeServerConfig


@pytest.fixture
def fake_server() -> Iterator[Callable[..., FakeServer]]:
    """Factory: fake_server(**FakeServerConfig fields) -> started server, stopped at teardown."""
    started: list[FakeServer] = []

    def start(**kwargs: Any) -> FakeServer:
        srv = FakeServer(FakeServerConfig(**kwargs)).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


def _config(srv: FakeServer, **overrides: Any) -> LLMConfig:
    # Tiny backoff so retry tests take milliseconds.
    base: dict[str, Any] = dict(
        backend="openai", model="fake-model", base_url=srv.base_url, api_key_env=None,
        max_concurrency=16, request_timeout_s=5.0, max_retries=3, backoff_base_s=0.001, backoff_max_s=0.01,
    )
    base.update(overrides)
    return LLMConfig(**base)


@pytest.fixture
def client_config() -> Callable[..., LLMConfig]:
    """client_config(srv, **overrides) -> LLMConfig for the openai backend at `srv`."""
    return _config


@pytest.fixture
def client() -> Callable[..., LLM]:
    """client(srv, **overrides) -> LLM for the openai backend at `srv`."""
    return lambda srv, **overrides: make_llm(_config(srv, **overrides))
