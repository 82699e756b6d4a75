"""The users agents serve: an LLM persona (tau2-style) for any task, configured per run.

    user: {kind: auto}                      # the environment's default user
    user: {kind: llm, llm: {...}}           # an LLM persona (the method's model unless `llm` is given)
    user: {kind: rules}                     # the environment's rule-based user (retail)
    user: {kind: scenario}                  # a deterministic user speaking from the task's scenario (envs/scenario_user.py)
    user: {kind: none}                      # no user: the agent's message is its final answer

The persona plays the person a task describes: `metadata["user_scenario"]` in tau2-bench's layout
(instructions with reason for call, known and unknown info, task instructions), or, for tasks
without one, the task's instruction as what the user wants. It reveals what it knows only when
asked, never invents what it does not know, and ends with `###STOP###` once served (or after
`max_turns` of its messages). It answers from the task and the conversation only, so it keeps no
state of its own, and its calls go through the LLM cache like any other.

    user: {kind: llm, fidelity: {on_broken: quarantine, judge_llm: {...}}}

A model-played user's turns are checked against the scenario after each episode (`fidelity`,
filters/user_fidelity.py): an episode with a broken turn is quarantined, or kept and marked.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from backends.base import LLM
from backends.config import LLMConfig
from envs.base import USER_STOP, Task, UserReply, UserSimulator
from schemas.models import Step

UserKind = Literal["auto", "llm", "rules", "scenario", "none"]
# The user kinds whose turns a model writes (the persona, the simulator's user): the ones fidelity checks.
MODEL_USERS = frozenset({"llm persona", "simulated"})


class FidelityConfig(BaseModel):
    """`user.fidelity`: check every turn of a model-played user against its scenario (filters/user_fidelity.py)."""

    model_config = ConfigDict(extra="forbid")

    check: bool = Field(True, description="check the turns of model-played users (persona, simulator)")
    on_broken: Literal["quarantine", "mark"] = Field(
        "quarantine", description="an episode with a broken user turn: quarantined, or kept and marked")
    judge: bool = Field(True, description="also ask a judge model (judge_llm, else the method's judge.llm); "
                                          "without one, the rules alone")
    judge_llm: LLMConfig | None = Field(None, description="the fidelity judge's model")


class UserConfig(BaseModel):
    """The `user:` block of a config."""

    model_config = ConfigDict(extra="forbid")

    kind: UserKind = "auto"
    llm: LLMConfig | None = Field(None, description="the persona's model; default: the method's model")
    max_turns: int = Field(12, ge=1, description="user messages before the user leaves")
    temperature: float = Field(0.0, ge=0, description="sampling temperature of the persona")
    fidelity: FidelityConfig = Field(default_factory=FidelityConfig, description="the check of the user's turns")


PERSONA_SYSTEM = """You are playing a customer who contacts an agent for help. Stay in this role for the whole \
conversation.

Rules:
- Write one message at a time, as the customer would: short, natural, in the first person.
- Follow the scenario below. Never invent facts it does not give you: what it does not say, you do \
not know, and you say so when asked.
- Share what you know only when the agent asks for it or needs it for the next step; do not recite \
the scenario at once, and do not copy its wording.
- Answer the agent's questions and confirm or refuse what it proposes, as the scenario wants.
- When everything you came for is done (or the agent cannot do it and you have nothing left to ask), \
reply with exactly {stop} and nothing else. Also reply {stop} if you are transferred to another agent.

<scenario>
{scenario}
</scenario>"""


def scenario_text(task: Task) -> str:
    """The persona's brief: a tau2 `user_scenario` rendered as text, else the task's request."""
    scenario = task.metadata.get("user_scenario")
    if not isinstance(scenario, dict):
        return f"What you want: {task.instruction}"
    parts: list[str] = []
    persona = scenario.get("persona")
    if persona:
        parts.append(f"Persona: {persona}")
    instructions = scenario.get("instructions")
    if isinstance(instructions, dict):
        labels = (("domain", "Domain"), ("reason_for_call", "Reason for call"), ("known_info", "Known info"),
                  ("unknown_info", "Unknown info"), ("task_instructions", "Task instructions"))
        parts += [f"{label}: {instructions[key]}" for key, label in labels if instructions.get(key)]
    elif isinstance(instructions, str) and instructions.strip():
        parts.append(instructions.strip())
    return "\n".join(parts) if parts else f"What you want: {task.instruction}"


def persona_messages(task: Task, conversation: Sequence[Step]) -> list[dict[str, Any]]:
    """The persona's chat: its own lines as `assistant`, the agent's messages as `user`.

    Tool calls and results stay hidden from the user: they happen on the agent's side.
    """
    msgs: list[dict[str, Any]] = [{"role": "system", "content": PERSONA_SYSTEM.format(stop=USER_STOP,
                                                                                     scenario=scenario_text(task))}]
    for step in conversation:
        if step.kind == "text" and step.source == "user":
            # The user's own tool calls (dual control) and what they gave, then what it said.
            for n, call in enumerate(step.extra.get("user_tool_calls") or []):
                call_id = f"user_call_{len(msgs)}_{n}"
                msgs.append({"role": "assistant", "content": "", "tool_calls": [{
                    "id": call_id, "type": "function", "function": {
                        "name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}]})
                msgs.append({"role": "tool", "tool_call_id": call_id, "content": str(call.get("result", ""))})
            if step.content:
                msgs.append({"role": "assistant", "content": step.content})
        elif step.kind == "message" and step.extra.get("kind") != "revision":
            msgs.append({"role": "user", "content": step.content})
    if len(msgs) == 1 or msgs[1]["role"] != "user":
        # Chat templates want the first turn from the `user` side: the agent's greeting opens the call.
        msgs.insert(1, {"role": "user", "content": "Hi! How can I help you today?"})
    return msgs


# What the persona says when the run's turn cap (`max_turns`) ends the conversation (not the model's words).
TURN_CAP_REPLY = f"I have to go now. {USER_STOP}"


class PersonaUser(UserSimulator):
    """An LLM playing the person a task describes."""

    kind = "llm persona"

    def __init__(self, llm: LLM, *, max_turns: int = 12, temperature: float = 0.0, opening_from_model: bool = True):
        self.llm = llm
        self.max_turns = max_turns
        self.temperature = temperature
        # tau2 tasks describe a situation, not a first message: the persona writes its own opening.
        self.opening_from_model = opening_from_model

    async def opening(self, task: Task) -> str:
        if not self.opening_from_model or not isinstance(task.metadata.get("user_scenario"), dict):
            return task.instruction
        return await self._say(task, [])

    async def reply(self, task: Task, conversation: Sequence[Step]) -> UserReply:
        turns = sum(1 for s in conversation if s.kind == "text" and s.source == "user")
        if turns >= self.max_turns:
            return UserReply(text=TURN_CAP_REPLY, stop=True)
        return await self._answer(task, conversation)

    async def _say(self, task: Task, conversation: Sequence[Step]) -> str:
        return (await self._answer(task, conversation)).text

    async def _answer(self, task: Task, conversation: Sequence[Step]) -> UserReply:
        """The persona's next message, or the calls of its own tools it makes first (where it has tools)."""
        from generators.agent import openai_tools  # the wire specs the agent's tools use (imported late: no cycle)

        extra: dict[str, Any] = {"tools": openai_tools(self.tools)} if self.tools else {}
        answer = (await self.llm.chat(persona_messages(task, conversation), temperature=self.temperature, **extra))[0]
        calls = [{"name": c.name, "arguments": _arguments(c.arguments)} for c in answer.tool_calls or []]
        text = (answer.text or "").strip()
        if not text and not calls:
            raise UserSimulationError(f"the user model gave an empty answer for task {task.id}")
        return UserReply(text=text, stop=USER_STOP in text, tool_calls=calls)


def _arguments(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw and raw.strip() else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class UserSimulationError(RuntimeError):
    """The user model gave no usable answer (see the LLM ledger)."""


def describe_user(config: UserConfig) -> dict[str, Any]:
    """The user config as JSON-safe data for trajectory details (no secrets: LLM configs hold env var names)."""
    return json.loads(config.model_dump_json(exclude_none=True))
