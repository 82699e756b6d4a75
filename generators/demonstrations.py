"""Demonstrations: an environment's reference solutions, recorded as trajectories (no model acts).

Each task's reference solution (`env.reference_solution`: tau2's gold actions followed by a message
with what the user must hear, MiniWoB's scripted solvers, a site task's `solution`, the built-in
worlds' goal actions) is played through the one episode loop by a proposer that replays it. A
demonstration therefore looks exactly like an agent's episode of the task: the opening, each
action with the observation it got, and the environment's own evaluation, after the system prompt an
agent of the same config receives (its first step, as in every environment trajectory). It gives an
improve loop training data without a strong teacher model.

Tasks without a reference solution are filtered ("no reference solution"); a reference that does
not solve its task is kept with `success = false` (supervised exports leave it out). The config's
`llm` is only used by whatever in the world needs a model (a persona user without a model of its
own); by default there is none.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal, Sequence

from pydantic import Field, model_validator

from backends.config import LLMConfig
from envs.base import Task
from generators._episode import play_episode, renumber_calls
from filters.policy_rules import DOMAINS, PolicyCheck, describe as describe_violation, violations_of
from generators.agent import AgentPolicy, Proposal
from envs.scenario_user import scenario_facts
from filters.grounding import describe as describe_ungrounded, ungrounded_calls
from generators.blueprint import MODEL, TEMPLATE, BlueprintAgent, authentication_calls, blueprint, rewrites_of
from generators.grounder import Grounder
from generators.base import TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.failures import episode_failure
from generators.registry import register_method
from schemas.models import Action, Provenance, Step, TextObservation

NO_REFERENCE = "no reference solution"
MAX_DIALOGUE_STEPS = 200  # a blueprint ends the episode when it is played out; this only stops a runaway
REFERENCE_MODEL = "reference-solution"


class DemonstrationsConfig(EnvMethodConfig):
    method: Literal["demonstrations"] = "demonstrations"
    llm: LLMConfig = Field(default_factory=lambda: LLMConfig(backend="fake", model=REFERENCE_MODEL),
                           description="the model that words a dialogue's agent messages (dialogue: true), and "
                                       "what in the world needs a model; the placeholder: template messages")
    dialogue: bool = Field(False, description=(
        "play the gold calls as a dialogue that obeys the policy (generators/blueprint.py): the agent asks for "
        "identity, states each write and gets a yes, reports the outcome; needs a user (user.kind scenario or llm)"))
    ground: bool = Field(True, description=(
        "dialogue: before a call uses a value nobody said, ask the user for it (where the user knows it) or make the "
        "reads a real agent makes (false: tau2's gold calls alone); either way a dialogue whose calls still use such "
        "a value is dropped, counted"))
    policy_check: PolicyCheck = Field(default_factory=PolicyCheck,
                                      description="the policy's rules a dialogue obeys and is checked by (default: "
                                                  "the task's tau2 domain's, else retail's)")

    @model_validator(mode="after")
    def _dialogue_has_a_user(self) -> DemonstrationsConfig:
        if self.dialogue and self.user.kind not in ("scenario", "llm"):
            raise ValueError("dialogue: true needs a user to talk to: user: {kind: scenario} (deterministic) or "
                             "{kind: llm} (a persona)")
        return self


class Replay:
    """A proposer that knows no model: it proposes the given actions, one per call, in order, after the
    system step `agent` (the config's agent policy) would open the episode with."""

    def __init__(self, actions: Sequence[Action], agent: AgentPolicy) -> None:
        self.actions = list(actions)
        self.agent = agent
        self.taken = 0

    def system_step(self, guidance: str | None = None) -> TextObservation:
        return self.agent.system_step(guidance)

    async def propose(self, history: list[Step], *, n: int = 1) -> list[Proposal]:
        action = self.actions[self.taken]
        self.taken += 1
        return [Proposal(action.model_copy(), raw="")] * n


@register_method
class Demonstrations(EnvMethod):
    """The environment's reference solutions (tau2 gold actions, MiniWoB solvers) recorded as trajectories."""

    name = "demonstrations"
    uses_reference_solutions = True
    Config = DemonstrationsConfig
    config: DemonstrationsConfig

    def tasks(self) -> Iterable[TaskSpec]:
        return [TaskSpec(id=task.id, instruction=task.instruction, payload={"task": task.id})
                for task in self.env_tasks().values()]

    async def run_task(self, spec: TaskSpec) -> TaskResult:
        task = self.env_tasks()[spec.payload["task"]]
        result = TaskResult()
        try:
            async with self.make_env() as env:
                actions = await env.reference_solution(task)
                if actions is None:
                    result.counts[f"filtered:{NO_REFERENCE}"] += 1
                    result.reject(self._placeholder(task), "demonstrations", NO_REFERENCE)
                    return result
                if self.config.dialogue:
                    return await self._dialogue(env, task, actions, result)
                episode = await play_episode(env, Replay(actions, self.policy()), task, max_steps=max(1, len(actions)))
        except Exception as exc:  # noqa: BLE001 - classified and quarantined; the run goes on
            stage, error = episode_failure(exc)
            result.fail(spec.id, stage, error, {"task": task.id})
            return result
        steps = renumber_calls(episode.steps)
        # The prompts are the ones an agent of this config gets (`details["render"]`); the actions are
        # the reference's, answers to no request: declared written.
        written = self.scripted(steps, "the environment's reference solution")["rewrites"]
        result.trajectories.append(self.trajectory(task, "", steps, episode.evaluation, reference_actions=len(actions),
                                                   **{**episode.details(), "rewrites": written}))
        episode.count(result.counts)
        return result

    async def _dialogue(self, env: Any, task: Task, actions: Sequence[Action], result: TaskResult) -> TaskResult:
        """The gold calls as a dialogue that obeys the policy, grounded (generators/blueprint.py); dropped (counted)
        where a call still uses a value nobody said, or the rule check finds a write without a confirmation or an
        act before authentication."""
        check = self.config.policy_check.rules(task.model_dump(mode="json"), DOMAINS["retail"])
        assert check is not None
        tools = env.tools()
        writes = set(getattr(env, "state_changing_tools", ()) or ())
        terminal = set(getattr(getattr(env, "config", None), "terminal_tools", ()) or ())
        told = [str(x) for x in task.goal.get("communicate_info") or []]
        known = scenario_facts(task)[1]
        authenticate = authentication_calls(known, check.auth_tools, check.public_tools, actions)
        turns = blueprint(actions, writes=writes, auth_tools=check.auth_tools, told=told, authenticate=authenticate,
                          confirm=check.confirm_writes)
        writer = None if self.config.llm.model == REFERENCE_MODEL else self.llm
        grounder = Grounder(env, tools, reads={t.name for t in tools} - writes - terminal, auth_tools=check.auth_tools,
                            public_tools=check.public_tools, gold=actions, known=known) if self.config.ground else None
        agent = BlueprintAgent(turns, self.policy(), writer, told, grounder)
        episode = await play_episode(env, agent, task, max_steps=MAX_DIALOGUE_STEPS)
        steps = renumber_calls(episode.steps)
        texts = {who: agent.texts.count(who) for who in (MODEL, TEMPLATE) if who in agent.texts}
        grounding = {"variant": "reads" if self.config.ground else "gold", **agent.inserted,
                     **({"probes": grounder.probes} if grounder is not None else {})}
        record = self.trajectory(task, "", steps, episode.evaluation, reference_actions=len(actions),
                                 **{**episode.details(), "rewrites": rewrites_of(steps, agent.texts),
                                    "agent_text": texts, "dialogue": "blueprint", "grounding": grounding,
                                    **({"added_authentication": len(authenticate)} if authenticate else {})})
        episode.count(result.counts)
        result.counts["grounding_reads"] += agent.inserted["reads"]
        result.counts["grounding_asks"] += agent.inserted["asks"]
        ungrounded = ungrounded_calls(steps, tools)
        if ungrounded:
            result.counts["filtered:ungrounded"] += 1
            result.reject(record, "grounding", f"ungrounded: {describe_ungrounded(ungrounded)}")
            return result
        if agent.inserted["reads"] or agent.inserted["asks"]:
            result.counts["grounded_by_inserted_turns"] += 1
        result.counts["policy_checked"] += 1
        found = violations_of(record, check, writes)
        for _, rule, _ in found:
            result.counts[f"policy:{rule}"] += 1
        if found:
            result.counts[f"filtered:policy: {found[0][1]}"] += 1
            result.reject(record, "policy_rules", describe_violation(found))
        else:
            result.trajectories.append(record)
        return result

    def _placeholder(self, task: Task) -> Any:
        """The record a filtered task leaves: the task, without steps."""
        return self.trajectory(task, "", [], None)

    def provenance(self, task_id: str, *, parents: Iterable[str] = (), seed: int | None = None) -> Provenance:
        return super().provenance(task_id, parents=parents, seed=seed).model_copy(update={"model": REFERENCE_MODEL})
