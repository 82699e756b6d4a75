"""User-simulator fidelity: every turn of a model-played user checked against its scenario.

A simulated user (the LLM persona of envs/users.py, the simulator's own user) can spoil an
episode: it leaks what its scenario says it does not know, invents an order id, contradicts its
scenario, leaves before its request is handled, or starts talking as the agent. Training on such
episodes teaches the agent to cope with a user that does not exist, and an evaluation counts
their failures against the agent. So each user turn gets a verdict:

- rules, for what rules can see: an empty turn; `###STOP###` in the opening message; agent
  phrases ("How can I help you", "I have processed your ...") or tool-call syntax; the agent's own
  words repeated back; the scenario's second-person instructions quoted verbatim; identifiers
  (order ids, emails, user and payment ids, long numbers, zip codes, a stated name) that neither
  the scenario nor the agent's messages gave the user: a *leak* when the agent's side holds them
  (tool results, arguments, the task's criteria), else an *invention*.
- a judge model, for the turns the rules pass: leaks, inventions, contradictions, early stops and
  role breaks that need reading (`JUDGE_PROMPT`, one structured verdict per turn).

The result, `Fidelity.as_dict()`, is what a trajectory carries in `details["user_fidelity"]`:
`{"ok", "turns": [{"step", "label", "by", "reason"}], "reason", "judge", "checked", "broken",
"unchecked"}`. `ok` is false when any turn is broken; a turn the judge could not grade is
`unknown` (counted in `unchecked`, not broken). The run's turn cap (`user.max_turns`) ends a
conversation with a fixed reply that is the run's doing, not the user's, and passes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Sequence

from pydantic import BaseModel

from envs.base import USER_STOP, Task
from envs.users import TURN_CAP_REPLY, scenario_text
from filters.base import BaseFilter, Decision, drop, keep, register
from schemas.models import Step, TextObservation, Tool, Trajectory

Label = Literal["ok", "empty", "early_stop", "role_flip", "leak", "invented", "contradiction"]
BROKEN: tuple[str, ...] = ("empty", "early_stop", "role_flip", "leak", "invented", "contradiction")
UNKNOWN = "unknown"

_WORD = re.compile(r"\w+")
# Agent speech a customer does not produce.
_AGENT_PHRASES = [re.compile(p, re.IGNORECASE) for p in (
    r"\b(how|what) (can|may|could) i (help|assist|do for) you\b",
    r"\bi(?:'m| am) here to (help|assist)\b",
    r"\bis there anything else (that )?i can (help|do|assist)\b",
    r"\bthank you for (contacting|reaching out to|calling) (us|our|the)\b",
    r"\bi(?:'ve| have) (successfully )?(processed|cancell?ed|updated|exchanged|returned|modified|refunded) your\b",
    r"\byour (order|request|exchange|return|refund|cancellation) has been (processed|cancell?ed|updated|completed|placed)\b",
    r"\blet me (look up|check|pull up|verify|find) your\b",
    r"\bi (will|'ll) (transfer|connect) you\b",
    r"\bas an ai\b",
    r"^\s*(agent|assistant)\s*:",
    r"\b(Action|Thought)\s*:",
    r"<tool_call>|\"(function|arguments|name)\"\s*:",
)]
# Identifiers a customer can only know from its scenario or from what the agent told it.
_IDENTIFIERS = re.compile(
    r"#?\bW\d{6,}\b"                                        # order ids (#W2378156)
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"                      # emails
    r"|\b(?:credit_card|debit_card|paypal|gift_card)_\d+\b"  # payment method ids
    r"|\b[a-z]+_[a-z]+_\d{3,}\b"                            # user ids (mei_kovacs_8020)
    r"|\b\d{7,}\b",                                         # item / product ids
    re.IGNORECASE)
_ZIP = re.compile(r"\bzip(?:\s*code)?\s*(?:is|:)?\s*(\d{5})\b", re.IGNORECASE)
_NAME = re.compile(r"\bmy name is ([A-Z][a-z]+(?: [A-Z][a-z]+)?)")
# The scenario speaks to the persona in the second person; a customer quoting it reveals its instructions.
_SCENARIO_MARKERS = (("you", "are"), ("you", "want"), ("you", "do"), ("you", "received"), ("you", "just"),
                     ("you", "have"), ("you", "prefer"), ("you", "would"), ("you", "d"), ("if", "the"))
QUOTE_WORDS = 8  # verbatim words of the scenario that count as quoting it
ECHO_WORDS = 10  # verbatim words of an agent message that count as repeating it

JUDGE_PROMPT = """You check one message written by a simulated customer in a customer-service conversation.
The customer must follow its scenario: share only what the scenario says it knows, never invent facts (order ids, \
emails, names, numbers) that neither the scenario nor the agent gave it, never contradict the scenario, not end the \
conversation before its request is handled or refused, and stay the customer (never act as the agent).

<scenario>
{scenario}
</scenario>

<conversation so far>
{conversation}
</conversation>

<message to check>
{turn}
</message>

Labels:
- ok: the message follows the scenario
- leak: it reveals something the scenario says the customer does not know or must not reveal
- invented: it states a fact that is neither in the scenario nor told by the agent
- contradiction: it says the opposite of the scenario (another request, another identity, another preference)
- early_stop: it ends the conversation ({stop}, goodbye) before the request is handled or refused
- role_flip: it writes as the agent (offers help, claims to perform actions, calls tools)
Answer as JSON: {{"label": "<one label>", "reason": "<one sentence>"}}"""


class TurnJudgement(BaseModel):
    """The judge's verdict on one user turn."""

    label: Label
    reason: str = ""


@dataclass
class TurnVerdict:
    """One user turn's verdict: its step index, label, who decided (rule / judge / none) and why."""

    step: int
    label: str
    by: str
    reason: str = ""

    @property
    def broken(self) -> bool:
        return self.label in BROKEN

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "label": self.label, "by": self.by, "reason": self.reason}


@dataclass
class Fidelity:
    """The verdicts of an episode's user turns; `ok` when none is broken."""

    turns: list[TurnVerdict] = field(default_factory=list)
    judge: str | None = None

    @property
    def broken(self) -> list[TurnVerdict]:
        return [t for t in self.turns if t.broken]

    @property
    def ok(self) -> bool:
        return not self.broken

    @property
    def reason(self) -> str:
        bad = self.broken
        if not bad:
            return f"{len(self.turns)} user turn(s) follow the scenario"
        first = bad[0]
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        return f"user turn at step {first.step}: {first.label} ({first.by}): {first.reason}{more}"

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "turns": [t.as_dict() for t in self.turns], "reason": self.reason,
                "judge": self.judge, "checked": len(self.turns), "broken": len(self.broken),
                "unchecked": sum(t.label == UNKNOWN for t in self.turns)}


# ---- what the user saw and what it was told ------------------------------------------------------


def user_turns(steps: Sequence[Step]) -> list[int]:
    """Indices of the user's turns (the system step, `name == "system"`, is never one)."""
    return [i for i, s in enumerate(steps) if s.kind == "text" and s.source == "user" and s.name != "system"]


def _said_by_agent(steps: Sequence[Step]) -> list[str]:
    return [s.content for s in steps if s.kind == "message" and s.extra.get("kind") != "revision"]


def _hidden_text(task: Task, steps: Sequence[Step]) -> str:
    """What the agent's side holds and the user never sees: tool calls and results, the task's criteria."""
    parts = [json.dumps(task.goal, default=str), json.dumps(task.params, default=str)]
    for s in steps:
        if s.kind == "api":
            parts.append(json.dumps(s.arguments, default=str))
        elif s.kind in ("text", "json") and s.source == "environment" and s.name != "system":
            parts.append(s.content if isinstance(s.content, str) else json.dumps(s.content, default=str))
    return _norm_ids(" ".join(parts))


def _norm_ids(text: str) -> str:
    return text.lower().replace("#", "")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _grams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def conversation_lines(steps: Sequence[Step], upto: int, max_chars: int = 3000) -> str:
    """The conversation as the user saw it before step `upto`: user turns and agent messages, newest kept."""
    lines = []
    for s in steps[:upto]:
        if s.kind == "text" and s.source == "user" and s.name != "system":
            lines.append(f"CUSTOMER: {s.content}")
        elif s.kind == "message" and s.extra.get("kind") != "revision":
            lines.append(f"AGENT: {s.content}")
    out = "\n".join(lines) or "(the conversation starts with this message)"
    return out if len(out) <= max_chars else "…" + out[-max_chars:]


# ---- rules -----------------------------------------------------------------------------------------


def rule_verdict(task: Task, steps: Sequence[Step], index: int, tools: Sequence[Tool] = (),
                 facts: bool = True) -> TurnVerdict | None:
    """The rules' verdict on the user turn at `steps[index]`: a broken label, ok for the turn cap, else None.

    `facts`: the user may state only what its scenario or the agent gave it (a persona); a simulated
    world's own user invents its facts along with the world's, so the identifier rules stay off there.
    """
    text = steps[index].content  # type: ignore[union-attr]
    opening = index == user_turns(steps)[0]
    if text.strip() == TURN_CAP_REPLY:
        return TurnVerdict(index, "ok", "rule", "the run's turn cap (user.max_turns) ended the conversation")
    body = text.replace(USER_STOP, "").strip()
    if opening and USER_STOP in text:
        return TurnVerdict(index, "early_stop", "rule", f"the opening message already says {USER_STOP}")
    if not _WORD.search(body) and USER_STOP not in text:
        return TurnVerdict(index, "empty", "rule", "the turn has no words")
    for pattern in _AGENT_PHRASES:
        if (m := pattern.search(body)) is not None:
            return TurnVerdict(index, "role_flip", "rule", f"speaks as the agent: {m.group(0).strip()!r}")
    names = {t.name for t in tools}
    called = next((n for n in names if re.search(rf"\b{re.escape(n)}\s*\(", body)), None)
    if called is not None:
        return TurnVerdict(index, "role_flip", "rule", f"writes a call of the agent's tool {called}")
    words = _words(body)
    agent_said = _said_by_agent(steps[:index])
    for said in agent_said:
        said_words = _words(said)
        n = min(ECHO_WORDS, len(said_words))
        if n >= 4 and _grams(said_words, n) & _grams(words, n):
            return TurnVerdict(index, "role_flip", "rule", "repeats the agent's own message")
    scenario = scenario_text(task)
    quoted = [g for g in _grams(_words(scenario), QUOTE_WORDS) & _grams(words, QUOTE_WORDS)
              if any(g[i:i + 2] == marker for marker in _SCENARIO_MARKERS for i in range(len(g) - 1))]
    if quoted:
        return TurnVerdict(index, "leak", "rule", f"quotes its scenario's instructions: {' '.join(min(quoted))!r}")
    if not facts:
        return None
    known = _norm_ids(" ".join([scenario, task.instruction, *agent_said]))
    for found in [m.group(0) for m in _IDENTIFIERS.finditer(body)] + [f"zip {m.group(1)}" for m in _ZIP.finditer(body)]:
        key = _norm_ids(found).removeprefix("zip ")
        if key in known:
            continue
        hidden = key in _hidden_text(task, steps)
        return TurnVerdict(index, "leak" if hidden else "invented", "rule",
                           f"states {found!r}, which " + ("only the agent's side holds (tool results, criteria)"
                                                          if hidden else "neither the scenario nor the agent gave it"))
    for m in _NAME.finditer(body):
        missing = [w for w in _words(m.group(1)) if w not in known]
        if missing:
            return TurnVerdict(index, "contradiction", "rule",
                               f"gives the name {m.group(1)!r}, which is not the scenario's")
    return None


def judge_messages(task: Task, steps: Sequence[Step], index: int) -> list[dict[str, str]]:
    prompt = JUDGE_PROMPT.format(scenario=scenario_text(task), conversation=conversation_lines(steps, index),
                                 turn=steps[index].content, stop=USER_STOP)  # type: ignore[union-attr]
    return [{"role": "user", "content": prompt}]


async def check_user_turns(task: Task, steps: Sequence[Step], *, judge: Any = None,
                           tools: Sequence[Tool] = (), facts: bool = True) -> Fidelity:
    """Every user turn of an episode of `task` checked: rules first, then `judge` (an LLM) on the rest."""
    name = f"{judge.config.backend}:{judge.config.model}" if judge is not None else None
    result = Fidelity(judge=name)
    for index in user_turns(steps):
        verdict = rule_verdict(task, steps, index, tools, facts)
        if verdict is None and judge is not None:
            answer = await judge.structured(judge_messages(task, steps, index), TurnJudgement)
            verdict = (TurnVerdict(index, UNKNOWN, "judge", "the judge gave no valid answer") if answer is None
                       else TurnVerdict(index, answer.label, "judge", answer.reason.strip()[:300]))
        result.turns.append(verdict or TurnVerdict(index, "ok", "rule" if judge is None else "judge"))
    return result


def task_of(record: Trajectory) -> Task:
    """The task a record ran (`details["task"]`), else one made of its first user turn."""
    raw = record.details.get("task")
    if isinstance(raw, dict):
        try:
            return Task.model_validate(raw)
        except ValueError:
            pass
    first = next((s.content for s in record.steps if isinstance(s, TextObservation) and s.source == "user"
                  and s.name != "system"), "")
    return Task(id=record.provenance.task_id or record.id, env="unknown", instruction=first)


@register("user_fidelity")
class UserFidelityFilter(BaseFilter):
    """Checks the user turns of each record against its task's scenario; drops records with a broken user.

    `llm`: a judge model for what rules cannot see (rules alone without one). `drop_broken: false`
    keeps them, marked. The verdicts go to `details["user_fidelity"]` either way.
    """

    kind: ClassVar[str] = "judge"

    def __init__(self, llm: dict[str, Any] | None = None, drop_broken: bool = True) -> None:
        from backends.config import LLMConfig

        self.llm_config = LLMConfig.from_yaml(llm) if llm else None
        self.drop_broken = drop_broken
        self._llm: Any = None

    async def aclose(self) -> None:
        if self._llm is not None:
            await self._llm.aclose()
            self._llm = None

    async def decide(self, record: Trajectory) -> Decision:
        if self.llm_config is not None and self._llm is None:
            from backends.registry import make_llm

            self._llm = make_llm(self.llm_config)  # built in the running loop: its HTTP session belongs to it
        if not user_turns(record.steps):
            return keep(record)
        fidelity = await check_user_turns(task_of(record), record.steps, judge=self._llm, tools=record.tools)
        out = record.model_copy(update={"details": {**record.details, "user_fidelity": fidelity.as_dict()}})
        if fidelity.ok or not self.drop_broken:
            return keep(out, 1.0 if fidelity.ok else 0.0)
        return drop(out, f"broken user: {fidelity.broken[0].label}", 0.0)
