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

Grounded (`Grounder`): tau2's gold calls use ids the gold never read (an exchange's new item id with no product
lookup, a payment method never shown), and a dialogue that replays them trains an agent to invent ids. Before a
call, every value it uses must be one the agent saw (filters/grounding.py): where the user's known facts hold a
missing value the agent asks the user for it, otherwise it makes the reads a real agent makes (found by probing
the world's read-only tools through `env.inspect`, unrecorded, with values already seen: a breadth-first search
of at most `MAX_DEPTH` reads) and only those reads enter the dialogue. Before authentication only public tools are
probed. A dialogue whose calls still use a value nobody said is dropped by the caller (counted, never written).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Sequence

from backends.base import LLM
from envs.base import Environment
from envs.scenario_user import CONFIRM_ASK, FACT_ASK
from filters.grounding import ids, said, seen_text, tools_text, values
from generators.agent import AgentPolicy, Proposal
from generators.transcript import strip_reasoning
from schemas.models import Action, ApiAction, MessageAction, Step, TextObservation, Tool, is_system_step

TurnKind = Literal["ask_identity", "confirm", "ask_user_action", "report", "call"]
MAX_DEPTH = 3  # reads in one grounding chain (user -> order -> product)
MAX_PROBES = 150  # probe reads per dialogue (one that cannot be grounded spends them all)
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


def _shape(value: str) -> str:
    """A pattern of a value's shape: digit and capital runs by their length, lowercase runs of any length
    ('#W2378156' -> '#[A-Z]{1}[0-9]{7}', 'credit_card_9513926' -> '[a-z]+_[a-z]+_[0-9]{7}')."""
    out = []
    for run in re.findall(r"\d+|[A-Z]+|[a-z]+|.", value):
        if run.isdigit():
            out.append(f"[0-9]{{{len(run)}}}")
        elif run.isalpha() and run.isupper():
            out.append(f"[A-Z]{{{len(run)}}}")
        elif run.isalpha():
            out.append("[a-z]+")
        else:
            out.append(re.escape(run))
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def _chunk_ids(text: str) -> frozenset[str]:
    return frozenset(ids(text))


@functools.lru_cache(maxsize=4096)
def _keyed(text: str) -> tuple[tuple[str, str], ...]:
    """(key, string value) of every member of the JSON in `text` (a tool result), however deep."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return ()
    out: list[tuple[str, str]] = []
    stack: list[Any] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if isinstance(v, str):
                    out.append((str(k), v))
                stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)
    return tuple(out)


class Grounder:
    """Finds what a real agent does before a call whose values nobody said (see the module doc): asks the user
    for the ones its known facts hold, then the reads, found by probing `env` (never recorded)."""

    def __init__(self, env: Environment, tools: Sequence[Tool], *, reads: Iterable[str], auth_tools: Iterable[str],
                 public_tools: Iterable[str], gold: Sequence[Action], known: str) -> None:
        self.env = env
        self.tools_text = tools_text(tools)
        self.auth, self.public = set(auth_tools), set(public_tools)
        readable = set(reads) - self.auth
        self.reads = [t for t in tools if t.name in readable]
        self.known = known
        self.asked = False
        self.probes = 0
        self._results: dict[str, str | None] = {}
        # Each argument's known values (the gold's), whose shapes pick candidates out of what was seen.
        self.shapes: dict[str, set[str]] = {}
        self.gold_values: set[str] = set()  # probed first: a read of what the gold uses is the likeliest source
        for call in gold:
            if isinstance(call, ApiAction):
                for key, value in call.arguments.items():
                    for v in value if isinstance(value, list) else [value]:
                        if isinstance(v, str) and v and len(v.split()) == 1:
                            self.shapes.setdefault(key, set()).add(_shape(v))
                            self.gold_values.add(v)

    def _authenticated(self, history: Sequence[Step]) -> bool:
        if not self.auth:
            return True
        return any(s.kind == "api" and s.function in self.auth and i + 1 < len(history)
                   and not seen_text(history[i + 1]).startswith("Error") for i, s in enumerate(history))

    def _candidates(self, seen: str, open_to: set[str] | None) -> list[ApiAction]:
        """The reads whose required arguments all take values already seen (by key in JSON results, or by the
        shape of the argument's known values)."""
        by_key: dict[str, list[str]] = {}
        chunks = seen.split("\n\x00")
        for chunk in chunks:
            for key, value in _keyed(chunk):
                by_key.setdefault(key, []).append(value)
        seen_ids = sorted(set().union(*(_chunk_ids(c) for c in chunks)))
        out = []
        for tool in self.reads:
            if open_to is not None and tool.name not in open_to:
                continue
            params = tool.parameters or {}
            required = [str(p) for p in params.get("required") or []]
            options: list[list[str]] = []
            for name in required:
                found = list(by_key.get(name, []))
                for shape in sorted(self.shapes.get(name, ())):
                    found += re.findall(rf"(?<![\w#]){shape}(?!\w)", seen)
                if not found:  # no value of it known: any id seen may be one
                    found += seen_ids
                options.append(list(dict.fromkeys(found)))
            combos: list[dict[str, str]] = [{}]
            for name, found in zip(required, options):
                combos = [{**c, name: v} for c in combos for v in found][:50]
            out += [ApiAction(function=tool.name, arguments=c) for c in combos]
        return sorted(out, key=lambda a: sum(v not in self.gold_values for v in a.arguments.values()))

    async def _probe(self, read: ApiAction) -> str | None:
        """What the read returns now (None: an error, or the probe budget is spent)."""
        key = json.dumps([read.function, read.arguments], sort_keys=True)
        if key not in self._results:
            if self.probes >= MAX_PROBES:
                return None
            self.probes += 1
            result = await self.env.inspect(read)
            text = seen_text(result.observation)
            self._results[key] = None if result.info.get("error") or text.startswith("Error") else text
        return self._results[key]

    async def _chain(self, missing: list[str], seen: str, open_to: set[str] | None) -> list[tuple[ApiAction, str]]:
        """The shortest chain of reads (breadth first, at most MAX_DEPTH) whose last one returns a missing value."""
        frontier: list[tuple[list[tuple[ApiAction, str]], str]] = [([], seen)]
        tried: set[str] = set()
        for _ in range(MAX_DEPTH):
            deeper = []
            for path, text in frontier:
                for read in self._candidates(text, open_to):
                    key = json.dumps([read.function, read.arguments], sort_keys=True)
                    if key in tried:
                        continue
                    tried.add(key)
                    result = await self._probe(read)
                    if result is None or result in text:
                        continue
                    step = [*path, (read, result)]
                    if any(said(v, result) for v in missing):
                        return step
                    deeper.append((step, f"{text}\n\x00{result}"))
            frontier = deeper[:12]
        return []

    async def before(self, call: ApiAction, history: Sequence[Step]) -> tuple[list[str], list[ApiAction]]:
        """(the arguments to ask the user for, the reads to make) before `call`."""
        # What the user and the tools said: where a read's arguments come from; the policy and tools only count
        # for the check (an enum's value, a reason the policy lists).
        pool = "\n\x00".join(seen_text(s) for s in history if not is_system_step(s))
        context = "\n\x00".join([self.tools_text, *(seen_text(s) for s in history if is_system_step(s))])
        missing = [v for v in values(call.arguments) if not said(v, f"{context}\n{pool}")]
        ask: list[str] = []
        self.asked = self.asked or (bool(self.known) and self.known.strip() in pool)  # given already (identity)
        if missing and not self.asked and self.known:
            # The user is asked once, for what it knows: the values it holds, else its account (the reads that
            # follow start from it, as an airline agent's from the user id it must obtain from the user).
            self.asked = True
            ask = [k for k, v in call.arguments.items() if any(said(m, self.known) and m in json.dumps(v)
                                                               for m in missing)] or ["account details"]
            pool += "\n\x00" + self.known
            missing = [v for v in missing if not said(v, self.known)]
        open_to = None if self._authenticated(history) else self.public
        reads: list[ApiAction] = []
        while missing:
            chain = await self._chain(missing, pool, open_to)
            if not chain:
                break
            for read, result in chain:
                reads.append(read)
                pool += "\n\x00" + result
            missing = [v for v in missing if not said(v, pool)]
        return ask, reads


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
        self.inserted = {"asks": 0, "reads": 0}
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
