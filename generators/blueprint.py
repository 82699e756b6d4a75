"""Dialogues from blueprints (APIGen-MT style): a task's gold actions played as a conversation that obeys the
service policy, for `demonstrations` with `dialogue: true`.

The blueprint is the gold calls with the turns the policy asks for around them:

1. the user opens with the reason for the call (the user of the run: the deterministic scenario user,
   envs/scenario_user.py, or the LLM persona under its fidelity check);
2. before the first authentication call the agent asks for the identifying facts, and the user gives
   what its scenario knows (so the lookup's name and zip are ones the user said);
3. before each write the agent states the call and asks for an explicit yes; the user answers;
4. at the end the agent reports the outcome (what the user must hear, tau2's communicate_info).

The agent's words come from the acting model: each message is asked of it with the blueprint's intent in
its system prompt (hidden guidance: the recorded prompt is the plain one, declared as a `context` rewrite).
A message that does not do its job (no question where a yes is needed) falls back to the template text.
Where no model is configured (the `reference-solution` placeholder) every message is the template's, and
the record says so (`details.agent_text`). The calls are the gold's, declared `written`. The environment's
own check (tau2's DB check) decides success; filters/policy_rules.py checks the policy's order.

Grounded: with a `Grounder` (generators/grounder.py), before a call whose values nobody said the agent asks the
user for them or makes the reads a real agent makes; those turns are inserted into the blueprint as it is played.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Sequence

from backends.base import LLM
from envs.scenario_user import CONFIRM_ASK, FACT_ASK
from generators.agent import AgentPolicy, Proposal
from generators.grounder import Grounder
from generators.transcript import strip_reasoning
from schemas.models import Action, ApiAction, MessageAction, Step, TextObservation

TurnKind = Literal["ask_identity", "confirm", "ask_user_action", "report", "call"]
TEMPLATE = "template"
MODEL = "model"


@dataclass(frozen=True)
class Turn:
    kind: TurnKind
    call: ApiAction | None = None  # the gold call (`call`), or the write a `confirm` states
    intent: str = ""  # what the message must do (the hidden guidance)
    template: str = ""  # the message where no model writes it


def describe_call(call: ApiAction) -> str:
    """A call as the agent states it to the user: the action and every argument."""
    args = ", ".join(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in call.arguments.items())
    return f"{call.function.replace('_', ' ')}" + (f" ({args})" if args else "")


def _identity_fields(call: ApiAction) -> str:
    keys = [k.replace("_", " ") for k in call.arguments]
    if {"first name", "last name"} <= set(keys):
        keys = ["full name", *[k for k in keys if k not in ("first name", "last name")]]
    return " and ".join(keys) or "identifying details"


_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_NAME = re.compile(r"\b(?:I am|I'm|[Mm]y name is|I name is)\s+([A-Z][a-z]+)\s+([A-Z][a-z]+)")  # "I name": tau2's "You name is"
_ZIP = re.compile(r"\bzip(?: code)?(?: is)?\s+(\d{5})\b", re.I)


def authentication_calls(known: str, auth_tools: Iterable[str], public: Iterable[str],
                         actions: Sequence[Action]) -> list[ApiAction]:
    """The lookups that authenticate the user, where the gold touches private data without one (tau2's gold
    lists some tasks' writes alone): by each email the user's known facts give (in order: the user may have
    several, and not all are on file), else by name and zip."""
    calls = [a for a in actions if isinstance(a, ApiAction)]
    auth, free = set(auth_tools), set(public)
    first = next((c for c in calls if c.function not in free), None)
    if first is None or first.function in auth:
        return []
    emails = _EMAIL.findall(known)
    if "find_user_id_by_email" in auth and emails:
        return [ApiAction(function="find_user_id_by_email", arguments={"email": e.rstrip(".")}) for e in emails]
    name, zip_code = _NAME.search(known), _ZIP.search(known)
    if "find_user_id_by_name_zip" in auth and name and zip_code:
        return [ApiAction(function="find_user_id_by_name_zip", arguments={
            "first_name": name.group(1), "last_name": name.group(2), "zip": zip_code.group(1)})]
    return []


def blueprint(actions: Sequence[Action], *, writes: Iterable[str], auth_tools: Iterable[str],
              told: Sequence[str] = (), authenticate: Sequence[ApiAction] = (), confirm: bool = True) -> list[Turn]:
    """The turns of a dialogue around the gold `actions` (see the module doc); `told`: what the user must hear;
    `authenticate`: lookups to make first where the gold has none (authentication_calls); `confirm`: whether the
    policy asks for a stated action and a yes before each write."""
    writes, auth = set(writes), set(auth_tools)
    actions = [*authenticate, *actions]
    turns: list[Turn] = []
    asked = False
    done: list[str] = []
    for call in (a for a in actions if isinstance(a, ApiAction)):
        if call.extra.get("requestor") == "user":  # dual control: the user acts on its side, when asked by name
            stated = describe_call(call)
            turns.append(Turn("ask_user_action", call, f"ask the customer to do this on their side, naming it: "
                                                       f"{stated}", f"Could you please {stated} on your side?"))
            continue
        if call.function in auth and not asked:
            asked = True
            fields = _identity_fields(call)
            turns.append(Turn("ask_identity", call, f"ask the customer for their {fields} to verify their identity "
                                                    "before anything else (do not guess them)",
                              f"Before I can help, I need to verify your identity. Could you give me your {fields}?"))
        if call.function in writes:
            stated = describe_call(call)
            if confirm:
                turns.append(Turn("confirm", call, f"state exactly this action with its details and ask the customer "
                                                   f"to confirm it with yes or no before you do it: {stated}",
                                  f"Here is what I will do: {stated}. Do you confirm that I should proceed (yes/no)?"))
            done.append(stated)
        turns.append(Turn("call", call))
    outcome = f"I have completed: {'; '.join(done)}." if done else "I have looked into your request."
    info = f" {'; '.join(told)}." if told else ""
    turns.append(Turn("report", None, "tell the customer the outcome of what was done" +
                      (f", including: {'; '.join(told)}" if told else "") + ", and ask if there is anything else",
                      f"{outcome}{info} Is there anything else I can help you with?"))
    return turns


def usable(kind: TurnKind, text: str, told: Sequence[str]) -> bool:
    """Whether a model's message does its turn's job (else the template's is used)."""
    if not text.strip():
        return False
    if kind == "ask_identity":
        return "?" in text and FACT_ASK.search(text) is not None and CONFIRM_ASK.search(text) is None
    if kind == "confirm":
        return "?" in text and CONFIRM_ASK.search(text) is not None
    if kind == "ask_user_action":
        return False  # the user acts on the action's name: the template names it
    said = text.lower().replace(",", "")
    return all(t.lower().replace(",", "") in said for t in told)


class BlueprintAgent:
    """A proposer that plays a blueprint: the gold calls as they are, the messages from `writer` (the acting
    model under hidden guidance) or the template; with a `grounder`, what a real agent does before a call whose
    values nobody said. `texts` records, per message step, who wrote it; `inserted` counts the grounding turns."""

    def __init__(self, turns: Sequence[Turn], agent: AgentPolicy, writer: LLM | None, told: Sequence[str] = (),
                 grounder: Grounder | None = None) -> None:
        self.turns = list(turns)
        self.agent = agent
        self.writer = writer
        self.told = list(told)
        self.grounder = grounder
        self.taken = 0
        self.texts: list[str] = []  # MODEL or TEMPLATE, per message, in order
        self.inserted = {"asks": 0, "reads": 0, "reworded": 0}
        self._grounded: set[int] = set()

    @property
    def finished(self) -> bool:
        return self.taken >= len(self.turns)

    def system_step(self, guidance: str | None = None) -> TextObservation:
        return self.agent.system_step(guidance)

    async def _ground(self, turn: Turn, history: list[Step]) -> None:
        """Insert, before `turn`, what grounds its call: a question to the user and the reads."""
        call = turn.call
        if (self.grounder is None or call is None or turn.kind not in ("confirm", "call") or id(call) in self._grounded
                or call.extra.get("requestor") == "user" or call.function in self.grounder.auth):
            return
        self._grounded.add(id(call))
        self.inserted["reworded"] += self.grounder.reword(call, history)
        ask, reads = await self.grounder.before(call, history)
        extra: list[Turn] = []
        if ask:
            fields = " and ".join(k.replace("_", " ") for k in ask)
            extra.append(Turn("ask_identity", call, f"ask the customer for their {fields} (do not guess it)",
                              f"To help with that, I need your {fields}. Could you give me your {fields}?"))
        for read in reads:
            self._grounded.add(id(read))
            extra.append(Turn("call", read))
        self.inserted["asks"] += len(ask) > 0
        self.inserted["reads"] += len(reads)
        self.turns[self.taken:self.taken] = extra

    async def propose(self, history: list[Step], *, n: int = 1) -> list[Proposal]:
        await self._ground(self.turns[self.taken], history)
        turn = self.turns[self.taken]
        self.taken += 1
        if turn.kind == "call":
            assert turn.call is not None
            return [Proposal(turn.call.model_copy(), raw="")] * n
        message = await self._say(turn, history)
        return [Proposal(message, raw=message.content)] * n

    async def _say(self, turn: Turn, history: list[Step]) -> MessageAction:
        if self.writer is not None:
            guidance = (f"Blueprint for your next message (hidden from the customer): {turn.intent}. Reply with that "
                        "one message to the customer, in your own words, and no tool call.")
            guided = [self.agent.system_step(guidance), *history[1:]]
            completion = (await self.writer.chat(self.agent.prompt(guided), temperature=0.0))[0]
            text = strip_reasoning(completion.text or "")[0].strip()
            if not completion.unusable and usable(turn.kind, text, self.told if turn.kind == "report" else ()):
                self.texts.append(MODEL)
                return MessageAction(content=text, usage=self.writer.step_usage(completion))
        self.texts.append(TEMPLATE)
        return MessageAction(content=turn.template)


def rewrites_of(steps: Sequence[Step], texts: Sequence[str]) -> list[dict[str, Any]]:
    """The record's declared rewrites: gold calls and template messages `written`, model messages `context`
    (answers to a prompt that held the hidden blueprint)."""
    messages = [i for i, s in enumerate(steps) if s.kind == "message" and not s.extra.get("given")]
    calls = [i for i, s in enumerate(steps) if s.kind == "api" and not s.extra.get("given")]
    by_model = [i for i, who in zip(messages, texts) if who == MODEL]
    written = sorted(calls + [i for i, who in zip(messages, texts) if who != MODEL])
    out = []
    if written:
        out.append({"steps": written, "kind": "written", "reason": "the task's gold calls and template messages "
                                                                    "(blueprint dialogue)"})
    if by_model:
        out.append({"steps": by_model, "kind": "context", "reason": "the acting model wrote these under a hidden "
                                                                    "blueprint in its system prompt"})
    return out
