"""tau2-bench tasks: the task source (splits, ids), tau2's criteria, the LLM persona user and the
NL-assertion judge against the fake OpenAI-compatible server, a simulation copied from the server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from backends.config import LLMConfig
from backends.fake_server import FakeServer, FakeServerConfig, Rule
from envs.base import USER_STOP
from envs.criteria import CallRecord, evaluate_criteria
from envs.spec import EnvFactory, EnvSpec
from envs.tasks import TaskFileError, TaskSourceConfig, load_tasks
from envs.users import UserConfig
from schemas.models import MessageAction, TextObservation
from tests.envs.mcp_support import TASKS, play, tau2_config

def source(**kwargs: Any) -> TaskSourceConfig:
    return TaskSourceConfig(source="tau2", path=TASKS, **kwargs)


def test_tau2_source_uses_train_by_default_and_refuses_test_tasks() -> None:
    train = load_tasks(source(), "mcp")
    assert len(train) == 74 and {t.metadata["split"] for t in train} == {"train"}
    first = train[0]
    assert first.id == "tau2-retail-0" and first.metadata["upstream_id"] == "0" and first.env == "mcp"
    assert first.instruction.startswith("You received your order #W2378156")
    assert first.metadata["user_scenario"]["instructions"]["known_info"] == "You are Yusuf Rossi in zip code 19122."
    assert first.goal["reward_basis"] == ["DB", "NL_ASSERTION"] and first.goal["actions"][0]["name"] == "find_user_id_by_name_zip"

    with pytest.raises(TaskFileError, match=r"40 task\(s\) of the benchmark's test split .*--allow-test-split"):
        load_tasks(source(split="test"), "mcp")
    with pytest.raises(TaskFileError, match="test split"):
        load_tasks(source(split="all", ids=["tau2-retail-5"]), "mcp")
    assert len(load_tasks(source(split="test", allow_test_split=True), "mcp")) == 40
    assert [t.id for t in load_tasks(source(split="all", ids=["tau2-retail-0"]), "mcp")] == ["tau2-retail-0"]
    assert load_tasks(source(n=2, options={"id_prefix": "r"}), "mcp")[1].id == "r1"


def test_tau2_source_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "tasks.json"
    bad.write_text("{not json")
    with pytest.raises(TaskFileError, match=r"tasks.json: the tasks file is not JSON"):
        load_tasks(TaskSourceConfig(source="tau2", path=str(bad)), "mcp")
    bad.write_text(json.dumps([{"id": "1", "user_scenario": {"instructions": "Help me."}}]))
    (task,) = load_tasks(TaskSourceConfig(source="tau2", path=str(bad)), "mcp")  # no split file: unsplit
    assert task.metadata["split"] is None and task.id == "tau2-1" and task.goal["reward_basis"] == ["DB", "COMMUNICATE"]
    with pytest.raises(TaskFileError, match="no split_tasks.json"):
        load_tasks(TaskSourceConfig(source="tau2", path=str(bad), split="train"), "mcp")
    # A task the source cannot read is marked with its reason (its episodes are quarantined); the file loads.
    bad.write_text(json.dumps([{"id": "1", "initial_state": {"initialization_data": {"robot_data": {}}}},
                               {"id": "2", "user_scenario": "Help me."}]))
    first, second = load_tasks(TaskSourceConfig(source="tau2", path=str(bad)), "mcp")
    assert first.metadata["unrunnable"].endswith("task #0: initialization_data holds agent_data and user_data only")
    assert "unrunnable" not in second.metadata and second.instruction == "Help me."


def test_criteria_follow_tau2_rules() -> None:
    goal = {"actions": [{"name": "find", "arguments": {"q": "a"}},
                        {"name": "cancel", "arguments": {"id": "1", "reason": "x"}, "compare_args": ["id"]},
                        {"name": "cancel", "arguments": {"id": "2", "reason": "x"}}],
            "communicate_info": ["1234.50"], "reward_basis": ["DB", "ACTION", "COMMUNICATE"]}
    writes = {"cancel"}.__contains__
    said = [MessageAction(content="Your refund is on its way.")]

    async def judge(calls: list[CallRecord], history: list[Any], **kw: Any) -> Any:
        return await evaluate_criteria(goal, history, calls, is_write=writes, **kw)

    good = [CallRecord("find", {"q": "a"}, True, False), CallRecord("cancel", {"id": "1", "reason": "y"}, True, True),
            CallRecord("cancel", {"id": "2", "reason": "x"}, True, True)]
    # DB compares every argument of a write (compare_args limits ACTION only).
    verdict = asyncio.run(judge(good, said))
    assert verdict.details["DB"]["missing"] == ['cancel({"id": "1", "reason": "x"})']
    assert verdict.details["ACTION"]["passed"] and verdict.details["failed"] == ["DB", "COMMUNICATE"]
    good[1] = CallRecord("cancel", {"id": "1", "reason": "x"}, True, True)
    told = [MessageAction(content="Refund: $1,234.50.")]  # tau2 drops the agent's commas before comparing
    assert asyncio.run(judge(good, told)).success
    # A failed write changes nothing; an extra successful one does.
    assert asyncio.run(judge([*good, CallRecord("cancel", {"id": "3", "reason": "x"}, False, True)], told)).success
    extra = asyncio.run(judge([*good, CallRecord("cancel", {"id": "3", "reason": "x"}, True, True)], told))
    assert extra.details["DB"]["unexpected"] == ['cancel({"id": "3", "reason": "x"})'] and extra.reward == 0
    # A reference write that fails on a fresh state is not required.
    skip = asyncio.run(judge(good[:2], told, reference_ok=[True, True, False]))
    assert skip.details["DB"]["passed"] and not skip.details["ACTION"]["passed"]


# ---- the LLM persona and the judge, on the fake server ---------------------------------------------


def persona_and_judge(body: dict[str, Any]) -> Any:
    system = body["messages"][0]["content"]
    last = body["messages"][-1]["content"]
    if system.startswith("You grade a conversation"):
        told = "$8,276.23" in last.split("EXPECTED OUTCOMES")[0]
        return {"results": [{"assertion": "Agent should tell the user the total refund amount is $8,276.23.",
                             "reasoning": "said" if told else "never said", "met": told}]}
    if system.startswith("You are playing a customer"):
        if last == "Hi! How can I help you today?":
            return "Hi, I want to cancel two pending orders and return an item."
        if "name and zip" in last:
            return "Sure, here they are."
        return f"Thanks, that's all. {USER_STOP}"
    return None


def test_persona_user_and_nl_judge_on_a_tau2_task() -> None:
    task = load_tasks(source(ids=["tau2-retail-16"]), "mcp")[0]
    assert task.goal["nl_assertions"] == ["Agent should tell the user the total refund amount is $8,276.23."]
    with FakeServer(FakeServerConfig(rules=[Rule(fn=persona_and_judge)])) as server:
        llm = LLMConfig(backend="openai", base_url=server.base_url, model="fake-model", api_key_env=None,
                        max_retries=0, request_timeout_s=5).model_dump(exclude_none=True)
        spec = EnvSpec(env="mcp", env_config={**tau2_config(), "judge": {"llm": llm}},
                       user=UserConfig(kind="llm", llm=llm))

        async def episode(final: str) -> Any:
            factory = EnvFactory(spec)
            try:
                async with factory.make() as env:
                    reference = await env.reference_solution(task)
                    steps = await play(env, task, [MessageAction(content="Can I have your name and zip code?"),
                                                   *reference[:-1], MessageAction(content=final)])
                    return steps, env.done, await env.evaluate()
            finally:
                await factory.aclose()

        steps, done, verdict = asyncio.run(episode("Done: your total refund is $8,276.23."))
        opening, reply = steps[0], steps[2]
        assert isinstance(opening, TextObservation) and opening.source == "user"
        assert opening.content == "Hi, I want to cancel two pending orders and return an item."
        assert reply.content == "Sure, here they are." and done and USER_STOP in steps[-1].content
        assert verdict.success and verdict.details["NL_ASSERTION"]["assertions"][0]["met"], verdict.reason
        persona_prompt = next(e["body"]["messages"][0]["content"] for e in server.log
                              if e["body"]["messages"][0]["content"].startswith("You are playing a customer"))
        assert task.metadata["user_scenario"]["instructions"]["known_info"] in persona_prompt  # for the persona only

        _, _, verdict = asyncio.run(episode("Done, all processed."))
        assert not verdict.success and verdict.details["failed"] == ["NL_ASSERTION"]
        assert "assertion not met" in verdict.reason


def test_simulated_env_copies_the_servers_tools_and_policy() -> None:
    from envs.simulated.env import SimulatedEnv

    config = tau2_config()
    factory = EnvFactory(EnvSpec(env="simulated", env_config={"from_mcp": config, "llm": {"backend": "fake"}}))
    env = factory.make()
    assert isinstance(env, SimulatedEnv)

    async def real_tools() -> list[Any]:
        from envs.registry import make_env

        async with make_env("mcp", **config) as real:
            return [(t.name, t.parameters) for t in real.tools()], real.policy

    tools, policy = asyncio.run(real_tools())
    assert [(t.name, t.parameters) for t in env.tools()] == tools and env.policy == policy
    assert "state_key" not in json.dumps([t.parameters for t in env.tools()])
