"""Grounding a scripted dialogue: before a call whose values nobody said, what a real agent does to learn them.

tau2's gold calls use ids the gold never read (an exchange's new item id with no product lookup, a payment method
never shown, an order the user never named), and a dialogue that replays them trains an agent to invent ids. Before
a call, every value it uses must be one the agent saw (filters/grounding.py). Where the user's known facts hold a
missing value (or, where nothing authenticates, the account the reads start from: airline's user id) the agent
asks the user once; the rest come from the reads a real agent makes, found by probing the world's read-only tools
through `env.inspect` (unrecorded) with values already seen: a breadth-first search of chains of at most
`MAX_DEPTH` reads, `MAX_PROBES` probes per dialogue, only public tools before authentication. Only the chain that
shows a missing value enters the dialogue. A free-text argument (a transfer's summary) is the agent's own words,
not the gold's: where nobody said it, it becomes the user's request as the user made it (`reword`). A read's arguments come from what the user and the tools said: by key
in a JSON result, or by the shape of the argument's values in the gold ('#W2378156' -> '#[A-Z]{1}[0-9]{7}'); reads
of the gold's own values are probed first.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Iterable, Sequence

from envs.base import Environment
from filters.grounding import SHORT_WORDS, ids, is_prose, said, seen_text, tools_text, values
from schemas.models import Action, ApiAction, Step, Tool, is_system_step, task_text

MAX_DEPTH = 3  # reads in one grounding chain (user -> order -> product)
MAX_PROBES = 150  # probe reads per dialogue (one that cannot be grounded spends them all)


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
    """Finds what a real agent does before a call whose values nobody said (see the module doc)."""

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

    def reword(self, call: ApiAction, history: Sequence[Step]) -> int:
        """Put the free-text arguments of `call` (more than `SHORT_WORDS` words) that nobody said in words the agent
        has: the user's request; how many were reworded. (tau2 compares no such argument: its reward reads the
        database and, where it checks actions, the arguments it names, ids.)"""
        seen = "\n".join(seen_text(s) for s in history)
        request = task_text(history) or "(no request)"
        free = [k for k, v in call.arguments.items() if isinstance(v, str) and is_prose(v) and not said(v, seen)]
        for key in free:
            call.arguments[key] = f"The customer's request: {request}"
        return len(free)

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
