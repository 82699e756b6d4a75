"""A teacher model explores a web site with step-wise task control (UI-Simulator's exploration).

The paper's explorer is a teacher LLM that acts on the pages as a user would, steered by a
*guide*: a short task for the next few steps. Before each action the teacher looks at where the
exploration is (the current page, the elements that just appeared, its steps so far) and says
whether the current guide is done; when it is (or at the start) it writes the next guide, one
that continues what was done; then it chooses the next action under that guide (a thought, the
action, a one-sentence summary). So the exploration goes deep along coherent user tasks instead
of wandering, and the pages it reaches feed the task proposer and the state store.

Per exploring step: one `TASK CONTROL` call (`{completed, guide}`) and one `EXPLORE STEP` call
(`{thought, action: {tool, arguments}, summary}`, the tool one of the world's). An action the
tools' schemas refuse, or the page refuses (`Error:`), is noted in the steps and the page stays;
no valid answer ends the exploration early (counted).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from pydantic import BaseModel, Field, create_model

from backends.base import LLM
from envs.base import Environment
from envs.pages import describe_action, page_elements
from schemas.models import ApiAction, Step, Tool, WebObservation
from schemas.toolcalls import call_problem

GUIDE_SYSTEM = (
    "You steer the exploration of a web site by someone who learns what users do on it. Given the current "
    "guide (a short task for the next few steps), the steps taken so far, the elements that just appeared and "
    "the current page, say whether the guide is completed by the steps so far. If it is, or there is no guide "
    "yet, write the next guide: one common thing a user does on this site that continues what was done (so "
    "that the steps form one task, preferring the elements that just appeared), doable with the page's "
    "elements, not about the page's looks and not a sign-out. Otherwise repeat the current guide. Answer with "
    'a JSON object {"completed": bool, "guide": str}.'
)
GUIDE_USER = (
    "TASK CONTROL\nCurrent guide: {guide}\nSteps so far:\n{steps}\n\nNewly appeared elements:\n{new}\n\n"
    "Current page:\n{page}"
)
ACT_SYSTEM = (
    "You explore a web site as a user following a guide. Given the guide, your steps so far and the current "
    "page, take the next step with one of the actions below: a thought of one or two sentences (what the page "
    "shows, with elements as evidence, and why this action follows the guide), the action, and a one-sentence "
    "summary of what the action does that does not mention the guide. Answer with a JSON object "
    '{{"thought": str, "action": {{"tool": str, "arguments": {{...}}}}, "summary": str}}.\n\n'
    "Actions (JSON, one per line):\n{tools}"
)
ACT_USER = "EXPLORE STEP\nGuide: {guide}\nSteps so far:\n{steps}\n\nCurrent page:\n{page}"
TEMPLATES = (GUIDE_SYSTEM, GUIDE_USER, ACT_SYSTEM, ACT_USER)


class GuideCheck(BaseModel):
    completed: bool
    guide: str = Field(min_length=1)


@dataclass
class Exploration:
    """What an exploration saw: the pages (and how each was reached), the steps (for the state store), the guides."""

    steps: list[Step]
    pages: list[WebObservation]
    how: list[str]
    guides: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"mode": "teacher", "guides": self.guides}


def _step_model(tools: Sequence[Tool]) -> type[BaseModel]:
    """The explorer's answer, its tool limited to the world's tools (a JSON Schema enum)."""
    names = tuple(t.name for t in tools) or ("none",)
    call = create_model("ExploreCall", tool=(Literal[names], ...),  # type: ignore[valid-type]
                        arguments=(dict[str, Any], Field(default_factory=dict)))
    return create_model("ExploreStep", thought=(str, ...), action=(call, ...), summary=(str, ...))


def _tools_block(tools: Sequence[Tool]) -> str:
    return "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
                     for t in tools)


def _page(page: WebObservation, limit: int) -> str:
    return f"{page.url or ''}\n{(page.axtree or page.html or '')[:limit]}"


def _new_elements(before: WebObservation | None, now: WebObservation) -> str:
    """The elements of `now` that `before` did not show (role and name), one a line."""
    seen = {(e.role, e.name) for e in page_elements(before.axtree)} if before is not None else set()
    new = [e.describe() for e in page_elements(now.axtree) if (e.role, e.name) not in seen and e.name]
    return "\n".join(new[:60]) or "(none)"


async def explore(env: Environment, teacher: LLM, tools: Sequence[Tool], opening: Sequence[Step], steps: int,
                  max_page_chars: int, counts: Counter[str]) -> Exploration:
    """Up to `steps` actions of the teacher on the pages of `env` (reset already, `opening` its first steps)."""
    walked: list[Step] = list(opening)
    pages = [s for s in opening if isinstance(s, WebObservation)]
    out = Exploration(walked, pages, [""] * len(pages))
    if not pages:
        return out
    schema = _step_model(tools)
    act_system = ACT_SYSTEM.format(tools=_tools_block(tools))
    lines: list[str] = []
    guide: str | None = None
    previous: WebObservation | None = None
    for _ in range(steps):
        page = pages[-1]
        shown = _page(page, max_page_chars)
        done = "\n".join(lines) or "(none yet)"
        control = await teacher.structured(
            [{"role": "system", "content": GUIDE_SYSTEM},
             {"role": "user", "content": GUIDE_USER.format(guide=guide or "(none yet)", steps=done,
                                                           new=_new_elements(previous, page), page=shown)}],
            GuideCheck, temperature=0.0)
        counts["explore_calls"] += 1
        if control is None:
            counts["explore_no_answer"] += 1
            break
        if guide is None or control.completed:
            guide = control.guide.strip()
            out.guides.append({"guide": guide, "steps": []})
            counts["explore_guides"] += 1
        answer: Any = await teacher.structured(
            [{"role": "system", "content": act_system},
             {"role": "user", "content": ACT_USER.format(guide=guide, steps=done, page=shown)}], schema)
        counts["explore_calls"] += 1
        if answer is None:
            counts["explore_no_answer"] += 1
            break
        action = ApiAction(function=answer.action.tool, arguments=answer.action.arguments,
                           thought=answer.thought.strip() or None)
        said = describe_action(action, page_elements(page.axtree))
        problem = call_problem(list(tools), action.function, action.arguments)
        result = None if problem else await env.step(action)
        if problem or result is None or result.info.get("error") or not isinstance(result.observation, WebObservation):
            why = problem or (result.info.get("error") if result is not None else None) or "no page came back"
            counts["explore_refused"] += 1
            lines.append(f"{len(lines) + 1}. {said}: {answer.summary.strip()} (refused: {why})")
            continue
        counts["explore_actions"] += 1
        lines.append(f"{len(lines) + 1}. {said}: {answer.summary.strip()}")
        out.guides[-1]["steps"].append(answer.summary.strip())
        walked += [action, result.observation]
        out.how.append(said)
        previous = page
        pages.append(result.observation)
        if result.done:
            break
    return out
