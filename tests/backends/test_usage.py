"""Usage per answer: tokens of every attempt, latency, retries, cost, cache hits; unusable answers handed back."""

from __future__ import annotations

import asyncio

from backends import LLMConfig
from backends.fake_backend import FakeLLM
from backends.fake_server import Fault, Rule, ToolCallAnswer
from backends.registry import make_llm
from backends.types import Completion, Usage
from schemas.models import ApiAction, MessageAction, TextObservation, Trajectory
from schemas.usage import usage_totals, with_usage

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
ASK = [{"role": "user", "content": "look it up"}]


def test_a_retried_answer_carries_the_tokens_and_time_of_every_attempt_and_a_price_makes_its_cost(
        fake_server, client_config):
    # First answer cut short (10 words of a 20-word echo), then a whole one: both were paid for.
    srv = fake_server(rules=[Rule(answer=Fault("truncated", answer="w " * 20), times=1)], latency=0.05)
    price = {"prompt_per_million": 2.0, "completion_per_million": 8.0}

    async def go():
        async with make_llm(client_config(srv, price=price)) as llm:
            [c] = await llm.chat(ASK)
            return c, llm.step_usage(c), llm.stats

    completion, usage, stats = asyncio.run(go())
    assert completion.unusable is None and completion.retries == 1
    bodies = [e for e in srv.log if "body" in e]
    assert [e["outcome"] for e in bodies] == ["truncated", "ok"]
    # The fake server counts words: the prompt twice, both answers' tokens.
    assert usage.prompt_tokens == 2 * 3 == stats.prompt_tokens
    assert usage.completion_tokens == stats.completion_tokens == (10 + 1) + (len(completion.text.split()) + 1)
    assert usage.latency_s is not None and usage.latency_s >= 0.1 and stats.latency_s >= 0.1
    assert usage.model == "openai:fake-model" and usage.retries == 1 and not usage.cached
    assert usage.cost_usd == (6 * 2.0 + usage.completion_tokens * 8.0) / 1e6 == stats.cost_usd()
    assert stats.truncated == 0  # the retry fixed it: nothing was handed back cut short


def test_cost_is_unknown_for_an_unpriced_remote_model_and_zero_for_a_local_one(fake_server, client_config):
    srv = fake_server()

    async def go():
        async with make_llm(client_config(srv)) as remote, FakeLLM(LLMConfig(backend="fake")) as local:
            return remote.step_usage((await remote.chat(ASK))[0]), remote.stats.as_dict(), \
                local.step_usage((await local.chat(ASK))[0]), local.stats.as_dict()

    remote, remote_stats, local, local_stats = asyncio.run(go())
    assert remote.cost_usd is None and remote_stats["cost_usd"] is None and "unknown" in remote_stats["cost"]
    assert local.cost_usd == 0.0 and local_stats["cost_usd"] == 0.0 and local_stats["cost"].startswith("local model")


def test_a_cached_answer_costs_nothing_and_says_so(tmp_path, fake_server, client_config):
    srv = fake_server()
    cfg = client_config(srv, cache_path=str(tmp_path / "cache.sqlite"),
                        price={"prompt_per_million": 1.0, "completion_per_million": 1.0})

    async def ask():
        async with make_llm(cfg) as llm:
            [c] = await llm.chat(ASK)
            return llm.step_usage(c), llm.stats

    fresh, _ = asyncio.run(ask())
    again, stats = asyncio.run(ask())
    assert not fresh.cached and fresh.cost_usd > 0
    assert again.cached and again.cost_usd == 0.0 and again.latency_s == 0.0 and again.retries == 0
    assert (again.prompt_tokens, again.completion_tokens) == (fresh.prompt_tokens, fresh.completion_tokens)
    assert stats.cache_hits == 1 and stats.calls == 0 and stats.prompt_tokens == 0 and stats.cost_usd() == 0.0


def test_unusable_answers_are_asked_again_then_handed_back_marked_never_raised(fake_server, client_config):
    """A tool call whose arguments are not JSON, and a 400 tool_use_failed, come back marked after the retries."""
    srv = fake_server(rules=[Rule(match="garbage", answer=ToolCallAnswer("lookup", "{broken")),
                             Rule(match="refuse", answer=Fault("refused"))])

    async def go():
        async with make_llm(client_config(srv, max_retries=2)) as llm:
            garbage = await llm.chat([{"role": "user", "content": "garbage"}], tools=TOOLS)
            refused = await llm.chat([{"role": "user", "content": "refuse"}], tools=TOOLS)
            return garbage[0], refused[0], llm.stats

    garbage, refused, stats = asyncio.run(go())
    assert garbage.unusable == "tool call 'lookup' has invalid JSON arguments" and garbage.retries == 2
    assert refused.unusable.startswith("refused tool call: Failed to call a function")
    assert refused.text.startswith("<function=lookup>")  # the generation the server refused
    assert stats.unusable == 2 and stats.truncated == 0 and stats.failures == 0 and stats.calls == 6


def test_an_emulated_tool_call_off_the_grammar_is_retried_and_its_tokens_counted():
    """The embedded engines' path: the backend marks the answer; the wrapper asks again, then hands it back."""
    answer = Completion('{"nam', [], "length", Usage(40, 16), unusable="emulated tool call unparseable")

    async def go():
        async with FakeLLM(LLMConfig(backend="fake", max_retries=2, backoff_base_s=0.0), [lambda r: answer]) as llm:
            [c] = await llm.chat(ASK, tools=TOOLS)
            return c, llm.stats

    c, stats = asyncio.run(go())
    assert c.finish_reason == "length" and c.unusable and c.retries == 2
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (3 * 40, 3 * 16)
    assert (stats.prompt_tokens, stats.completion_tokens, stats.calls, stats.truncated) == (120, 48, 3, 1)


def test_usage_totals_sum_steps_and_make_cost_unknown_when_one_call_had_no_price():
    from schemas.models import Usage as StepUsage

    def traj(i: int, *usages: StepUsage) -> Trajectory:
        steps = [TextObservation(content="task", source="user")]
        steps += [MessageAction(content=f"m{j}", usage=u) for j, u in enumerate(usages)]
        return with_usage(Trajectory(id=f"t{i}", source="x", steps=steps))

    priced = StepUsage(model="m", prompt_tokens=10, completion_tokens=2, latency_s=0.5, cost_usd=0.01)
    cached = StepUsage(model="m", prompt_tokens=10, completion_tokens=2, latency_s=0.0, cost_usd=0.0, cached=True)
    unpriced = StepUsage(model="m", prompt_tokens=1, completion_tokens=1, latency_s=0.1)
    a, b = traj(0, priced, cached), traj(1, unpriced)
    assert a.details["usage"] == {"calls": 2, "cached": 1, "prompt_tokens": 20, "completion_tokens": 4,
                                  "latency_s": 0.5, "cost_usd": 0.01}
    assert usage_totals([a])["cost_usd"] == 0.01
    both = usage_totals([a, b])
    assert both["calls"] == 3 and both["prompt_tokens"] == 21 and both["cost_usd"] is None
    # A step without usage (not made by a model) counts nothing; a record without any has no totals.
    plain = with_usage(Trajectory(id="p", source="x", steps=[ApiAction(function="f")]))
    assert "usage" not in plain.details and usage_totals([plain])["calls"] == 0
