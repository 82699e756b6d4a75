"""What every method that acts in an environment shares: its env keys, its tasks, its agent, its records.

A method config mixes in `EnvSpec` (env, env_config, tasks, user); `EnvMethod` builds the
environments (`self.envs`), loads the run's tasks once before the run starts, reads the tools
from a started environment (an MCP server lists them), and closes what it opened at the end.
Trajectories made in an environment record the same facts wherever they come from: the task
(so step verification can replay it), the environment and its config, the episode's evaluation,
the task split in provenance, and what the acting model saw: the system step first, the tools as
sent, the render settings of its prompts (`details["render"]`), and the steps a method rewrote
(`details["rewrites"]`, `schemas.models.Rewrite`).
Where a model plays the user (the LLM persona, the simulator's
user), every user turn of every trajectory a task produced is checked against the task's scenario
(`user.fidelity`, filters/user_fidelity.py) and the verdicts go to `details["user_fidelity"]`; an
episode with a broken user turn is quarantined (stage "user") or, with `on_broken: mark`, kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Iterable, Literal

from pydantic import Field, model_validator

from backends.base import LLM
from backends.errors import EngineCrashed
from backends.registry import make_llm
from envs.base import Environment, Evaluation, Task
from envs.spec import EnvFactory, EnvSpec
from generators.agent import SYSTEM as AGENT_SYSTEM
from envs.users import MODEL_USERS
from generators.agent import AgentPolicy, agent_settings
from filters.policy_rules import PolicyCheck, describe as describe_violation, violations_of
from generators.base import GenerationMethod, MethodConfig, Role, RunSummary, TaskResult, TaskSpec
from schemas.models import RenderSettings, Rewrite, Step, Tool, Trajectory
from schemas.store import Dataset


# Where a world's evaluation is a model's, the model that grades it (the method's judge).
EPISODE_JUDGE = Role("episode judge", "grades episodes where the world's evaluation is a model's", ("judge",))


class EnvMethodConfig(MethodConfig, EnvSpec):
    """A method that acts in an environment."""

    max_steps: int = Field(20, ge=1, description="agent actions per episode")
    max_parse_failures: int = Field(3, ge=1, description="unusable answers before the episode ends")
    agent_mode: Literal["tools", "text"] = "tools"
    agent_temperature: float | None = None
    policy_check: PolicyCheck | None = Field(default_factory=PolicyCheck, description=(
        "the service policy's rule check on every episode (filters/policy_rules.py; default: the task's tau2 domain's "
        "rules, none for other tasks; null: off): a success that breaks it is recorded as a failure"))
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
    # Methods that read the environment's reference solutions (an oracle): `trajforge improve` keeps them off the
    # measured tasks.
    uses_reference_solutions: ClassVar[bool] = False

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
        # Set by setup(): whether a model plays the user (its turns are then checked), and the check's judge.
        self._checks_users = False
        self._user_kind: str | None = None
        self._fidelity_judge: LLM | None = None

    # ---- set-up ---------------------------------------------------------------------------------

    def roles_in_use(self) -> list[Role]:
        """The method's roles, and the episode judge where the world's evaluation is a model's: an MCP world's
        natural-language assertions (`env_config.judge: {}`), a simulated world's verdicts."""
        roles = super().roles_in_use()
        judge = self.config.env_config.get("judge")
        model_judged = (isinstance(judge, dict) and not judge.get("llm")) or (
            getattr(self.envs.cls, "needs_llm", False) and judge is None and not self.config.env_config.get("llm"))
        return [*roles, EPISODE_JUDGE] if model_judged else roles

    def prepare(self, output: Dataset) -> None:
        self.envs.output = Path(output.path)
        in_use = {r.name for r in self.roles_in_use()}
        self.envs.judge = self.model_for(EPISODE_JUDGE.name) if EPISODE_JUDGE.name in in_use else self.judge_model
        fidelity = self.config.user.fidelity
        if fidelity.judge and fidelity.judge_llm is not None and self._fidelity_judge is None:
            cfg = fidelity.judge_llm
            updates = {"ledger_path": str(Path(output.path) / "_fidelity_llm_ledger.jsonl")}
            if self.config.cache and cfg.cache_path is None:
                updates["cache_path"] = str(Path(output.path) / "_fidelity_llm_cache.sqlite")
            self._fidelity_judge = make_llm(cfg.model_copy(update=updates))
            self._role_llms.append(self._fidelity_judge)

    async def setup(self) -> None:
        """Start the run's anchor environment and read its tools and policy (an MCP server lists them)."""
        if self._anchor is None:
            anchor = self.envs.make()
            await anchor.start()
            self._anchor = anchor
            self._tools = anchor.tools()
            self._policy_text = anchor.policy
            self._user_kind = anchor.user.kind if anchor.user is not None else None
            self._checks_users = self.config.user.fidelity.check and self._user_kind in MODEL_USERS

    async def run(self, tasks: Iterable[TaskSpec], output: Dataset, *, progress: Any = None) -> RunSummary:
        try:
            return await super().run(tasks, output, progress=progress)
        finally:
            await self.teardown()

    async def _safe_run(self, task: TaskSpec) -> TaskResult:
        result = await super()._safe_run(task)
        for record in [*result.trajectories, *(item.record for item in result.filtered)]:
            if "policy" in record.details:
                result.counts["policy_broken"] += 1
        if self._checks_users:
            try:
                await self.check_users(result)
            except EngineCrashed:
                raise
            except Exception as exc:  # noqa: BLE001 - a judge that fails (LLMRequestError) quarantines the task
                records = [t.model_dump(mode="json") for t in result.trajectories]
                result = TaskResult(quarantined=result.quarantined, counts=result.counts)
                result.fail(task.id, "user", f"user_fidelity: the check failed: {type(exc).__name__}: {exc}", records)
        return result

    async def check_users(self, result: TaskResult) -> None:
        """Check the user turns of `result`'s trajectories; quarantine or mark those with a broken user."""
        from filters.user_fidelity import check_user_turns, task_of, user_turns

        fidelity = self.config.user.fidelity
        judge = self._fidelity_judge or (self.judge_model if fidelity.judge else None)
        kept: list[Trajectory] = []
        for trajectory in result.trajectories:
            if not user_turns(trajectory.steps):
                kept.append(trajectory)
                continue
            task = task_of(trajectory)
            # A simulated world's own user invents its facts with the world's; a persona has only its scenario's.
            facts = self._user_kind != "simulated" or isinstance(task.metadata.get("user_scenario"), dict)
            verdict = await check_user_turns(task, trajectory.steps, judge=judge, tools=trajectory.tools, facts=facts)
            trajectory.details["user_fidelity"] = verdict.as_dict()
            result.counts["user_fidelity:checked"] += 1
            if verdict.ok:
                kept.append(trajectory)
                continue
            result.counts["user_fidelity:broken"] += 1
            result.counts[f"user_fidelity:{verdict.broken[0].label}"] += 1
            if fidelity.on_broken == "mark":
                kept.append(trajectory)
            else:
                result.fail(trajectory.provenance.task_id or trajectory.id, "user", f"user_fidelity: {verdict.reason}",
                            trajectory.model_dump(mode="json"))
        result.trajectories = kept

    async def teardown(self) -> None:
        """Release the anchor environment, the models the environments made and the role models."""
        anchor, self._anchor = self._anchor, None
        if anchor is not None:
            await anchor.close()
        await self.envs.aclose()
        await self.close_role_llms()

    async def close_role_llms(self) -> None:
        owned, self._role_llms = self._role_llms, []
        self._fidelity_judge = None
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

    def render_settings(self) -> RenderSettings:
        """How the agent's prompts are rendered (`policy()`), recorded in every trajectory's `details["render"]`."""
        return agent_settings(self.config.agent_mode)

    def policy(self, temperature: float | None = None, *, llm: Any = None, draw: int | None = None) -> AgentPolicy:
        """The agent; `draw` k makes it independent draw k of the run (sampling seed `seed + k`)."""
        t = self.config.agent_temperature if temperature is None else temperature
        return AgentPolicy(llm or self.llm, self.tools, mode=self.config.agent_mode, temperature=t,
                           system=self.agent_system(), seed=None if draw is None else self.config.seed + draw)

    # ---- records --------------------------------------------------------------------------------

    @staticmethod
    def scripted(steps: list[Step], reason: str) -> dict[str, Any]:
        """Details of a record whose actions no model chose (a task's solution run by a check): no render
        settings, every action declared written."""
        actions = [i for i, s in enumerate(steps) if s.kind in ("api", "code", "message")]
        return {"render": None, "rewrites": [Rewrite(steps=actions, kind="written", reason=reason).model_dump()]
                if actions else []}

    def trajectory(self, task: Task, key: str, steps: list[Step], evaluation: Evaluation | None, *,
                   parents: Iterable[str] = (), seed: int | None = None, **details: Any) -> Trajectory:
        """A trajectory of `task` (id `<method>/<task id><key>`) with what every env record carries.

        `steps` open with the agent's system step (the episode loop puts it there); `details["render"]`
        says how its prompts were rendered from them, so exporters rebuild each request exactly."""
        reward = evaluation.reward if evaluation is not None else None
        split = task.metadata.get("split")
        record = Trajectory(
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
                     "render": self.render_settings().model_dump(), **details},
        )
        return self.held_to_policy(record)

    def held_to_policy(self, record: Trajectory) -> Trajectory:
        """`record`, a failure where it succeeded by breaking its policy's rules (acting before authentication,
        writing without a confirmed yes): the world's reward stays, `details["policy"]` says what broke."""
        check = self.config.policy_check
        rules = check.rules(record.details.get("task")) if check is not None and record.success else None
        found = violations_of(record, rules) if rules is not None else []
        if found:
            record.success = False
            record.details["policy"] = {"broken": describe_violation(found),
                                        "violations": [{"step": i, "rule": r, "what": w} for i, r, w in found]}
        return record
