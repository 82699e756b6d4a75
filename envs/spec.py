"""The world a run acts in, as configured: environment, its config, its tasks, its user.

Every method that acts in an environment, and `trajforge envs check`, read the same keys:

    env: mcp                      # a registered environment
    env_config: {...}             # the environment's own settings (server, policy, ...)
    tasks: {source: tau2, ...}    # where tasks come from (envs/tasks.py)
    user: {kind: auto}            # who answers the agent's messages (envs/users.py)
    max_observation_chars: 262144 # longer observations are cut (the record keeps the whole text once)

`EnvFactory` turns them into environments: the world with its user and, for worlds that need a
model (the LLM-simulated one) or a persona user, the LLM they use. Those LLMs are the method's own
(same cache, same stats) unless the config names another, which is then made once per run, cached
beside the method's cache in the output directory, and closed by `aclose()`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from backends.base import LLM
from backends.config import LLMConfig
from envs.base import Environment, Task
from envs.registry import env_class, make_env
from envs.tasks import TaskSourceConfig, load_tasks
from envs.users import PersonaUser, UserConfig
from envs.scenario_user import ScenarioUser
from schemas.cut import DEFAULT_MAX_OBSERVATION_CHARS


class EnvSpec(BaseModel):
    """The environment keys of a config (mixed into every method config that acts in a world)."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field("retail", description="environment name (retail, web, simulated, mcp, or any registered)")
    env_config: dict[str, Any] = Field(default_factory=dict, description="the environment's own settings")
    tasks: TaskSourceConfig = Field(default_factory=TaskSourceConfig, description="where the tasks come from")
    user: UserConfig = Field(default_factory=UserConfig, description="who answers the agent's messages")
    max_observation_chars: int | None = Field(
        DEFAULT_MAX_OBSERVATION_CHARS, ge=1, description="observations (tool results, pages, user turns) longer "
        "than this are cut where they leave the world; the record keeps the whole text once (None: no limit)")

    def env_spec(self) -> EnvSpec:
        return EnvSpec(env=self.env, env_config=self.env_config, tasks=self.tasks, user=self.user,
                       max_observation_chars=self.max_observation_chars)

    @model_validator(mode="after")
    def _known_env_and_keys(self) -> EnvSpec:
        check_env(self.env, self.env_config)
        return self


def check_env(name: str, config: dict[str, Any]) -> None:
    """A config names a registered environment and only settings it takes (checked before any run)."""
    try:
        cls = env_class(name)
    except KeyError as exc:
        raise ValueError(str(exc.args[0])) from None
    check_env_config(name, cls, config)


def check_env_config(name: str, cls: Any, config: dict[str, Any]) -> None:
    """Unknown env_config keys are named at once, not as a TypeError deep inside a run."""
    if "max_steps" in config:
        raise ValueError("env_config: max_steps is not an environment setting: write max_steps at the top level of "
                         "the config (agent actions per episode; one setting for the method and its world)")
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    # `from_mcp` stands for the tools and policy of a real MCP server (worlds that take both: simulated).
    derived = {"from_mcp"} if {"tools", "policy"} <= set(params) else set()
    unknown = sorted(set(config) - set(params) - {"user"} - derived)
    if unknown:
        allowed = ", ".join(sorted(k for k in params if k not in ("user", "llm")))
        raise ValueError(f"env_config: unknown key(s) {', '.join(unknown)} for environment {name!r}"
                         f" (accepted: {allowed or 'none'})")


def uses_method_model(spec: EnvSpec) -> bool:
    """Whether a part of the world uses the method's model (the config's `llm`): a user, a judge, a simulator."""
    judge = spec.env_config.get("judge")
    return ((spec.user.kind == "llm" and spec.user.llm is None)
            or (isinstance(judge, dict) and judge.get("llm") is None)
            or (getattr(env_class(spec.env), "needs_llm", False) and spec.env_config.get("llm") is None))


class EnvFactory:
    """Builds (unstarted) environments of one spec; `async with factory.make() as env:` starts one."""

    def __init__(self, spec: EnvSpec, llm: LLM | None = None, output: Path | None = None,
                 judge: LLM | None = None) -> None:
        self.spec = spec.env_spec()
        if "from_mcp" in self.spec.env_config:  # a simulation of a real MCP server: its tools and policy
            from envs.mcp.simulate import simulated_from_mcp

            self.spec = self.spec.model_copy(update={"env_config": simulated_from_mcp(self.spec.env_config)})
        self.llm = llm
        self.output = output
        # The method's episode length: the world's own step cap never ends an episode before it does.
        self.max_steps: int | None = getattr(spec, "max_steps", None)
        # The grading model, for worlds that judge episodes (`judge` parameter); None: they use their own.
        self.judge = judge
        self._own: dict[str, LLM] = {}
        self.cls = env_class(self.spec.env)

    # ---- LLMs -----------------------------------------------------------------------------------

    def _llm_for(self, role: str, config: LLMConfig | dict[str, Any] | None) -> LLM:
        if config is None:
            if self.llm is None:
                raise ValueError(f"the {role} needs a model: give it an llm config, or run it from a method")
            return self.llm
        if role not in self._own:
            from backends.registry import make_llm

            cfg = config if isinstance(config, LLMConfig) else LLMConfig.model_validate(config)
            if cfg.cache_path is None and self.output is not None:
                cfg = cfg.model_copy(update={"cache_path": str(self.output / f"_{role}_llm_cache.sqlite")})
            self._own[role] = make_llm(cfg)
        return self._own[role]

    # ---- environments ---------------------------------------------------------------------------

    def make(self) -> Environment:
        config = dict(self.spec.env_config)
        if getattr(self.cls, "needs_llm", False) and not isinstance(config.get("llm"), LLM):
            config["llm"] = self._llm_for("env", config.get("llm"))
        judge = config.get("judge")
        if isinstance(judge, dict):  # judge: {} is the method's grading model, judge: {llm: ...} its own
            config["judge"] = self._llm_for("judge", judge["llm"]) if judge.get("llm") else (self.judge or self._llm_for("judge", None))
        elif judge is None and self.judge is not None and "judge" in inspect.signature(self.cls).parameters:
            config["judge"] = self.judge
        if getattr(self.cls, "writes_files", False) and self.output is not None:
            config.setdefault("output_dir", str(self.output))  # files the records point to (screenshots), logs
        cap = inspect.signature(self.cls).parameters.get("max_steps")
        if isinstance(self.max_steps, int) and cap is not None and isinstance(cap.default, int):
            config["max_steps"] = max(cap.default, self.max_steps)
        env = make_env(self.spec.env, **config)
        env.max_observation_chars = self.spec.max_observation_chars
        user = self.spec.user
        if user.kind == "none":
            env.user = None
        elif user.kind == "llm":
            env.user = PersonaUser(self._llm_for("user", user.llm), max_turns=user.max_turns,
                                   temperature=user.temperature)
        elif user.kind == "scenario":
            env.user = ScenarioUser(max_turns=user.max_turns)
        elif user.kind == "rules" and (env.user is None or env.user.kind != "rules"):
            raise ValueError(f"environment {self.spec.env!r} has no rule-based user; use user.kind llm or none")
        return env

    def tasks(self) -> list[Task]:
        """The run's tasks (a world's own generator works on an unstarted environment)."""
        env = self.make() if self.spec.tasks.source == "env" else None
        # A world with a Python of its own (an MCP server's venv) is where its `pkg://` task files are.
        interpreter = getattr(self.cls, "package_interpreter", None)
        return load_tasks(self.spec.tasks, self.spec.env, env,
                          interpreter(self.spec.env_config) if interpreter is not None else None)

    def describe(self) -> dict[str, Any]:
        """The env, its task source and user as JSON-safe data for trajectory details (no LLM objects).

        Bulky inputs (tools are on the trajectory already; policies and seeds can be long) are
        summarised by a hash instead of repeated in every record.
        """
        bulky = {"llm", "tools", "seeds", "policy", "tasks"}
        config = {k: v for k, v in self.spec.env_config.items() if k not in bulky}
        for key in sorted((bulky - {"llm"}) & set(self.spec.env_config)):
            config[f"{key}_sha256"] = hashlib.sha256(json.dumps(self.spec.env_config[key], default=str, sort_keys=True)
                                                     .encode()).hexdigest()[:16]
        return {"name": self.spec.env, "config": json.loads(json.dumps(config, default=str)),
                "tasks": self.spec.tasks.model_dump(mode="json", exclude_defaults=True),
                "user": self.spec.user.kind}

    async def aclose(self) -> None:
        own, self._own = self._own, {}
        for llm in own.values():
            await llm.aclose()
        release = getattr(self.cls, "release_shared", None)  # e.g. a browser kept up between episodes
        if release is not None:
            await release()
