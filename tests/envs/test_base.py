"""The environment contract: registry, async episodes, evaluation, users, replay restore, task sources, env specs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Sequence

import pytest
from pydantic import ValidationError

from envs import Environment, Task, available_envs, make_env, register_env
from envs.base import Checkpoint, Evaluation, UserReply, UserSimulator, checkpoint, restore, transitions
from envs.retail.env import RetailEnv
from envs.spec import EnvFactory, EnvSpec
from envs.tasks import TaskFileError, TaskSourceConfig, load_tasks, resolve_path
from envs.users import PersonaUser, UserConfig
from envs.web.env import WebShopEnv
from schemas.models import ApiAction, MessageAction, Step, TextObservation


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_make_env_builds_builtins_with_config() -> None:
    env = make_env("retail", seed=3)
    assert isinstance(env, RetailEnv) and env.seed == 3
    assert isinstance(make_env("web", seed=1), WebShopEnv)
    assert {"retail", "web", "simulated"} <= set(available_envs())


def test_make_env_unknown_name_lists_available() -> None:
    with pytest.raises(KeyError, match="available"):
        make_env("no-such-env")


def test_register_env_refuses_silent_replacement() -> None:
    register_env("test-dummy", WebShopEnv, replace=True)
    assert isinstance(make_env("test-dummy"), WebShopEnv)
    with pytest.raises(ValueError, match="already registered"):
        register_env("test-dummy", RetailEnv)


def test_task_model_forbids_unknown_fields() -> None:
    Task(id="t", env="retail", instruction="x")
    with pytest.raises(ValidationError):
        Task(id="t", env="retail", instruction="x", bogus=1)


def test_reset_refuses_task_of_other_env() -> None:
    with pytest.raises(ValueError, match="not 'web'"):
        run(make_env("web").reset(Task(id="t", env="retail", instruction="x")))


def test_evaluation_reward_is_bounded() -> None:
    with pytest.raises(ValueError, match="outside"):
        Evaluation(1.5, True, "too good")
    assert Evaluation.of(2.0, "clipped").reward == 1.0 and Evaluation.of(0.5, "half").success is False


def test_every_world_is_async_and_opens_with_the_request() -> None:
    async def main() -> None:
        for env in (make_env("retail"), make_env("web")):
            async with env:
                task = env.generate_tasks(1)[0]
                opening = await env.reset(task)
                assert opening[0].kind == "text" and opening[0].source == "user"
                assert opening[0].content == task.instruction
                result = await env.step(ApiAction(function="no_such_tool", arguments={}))
                assert result.observation.content.startswith("Error:") and "unknown tool" in result.info["error"]
                verdict = await env.evaluate()
                assert verdict.reward == 0.0 and not verdict.success and verdict.reason

    run(main())


class CountingUser(UserSimulator):
    kind = "counting"

    def __init__(self) -> None:
        self.calls = 0

    async def reply(self, task: Task, conversation: Sequence[Step]) -> UserReply:
        self.calls += 1
        return UserReply(text=f"answer {self.calls}")


def test_replay_restores_the_state_and_reuses_recorded_user_turns() -> None:
    async def main() -> None:
        user = CountingUser()
        env = RetailEnv(user=user)
        task = env.generate_tasks(3)[0]
        steps = list(await env.reset(task))
        for action in (await env.reference_solution(task) or [])[:-1]:
            result = await env.step(action)
            steps += [action, result.observation]
        ask = MessageAction(content="Anything else?")
        steps += [ask, (await env.step(ask)).observation]
        # A masked branch and a revision thought are not moves of the world: replay skips them.
        steps += [ApiAction(function="cancel_pending_order", arguments={"order_id": "#W0", "reason": "x"}, train=False),
                  TextObservation(content="Error: nope", source="environment", train=False),
                  MessageAction(content="I was wrong.", extra={"kind": "revision"})]
        assert user.calls == 1
        fresh = RetailEnv(user=user)
        await restore(fresh, Checkpoint(task, tuple(steps)))  # no snapshot: a replay
        assert fresh.replays == 1 and user.calls == 1  # the user's recorded answer was reused
        assert fresh.db.state_hash() == env.db.state_hash()
        assert [s for s in fresh.history if s.kind == "text" and s.source == "user"][-1].content == "answer 1"
        assert len(transitions(steps)) == len(task.goal["actions"]) + 1

    run(main())


def test_snapshot_checkpoint_restores_without_replay() -> None:
    async def main() -> None:
        env = RetailEnv()
        task = env.generate_tasks(1)[0]
        opening = await env.reset(task)
        point = checkpoint(env, opening)
        assert point.snapshot is not None
        await env.step(ApiAction(function="find_user_id_by_email", arguments={"email": "x@y.z"}))
        await restore(env, point)
        assert env.replays == 0 and env.history == list(opening)

    run(main())


# ---- env specs ------------------------------------------------------------------------------------

def test_env_factory_names_unknown_env_config_keys() -> None:
    with pytest.raises(ValidationError, match=r"unknown key\(s\) bogus for environment 'retail' \(accepted: .*seed"):
        EnvSpec(env="retail", env_config={"bogus": 1})
    with pytest.raises(ValidationError, match="unknown environment 'nosuch'"):
        EnvSpec(env="nosuch")


def test_env_factory_users() -> None:
    assert EnvFactory(EnvSpec(env="retail")).make().user.kind == "rules"
    assert EnvFactory(EnvSpec(env="retail", user=UserConfig(kind="none"))).make().user is None
    with pytest.raises(ValueError, match="has no rule-based user"):
        EnvFactory(EnvSpec(env="web", user=UserConfig(kind="rules"))).make()
    with pytest.raises(ValueError, match="needs a model"):
        EnvFactory(EnvSpec(env="retail", user=UserConfig(kind="llm"))).make()
    from backends.fake_backend import FakeLLM
    from backends.config import LLMConfig

    env = EnvFactory(EnvSpec(env="retail", user=UserConfig(kind="llm")), llm=FakeLLM(LLMConfig(backend="fake"))).make()
    assert isinstance(env.user, PersonaUser)
    # Without a user, the agent's message is its final answer: the episode ends.
    async def main() -> None:
        async with EnvFactory(EnvSpec(env="retail", user=UserConfig(kind="none"))).make() as quiet:
            await quiet.reset(quiet.generate_tasks(1)[0])
            assert (await quiet.step(MessageAction(content="Done."))).done

    run(main())


def test_env_spec_tasks_from_the_generator_with_ids_and_n() -> None:
    spec = EnvSpec(env="retail", tasks=TaskSourceConfig(n=3, seed=1))
    tasks = EnvFactory(spec).tasks()
    assert [t.id for t in tasks] == [f"retail-w0-s1-{i:04d}" for i in range(3)]
    picked = EnvFactory(EnvSpec(env="retail", tasks=TaskSourceConfig(n=5, seed=1, ids=[tasks[2].id]))).tasks()
    assert [t.id for t in picked] == [tasks[2].id]


# ---- task sources ---------------------------------------------------------------------------------

def test_jsonl_tasks_and_their_errors(tmp_path: Path) -> None:
    good = tmp_path / "tasks.jsonl"
    good.write_text(json.dumps({"instruction": "Do A"}) + "\n\n" + json.dumps({"id": "b", "instruction": "Do B"}) + "\n")
    tasks = load_tasks(TaskSourceConfig(source="jsonl", path=str(good)), "retail")
    assert [(t.id, t.env) for t in tasks] == [("task-0001", "retail"), ("b", "retail")]
    cases = {
        "not JSON": "{nope\n",
        "needs an 'instruction'": json.dumps({"id": "x"}) + "\n",
        "duplicate task id 'x'": json.dumps({"id": "x", "instruction": "a"}) + "\n" + json.dumps({"id": "x", "instruction": "b"}),
        "seed": json.dumps({"instruction": "a", "seed": "many"}) + "\n",
    }
    for problem, text in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(TaskFileError, match=problem):
            load_tasks(TaskSourceConfig(source="jsonl", path=str(bad)), "retail")
    with pytest.raises(TaskFileError, match="not a regular file"):
        load_tasks(TaskSourceConfig(source="jsonl", path="/dev/zero"), "retail")
    with pytest.raises(TaskFileError, match="unknown task source 'nope'"):
        load_tasks(TaskSourceConfig(source="nope"), "retail")


def test_package_paths_resolve_inside_installed_packages() -> None:
    assert resolve_path("pkg://envs/base.py").read_text().startswith('"""The one environment contract')
    with pytest.raises(TaskFileError, match="not installed"):
        resolve_path("pkg://no_such_package_here/x.json")


class NoSnapshots(Environment):
    name = "test-nosnap"
    evaluation = "always half"

    async def _reset(self, task: Task) -> None:
        self.moves: list[str] = []

    async def _act(self, action: Any) -> Any:
        from envs.base import StepResult

        self.moves.append(action.function)
        return StepResult(TextObservation(content=f"ok {len(self.moves)}", source="environment"))

    async def _evaluate(self, task: Task, history: Sequence[Step]) -> Evaluation:
        return Evaluation.of(0.5, "half")

    def tools(self) -> list[Any]:
        return []


def test_worlds_without_snapshots_refuse_them_and_replay_instead() -> None:
    async def main() -> None:
        env = NoSnapshots()
        task = Task(id="t", env="test-nosnap", instruction="go")
        steps = list(await env.reset(task))
        for n in range(3):
            a = ApiAction(function=f"f{n}", arguments={})
            steps += [a, (await env.step(a)).observation]
        assert env.capabilities().restore == "replay"
        with pytest.raises(NotImplementedError, match="restored by replay"):
            env.snapshot()
        point = checkpoint(env, steps[:5])
        assert point.snapshot is None
        await restore(env, point)
        assert env.moves == ["f0", "f1"] and env.replays == 1

    run(main())
