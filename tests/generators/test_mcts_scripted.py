"""The scripted retail model the search tests and the benchmark share: its sample script and overrides."""

from __future__ import annotations

import asyncio

from backends.types import ChatRequest
from generators.scripted import QUESTION, ScriptedRetailLLM, cancel_tasks


def _answers(llm: ScriptedRetailLLM, instruction: str) -> list[str]:
    req = ChatRequest([{"role": "system", "content": "s"}, {"role": "user", "content": instruction}], {}, n=4)
    out = asyncio.run(llm._complete(req))
    return [c.tool_calls[0].name if c.tool_calls else c.text for c in out]


def test_scripted_model_follows_the_reference_actions():
    task = cancel_tasks(1)[0]
    assert _answers(ScriptedRetailLLM([task]), task.instruction) == [
        task.goal["actions"][0]["function"], "cancel_pending_order", "get_order_details", QUESTION]


def test_per_task_overrides():
    a, b = cancel_tasks(2)
    llm = ScriptedRetailLLM([a, b], solved={a.id: 4, b.id: 1})
    assert _answers(llm, a.instruction) == [a.goal["actions"][0]["function"]] * 4
    assert _answers(llm, b.instruction) == [b.goal["actions"][0]["function"]] + ["transfer_to_human_agents"] * 3
