"""The transformers backend on a tiny random model directory: the prompt its template renders, greedy answers,
written tool calls read back, the prefix cache, and greedy answers cut short handed back at once."""

from __future__ import annotations

import asyncio
import json

import pytest

from backends.registry import make_llm
from backends.transformers_backend import read_answer, resolve_chat_template
from backends.types import ChatRequest, Usage
from tests.export import _tiny

CLICK = {"type": "function", "function": {"name": "click", "description": "Click an element.",
                                          "parameters": {"type": "object", "properties": {"bid": {"type": "string"}},
                                                         "required": ["bid"]}}}
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(_tiny.shared_model_dir(tmp_path_factory))


def _messages(page: str) -> list[dict]:
    return [{"role": "system", "content": "You act on web pages. " * 8},
            {"role": "user", "content": "Click the OK button."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "click", "arguments": '{"bid": "3"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": page}]


def test_written_tool_calls_become_tool_calls_and_unreadable_ones_stay_text():
    done = read_answer('Clicking.\n<tool_call>\n{"name": "click", "arguments": {"bid": "7"}}\n</tool_call>', "stop",
                       Usage(5, 9), emulated=False)
    assert done.text == "Clicking." and done.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in done.tool_calls] == [("click", {"bid": "7"})]
    broken = read_answer('<tool_call>{"name": "click", "arguments": {bid</tool_call>', "stop", Usage(), emulated=False)
    assert broken.tool_calls == [] and broken.text.startswith("<tool_call>")  # the agent counts it as unusable
    emulated = read_answer('{"name": "click", "arguments": {"bid": "2"}}', "stop", Usage(), emulated=True)
    assert emulated.tool_calls[0].name == "click" and emulated.text == ""


def test_prompt_renders_tools_and_mapping_arguments_with_the_template(model_path):
    llm = make_llm({"backend": "transformers", "model_path": model_path})
    try:
        text, emulated = llm.prompt_text(ChatRequest(_messages("[3] button 'OK', focused"), {}, tools=[CLICK]))
        assert not emulated and "<tools>" in text and '"name": "click"' in text
        assert '{"name": "click", "arguments": {"bid": "3"}}' in text  # JSON text in the request, a mapping here
        assert text.endswith("<|im_start|>assistant\n") and "<tool_response>" in text
    finally:
        asyncio.run(llm.aclose())
    plain = make_llm({"backend": "transformers", "model_path": model_path, "chat_template": CHATML})
    try:  # a template without tools: they are described in a system turn and asked for as one JSON object
        text, emulated = plain.prompt_text(ChatRequest(_messages("page"), {}, tools=[CLICK]))
        assert emulated and "You can call these tools" in text and "Tool result: page" in text
    finally:
        asyncio.run(plain.aclose())
    with pytest.raises(ValueError, match="no such TRL template"):
        resolve_chat_template("no_such_template")


def test_greedy_answers_repeat_and_the_prefix_cache_changes_nothing(model_path):
    async def run() -> None:
        cached = make_llm({"backend": "transformers", "model_path": model_path, "max_tokens": 6, "max_retries": 3,
                           "backoff_base_s": 0.0})
        fresh = make_llm({"backend": "transformers", "model_path": model_path, "max_tokens": 6, "max_retries": 0})
        fresh._prefix.min_tokens = 10**9  # never reuses
        try:
            first = await cached.chat(_messages("[3] button 'OK'"), tools=[CLICK])
            second = await cached.chat(_messages("[3] button 'OK', focused"), tools=[CLICK])
            assert cached._prefix.reused_tokens > 20  # the shared system turn and history were not computed again
            again = await fresh.chat(_messages("[3] button 'OK', focused"), tools=[CLICK])
            assert second[0].text == again[0].text and second[0].tool_calls == again[0].tool_calls
            # A random model writes no end token within 6: cut short, handed back once (a retry repeats it).
            assert first[0].finish_reason == "length" and cached.stats.calls == 2 and cached.stats.truncated == 2
            assert first[0].usage.completion_tokens == 6 and first[0].usage.prompt_tokens > 50
            samples = await cached.chat(_messages("x"), n=2, temperature=1.0, seed=3, max_tokens=4, tools=[CLICK])
            repeat = await fresh.chat(_messages("x"), n=2, temperature=1.0, seed=3, max_tokens=4, tools=[CLICK])
            assert [c.text for c in samples] == [c.text for c in repeat]  # a seed makes sampling repeatable
        finally:
            await cached.aclose()
            await fresh.aclose()

    asyncio.run(run())
