"""WebShopEnv: browser-style tool calls over the shop state machine, WebObservations, goal-checked reward."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from envs.base import Environment, Snapshot, StepResult, Task, action_kind, error_observation
from envs.toolspec import ToolSpec, obj, validate_call
from envs.web.catalog import generate_catalog
from envs.web.site import ActionError, BrowserState, Site
from envs.web.tasks import check_goal, generate_tasks
from schemas.models import Action, ApiAction, MessageAction, Observation, TextObservation, Tool, WebObservation

_BID = {"type": "string", "description": "The bid of an element on the current page."}
TOOL_SPECS: dict[str, ToolSpec] = {s.name: s for s in [
    ToolSpec("click", "Click an element (link, button, text box).", obj({"bid": _BID}), Site.click),
    ToolSpec("type", "Replace the text of a text box; press_enter submits its form.",
             obj({"bid": _BID, "text": {"type": "string"}, "press_enter": {"type": "boolean"}}, required=["bid", "text"]),
             Site.type),
    ToolSpec("scroll", "Scroll the page.", obj({"direction": {"type": "string", "enum": ["up", "down"]}}), Site.scroll),
    ToolSpec("go_back", "Go back to the previous page.", obj({}), Site.go_back),
    ToolSpec("goto", "Open a URL on the shop (absolute, or a path such as /cart).",
             obj({"url": {"type": "string", "minLength": 1}}), Site.navigate),
]}


@lru_cache(maxsize=16)
def _site(catalog_seed: int) -> Site:
    return Site(generate_catalog(catalog_seed))


@dataclass
class _Episode:
    task: Task | None = None
    browser: BrowserState = field(default_factory=BrowserState)
    steps: int = 0
    done: bool = False
    answer: str | None = None


class WebShopEnv(Environment):
    """A web shop. Tasks name their catalog seed in `params["catalog_seed"]`; a message ends the episode."""

    name = "web"

    def __init__(self, seed: int = 0, max_steps: int = 50) -> None:
        self.seed = seed
        self.max_steps = max_steps
        self.site = _site(seed)
        self._ep = _Episode()

    def tools(self) -> list[Tool]:
        return [s.tool() for s in TOOL_SPECS.values()]

    def generate_tasks(self, n: int, seed: int = 0) -> list[Task]:
        return generate_tasks(n, seed=seed, catalog_seed=self.seed)

    @property
    def browser(self) -> BrowserState:
        return self._ep.browser

    @property
    def done(self) -> bool:
        return self._ep.done

    def reset(self, task: Task) -> Observation:
        self._check_task(task)
        self.site = _site(int(task.params.get("catalog_seed", self.seed)))
        self._ep = _Episode(task=task)
        obs = self.observe()
        obs.extra["instruction"] = task.instruction
        return obs

    def observe(self) -> WebObservation:
        page = self.site.render(self._ep.browser)
        return WebObservation(url=page.url, axtree=self.site.axtree(self._ep.browser, page), html=Site.html(page))

    def step(self, action: Action) -> StepResult:
        if self._ep.task is None:
            raise RuntimeError("call reset(task) before step()")
        if self._ep.done:
            return StepResult(error_observation("the episode is over"), 0.0, True, {"error": "the episode is over"})
        self._ep.steps += 1
        if isinstance(action, ApiAction):
            result = self._api(action)
        elif isinstance(action, MessageAction):
            self._ep.answer = action.content
            result = StepResult(TextObservation(content="Episode finished.", source="environment"), done=True)
        else:
            reason = f"{action_kind(action)} actions are not supported here; use the browser tools or send a message"
            result = StepResult(error_observation(reason), info={"error": reason})
        if not result.done and self._ep.steps >= self.max_steps:
            result.done, result.info["truncated"] = True, True
        if result.done:
            self._ep.done = True
            result.reward = self.evaluate()
        return result

    def _api(self, action: ApiAction) -> StepResult:
        ids = {"name": action.function, "tool_call_id": action.tool_call_id}
        reason = validate_call(TOOL_SPECS, action.function, action.arguments)
        if reason is not None:
            return StepResult(error_observation(reason, **ids), info={"error": reason})
        # Apply to a copy so a refused action leaves the state untouched.
        trial = copy.deepcopy(self._ep.browser)
        try:
            TOOL_SPECS[action.function].fn(self.site, trial, **action.arguments)
        except ActionError as exc:
            return StepResult(error_observation(str(exc), **ids), info={"error": str(exc)})
        self._ep.browser = trial
        obs = self.observe()
        obs.tool_call_id = action.tool_call_id
        return StepResult(obs)

    def evaluate(self) -> float:
        if self._ep.task is None:
            return 0.0
        return check_goal(self._ep.task.goal, self._ep.browser, self._ep.answer)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.name, (self.site, copy.deepcopy(self._ep.browser), self._ep.task, self._ep.steps,
                                    self._ep.done, self._ep.answer))

    def restore(self, snapshot: Snapshot) -> None:
        self._check_snapshot(snapshot)
        site, browser, task, steps, done, answer = snapshot.payload
        self.site = site
        # Copy again so the snapshot stays pristine however often it is restored.
        self._ep = _Episode(task=task, browser=copy.deepcopy(browser), steps=steps, done=done, answer=answer)

    def state(self) -> dict[str, Any]:
        b = self._ep.browser
        return {"url": b.url, "cart": dict(b.cart), "orders": [o.__dict__ for o in b.orders], "answer": self._ep.answer}
