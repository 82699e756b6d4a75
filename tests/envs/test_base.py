"""The environment interface: registry, Task model, async wrappers."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from envs import Environment, Task, available_envs, make_env, register_env
from envs.retail.env import RetailEnv
from envs.web.env import WebShopEnv
from schemas.models import ApiAction


def test_make_env_builds_builtins_with_config() -> None:
    env = make_env("retail", seed=3)
    assert isinstance(env, RetailEnv) and env.seed == 3
    assert isinstance(make_env("web", seed=1), WebShopEnv)
    assert {"retail", "web"} <= set(available_envs())


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


def test_async_wrappers_delegate_to_sync() -> None:
    env: Environment = make_env("retail", seed=0)
    task = env.generate_tasks(1)[0]

    async def run() -> float:
        await env.areset(task)
        result = await env.astep(ApiAction(function="think", arguments={"thought": "plan"}))
        return result.reward

    assert asyncio.run(run()) == 0.0


def test_reset_refuses_task_of_other_env() -> None:
    env = make_env("web")
    with pytest.raises(ValueError):
        env.reset(Task(id="t", env="retail", instruction="x"))
