"""Fixtures for filter tests: a scripted fake LLM server and synthetic datasets on disk."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.fake_server import FakeServer, FakeServerConfig, Rule
from schemas.store import Dataset
from tests.factories import tool_trajectory

# Which records the judge server treats how: matched on the task text in the prompt.
JUDGE_RULES = [
    Rule(match=re.compile(r"Rate the quality[\s\S]*Find item 1\b"), answer={"score": 2, "reason": "sloppy"}),
    Rule(match=re.compile(r"Rate the quality[\s\S]*Find item 3\b"), answer="this is not json"),
    Rule(match="Rate the quality", answer={"score": 4, "reason": "clear and correct"}),
    Rule(match=re.compile(r"completed a task[\s\S]*Find item 2\b"), answer={"thoughts": "wrong item", "success": False}),
    Rule(match="completed a task", answer={"thoughts": "answered", "success": True}),
]


@pytest.fixture
def judge_server() -> Iterator[FakeServer]:
    srv = FakeServer(FakeServerConfig(rules=list(JUDGE_RULES))).start()
    yield srv
    srv.stop()


def llm_config(srv: FakeServer, **extra: Any) -> dict[str, Any]:
    return dict(backend="openai", model="fake-model", base_url=srv.base_url, api_key_env=None, max_retries=0,
                structured_attempts=2, backoff_base_s=0.001, request_timeout_s=5.0, **extra)


def make_dataset(path: Path, records: list[Any], per_unit: int = 4) -> Dataset:
    ds = Dataset.create(path, stage="test", overwrite=True)
    for start in range(0, len(records), per_unit):
        with ds.unit(f"in-{start // per_unit:03d}") as u:
            for r in records[start : start + per_unit]:
                u.write("trajectories", r)
    ds.mark_complete()
    return ds


def records(n: int) -> list[Any]:
    return [tool_trajectory(i) for i in range(n)]
