"""Browser environment speed: env steps/s against the same actions and page reads made with bare
Playwright, in the same run on the same Chromium; episodes/s with 4 concurrent contexts against 1.

Steps: on MiniWoB pages that do not end on these actions (typing into enter-text, toggling boxes
of click-checkboxes, choosing in choose-list), each step is one action and a full observation.
The environment does it through `BrowserEnv.step` (schema check, the action by element id, load
settling, the page's reward state, element ids, the accessibility tree as text, capped HTML, a
screenshot file); bare Playwright does the same action by CSS selector and reads the same things
(URL, `page.content()`, a screenshot file, CDP's raw accessibility tree). Both run alternately
on one browser. Target: env / bare >= 0.7. The same pair with no observation recorded (the env
still gives element ids and reads the page's state) is printed too, without a target.

Episodes: MiniWoB episodes with scripted reference solutions (reset, actions, evaluation), run
one at a time in one context, then four at a time in four contexts of the same browser. The
ratio says what concurrency gives on this machine (on two cores, little more than the overlap
of page loads with Python); no target.

The browser section of `python -m benchmarks.envs` (`--only browser --steps 120 --browser-episodes 16`).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import row
from envs.base import Task
from envs.browser import miniwob
from envs.browser.chromium import LAUNCH_ARGS, find_chromium
from envs.browser.env import BrowserEnv
from envs.browser.solvers import parse_axtree
from envs.tasks import TaskSourceConfig, load_tasks
from schemas.models import ApiAction

TARGET = 0.7
ROUNDS = 4  # env and bare alternate this many times; each round does steps / ROUNDS steps each
EPISODE_PAGES = ["click-test", "click-button", "enter-text", "login-user", "click-checkboxes", "choose-list",
                 "focus-text", "click-link"]
CONCURRENT = 4


# ---- one step's worth of work on each page, as env actions and as bare Playwright calls ----------

def env_action(page: str, axtree: str, k: int) -> ApiAction:
    nodes = parse_axtree(axtree)
    if page == "enter-text":
        box = next(n for n in nodes if n.role == "textbox")
        return ApiAction(function="type", arguments={"bid": box.bid, "text": f"text {k}"})
    if page == "click-checkboxes":
        boxes = [n for n in nodes if n.role == "checkbox"]
        return ApiAction(function="click", arguments={"bid": boxes[k % len(boxes)].bid})
    combo = next(n for n in nodes if n.role == "combobox")
    options = [n for n in nodes if n.role == "option"]
    return ApiAction(function="select_option", arguments={"bid": combo.bid, "options": options[k % len(options)].name})


async def bare_action(page_name: str, page: Any, k: int, choices: list[str]) -> None:
    """The env's action as a bare Playwright call; `choices`: the page's checkboxes or options, read beforehand."""
    if page_name == "enter-text":
        await page.locator("#area input").first.fill(f"text {k}")
    elif page_name == "click-checkboxes":
        await page.locator("#area input[type=checkbox]").nth(k % len(choices)).click()
    else:
        await page.locator("#area select").select_option(choices[k % len(choices)])


STEP_PAGES = ["enter-text", "click-checkboxes", "choose-list"]


async def env_steps(env: BrowserEnv, tasks: dict[str, Task], n: int) -> float:
    """Seconds for `n` env steps spread over the step pages (resets not counted)."""
    spent = 0.0
    for i, name in enumerate(STEP_PAGES):
        count = n // len(STEP_PAGES) + (1 if i < n % len(STEP_PAGES) else 0)
        await env.reset(tasks[name])
        axtree = await env.axtree()  # element ids stay put on these pages
        for k in range(count):
            action = env_action(name, axtree, k)
            started = time.perf_counter()
            result = await env.step(action)
            spent += time.perf_counter() - started
            assert "error" not in result.info, result.observation
    return spent


async def bare_steps(browser: Any, base: str, tasks: dict[str, Task], n: int, observe: bool, shots: Path) -> float:
    spent = 0.0
    for i, name in enumerate(STEP_PAGES):
        count = n // len(STEP_PAGES) + (1 if i < n % len(STEP_PAGES) else 0)
        context = await browser.new_context(viewport={"width": 1280, "height": 720})
        page = await context.new_page()
        cdp = await context.new_cdp_session(page)
        await page.goto(f"{base}miniwob/{name}.html")
        await miniwob.start_episode(page, tasks[name].seed, 5000)
        choices = await page.locator("#area input[type=checkbox], #area select option").all_text_contents()
        for k in range(count):
            started = time.perf_counter()
            await bare_action(name, page, k, choices)
            if observe:
                _ = page.url
                await asyncio.gather(cdp.send("Accessibility.getFullAXTree"), page.content(),
                                     page.screenshot(path=str(shots / f"{k % 10}.png"), type="png"))
            spent += time.perf_counter() - started
        await context.close()
    return spent


async def measure_steps(tasks: dict[str, Task], n: int, observe: bool, out: Path) -> dict[str, float]:
    from playwright.async_api import async_playwright

    from envs.browser.server import serve_directory

    base = serve_directory(miniwob.html_dir())
    kinds = ["axtree", "html", "screenshot"] if observe else []
    env_s = bare_s = 0.0
    per_round = max(len(STEP_PAGES), n // ROUNDS)
    async with async_playwright() as p, BrowserEnv(observe=kinds, output_dir=out) as env:
        browser = await p.chromium.launch(executable_path=find_chromium(), args=list(LAUNCH_ARGS))
        await env_steps(env, tasks, len(STEP_PAGES))  # warm-up: imports, the server, the pages' files
        await bare_steps(browser, base, tasks, len(STEP_PAGES), observe, out)
        for _ in range(ROUNDS):
            env_s += await env_steps(env, tasks, per_round)
            bare_s += await bare_steps(browser, base, tasks, per_round, observe, out)
        await browser.close()
    steps = per_round * ROUNDS
    return {"steps": steps, "env_steps_per_s": steps / env_s, "bare_steps_per_s": steps / bare_s}


# ---- episodes -----------------------------------------------------------------------------------

async def measure_episodes(tasks: list[Task], out: Path) -> dict[str, Any]:
    async with BrowserEnv(observe=[]) as env:
        solutions = {t.id: await env.reference_solution(t) for t in {t.id: t for t in tasks}.values()}

    async def episodes(workers: int) -> tuple[float, list[str]]:
        """Seconds to run all `tasks` with `workers` contexts at once, and the episodes left unsolved (why)."""
        queue: asyncio.Queue[Task] = asyncio.Queue()
        for task in tasks:
            queue.put_nowait(task)
        unsolved: list[str] = []

        async def worker() -> None:
            async with BrowserEnv(observe=["axtree", "html", "screenshot"], output_dir=out,
                                  max_contexts=CONCURRENT) as env:
                while not queue.empty():
                    task = queue.get_nowait()
                    await env.reset(task)
                    errors = [(await env.step(action)).info.get("error") for action in solutions[task.id] or []]
                    verdict = await env.evaluate()
                    if not verdict.success:
                        unsolved.append(f"{task.id}: {verdict.reason} {[e for e in errors if e]}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
        return time.perf_counter() - started, unsolved

    async with BrowserEnv(observe=[]):  # keeps one browser up for both runs
        await episodes(CONCURRENT)  # warm-up
        one_s, one_unsolved = await episodes(1)
        many_s, many_unsolved = await episodes(CONCURRENT)
    return {"episodes": len(tasks), "episodes_per_s_1": len(tasks) / one_s,
            f"episodes_per_s_{CONCURRENT}": len(tasks) / many_s, "unsolved_1": one_unsolved,
            f"unsolved_{CONCURRENT}": many_unsolved}


# ---- the run ------------------------------------------------------------------------------------

def run(steps: int = 120, episodes: int = 16) -> dict[str, Any]:
    """Measure and return JSON-able results (see the module doc)."""
    pages = sorted(set(STEP_PAGES) | set(EPISODE_PAGES))
    loaded = {t.params["miniwob"]: t for t in load_tasks(TaskSourceConfig(source="miniwob", options={"tasks": pages}),
                                                          "browser")}
    episode_tasks = [loaded[EPISODE_PAGES[i % len(EPISODE_PAGES)]] for i in range(episodes)]
    with tempfile.TemporaryDirectory(prefix="bench-browser-") as tmp:
        out = Path(tmp)
        full = asyncio.run(measure_steps(loaded, steps, True, out))
        bare = asyncio.run(measure_steps(loaded, steps, False, out))
        eps = asyncio.run(measure_episodes(episode_tasks, out))
    return {"steps_observed": full, "steps_unobserved": bare, "episodes": eps,
            "load_average": os.getloadavg(), "target": {"env_over_bare": TARGET}}


def rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    full, bare, eps = res["steps_observed"], res["steps_unobserved"], res["episodes"]
    ratio = full["env_steps_per_s"] / full["bare_steps_per_s"]
    return [
        row("env steps/s, full observation (axtree, html, screenshot)", full["env_steps_per_s"], "steps/s",
            full["bare_steps_per_s"], "bare Playwright: same actions and page reads", f">= {TARGET}", ratio >= TARGET),
        row("env steps/s, no observation recorded", bare["env_steps_per_s"], "steps/s", bare["bare_steps_per_s"],
            "bare Playwright: same actions only"),
        row(f"episodes/s, {CONCURRENT} contexts at once", eps[f"episodes_per_s_{CONCURRENT}"], "episodes/s",
            eps["episodes_per_s_1"], "one context at a time"),
    ]
