"""What an agent could know: the values its tool calls use and the words its turns say, against what it saw.

At inference an agent sees its system prompt (the policy), its tools, what the user says and what its tools
return; never what a record keeps beside that: a simulated user's script, the task's reference calls, a
tutorial, a guide, a verifier's or judge's reason. Two checks on that line, one implementation for the methods,
the `grounded_calls` filter and the tests:

- `ungrounded_calls(steps, tools)`: every value an agent's tool call uses must appear, before the call, in what
  the agent saw (the system prompt, the tools, user messages, tool results). The agent's own messages do not
  count: a confirmation that names an id first grounds nothing. A value is a string argument (an id, a name, an
  address line, a date); in longer or computed text (a summary, a calculator expression) only its id-like tokens
  (with a digit, `_`, `@` or `#`) are checked. Numbers and booleans are the agent's decisions, not checked.
  Calls given as context (`extra.given`: a task's conversation so far) are not the agent's.
- `quoted(text, hidden, seen)`: the spans of `SPAN_WORDS` words and the ids that `text` takes from `hidden` and
  that `seen` does not hold: what a trained turn says that only the record's hidden parts (`hidden_texts`) could
  have told it.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Iterator, Sequence

from filters.base import BaseFilter, Decision, drop, keep, register
from schemas.models import Step, Tool, Trajectory

SPAN_WORDS = 8  # a span this long taken word for word is a quote, not a coincidence
SHORT_WORDS = 4  # a value of at most this many words is matched whole
_WORD = re.compile(r"\w+")
_ID = re.compile(r"[#\w][\w@#.\-]*\w")
_COMPUTED = re.compile(r"[+*=()<>]|\s[-/]\s")


def _is_id(token: str) -> bool:
    return len(token) >= 4 and (any(c.isdigit() for c in token) or any(c in token for c in "_@#"))


def ids(text: str) -> set[str]:
    """The id-like tokens of `text` (order numbers, user ids, emails, item ids)."""
    return {t for t in _ID.findall(text) if _is_id(t)}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        if value.strip():
            yield value.strip()
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def is_value(text: str) -> bool:
    """Whether a string argument is a value (an id, a name, an address line) rather than free or computed text."""
    return len(_WORD.findall(text)) <= SHORT_WORDS and not _COMPUTED.search(text)


def is_prose(text: str) -> bool:
    """Whether a string argument is free text in words (a summary), not a value and not computed."""
    return len(_WORD.findall(text)) > SHORT_WORDS and not _COMPUTED.search(text)


def values(arguments: dict[str, Any]) -> list[str]:
    """What of a call's arguments must have been seen: short strings whole, the id-like tokens of longer ones."""
    out: list[str] = []
    for text in _strings(arguments):
        if is_value(text):
            out.append(text)
        else:
            out.extend(sorted(ids(text)))
    return list(dict.fromkeys(out))


def said(value: str, seen: str) -> bool:
    """Whether `value` stands in `seen` as a whole (any case, not inside a longer word; `_` parts count, as the
    name in a user id `mei_kovacs_8020`)."""
    pattern = r"(?<![^\W_])" + r"\s+".join(re.escape(w) for w in value.split()) + r"(?![^\W_])"
    return re.search(pattern, seen, re.I) is not None


def seen_text(step: Step) -> str:
    """What the agent saw in one step: the system prompt, a user message, a tool result; '' for its own turns."""
    if step.kind == "text":
        return "" if step.source == "agent" else step.content
    if step.kind == "json":
        return json.dumps(step.content, ensure_ascii=False)
    if step.kind == "web":
        return "\n".join(x for x in (step.url, step.axtree, step.html) if x)
    return ""


def tools_text(tools: Iterable[Tool] | None) -> str:
    return json.dumps([t.model_dump(mode="json") for t in tools or ()], ensure_ascii=False)


def ungrounded_calls(steps: Sequence[Step], tools: Iterable[Tool] | None = None) -> list[tuple[int, str, str]]:
    """(step, function, value) for each value an agent's call uses that nothing it saw before gave (module doc)."""
    seen = [tools_text(tools)]
    out: list[tuple[int, str, str]] = []
    for i, step in enumerate(steps):
        if step.kind == "api" and not step.extra.get("given"):
            text = "\n".join(seen)
            out += [(i, step.function, v) for v in values(step.arguments) if not said(v, text)]
        elif step.kind not in ("api", "code", "message"):
            seen.append(seen_text(step))
    return out


def describe(found: Sequence[tuple[int, str, str]]) -> str:
    step, function, value = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"step {step}: {function} uses {value!r}, which no user message or tool result gave before it{more}"


@register("grounded_calls")
class GroundedCalls(BaseFilter):
    """Drops a trajectory whose agent calls a tool with a value nobody said before (an invented id)."""

    def decide(self, record: Trajectory) -> Decision:
        found = ungrounded_calls(record.steps, record.tools)
        return drop(record, f"ungrounded: {describe(found)}") if found else keep(record)


# ---- quotes of what a record keeps hidden ---------------------------------------------------------------


def _spans(text: str, n: int = SPAN_WORDS) -> set[tuple[str, ...]]:
    words = [w.lower() for w in _WORD.findall(text)]
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def quoted(text: str, hidden: Sequence[str], seen: str) -> list[str]:
    """The spans of `SPAN_WORDS` words and the ids of `text` that come from `hidden` and are not in `seen`."""
    joined = "\n".join(hidden)
    spans = (_spans(text) & _spans(joined)) - _spans(seen)
    out = [" ".join(s) for s in sorted(spans)]
    seen_ids = ids(seen)
    out += sorted(i for i in ids(text) & ids(joined) if i not in seen_ids)
    return out


# Keys of `details` (and of a step's `extra`) that hold what the acting agent was never shown.
HIDDEN_DETAILS = ("splice", "reflection", "judge", "verifier", "challenge", "evolution", "explore", "spec",
                  "tutorial", "replay_prompt", "classifier", "step_verify", "fallbacks", "env_evaluation",
                  "evaluation")
HIDDEN_EXTRA = ("teacher_reason", "judge_reason", "llm_reason", "rule_reason", "truth_reason")
_VISIBLE_TASK = ("id", "env", "instruction", "seed", "params")


def hidden_texts(record: Trajectory) -> list[str]:
    """What the record keeps beside what its agent saw: the task's hidden parts (its goal and reference calls,
    a simulated user's scenario, a ticket), tutorials, specs, guides, and every verifier's, judge's and
    teacher's verdict and reason."""
    details = record.details
    task = details.get("task") if isinstance(details.get("task"), dict) else {}
    hidden: list[Any] = [v for k, v in task.items() if k not in _VISIBLE_TASK]
    hidden += [details[k] for k in HIDDEN_DETAILS if k in details]
    hidden += [s.extra[k] for s in record.steps for k in HIDDEN_EXTRA if k in s.extra]
    return [text for value in hidden for text in _strings(value)]


def visible_text(steps: Sequence[Step], tools: Iterable[Tool] | None = None) -> str:
    """All that an agent saw along `steps` (system prompt, tools, user messages, tool results)."""
    return "\n".join([tools_text(tools), *(seen_text(s) for s in steps)])
