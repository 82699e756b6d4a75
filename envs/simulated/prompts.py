"""Prompt templates and compact renderings (tools, seeds, history) for the LLM-simulated environment.

Kept apart from the env so the templates can be hashed for provenance and read in one place.
Every user prompt starts with an upper-case marker (SIMULATE TOOL STEP, SIMULATE PAGE, ...)
so scripted test servers and log readers can tell the calls apart.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from envs.base import Task
from envs.simulated.real_states import RealState
from schemas.models import Step, Tool

STOP = "###STOP###"

TOOL_SYSTEM = (
    "You simulate a software environment for an AI agent: you play the tools it calls and the user it "
    "serves. Tool results must be realistic, consistent with everything earlier in the episode, and "
    "follow the policy below (refuse calls the policy forbids with an error message). When the agent "
    "writes to the user, answer as the user would, from what the user knows and wants; the user reveals "
    "information only when asked. When the user's request is fully handled or the user gives up, the "
    f"user's reply ends with {STOP} and done is true.\n\n"
    "Policy:\n{policy}\n\nTools (JSON, one per line):\n{tools}{examples}"
)
TOOL_USER = (
    "SIMULATE TOOL STEP\nTask (hidden from the agent):\n{task}\n\nEpisode so far:\n{history}\n\n"
    "The agent now {action}\n\n"
    'Answer with a JSON object {{"observation": str, "done": bool}}: observation is {what}.'
)
WEB_SYSTEM = (
    "You simulate a web site for an AI agent that browses it. {page_format} Pages must be realistic and "
    "consistent with earlier pages and with the site description below. The agent acts on elements by bid.\n\n"
    "Site description and rules:\n{policy}\n\nAgent actions (JSON, one per line):\n{tools}{examples}"
)
# How pages are written: the JSON of the built-in shop, or (seeded with real pages) the real site's own format.
PAGE_FORMAT_JSON = (
    'Each page state is an accessibility tree written as JSON text: {"url": str, "title": str, "elements": '
    '[{"bid": str, "role": str, "name": str, "clickable": bool}, ...]}; roles are link, button, textbox (with a '
    '"value"), heading, text; every element has a unique bid.'
)
PAGE_FORMAT_REAL = (
    "Each page state is an accessibility tree written exactly in the format of the real pages of this site that "
    "come with each step (their roles, names, nesting and properties); every element an action can address has a "
    "unique bid, written the way the real pages write it."
)
WEB_START = (
    "SIMULATE START PAGE\nTask the agent will attempt (hidden from it):\n{task}\n\n"
    'Answer with a JSON object {{"url": str, "axtree": str, "done": bool}} describing the site\'s start page '
    "(done is false)."
)
WEB_USER = (
    "SIMULATE PAGE\nTask (hidden from the agent):\n{task}\n\nEpisode so far:\n{history}\n\nThe agent now {action}"
    "{real_pages}\n\n"
    'Answer with a JSON object {{"url": str, "axtree": str, "done": bool}}: the page after the action; done is '
    "true only if the site reached a final state (e.g. an order was placed)."
)
JUDGE_SYSTEM = (
    "You judge an episode of an AI agent in a simulated environment. Given the policy, the task and the "
    "transcript, decide how well the agent accomplished the task while following the policy. Answer with a "
    'JSON object {{"reasoning": str, "reward": number}}: reward 1 for complete success, 0 for failure, '
    "in between only for partial success.\n\nPolicy:\n{policy}"
)
JUDGE_USER = "JUDGE EPISODE\nTask:\n{task}\n\nTranscript:\n{history}"

REAL_PAGES = (
    "\n\nReal pages of this site, recorded after the most similar actions. Write the next page as the real site "
    "would show it: in their format, with their structure and wording, changed only where this step differs "
    "from theirs.\n{pages}"
)

TEMPLATES = (TOOL_SYSTEM, TOOL_USER, WEB_SYSTEM, PAGE_FORMAT_JSON, PAGE_FORMAT_REAL, WEB_START, WEB_USER, REAL_PAGES,
             JUDGE_SYSTEM, JUDGE_USER)

# Actions of the simulated web mode when the config gives none: the same browser tools, by element
# bid, as the built-in `web` shop (envs/web), so agents move between the two unchanged.
_BID = {"type": "string", "description": "The bid of an element on the current page."}


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


DEFAULT_WEB_TOOLS = [
    Tool(name="click", description="Click an element (link, button, text box).", parameters=_obj({"bid": _BID}, ["bid"])),
    Tool(name="type", description="Replace the text of a text box; press_enter submits its form.",
         parameters=_obj({"bid": _BID, "text": {"type": "string"}, "press_enter": {"type": "boolean"}}, ["bid", "text"])),
    Tool(name="scroll", description="Scroll the page.",
         parameters=_obj({"direction": {"type": "string", "enum": ["up", "down"]}}, ["direction"])),
    Tool(name="go_back", description="Go back to the previous page.", parameters=_obj({}, [])),
    Tool(name="goto", description="Open a URL on the site (absolute, or a path such as /cart).",
         parameters=_obj({"url": {"type": "string", "minLength": 1}}, ["url"])),
]


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def tools_block(tools: Iterable[Tool]) -> str:
    return "\n".join(dumps({"name": t.name, "description": t.description, "parameters": t.parameters}) for t in tools)


def task_block(task: Task) -> str:
    """What the simulator may know about the task: everything but its id and env name."""
    data = {"instruction": task.instruction}
    for key in ("goal", "metadata", "params"):
        value = getattr(task, key)
        if value:
            data[key] = value
    return dumps(data)


def step_line(step: Step, max_chars: int = 2000) -> str:
    """One history step as a short line ('USER: ...', 'AGENT CALLS f({...})', 'TOOL f: ...', 'PAGE ...')."""
    kind = step.kind
    if kind == "api":
        return f"AGENT CALLS {step.function}({dumps(step.arguments)})"
    if kind == "message":
        return f"AGENT SAYS: {step.content}"
    if kind == "code":
        return f"AGENT RUNS {step.language} CODE: {step.content}"
    if kind == "text":
        who = {"user": "USER", "agent": "AGENT SAYS"}.get(step.source, f"TOOL {step.name or ''}".strip())
        return f"{who}: {step.content[:max_chars]}"
    if kind == "json":
        return f"TOOL {step.name or ''}: {dumps(step.content)[:max_chars]}"
    if kind == "web":
        return f"PAGE {step.url or ''}: {(step.axtree or step.html or '')[:max_chars]}"
    return f"{kind.upper()}"


def history_block(steps: Iterable[Step], max_chars: int) -> str:
    """The transcript, keeping its first line (the request) and the most recent lines within `max_chars`."""
    lines = [step_line(s) for s in steps]
    if sum(len(x) + 1 for x in lines) <= max_chars or len(lines) < 2:
        return "\n".join(lines) or "(nothing yet)"
    head, tail, size = lines[0], [], len(lines[0]) + 20
    for line in reversed(lines[1:]):
        if size + len(line) + 1 > max_chars:
            break
        tail.append(line)
        size += len(line) + 1
    return "\n".join([head, "[... earlier steps omitted ...]", *reversed(tail)])


def real_pages_block(states: Sequence[RealState], max_chars: int) -> str:
    """Retrieved real transitions for the simulator: where each started, what was done, the page it led to
    (each cut to its share of `max_chars`)."""
    if not states:
        return ""
    share = max(200, max_chars // len(states))
    parts = []
    for i, s in enumerate(states, 1):
        head = f"Real page {i}: on {s.from_url} ({s.from_title or 'untitled'}), {s.action_text} -> {s.url}\n"
        parts.append(head + s.axtree[: max(0, share - len(head))])
    return REAL_PAGES.format(pages="\n\n".join(parts))


def examples_block(seeds: list[Any], max_chars: int) -> str:
    """Seed trajectories as example transcripts (realistic tool outputs), cut to `max_chars` in all."""
    if not seeds:
        return ""
    parts, size = [], 0
    for i, seed in enumerate(seeds, 1):
        text = f"Example {i}:\n" + "\n".join(step_line(s, 1500) for s in seed.steps)
        if size + len(text) > max_chars:
            text = text[: max(0, max_chars - size)]
        if not text:
            break
        parts.append(text)
        size += len(text)
    return "\n\nExamples of realistic episodes:\n" + "\n\n".join(parts)
