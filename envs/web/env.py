"""WebShopEnv: browser-style tool calls over the shop state machine, WebObservations, goal-checked reward."""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any, Sequence
from urllib.parse import urljoin

from envs.base import Environment, Evaluation, StepResult, Task, refused, unsupported
from envs.toolspec import ToolSpec, obj, validate_call
from envs.web.catalog import generate_catalog
from envs.web.site import ORIGIN, ActionError, BrowserState, Site
from envs.web.tasks import check_goal, generate_tasks
from schemas.models import Action, ApiAction, MessageAction, Observation, Step, TextObservation, Tool, WebObservation

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


class WebShopEnv(Environment):
    """A web shop. Tasks name their catalog seed in `params["catalog_seed"]` and may open on `params["start_url"]`
    (a path of the shop); a message is the final answer."""

    name = "web"
    can_snapshot = True
    evaluation = "goal check over the cart, orders and answer"

    @classmethod
    def offers(cls, config: dict[str, Any]) -> set[str]:
        return super().offers(config) | {"pages"}

    def __init__(self, seed: int = 0, max_steps: int = 50) -> None:
        super().__init__(max_steps=max_steps)
        self.seed = seed
        self.site = _site(seed)
        self.browser = BrowserState()
        self.answer: str | None = None

    def tools(self) -> list[Tool]:
        return [s.tool() for s in TOOL_SPECS.values()]

    def generate_tasks(self, n: int, seed: int = 0) -> list[Task]:
        return generate_tasks(n, seed=seed, catalog_seed=self.seed)

    async def _reset(self, task: Task) -> Observation | None:
        self.site = _site(int(task.params.get("catalog_seed", self.seed)))
        self.browser = BrowserState()
        start = task.params.get("start_url")
        if isinstance(start, str) and start:  # a page of the shop (relative to its origin) to open first
            self.browser.url = urljoin(ORIGIN + "/", start)
        self.answer = None
        return self.observe()

    async def reference_solution(self, task: Task) -> list[Action] | None:
        from envs.web.solver import reference_actions

        return list(await reference_actions(task))

    def observe(self) -> WebObservation:
        page = self.site.render(self.browser)
        return WebObservation(url=page.url, axtree=self.site.axtree(self.browser, page), html=Site.html(page))

    async def _act(self, action: Action) -> StepResult:
        if isinstance(action, MessageAction):
            self.answer = action.content
            return StepResult(TextObservation(content="Episode finished.", source="environment"), done=True)
        if not isinstance(action, ApiAction):
            return unsupported(action, "use the browser tools or send a message")
        reason = validate_call(TOOL_SPECS, action.function, action.arguments)
        if reason is not None:
            return refused(action, reason)
        # Apply to a copy so a refused action leaves the state untouched.
        trial = copy.deepcopy(self.browser)
        try:
            TOOL_SPECS[action.function].fn(self.site, trial, **action.arguments)
        except ActionError as exc:
            return refused(action, str(exc))
        self.browser = trial
        obs = self.observe()
        obs.tool_call_id = action.tool_call_id
        return StepResult(obs)

    async def _evaluate(self, task: Task, history: Sequence[Step]) -> Evaluation:
        reward = check_goal(task.goal, self.browser, self.answer)
        kind = task.goal.get("type", "goal")
        return Evaluation.of(reward, f"{kind} goal {'met' if reward >= 1.0 else 'not met'}",
                             cart=dict(self.browser.cart), orders=len(self.browser.orders), answer=self.answer)

    def _snapshot_world(self) -> Any:
        return (self.site, copy.deepcopy(self.browser), self.answer)

    def _restore_world(self, payload: Any) -> None:
        site, browser, answer = payload
        # Copy again so the snapshot stays pristine however often it is restored.
        self.site, self.browser, self.answer = site, copy.deepcopy(browser), answer

    def state(self) -> dict[str, Any]:
        b = self.browser
        return {"url": b.url, "cart": dict(b.cart), "orders": [o.__dict__ for o in b.orders], "answer": self.answer}
