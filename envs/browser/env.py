"""BrowserEnv: real pages in the system Chromium, driven by Playwright; MiniWoB++ or any site.

    env: browser
    env_config:
      observe: [axtree, html, screenshot]   # what each page observation records (the url always)
      viewport: [1280, 720]
      step_timeout_s: 30                    # an action plus reading the page; past it the page counts as hung
      episode_timeout_s: 900
      max_contexts: 4                       # episodes open at once in this process (one browser, one context each)
      site_dir: path/to/static/site         # or base_url: http://127.0.0.1:8000/ (for relative start URLs)
      allowed_hosts: [cdn.example]          # beyond the start URL's host and loopback (envs/browser/egress.py)
      actions: [click, type]                # the tools offered (default: all of them)

An episode is one isolated browser context (its own cookies and storage) on the process's shared
Chromium. Observations are `WebObservation`s: the url, the accessibility tree with element ids
(`[12] button 'Submit'`), the HTML (capped), and a screenshot PNG written under `output_dir` and
referenced by its path relative to it (`screenshots/<task>/<episode>/<n>.png`; the records hold
paths, never pixels). Methods pass their dataset directory as `output_dir` (through EnvFactory);
without one, screenshots are not taken unless `observe` asks for them, which is then an error.

Actions are the tools of `envs/browser/actions.py`; a final answer is `send_msg_to_user` or a
plain agent message, and ends the episode. A MiniWoB page also ends it when it gives its reward.
A page that stops answering (a script that never ends), crashes or cannot be opened raises
EnvError: the run quarantines that episode and goes on; the next reset opens a fresh context.
The world cannot copy itself: a checkpoint is restored by replaying the actions on a fresh
episode of the same task and seed (element ids come out the same).

Egress: an episode reaches the host of its start URL, loopback, and the hosts `allowed_hosts`
names; every other request is blocked in the browser (navigations, sub-resources, fetches, web
sockets, service workers). A `goto` or a navigation an action starts toward a blocked host is an
`Error:` observation; blocked sub-resources are listed in the step's `info["blocked"]`.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence
from urllib.parse import urljoin, urlsplit

from playwright.async_api import Error as PlaywrightError

from envs.base import Environment, EnvError, Evaluation, StepResult, Task, UserSimulator, refused, unsupported
from envs.browser import miniwob, sites
from envs.browser.actions import FINAL_ANSWER, NAVIGATIONS, TOOL_SPECS, ActionFailed, describe_failure
from envs.browser.chromium import SharedBrowser, close_idle_browsers, find_chromium, shared_browser
from envs.browser.egress import Egress
from envs.browser.page import AFTER_ACTION_JS, WATCH_POPUPS_JS, axtree_text, cap_html, mark_elements
from envs.browser.server import served_target, stable_base
from envs.browser.solvers import Solver, find_solver
from envs.episode_files import episode_dir
from envs.tasks import resolve_path
from envs.toolspec import validate_call
from schemas.models import Action, ApiAction, ImageRef, MessageAction, Observation, Step, TextObservation, Tool, WebObservation

if TYPE_CHECKING:
    from backends.base import LLM

OBSERVABLE = ("axtree", "html", "screenshot")
NAVIGATION_SHARE = 0.8  # of step_timeout_s, for goto and go_back
PROBE_S = 2.0  # how long a page may take to run `1` before it counts as hung
OBSERVE_ATTEMPTS = 4  # reads of a page cut by a navigation or a refused capture are tried again
CAPTURE_RETRY_S = 0.25  # times the attempt: the pause before asking Chromium for a refused capture again
SOLVER_ROUNDS = 20
log = logging.getLogger(__name__)


class BrowserEnv(Environment):
    """Chromium through Playwright; tasks from MiniWoB++ (`params.miniwob`) or any site (`params.start_url`)."""

    name = "browser"
    can_snapshot = False
    evaluation = "the page's own reward (MiniWoB), url / text / JavaScript checks, or an LLM judge"
    writes_files = True  # EnvFactory passes the run's dataset directory as output_dir (screenshots)

    def __init__(
        self,
        *,
        observe: Sequence[str] | None = None,
        output_dir: str | Path | None = None,
        chromium: str | None = None,
        viewport: Sequence[int] = (1280, 720),
        max_axtree_chars: int = 40_000,
        max_html_chars: int = 100_000,
        step_timeout_s: float = 30.0,
        action_timeout_s: float = 5.0,
        episode_timeout_s: float = 900.0,
        max_contexts: int = 4,
        browser_idle_s: float = 0.0,
        base_url: str | None = None,
        site_dir: str | None = None,
        solvers: Sequence[str] = (),
        allowed_hosts: Sequence[str] | None = None,
        actions: Sequence[str] | None = None,
        judge: LLM | None = None,
        max_steps: int = 50,
        user: UserSimulator | None = None,
    ) -> None:
        super().__init__(max_steps=max_steps, user=user)
        self.output_dir = Path(output_dir) if output_dir is not None else None
        wanted = list(observe) if observe is not None else [
            k for k in OBSERVABLE if k != "screenshot" or self.output_dir is not None]
        unknown = sorted(set(wanted) - set(OBSERVABLE))
        if unknown:
            raise ValueError(f"env_config.observe: unknown {', '.join(unknown)} (choose from {', '.join(OBSERVABLE)})")
        if "screenshot" in wanted and self.output_dir is None:
            raise ValueError("screenshots are written under an output directory: set env_config.output_dir, run the "
                             "environment from a method (it passes its dataset directory), or leave screenshot out of "
                             "env_config.observe")
        if len(viewport) != 2 or min(viewport) < 1:
            raise ValueError(f"env_config.viewport must be [width, height], not {list(viewport)}")
        for key, value in (("step_timeout_s", step_timeout_s), ("action_timeout_s", action_timeout_s),
                           ("episode_timeout_s", episode_timeout_s), ("max_contexts", max_contexts)):
            if value <= 0:
                raise ValueError(f"env_config.{key} must be > 0")
        if base_url is not None and site_dir is not None:
            raise ValueError("env_config: give base_url or site_dir, not both")
        unknown = sorted(set(actions or ()) - set(TOOL_SPECS))
        if unknown or (actions is not None and not actions):
            raise ValueError(f"env_config.actions: {'unknown ' + ', '.join(unknown) if unknown else 'empty'} "
                             f"(choose from {', '.join(TOOL_SPECS)})")
        # The tools offered to the agent (a small model learns a small action space); others are refused.
        self.specs = {k: v for k, v in TOOL_SPECS.items() if actions is None or k in actions}
        self.observe = frozenset(wanted)
        self.chromium = chromium
        self.viewport = {"width": int(viewport[0]), "height": int(viewport[1])}
        self.max_axtree_chars = max_axtree_chars
        self.max_html_chars = max_html_chars
        self.step_timeout_s = step_timeout_s
        self.action_timeout_ms = 1000 * min(action_timeout_s, step_timeout_s)
        # A page slow to load is the action's failure (an Error: observation), before it is the step's (EnvError).
        self.navigation_timeout_ms = 1000 * NAVIGATION_SHARE * step_timeout_s
        self.episode_timeout_s = episode_timeout_s
        self.max_contexts = max_contexts
        self.browser_idle_s = browser_idle_s
        self.base_url = base_url
        self.site_dir = site_dir
        self.solver_modules = tuple(solvers)
        if isinstance(allowed_hosts, str):
            raise ValueError("env_config.allowed_hosts is a list of hosts, e.g. [shop.example, 10.0.0.0/8]")
        self.allowed_hosts = tuple(allowed_hosts or ())
        Egress(self.allowed_hosts)  # a bad entry is named now, not at the first episode
        self._egress: Egress | None = None
        self._blocked: list[tuple[str, str, bool]] = []  # (url, why, a navigation of the main frame)
        # The grading model of tasks evaluated by a judge (a method's `judge.llm`); others need none.
        self.judge = judge
        self.answer: str | None = None
        self.page_instruction: str | None = None  # what a MiniWoB page asks (core.getUtterance())
        self._shared: SharedBrowser | None = None
        self._context: Any = None
        self._page: Any = None
        self._cdp: Any = None
        self._crashed = False
        self._deadline = 0.0
        self._shots = 0
        self._shot_dir: Path | None = None

    @classmethod
    def offers(cls, config: dict[str, Any]) -> set[str]:
        return super().offers(config) | {"pages"}

    # ---- lifecycle ------------------------------------------------------------------------------

    @classmethod
    async def release_shared(cls) -> None:
        """Close the browsers kept up between episodes (`browser_idle_s`); EnvFactory calls it at the end of a run."""
        await close_idle_browsers()

    async def start(self) -> None:
        if self._shared is not None:
            return
        shared = shared_browser(find_chromium(self.chromium))
        await shared.acquire(self.max_contexts)
        self._shared = shared

    async def close(self) -> None:
        await self._close_page()
        shared, self._shared = self._shared, None
        if shared is not None:
            await shared.release(self.browser_idle_s)

    async def _close_page(self) -> None:
        context, self._context, self._page, self._cdp = self._context, None, None, None
        if context is not None and self._shared is not None:
            await self._shared.close_context(context)

    def tools(self) -> list[Tool]:
        return [s.tool() for s in self.specs.values()]

    def generate_tasks(self, n: int, seed: int = 0) -> list[Task]:
        raise NotImplementedError("the browser environment takes its tasks from a source: "
                                  "tasks: {source: miniwob, options: {tasks: [...]}} or {source: sites, path: ...}")

    # ---- episodes -------------------------------------------------------------------------------

    async def _reset(self, task: Task) -> Observation | None:
        await self.start()
        await self._close_page()
        assert self._shared is not None and self._episode is not None
        self.answer, self.page_instruction, self._crashed, self._shots = None, None, False, 0
        self._shot_dir = None
        if "screenshot" in self.observe and self.output_dir is not None:
            self._shot_dir = episode_dir("screenshots", task.id, self._episode.key)
        url = self._start_url(task)
        self._deadline = asyncio.get_running_loop().time() + self.episode_timeout_s
        try:
            # Waiting for a free context slot is not the page's time.
            self._egress, self._blocked = Egress(self.allowed_hosts, [url]), []
            # Service workers fetch outside the routes below: blocked, so every request passes the egress check.
            self._context = await self._shared.new_context(viewport=self.viewport, accept_downloads=False,
                                                           service_workers="block")
            async with asyncio.timeout(self.step_timeout_s):
                await self._context.route("**/*", self._route)
                await self._context.route_web_socket("**/*", self._route_socket)
                self._context.set_default_timeout(self.action_timeout_ms)
                self._context.set_default_navigation_timeout(self.navigation_timeout_ms)
                await self._context.add_init_script(WATCH_POPUPS_JS)
                await self._use_page(await self._context.new_page())
                await self._page.goto(url)
                if miniwob.is_miniwob(task):
                    self.page_instruction = await miniwob.start_episode(self._page, task.seed, self.action_timeout_ms)
                    # A task from the MiniWoB source asks what its page asks; other tasks on a MiniWoB page
                    # (a tutorial's) give their own instruction, and the page shows its own in the page.
                    if task.metadata.get("source") == miniwob.SOURCE and task.instruction \
                            and self.page_instruction != task.instruction:
                        raise EnvError(f"task {task.id}: the page asks {self.page_instruction!r}, not the task's "
                                       f"{task.instruction!r} (the page is not deterministic under its seed)")
                return await self._observe()
        except TimeoutError:
            raise EnvError(f"task {task.id}: {url} did not load within {self.step_timeout_s:g} s") from None
        except Exception as exc:
            if isinstance(exc, EnvError):
                raise
            raise EnvError(f"task {task.id}: could not open {url}: {_first_line(exc)}") from None

    def _start_url(self, task: Task) -> str:
        if miniwob.is_miniwob(task):
            return stable_base(miniwob.html_dir(), "miniwob") + miniwob.page_path(task)
        start = task.params.get("start_url")
        if not isinstance(start, str) or not start:
            raise EnvError(f"task {task.id}: no start page (params.miniwob or params.start_url)")
        if not urlsplit(start).scheme:
            base = self.base_url or (stable_base(resolve_path(self.site_dir)) if self.site_dir else None)
            if base is None:
                raise EnvError(f"task {task.id}: start_url {start!r} is relative; set env_config.base_url or site_dir")
            start = urljoin(base if base.endswith("/") else base + "/", start.lstrip("/"))
        if urlsplit(start).scheme not in ("http", "https"):
            raise EnvError(f"task {task.id}: start_url {start!r} is not an http(s) URL")
        return start

    async def _route(self, route: Any) -> None:
        """Every request of the episode's pages: on to the network if its host is allowed, else aborted."""
        request = route.request
        try:
            reason = await self._egress.check(request.url) if self._egress is not None else None
            if reason is None:
                target = served_target(request.url)  # a served folder's stable origin: on to its server
                await (route.continue_(url=target) if target is not None else route.continue_())
                return
            main = request.is_navigation_request() and self._page is not None and request.frame == self._page.main_frame
            self._blocked.append((request.url, reason, main))
            await route.abort("blockedbyclient")
        except Exception:  # noqa: BLE001 - the page or context closed meanwhile: nothing left to route
            pass

    async def _route_socket(self, socket: Any) -> None:
        reason = await self._egress.check(socket.url) if self._egress is not None else None
        if reason is None:
            socket.connect_to_server()
        else:
            self._blocked.append((socket.url, reason, False))
            await socket.close(code=1008, reason="blocked")

    async def _use_page(self, page: Any) -> None:
        self._page = page
        page.on("crash", self._on_crash)
        self._cdp = await self._context.new_cdp_session(page)

    def _on_crash(self, _page: Any) -> None:
        self._crashed = True

    async def _act(self, action: Action) -> StepResult:
        if isinstance(action, MessageAction):
            return self._finish(action.content, None)
        if not isinstance(action, ApiAction):
            return unsupported(action, "use the browser tools or send a message")
        reason = validate_call(self.specs, action.function, action.arguments)
        if reason is not None:
            return refused(action, reason)
        if action.function == FINAL_ANSWER:
            return self._finish(str(action.arguments["text"]), action.tool_call_id)
        if self._page is None:
            raise EnvError("no page is open (the episode's page failed earlier)")
        if asyncio.get_running_loop().time() > self._deadline:
            reason = f"the episode ran past its time limit of {self.episode_timeout_s:g} s"
            result = refused(action, reason)
            result.done, result.info["truncated"] = True, True
            return result
        info: dict[str, Any] = {}
        if action.function == "goto" and self._egress is not None:
            target = urljoin(self._page.url, str(action.arguments.get("url", "")))
            reason = await self._egress.check(target) if urlsplit(target).scheme in ("http", "https") else None
            if reason is not None:  # (other schemes: the goto tool says what it takes)
                return refused(action, f"cannot open {target}: {reason}")
        self._blocked.clear()
        try:
            async with asyncio.timeout(self.step_timeout_s):
                known = list(self._context.pages)
                timeout_ms = self.navigation_timeout_ms if action.function in NAVIGATIONS else self.action_timeout_ms
                try:
                    await TOOL_SPECS[action.function].fn(self._page, timeout_ms, **action.arguments)
                except ActionFailed as exc:
                    return refused(action, str(exc))
                except Exception as exc:  # noqa: BLE001 - Playwright's errors: the element's, or a dead page's
                    await self._check_alive(exc)
                    return refused(action, describe_failure(action.function, action.arguments, exc, timeout_ms))
                wob = await self._settle(known)
                navigation = next(((u, why) for u, why, main in self._blocked if main), None)
                if navigation is not None:
                    if self._page.url.startswith("chrome-error:"):
                        await self._page.go_back()  # the blocked navigation left an error page: back to the last page
                    return refused(action, f"the page tried to open {navigation[0]}: {navigation[1]}")
                if self.task is not None and miniwob.is_miniwob(self.task):
                    info["miniwob"] = miniwob.state_of(wob) if wob is not None else miniwob.LEFT_THE_PAGE
                observation = await self._observe()
        except TimeoutError:
            raise EnvError(f"the page did not answer within {self.step_timeout_s:g} s after {action.function} "
                           "(it hung or crashed)") from None
        observation.tool_call_id = action.tool_call_id
        if self._blocked:
            info["blocked"] = [{"url": u, "reason": why} for u, why, _ in self._blocked]
        return StepResult(observation, done=bool(info.get("miniwob", {}).get("done")), info=info)

    def _finish(self, answer: str, tool_call_id: str | None) -> StepResult:
        self.answer = answer
        return StepResult(TextObservation(content="Episode finished.", source="environment", tool_call_id=tool_call_id,
                                          name=FINAL_ANSWER if tool_call_id else None), done=True)

    async def _check_alive(self, exc: BaseException) -> None:
        """Raise EnvError when the page (not the action) failed: crashed, closed or no longer running scripts."""
        if self._crashed:
            raise EnvError("the page crashed")
        try:
            await asyncio.wait_for(self._page.evaluate("1"), PROBE_S)
        except asyncio.TimeoutError:
            raise EnvError(f"the page stopped responding (a script that does not end?) after: {_first_line(exc)}") from None
        except Exception as probe:  # noqa: BLE001 - a closed page or browser
            raise EnvError(f"the page is gone: {_first_line(probe)}") from None

    async def _settle(self, known: list[Any]) -> list[Any] | None:
        """Follow a tab the action opened (or go back from one it closed), and let a new document load.

        Returns the MiniWoB reward state of the page the action was done on (None on other pages).
        """
        try:
            after = await self._page.evaluate(AFTER_ACTION_JS) if not self._page.is_closed() else {}
        except Exception:  # noqa: BLE001 - the document was replaced (a navigation): no tab was opened from it
            after = {}
        opened, wob = after.get("opened", False), after.get("wob")
        deadline = asyncio.get_running_loop().time() + self.action_timeout_ms / 1000
        # A new tab reaches Playwright a moment after the click that opened it.
        while opened and not [p for p in self._context.pages if p not in known] \
                and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        pages = [p for p in self._context.pages if not p.is_closed()]
        if not pages:
            raise EnvError("the page closed itself and no other page is open")
        if pages[-1] is not self._page:
            await self._use_page(pages[-1])
        try:
            await self._page.wait_for_load_state("load", timeout=self.action_timeout_ms)
        except Exception as exc:  # noqa: BLE001 - a slow subresource must not fail the step; a dead page must
            await self._check_alive(exc)
        return wob

    async def _observe(self) -> WebObservation:
        page = self._page
        for attempt in range(OBSERVE_ATTEMPTS):
            try:
                await mark_elements(page)
                observation = WebObservation(url=page.url, viewport=(self.viewport["width"], self.viewport["height"]))
                reads: list[Any] = []
                if "axtree" in self.observe:
                    reads.append(axtree_text(self._cdp, self.max_axtree_chars))
                if "html" in self.observe:
                    reads.append(page.content())
                shot = None
                if self._shot_dir is not None and self.output_dir is not None:
                    shot = self._shot_dir / f"{self._shots + 1:03d}.png"
                    (self.output_dir / shot).parent.mkdir(parents=True, exist_ok=True)
                    reads.append(page.screenshot(path=str(self.output_dir / shot), type="png"))
                done = iter(await asyncio.gather(*reads))  # one page, read all at once
                if "axtree" in self.observe:
                    observation.axtree = next(done)
                if "html" in self.observe:
                    observation.html = cap_html(next(done), self.max_html_chars)
                if shot is not None:
                    self._shots += 1
                    observation.screenshot = ImageRef(path=shot.as_posix())
                return observation
            except Exception as exc:  # noqa: BLE001 - a navigation under way, or a dead page
                if self._crashed:
                    raise EnvError("the page crashed") from None
                last = attempt == OBSERVE_ATTEMPTS - 1
                if not last and _navigating(exc):
                    await page.wait_for_load_state("load")
                    continue
                if not last and _capture_refused(exc):
                    # Chromium refuses a capture while no frame is ready (a document just replaced, a renderer
                    # busy on a loaded machine) and takes the same picture a moment later.
                    await asyncio.sleep(CAPTURE_RETRY_S * (attempt + 1))
                    continue
                raise EnvError(f"could not read the page: {_first_line(exc)}") from None
        raise AssertionError("unreachable")

    async def axtree(self) -> str:
        """The current page's accessibility tree (with element ids), whatever `observe` records."""
        await mark_elements(self._page)
        return await axtree_text(self._cdp, self.max_axtree_chars)

    async def _evaluate(self, task: Task, history: Sequence[Step]) -> Evaluation:
        if self._page is None:
            return Evaluation(0.0, False, "no page was opened")
        try:
            if miniwob.is_miniwob(task):
                async with asyncio.timeout(self.step_timeout_s):
                    return miniwob.evaluation(await miniwob.page_state(self._page))
            return await sites.evaluate_site(task, self._page, history, self.answer, self.judge, self.axtree,
                                             self.step_timeout_s)
        except TimeoutError:
            raise EnvError(f"the page did not answer the evaluation within {self.step_timeout_s:g} s") from None
        except PlaywrightError as exc:
            raise EnvError(f"could not evaluate the page: {_first_line(exc)}") from None

    # ---- reference solutions --------------------------------------------------------------------

    async def reference_solution(self, task: Task) -> list[Action] | None:
        """MiniWoB: a scripted solver's actions, found by solving an episode of the task here; sites: the
        task's `solution`. Call it between episodes: it runs (and ends) an episode of its own."""
        if not miniwob.is_miniwob(task):
            refs = task.goal.get("actions")
            if not isinstance(refs, list):
                return None
            return [ApiAction(function=a.get("function") or a["name"], arguments=a.get("arguments") or {}) for a in refs]
        solver = find_solver(str(task.params["miniwob"]), self.solver_modules)
        return None if solver is None else await self._solve(task, solver)

    async def _solve(self, task: Task, solver: Solver) -> list[Action]:
        """The solver's actions, each round read from the page the previous round led to.

        A solver that fails on a page (or repeats itself) stops there: the actions so far are the
        reference, and replaying them shows the task unsolved.
        """
        await self.reset(task)
        actions: list[Action] = []
        previous: list[Action] | None = None
        try:
            for _ in range(SOLVER_ROUNDS):
                last = self.history[-1]
                # What the agent would read: the last observation (reading the page again could give ids
                # to elements the replay's observations never saw).
                axtree = last.axtree if isinstance(last, WebObservation) and last.axtree else await self.axtree()
                try:
                    batch = solver(self.page_instruction or task.instruction, axtree)
                except (LookupError, ValueError) as exc:
                    log.warning("reference solver for %s stopped: %s", task.id, exc)
                    break
                if not batch or batch == previous:
                    break
                previous = batch
                for action in batch:
                    actions.append(action)
                    if (await self.step(action)).done:
                        return actions
        finally:
            await self._close_page()
            self._episode = None
        return actions

def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

def _capture_refused(exc: BaseException) -> bool:
    return "Unable to capture screenshot" in str(exc)

def _navigating(exc: BaseException) -> bool:
    text = str(exc)
    return "context was destroyed" in text or "navigating" in text or "Cannot find context" in text
