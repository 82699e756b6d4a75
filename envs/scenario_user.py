"""A deterministic user that speaks from a tau2 scenario (`user: {kind: scenario}`): no model plays it.

It opens with the reason for the call, gives its known facts when the agent asks for them (a name, a zip
code, an email, an id), answers an explicit confirmation request with an explicit yes, and leaves
(`###STOP###`) once the agent reports the outcome or offers more help. tau2 writes its scenarios to the
user in the second person ("You received your order..."); the user says them in the first person.

Where the world gives the user tools of its own (dual control, tau2 telecom), it makes the task's user-side
reference actions when the agent asks for them by name, and reports what they gave.

It never breaks character, so nothing is unscorable because of it: the user for evals of small models
(whose persona turns the fidelity check would mark) and for dialogues built from blueprints
(generators/blueprint.py). It knows only what the scenario says, and its answers are rules, not
conversation: an eval with it measures whether the agent serves a cooperative, terse customer.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from envs.base import USER_STOP, Task, UserReply, UserSimulator
from schemas.models import Step

_SWAPS = [(r"\byou are\b", "I am"), (r"\byou were\b", "I was"), (r"\byou have\b", "I have"), (r"\byou've\b", "I've"),
          (r"\byou're\b", "I'm"), (r"\byourself\b", "myself"), (r"\byours\b", "mine"), (r"\byour\b", "my")]
_OBJECT_AFTER = ("to|for|with|at|from|about|by|of|tell|told|give|gave|ask|asked|send|sent|help|helps|let|call|"
                 "asks|tells|contact|offer|offers|show|shows|charge|refund|transfer|than")
CONFIRM_ASK = re.compile(r"\b(confirm|proceed|go ahead|shall i|should i|would you like me to|do you want me to|"
                         r"is (?:that|this) (?:correct|right|ok)|(?:reply|answer|say) yes)\b", re.I)
FACT_ASK = re.compile(r"\b(name|zip|postal|e-?mail|user id|phone|account|address|order id|order number|"
                      r"reservation|booking)\b", re.I)
MORE_HELP = re.compile(r"\b(anything else|something else|further assistance|help (?:you )?with anything)\b", re.I)
YES = "Yes, please go ahead."
DONE = f"Thank you, that's all I needed. {USER_STOP}"
TURN_CAP = f"I have to go now. {USER_STOP}"


def first_person(text: str) -> str:
    """A second-person brief as the user says it ("You are Yusuf" -> "I am Yusuf")."""
    out = text.strip()
    for pattern, repl in _SWAPS:
        out = re.sub(pattern, lambda m, r=repl: r if m.group(0)[0].islower() or r == "I am" or r.startswith("I")
                     else r.capitalize(), out, flags=re.I)
    # What remains: "you" as an object after a preposition or a verb that takes one, else as the subject.
    out = re.sub(rf"\b({_OBJECT_AFTER})\s+you\b", lambda m: f"{m.group(1)} me", out, flags=re.I)
    out = re.sub(r"\byou\b", "I", out, flags=re.I)
    return re.sub(r"(^|[.!?]\s+)my\b", lambda m: m.group(1) + "My", out)


def scenario_facts(task: Task) -> tuple[str, str]:
    """(the reason for the call, the facts the user knows), first person, from the task's scenario."""
    scenario = task.metadata.get("user_scenario")
    instructions = scenario.get("instructions") if isinstance(scenario, dict) else None
    if isinstance(instructions, dict):
        reason = str(instructions.get("reason_for_call") or task.instruction)
        known = str(instructions.get("known_info") or "")
    else:  # a scenario that is one text, or none (a generated task's instruction): the user knows what it says
        reason = str(instructions or task.instruction)
        known = reason
    return first_person(reason), first_person(known)


class ScenarioUser(UserSimulator):
    """The scenario's user, played by rules (see the module doc)."""

    kind = "scenario"

    def __init__(self, *, max_turns: int = 12) -> None:
        self.max_turns = max_turns

    async def opening(self, task: Task) -> str:
        return scenario_facts(task)[0]

    async def reply(self, task: Task, conversation: Sequence[Step]) -> UserReply:
        turns = sum(1 for s in conversation if s.kind == "text" and s.source == "user")
        if turns >= self.max_turns:
            return UserReply(text=TURN_CAP, stop=True)
        last = conversation[-1] if conversation else None
        if last is not None and last.kind == "text" and last.extra.get("user_tool_calls"):  # after its own calls
            return UserReply(text="I did that on my side: " + "; ".join(
                f"{c['name']} gave {str(c.get('result', ''))[:200]}" for c in last.extra["user_tool_calls"]) + ".")
        said = str(getattr(last, "content", "")) if last is not None else ""
        call = self._asked_call(task, conversation, said)
        if call is not None:
            return UserReply(text="", tool_calls=[call])
        text = answer(said, *scenario_facts(task))
        return UserReply(text=text, stop=USER_STOP in text)

    def _asked_call(self, task: Task, conversation: Sequence[Step], said: str) -> dict[str, Any] | None:
        """The next of the task's user-side reference actions (dual control: the user acts on its own device)
        that the agent's message asks for by name, where the user has that tool."""
        have = {t.name for t in self.tools}
        made = [c["name"] for s in conversation if s.kind == "text" for c in s.extra.get("user_tool_calls") or []]
        lowered = said.lower()
        for action in task.goal.get("actions") or []:
            if action.get("requestor") != "user" or action["name"] not in have:
                continue
            if action["name"] in made:
                made.remove(action["name"])
                continue
            if action["name"] in said or action["name"].replace("_", " ") in lowered:
                return {"name": action["name"], "arguments": dict(action.get("arguments") or {})}
        return None


def answer(said: str, reason: str, known: str) -> str:
    """The user's answer to the agent's message `said`."""
    asks = "?" in said
    if asks and CONFIRM_ASK.search(said):
        return YES
    if asks and FACT_ASK.search(said):
        return known or "I'm sorry, I don't have that information."
    if MORE_HELP.search(said) or not asks:
        return DONE
    return f"I don't know more than that. {reason}"
