"""The LLM-simulated environment against the fake OpenAI-compatible server (real HTTP)."""

from __future__ import annotations

import asyncio
import json

import pytest

from backends.config import LLMConfig
from backends.fake_server import FakeServer, Rule
from backends.registry import make_llm
from envs.base import Task
from envs.registry import make_env
from envs.simulated import SimulatedEnv, SimulationError
from schemas.models import ApiAction, CodeAction, MessageAction
from tests.factories import tool_trajectory

BOOK = {"name": "book_flight", "description": "Book a flight.",
        "parameters": {"type": "object", "properties": {"flight": {"type": "string"}, "seats": {"type": "integer"}},
                       "required": ["flight", "seats"], "additionalProperties": False}}
POLICY = "At most 4 seats per booking."
TASK = Task(id="t1", env="simulated", instruction="Book 2 seats on flight AF12.", metadata={"user_name": "Ana"})


def _cfg(base_url: str) -> LLMConfig:
    return LLMConfig(backend="openai", base_url=base_url, model="fake-model", api_key_env=None, max_retries=0,
                     request_timeout_s=5)


def _prompt(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def _system(body: dict) -> str:
    return body["messages"][0]["content"]


def simulator(body: dict):
    prompt = _prompt(body)
    if prompt.startswith("SIMULATE TOOL STEP"):
        action = prompt.rsplit("The agent now", 1)[1]
        if "book_flight" in action:
            return {"observation": '{"booking": "B-1", "seats": 2}', "done": False}
        return {"observation": "Great, thanks! ###STOP###", "done": False}
    if prompt.startswith("JUDGE EPISODE"):
        booked = '"booking": "B-1"' in prompt
        return {"reasoning": "booked" if booked else "nothing booked", "reward": 1.0 if booked else 0.0}
    if prompt.startswith("SIMULATE START PAGE"):
        return {"url": "http://shop/", "done": False,
                "axtree": json.dumps({"url": "http://shop/", "title": "Shop", "elements": [
                    {"bid": "1", "role": "link", "name": "Mugs", "clickable": True},
                    {"bid": "2", "role": "button", "name": "Cart", "clickable": True}]})}
    if prompt.startswith("SIMULATE PAGE"):
        return {"url": "http://shop/mugs", "axtree": '{"url": "http://shop/mugs", "title": "Mugs", "elements": []}',
                "done": False}
    return None


def test_tool_mode_validation_stop_marker_judge_and_snapshot():
    async def main(server: FakeServer) -> None:
        llm = make_llm(_cfg(server.base_url))
        env = make_env("simulated", tools=[BOOK], policy=POLICY, llm=llm, seeds=[tool_trajectory(0)])
        assert isinstance(env, SimulatedEnv) and [t.name for t in env.tools()] == ["book_flight"]
        first = (first,) = await env.reset(TASK)
        assert first.source == "user" and first.content == TASK.instruction
        assert server.log == []  # the first user turn is the instruction: no model call

        # Arguments that fail the schema / an unknown tool / code: error observations, no model call.
        bad = await env.step(ApiAction(function="book_flight", arguments={"flight": "AF12", "seats": "two"},
                                        tool_call_id="c0"))
        assert bad.observation.content.startswith("Error: argument 'seats' must be of type integer")
        assert bad.info["error"] and not bad.done and bad.observation.tool_call_id == "c0"
        unknown = await env.step(ApiAction(function="cancel_all", arguments={}))
        assert "unknown tool 'cancel_all'" in unknown.observation.content
        code = await env.step(CodeAction(language="python", content="print(1)"))
        assert "code actions are not supported" in code.observation.content
        assert server.log == []

        before = env.snapshot()
        ok = await env.step(ApiAction(function="book_flight", arguments={"flight": "AF12", "seats": 2},
                                       tool_call_id="c1"))
        assert ok.observation.content == '{"booking": "B-1", "seats": 2}' and not ok.done
        assert ok.observation.name == "book_flight" and ok.observation.tool_call_id == "c1"
        sent = server.log[-1]["body"]
        assert POLICY in _system(sent) and "Find item 0" in _system(sent)  # policy and seed example shown
        assert '"user_name": "Ana"' in _prompt(sent)  # hidden task info for the simulated user
        assert sent["response_format"]["type"] == "json_schema"

        bye = await env.step(MessageAction(content="Booked B-1 for you."))
        assert bye.done and bye.observation.source == "user" and "###STOP###" in bye.observation.content
        after = await env.step(MessageAction(content="anything else?"))
        assert after.done and after.info["error"] == "the episode is over"
        verdict = await env.evaluate()
        assert verdict.reward == 1.0 and verdict.success and verdict.reason == "booked"
        calls = len(server.log)
        assert (await env.evaluate()).reward == 1.0 and len(server.log) == calls  # judged once per history

        # Restore: back before the booking, any number of times; the judge sees that history.
        end = env.snapshot()
        env.restore(before)
        assert not env.done and len(env.history) == 7
        assert (await env.evaluate()).reward == 0.0
        env.restore(before)
        env.restore(end)
        assert env.done and len(env.history) == 11
        with pytest.raises(ValueError, match="cannot restore"):
            env.restore(make_env("retail", seed=0).snapshot())
        await llm.aclose()

    with FakeServer(rules=[Rule(fn=simulator)]) as server:
        asyncio.run(main(server))


def test_done_flag_max_steps_and_bad_answers():
    async def main(server: FakeServer) -> None:
        # An LLM config instead of an instance: the env makes (and closes) its own client.
        env = SimulatedEnv(tools=[BOOK], policy=POLICY, llm=_cfg(server.base_url), max_steps=2)
        await env.reset(TASK)
        first = await env.step(MessageAction(content="Which flight?"))
        assert first.done is False
        second = await env.step(MessageAction(content="Still there?"))
        assert second.done and second.info["truncated"]
        await env.reset(TASK.model_copy(update={"instruction": "DONE NOW"}))
        assert (await env.step(MessageAction(content="ok"))).done  # the model's done flag ends it
        await env.reset(TASK.model_copy(update={"instruction": "GARBAGE"}))
        with pytest.raises(SimulationError, match="ToolTurn"):
            await env.step(MessageAction(content="ok"))
        await env.close()

    def rule(body: dict):
        prompt = _prompt(body)
        if "GARBAGE" in prompt:
            return "not json at all"
        return {"observation": "ok, bye", "done": "DONE NOW" in prompt}

    with FakeServer(rules=[Rule(fn=rule)]) as server:
        asyncio.run(main(server))


def test_web_mode_pages_and_tasks():
    async def main(server: FakeServer) -> None:
        llm = make_llm(_cfg(server.base_url))
        env = make_env("simulated", mode="web", policy="A small shop selling mugs.", llm=llm,
                       tasks=["Buy a mug.", {"instruction": "Open the cart.", "metadata": {"k": 1}}])
        assert [t.name for t in env.tools()] == ["click", "type", "scroll", "go_back", "goto"]
        tasks = env.generate_tasks(3, seed=1)
        assert [t.id for t in tasks] == ["simulated-s1-0000", "simulated-s1-0001", "simulated-s1-0002"]
        assert {t.instruction for t in tasks} == {"Buy a mug.", "Open the cart."}
        assert env.generate_tasks(3, seed=1) == tasks
        request, start = await env.reset(tasks[0])
        assert request.content == "Buy a mug." and start.kind == "web" and start.url == "http://shop/" and json.loads(start.axtree)["title"] == "Shop"
        page = await env.step(ApiAction(function="click", arguments={"bid": "1"}, tool_call_id="c1"))
        assert page.observation.kind == "web" and page.observation.url == "http://shop/mugs"
        assert page.observation.tool_call_id == "c1" and not page.done
        assert "PAGE http://shop/" in _prompt(server.log[-1]["body"])  # the history shows the earlier page
        n = len(server.log)
        bad = await env.step(ApiAction(function="click", arguments={}))
        assert "missing required argument 'bid'" in bad.observation.content and len(server.log) == n
        end = await env.step(MessageAction(content="I bought the mug."))
        assert end.done and end.info["answer"] == "I bought the mug." and len(server.log) == n
        # A start page given in the config needs no model call.
        fixed = SimulatedEnv(mode="web", llm=llm, start_page={"url": "http://x/", "axtree": '{"title": "x", "elements": []}'})
        assert (await fixed.reset(tasks[0]))[1].url == "http://x/" and len(server.log) == n
        with pytest.raises(NotImplementedError):
            fixed.generate_tasks(1)
        await llm.aclose()

    with FakeServer(rules=[Rule(fn=simulator)]) as server:
        asyncio.run(main(server))


def test_config_errors():
    with pytest.raises(ValueError, match="needs tools"):
        SimulatedEnv(policy="x")
    with pytest.raises(ValueError, match="mode"):
        SimulatedEnv(tools=[BOOK], mode="desktop")  # type: ignore[arg-type]
    openai_style = SimulatedEnv(tools=[{"type": "function", "function": BOOK}])
    assert openai_style.tools()[0].name == "book_flight"

    async def talk() -> None:
        await openai_style.reset(TASK)
        await openai_style.step(MessageAction(content="hi"))

    with pytest.raises(ValueError, match="needs llm"):
        asyncio.run(talk())
