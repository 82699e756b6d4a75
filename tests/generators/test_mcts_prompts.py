"""Per-step costs of the search: incremental prompts equal full renders; memoised retail calls equal fresh ones."""

from __future__ import annotations

import asyncio

import json

from backends.config import LLMConfig
from backends.fake_backend import FakeLLM
from converters.export.render import RenderOptions, messages, render
from envs.retail.env import RetailEnv
from envs.retail.memo import MEMO, clear_caches
from envs.retail.tasks import generate_tasks
from generators.agent import AgentPolicy
from schemas.models import ApiAction, MessageAction, Step, TextObservation, Trajectory


def _full(policy: AgentPolicy, history: list[Step]) -> list[dict]:
    opts = RenderOptions(reasoning=False, web_max_chars=policy.max_history_chars)
    return messages(render(Trajectory(id="p", source="agent", steps=history), opts, require_assistant=False))


def _histories() -> list[list[Step]]:
    """Growing histories over shared step objects, with the shapes that make rendering stateful."""
    user = TextObservation(content="cancel my order", source="user")
    system = TextObservation(content="store policy", source="environment")
    a1 = ApiAction(function="get_order_details", arguments={"order_id": "#1"}, tool_call_id="x")
    o1 = TextObservation(content='{"status": "pending"}', source="environment", tool_call_id="x")
    bad = TextObservation(content="garbled", source="agent", train=False, label="bad")
    err = TextObservation(content="Error: unreadable", source="environment", name="parse_error", train=False)
    a2 = ApiAction(function="think", arguments={"thought": "a"})  # no call id: rendered as call_<index>
    a3 = ApiAction(function="think", arguments={"thought": "b"})  # merged into a2's message
    o2 = TextObservation(content="ok", source="environment")
    o3 = TextObservation(content="ok too", source="environment")
    msg = MessageAction(content="done")
    reply = TextObservation(content="thanks", source="user")
    full = [system, user, a1, o1, bad, err, a2, a3, o2, o3, msg, reply]
    histories = [full[:k] for k in range(2, len(full) + 1)]
    # A branch off the shared prefix and a history whose tail starts on an observation.
    histories += [full[:4] + [a2, o2], full[:4] + [o2], full[:7]]
    return histories


def test_incremental_prompts_equal_full_renders() -> None:
    for mode in ("tools", "text"):
        policy = AgentPolicy(FakeLLM(LLMConfig(backend="fake", model="m")), [], mode=mode)
        fresh = AgentPolicy(FakeLLM(LLMConfig(backend="fake", model="m")), [], mode=mode)
        for history in _histories():
            assert _full(policy, history) == policy._rendered.messages(history)
            assert policy.prompt(list(history)) == fresh.prompt(history)
            fresh._rendered = type(fresh._rendered)(fresh._rendered.opts)  # never reuses: a full render each time
        assert len(policy._rendered._entries) > 0


def test_memoised_calls_equal_fresh_calls_and_keep_tokens() -> None:
    clear_caches()
    task = generate_tasks(1, seed=0, kinds=["cancel"])[0]
    order = task.metadata["user_info"]["order_id"]
    calls = [("get_order_details", {"order_id": order}), ("get_order_details", {"order_id": "#W0000000"}),
             ("cancel_pending_order", {"order_id": order, "reason": "bogus"}),
             ("cancel_pending_order", {"order_id": order, "reason": task.metadata["user_info"]["reason"]}),
             ("cancel_pending_order", {"order_id": order, "reason": "no longer needed"}),
             ("get_order_details", {"order_id": order})]

    async def episode() -> tuple[list[tuple], dict]:
        env = RetailEnv(0)
        await env.reset(task)
        out = []
        for function, arguments in calls:
            r = await env.step(ApiAction(function=function, arguments=arguments, tool_call_id="c"))
            out.append((r.observation.content, r.done, r.info, env.db.tokens()))
        return out, {"state": env.state(), "reward": (await env.evaluate()).reward}

    def play() -> tuple[list[tuple], dict]:
        return asyncio.run(episode())

    first, state1 = play()
    entries = len(MEMO)
    second, state2 = play()  # every call now comes from the memo
    assert entries == len(calls) and len(MEMO) == entries
    assert first == second and state1 == state2
    assert json.loads(first[3][0])["status"] == "cancelled" and state1["reward"] == 1.0
    assert "error" in first[2][2] and first[2][3] == first[1][3]  # a refused call changes nothing
    assert first[4][2].get("rule_violation") and first[4][3] == first[3][3]  # rolled back: tokens unchanged
    assert first[0][3] == first[1][3] != first[3][3]  # lookups change nothing; the write does


def test_exports_rebuild_windowed_requests_exactly() -> None:
    """With a history window that drops messages, each trl-sft row of the episode is still the very request the
    agent sent (the export runs the agent's own request function over the stored record)."""
    from converters.export import preview
    from generators._episode import play_episode
    from generators.scripted import ScriptedRetailLLM, cancel_tasks

    task = cancel_tasks(1)[0]
    llm = ScriptedRetailLLM([task])
    policy = AgentPolicy(llm, RetailEnv(0).tools(), max_history_chars=300)

    async def episode():
        async with RetailEnv(0) as env:
            return await play_episode(env, policy, task, max_steps=8)

    steps = asyncio.run(episode()).steps
    sent = [_arguments_as_objects(r.messages) for r in llm.requests]
    # The window dropped messages: a later request is no longer than the one before it.
    assert len(sent) >= 3 and any(len(b) <= len(a) for a, b in zip(sent, sent[1:]))
    traj = Trajectory(id="w", source="rollout", steps=steps, tools=policy.tools,
                      details={"render": policy.settings.model_dump()})
    rows = preview(traj, "trl-sft").rows
    assert [_arguments_as_objects(r["prompt"]) for r in rows] == sent
    assert all(r["prompt"][0] == {"role": "system", "content": steps[0].content} for r in rows)
    # --history full: the whole history instead, one segment (no step is masked): system prompt and task, then all.
    (full,) = preview(traj, "trl-sft", history="full").rows
    assert [m["role"] for m in full["prompt"]] == ["system", "user"] and full["prompt"][0] == rows[0]["prompt"][0]
    assert sum(m["role"] == "assistant" for m in full["completion"]) == len(rows)


def _arguments_as_objects(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _object(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def _object(arguments: str | dict) -> dict:
    return arguments if isinstance(arguments, dict) else json.loads(arguments)


def test_a_tool_result_longer_than_the_window_is_in_the_next_request() -> None:
    """A result bigger than the whole history window stays in the request after it (with its call), and the
    export rebuilds that request: dropping it made the model see the previous request again and repeat the call."""
    from converters.export import preview

    system = TextObservation(content="policy", source="environment", name="system", train=False)
    user = TextObservation(content="list everything", source="user")
    call = ApiAction(function="list_all", arguments={}, tool_call_id="call_2")
    big = TextObservation(content="x" * 5000, source="environment", tool_call_id="call_2")
    answer = MessageAction(content="Here is the list.")
    policy = AgentPolicy(FakeLLM(LLMConfig(backend="fake", model="m")), RetailEnv(0).tools(), max_history_chars=1000)
    sent = policy.prompt([system, user, call, big])
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[-1]["content"] == big.content and sent[-2]["tool_calls"][0]["function"]["name"] == "list_all"
    traj = Trajectory(id="w", source="rollout", steps=[system, user, call, big, answer], tools=policy.tools,
                      details={"render": policy.settings.model_dump()})
    rows = preview(traj, "trl-sft").rows
    assert _arguments_as_objects(rows[-1]["prompt"]) == _arguments_as_objects(sent)
