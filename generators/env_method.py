"""What every method that acts in an environment shares: its env keys, its tasks, its agent, its records.

A method config mixes in `EnvSpec` (env, env_config, tasks, user); `EnvMethod` builds the
environments (`self.envs`), loads the run's tasks once before the run starts, reads the tools
from a started environment (an MCP server lists them), and closes what it opened at the end.
Trajectories made in an environment record the same facts wherever they come from: the task
(so step verification can replay it), the environment and its config, the episode's evaluation,
and the task split in provenance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Iterable, Literal

from pydantic import Field, model_validator

from backends.base import LLM
from backends.registry import make_llm
from envs.base import Environment, Evaluation, Task
from envs.spec import EnvFactory, EnvSpec
from generators.agent import SYSTEM as AGENT_SYSTEM
from generators.agent import AgentPolicy
from generators.base import GenerationMethod, MethodConfig, RunSummary, TaskSpec, llm_config_for
from schemas.models import Step, Tool, Trajectory
from schemas.store import Dataset


class EnvMethodConfig(MethodConfig, EnvSpec):
    """A method that acts in an environment."""

    max_steps: int = Field(20, ge=1, description="agent actions per episode")
    max_parse_failures: int = Field(3, ge=1, description="unusable answers before the episode ends")
    agent_mode: Literal["tools", "text"] = "tools"
    agent_temperature: float | None = None
    # What the method needs from its world (see Environment.offers); checked when the config loads.
    requires: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="after")
    def _world_offers_what_the_method_needs(self) -> EnvMethodConfig:
        from envs.registry import env_class

        missing = sorted(self.requires - env_class(self.env).offers(self.env_config))
        if missing:
            what = {"pages": "web pages to explore", "state": "a state a verifier can read (state())",
                    "generator": "a task generator of its own", "snapshot": "snapshots"}
            raise ValueError(f"{self.method} needs {', '.join(what.get(m, m) for m in missing)}; "
                             f"environment {self.env!r} does not offer it")
        return self


class EnvMethod(GenerationMethod):
    """A method whose tasks come from its environment's task source."""

    config: EnvMethodConfig
    # Methods whose tasks come from elsewhere (input trajectories, tutorials) do not read the task source.
    uses_task_source: ClassVar[bool] = True

    def __init__(self, config: EnvMethodConfig, llm: Any):
        super().__init__(config, llm)
        self.envs = EnvFactory(config, llm)
        self._tasks: dict[str, Task] | None = None
        self._tools: list[Tool] | None = None
        self._policy_text: str | None = None
        self._role_llms: list[LLM] = []
        # One started environment held for the whole run: worlds that share resources between their
        # instances (an MCP server pool, a browser) keep them alive across episodes instead of restarting.
        self._anchor: Environment | None = None

    # ---- set-up ---------------------------------------------------------------------------------

    def prepare(self, output: Dataset) -> None:
        self.envs.output = Path(output.path)
        self.envs.judge = self.judge_model

    async def setup(self) -> None:
        """Start the run's anchor environment and read its tools and policy (an MCP server lists them)."""
        if self._anchor is None:
            anchor = self.envs.make()
            await anchor.start()
            self._anchor = anchor
            self._tools = anchor.tools()
            self._policy_text = anchor.policy

    def role_llm(self, role: str, output: Dataset) -> LLM | None:
        """The model of `role` (a `RoleModel` field of the config), cached in `output`; None when unset.

        Closed with the run's environments.
        """
        if getattr(self.config, role).llm is None:
            return None
        llm = make_llm(llm_config_for(self.config, Path(output.path), role))
        self._role_llms.append(llm)
        return llm

    async def run(self, tasks: Iterable[TaskSpec], output: Dataset, *, progress: Any = None) -> RunSummary:
        try:
            return await super().run(tasks, output, progress=progress)
        finally:
            await self.teardown()

    async def teardown(self) -> None:
        """Release the anchor environment, the models the environments made and the role models."""
        anchor, self._anchor = self._anchor, None
        if anchor is not None:
            await anchor.close()
        await self.envs.aclose()
        await self.close_role_llms()

    async def close_role_llms(self) -> None:
        owned, self._role_llms = self._role_llms, []
        for llm in owned:
            await llm.aclose()

    def env_tasks(self) -> dict[str, Task]:
        """The run's tasks by id, from the config's task source (loaded once)."""
        if self._tasks is None:
            self._tasks = {t.id: t for t in self.envs.tasks()} if self.uses_task_source else {}
        return self._tasks

    @property
    def tools(self) -> list[Tool]:
        if self._tools is None:
            raise RuntimeError("the tools are read by setup(), which run() calls first")
        return self._tools

    def make_env(self) -> Environment:
        return self.envs.make()

    # ---- the agent ------------------------------------------------------------------------------

    def agent_system(self) -> str:
        """The agent's system prompt: how to act, then the environment's policy where it has one."""
        if self._policy_text:
            return f"{AGENT_SYSTEM}\n\n# Policy\n{self._policy_text}"
        return AGENT_SYSTEM

    def policy(self, temperature: float | None = None, *, llm: Any = None, seed: int | None = None) -> AgentPolicy:
        t = self.config.agent_temperature if temperature is None else temperature
        return AgentPolicy(llm or self.llm, self.tools, mode=self.config.agent_mode, temperature=t,
                           system=self.agent_system(), seed=seed)

    # ---- records --------------------------------------------------------------------------------

    def trajectory(self, task: Task, key: str, steps: list[Step], evaluation: Evaluation | None, *,
                   parents: Iterable[str] = (), seed: int | None = None, **details: Any) -> Trajectory:
        """A trajectory of `task` (id `<method>/<task id><key>`) with what every env record carries."""
        reward = evaluation.reward if evaluation is not None else None
        split = task.metadata.get("split")
        return Trajectory(
            id=f"{self.name}/{task.id}{key}",
            source=self.name,
            steps=list(steps),
            tools=self.tools,
            reward=reward,
            success=evaluation.success if evaluation is not None else None,
            provenance=self.provenance(task.id, parents=parents, seed=task.seed if seed is None else seed)
            .model_copy(update={"source_id": task.id, "task_split": split}),
            details={"task": task.model_dump(mode="json"), "env": self.envs.describe(),
                     "env_config": self.config.env_config,
                     **({"split": split} if split else {}),
                     **({"evaluation": evaluation.as_dict()} if evaluation is not None else {}),
                     **details},
        )
