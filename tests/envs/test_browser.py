"""The browser environment on a real Chromium: a small shop served by the test, and MiniWoB++ pages.

One browser serves the whole module (module-scoped event loop and environment); the tests that
check what is left after a close or a kill -9 run their own browser in a thread or a child process.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator

import psutil
import pytest
from jsonschema import Draft202012Validator
from playwright.async_api import Error as PlaywrightError
from PIL import Image

from backends.fake_server import FakeServer, FakeServerConfig, Rule
from backends.registry import make_llm
from backends.config import LLMConfig
from envs.base import EnvError, Task, checkpoint, restore
from envs.browser.chromium import ChromiumNotFound, find_chromium, shared_browser
from envs.browser.env import BrowserEnv
from envs.browser.solvers import SOLVERS, parse_axtree
from envs.spec import EnvFactory, EnvSpec
from envs.tasks import TaskFileError, TaskSourceConfig, load_tasks
from schemas.models import ApiAction, MessageAction, Trajectory, WebObservation
from schemas.store import Dataset

SITE = Path(__file__).with_name("browser_site")
REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset directory, as a method's run gives the env: its screenshots land beside the shards."""
    path = tmp_path_factory.mktemp("browser-out")
    Dataset.create(path, stage="generate:test")
    return path


@pytest.fixture(scope="module")
async def env(out_dir: Path) -> AsyncIterator[BrowserEnv]:
    async with BrowserEnv(site_dir=str(SITE), output_dir=out_dir, step_timeout_s=10, action_timeout_s=1.5) as e:
        yield e


def shop_task(task_id: str = "shop", start: str = "index.html", **goal: Any) -> Task:
    return Task(id=task_id, env="browser", instruction="Buy two pairs of red socks as Ada.",
                params={"start_url": start}, goal=goal)


def call(function: str, **arguments: Any) -> ApiAction:
    return ApiAction(function=function, arguments=arguments)


def bid_of(observation: Any, role: str, name: str) -> str:
    assert isinstance(observation, WebObservation) and observation.axtree
    for node in parse_axtree(observation.axtree):
        if node.role == role and node.name == name and node.bid:
            return node.bid
    raise AssertionError(f"no {role} {name!r} in:\n{observation.axtree}")


async def buy_socks(env: BrowserEnv, task: Task | None = None) -> list[Any]:
    """A scripted agent that reads each page's accessibility tree and buys two pairs of socks."""
    steps = list(await env.reset(task or shop_task()))
    moves = [
        lambda o: call("click", bid=bid_of(o, "link", "Red socks")),
        lambda o: call("select_option", bid=bid_of(o, "combobox", "Quantity"), options="2"),
        lambda o: call("click", bid=bid_of(o, "button", "Add to cart")),
        lambda o: call("click", bid=bid_of(o, "link", "Back to the shop")),
        lambda o: call("click", bid=bid_of(o, "link", "Cart")),
        lambda o: call("type", bid=bid_of(o, "textbox", "Name"), text="Ada"),
        lambda o: call("click", bid=bid_of(o, "checkbox", "I accept the terms")),
        lambda o: call("click", bid=bid_of(o, "button", "Place order")),
    ]
    for move in moves:
        action = move(steps[-1])
        result = await env.step(action)
        assert "error" not in result.info, result.observation
        steps += [action, result.observation]
    return steps


def shop_goal() -> dict[str, Any]:
    return {"evaluation": [{"type": "url", "contains": "thanks.html"}, {"type": "text", "text": "order placed"},
                           {"type": "js", "expression": "JSON.parse(localStorage.getItem('ordered') || '{}').socks / 2"}]}


# ---- tools and observations ---------------------------------------------------------------------


async def test_tools_are_declared_with_json_schemas(env: BrowserEnv) -> None:
    tools = {t.name: t for t in env.tools()}
    assert {"click", "type", "select_option", "press", "scroll", "hover", "goto", "go_back", "wait",
            "send_msg_to_user"} <= set(tools)
    for tool in tools.values():
        Draft202012Validator.check_schema(tool.parameters)
        assert tool.description


async def test_observations_have_url_axtree_html_and_a_png_screenshot(env: BrowserEnv, out_dir: Path) -> None:
    opening = await env.reset(shop_task())
    assert opening[0].kind == "text" and opening[0].source == "user"
    page = opening[1]
    assert isinstance(page, WebObservation)
    assert page.url and page.url.endswith("/index.html")
    assert re.search(r"^\t+\[\d+\] link 'Red socks'$", page.axtree or "", re.M)
    assert "RootWebArea 'Tiny Shop'" in (page.axtree or "")
    assert page.html and 'bid="' in page.html and "<h1" in page.html
    assert page.screenshot is not None and not Path(page.screenshot.path).is_absolute()
    png = out_dir / page.screenshot.path
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == (1280, 720)


REFUSED = "Protocol error (Page.captureScreenshot): Unable to capture screenshot"


async def test_a_capture_chromium_refuses_is_asked_again(env: BrowserEnv, out_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Chromium now and then refuses a capture (no frame ready on a loaded machine) and takes it when asked
    again: the step keeps its screenshot instead of ending the episode; a page that never gives one is an
    EnvError that says why."""
    await env.reset(shop_task())
    page, real = env._page, env._page.screenshot
    asked: list[dict[str, Any]] = []

    async def refuse(times: int, **options: Any) -> bytes:
        asked.append(options)
        if len(asked) <= times:
            raise PlaywrightError(REFUSED)
        return await real(**options)

    monkeypatch.setattr(page, "screenshot", lambda **o: refuse(2, **o))
    result = await env.step(call("scroll", direction="down"))
    assert len(asked) == 3 and "error" not in result.info
    shot = result.observation.screenshot
    assert shot is not None and (out_dir / shot.path).read_bytes()[:8] == PNG_SIGNATURE

    asked.clear()
    monkeypatch.setattr(page, "screenshot", lambda **o: refuse(99, **o))
    with pytest.raises(EnvError, match="could not read the page: .*Unable to capture screenshot"):
        await env.step(call("scroll", direction="up"))
    assert len(asked) == 4


async def test_element_ids_are_stable_across_observations(env: BrowserEnv) -> None:
    first = (await env.reset(shop_task()))[-1]
    link = bid_of(first, "link", "Cart")
    result = await env.step(call("type", bid=bid_of(first, "textbox", "Search"), text="socks"))
    assert bid_of(result.observation, "link", "Cart") == link
    assert "value='socks'" in (result.observation.axtree or "")
    assert 'value="socks"' in (result.observation.html or "")


async def test_html_and_axtree_are_capped(out_dir: Path) -> None:
    async with BrowserEnv(site_dir=str(SITE), observe=["axtree", "html"], max_html_chars=300,
                          max_axtree_chars=80) as small:
        page = (await small.reset(shop_task()))[-1]
        assert isinstance(page, WebObservation)
        assert len(page.html or "") < 400 and "truncated" in (page.html or "")
        assert (page.axtree or "").endswith("more lines cut)")
        assert page.screenshot is None


# ---- actions that cannot be done ----------------------------------------------------------------


async def test_impossible_actions_are_error_observations(env: BrowserEnv) -> None:
    page = (await env.reset(shop_task()))[-1]
    before = await env.axtree()
    hidden = await env._page.get_attribute("#hidden-button", "bid")
    disabled = await env._page.get_attribute("#disabled-button", "bid")
    cases = {
        "no element with bid '9999'": call("click", bid="9999"),
        f"element [{hidden}] is not visible": call("click", bid=hidden),
        f"element [{disabled}] is disabled": call("click", bid=disabled),
        "type [": call("type", bid=bid_of(page, "link", "Cart"), text="x"),
        "only http and https": call("goto", url="file:///etc/passwd"),
        "no previous page": call("go_back"),
        "unknown tool 'fly'": call("fly"),
        "missing required argument 'bid'": call("click"),
        "does not match": call("click", bid="1'] , x"),
    }
    for expected, action in cases.items():
        result = await env.step(action)
        assert result.observation.kind == "text" and result.observation.content.startswith("Error: "), expected
        assert expected in result.observation.content, result.observation.content
        assert not result.done and result.info["error"]
    assert env._page.url.endswith("/index.html") and await env.axtree() == before


async def test_a_new_tab_is_followed(env: BrowserEnv) -> None:
    page = (await env.reset(shop_task()))[-1]
    result = await env.step(call("click", bid=bid_of(page, "link", "Help (opens a new tab)")))
    assert result.observation.url.endswith("/help.html")
    assert "heading 'Help'" in result.observation.axtree


async def test_scroll_hover_press_and_goto(env: BrowserEnv) -> None:
    page = (await env.reset(shop_task()))[-1]
    for action in (call("scroll", direction="down"), call("hover", bid=bid_of(page, "link", "Blue hat")),
                   call("press", key="Tab"), call("wait", seconds=0.05)):
        result = await env.step(action)
        assert result.observation.kind == "web", result.observation
    result = await env.step(call("goto", url="cart.html"))
    assert result.observation.url.endswith("/cart.html")
    result = await env.step(call("go_back"))
    assert result.observation.url.endswith("/index.html")


# ---- a whole task, evaluations, stored trajectories ----------------------------------------------


async def test_site_task_evaluations(env: BrowserEnv) -> None:
    task = shop_task(**shop_goal())
    await env.reset(task)
    before = await env.evaluate()
    assert not before.success and before.reward == 0.0
    assert "does not contain 'thanks.html'" in before.reason and "not shown" in before.reason

    steps = await buy_socks(env, task)
    verdict = await env.evaluate()
    assert verdict.success and verdict.reward == 1.0, verdict.reason
    assert [c["type"] for c in verdict.details["checks"]] == ["url", "text", "js"]
    assert steps[-1].url.endswith("thanks.html?name=Ada")

    half = task.model_copy(update={"goal": {"evaluation": [{"type": "js", "expression": "0.5", "threshold": 0.5},
                                                           {"type": "text", "text": "Order placed", "absent": True},
                                                           {"type": "url", "regex": r"thanks\.html\?name=Ada$"},
                                                           {"type": "js", "expression": "nope()"}]}})
    env._episode.task = half
    verdict = await env.evaluate()
    assert not verdict.success and verdict.reward == pytest.approx((0.5 + 0 + 1 + 0) / 4)
    assert "check expression failed" in verdict.reason


async def test_final_answer_ends_the_episode_and_answer_check(env: BrowserEnv) -> None:
    task = shop_task(evaluation={"type": "answer", "contains": "4.50"})
    await env.reset(task)
    result = await env.step(call("send_msg_to_user", text="The red socks cost 4.50."))
    assert result.done and env.answer == "The red socks cost 4.50."
    assert (await env.evaluate()).success
    await env.reset(task)
    result = await env.step(MessageAction(content="I could not find it."))
    assert result.done and not (await env.evaluate()).success
    assert (await env.step(call("click", bid="1"))).info["error"] == "the episode is over"


async def test_llm_judge_reads_the_task_actions_and_final_page(env: BrowserEnv) -> None:
    def judge(body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["messages"][-1]["content"]
        ok = "thanks.html" in prompt and "click(" in prompt and "heading 'Order placed'" in prompt
        return {"reason": "the thank-you page is shown" if ok else "no order", "success": ok}

    task = shop_task(evaluation={"type": "judge", "criteria": "an order was placed"})
    with FakeServer(FakeServerConfig(rules=[Rule(match="# Final page", fn=judge)])) as server:
        llm = make_llm(LLMConfig(backend="openai", model="fake-model", base_url=server.base_url, api_key_env=None,
                                 max_retries=0, structured_attempts=1, request_timeout_s=5.0))
        env.judge = llm
        try:
            await buy_socks(env, task)
            verdict = await env.evaluate()
            assert verdict.success and "thank-you page" in verdict.reason
            await env.reset(task)
            assert not (await env.evaluate()).success
        finally:
            env.judge = None
            await llm.aclose()
    await env.reset(task)
    with pytest.raises(EnvError, match="judged by an LLM"):
        await env.evaluate()


async def test_scripted_agent_trajectories_are_stored_with_web_observations(env: BrowserEnv, out_dir: Path) -> None:
    """A scripted agent on the shop and on a MiniWoB page; the trajectories go through the shard store."""
    shop = await buy_socks(env)
    verdict_shop = await env.evaluate()
    task = Task(id="miniwob/login-user/0", env="browser", instruction="", params={"miniwob": "login-user"}, seed=0,
                goal={"type": "miniwob"})
    miniwob_steps = list(await env.reset(task))
    for action in SOLVERS["login-user"](env.page_instruction or "", miniwob_steps[-1].axtree):
        result = await env.step(action)
        miniwob_steps += [action, result.observation]
    verdict = await env.evaluate()
    assert verdict.success and result.done

    dataset = Dataset.create(out_dir, stage="generate:test")
    with dataset.unit("scripted") as unit:
        for name, steps, evaluation in (("shop", shop, verdict_shop), ("login-user", miniwob_steps, verdict)):
            unit.write("trajectories", Trajectory(id=f"scripted/{name}", source="scripted", steps=steps,
                                                  tools=env.tools(), reward=evaluation.reward,
                                                  success=evaluation.success))
    stored = {t.id: t for t in Dataset.open(out_dir).iter_records()}
    assert set(stored) == {"scripted/shop", "scripted/login-user"}
    for trajectory in stored.values():
        pages = [s for s in trajectory.steps if s.kind == "web"]
        assert len(pages) >= 2
        for page in pages:
            assert page.url and page.axtree and page.html and page.screenshot
            with Image.open(out_dir / page.screenshot.path) as image:
                image.verify()
                assert image.format == "PNG"
    assert stored["scripted/login-user"].success
    assert stored["scripted/shop"].steps[-1].url.endswith("thanks.html?name=Ada")


# ---- restore by replay ----------------------------------------------------------------------------


async def test_replay_restores_the_same_page_state(env: BrowserEnv) -> None:
    steps = await buy_socks(env)
    prefix = steps[:10]  # open the product, choose 2, add to cart, back to the shop
    original = prefix[-1]
    point = checkpoint(env, prefix)
    async with BrowserEnv(site_dir=str(SITE), observe=["axtree", "html"]) as fresh:
        await restore(fresh, point)
        assert fresh.replays == 1 and len(fresh.history) == len(prefix)
        replayed = fresh.history[-1]
        assert replayed.url == original.url and replayed.axtree == original.axtree
        assert await fresh._page.evaluate("localStorage.getItem('cart')") == '{"socks":2}'
        # The replayed episode goes on like the original did.
        nxt = await fresh.step(call("click", bid=bid_of(replayed, "link", "Cart")))
        assert "socks x 2" in nxt.observation.axtree


# ---- failures of the world ------------------------------------------------------------------------


async def test_a_hung_page_ends_the_episode_with_env_error_and_the_next_works() -> None:
    async with BrowserEnv(site_dir=str(SITE), observe=["axtree"], step_timeout_s=4, action_timeout_s=1) as env:
        page = (await env.reset(shop_task(start="hang.html")))[-1]
        started = time.monotonic()
        with pytest.raises(EnvError, match="stopped responding|did not answer"):
            await env.step(call("click", bid=bid_of(page, "button", "Spin forever")))
        assert time.monotonic() - started < 8
        page = (await env.reset(shop_task()))[-1]
        assert "link 'Red socks'" in page.axtree
        result = await env.step(call("click", bid=bid_of(page, "link", "Cart")))
        assert result.observation.url.endswith("/cart.html")


async def test_a_page_that_cannot_be_opened_is_env_error(env: BrowserEnv) -> None:
    with pytest.raises(EnvError, match="could not open http://127.0.0.1:9/"):
        await env.reset(shop_task(start="http://127.0.0.1:9/"))
    with pytest.raises(EnvError, match="relative"):
        async with BrowserEnv(observe=[]) as bare:
            await bare.reset(shop_task())
    assert "Red socks" in (await env.reset(shop_task()))[-1].axtree


async def test_the_episode_time_limit_ends_the_episode() -> None:
    async with BrowserEnv(site_dir=str(SITE), observe=[], episode_timeout_s=0.2) as env:
        await env.reset(shop_task())
        await asyncio.sleep(0.3)
        result = await env.step(call("scroll", direction="down"))
        assert result.done and result.info["truncated"]
        assert "time limit of 0.2 s" in result.observation.content


async def test_four_episodes_run_at_once_in_isolated_contexts() -> None:
    envs = [BrowserEnv(site_dir=str(SITE), observe=["axtree"], max_contexts=4) for _ in range(5)]
    peak = 0

    async def watch(shared: Any) -> None:
        nonlocal peak
        while True:
            peak = max(peak, shared.open_contexts)
            await asyncio.sleep(0.005)

    async def shop(env: BrowserEnv, k: int) -> str:
        page = (await env.reset(shop_task(f"shop-{k}")))[-1]
        if k == 0:  # only the first episode adds to its cart
            page = (await env.step(call("click", bid=bid_of(page, "link", "Red socks")))).observation
            await env.step(call("click", bid=bid_of(page, "button", "Add to cart")))
        await env.step(call("goto", url="cart.html"))
        cart = await env._page.evaluate("localStorage.getItem('cart')")
        await env.close()  # frees the context for the fifth episode
        return str(cart)

    for e in envs:
        await e.start()
    shared = envs[0]._shared
    assert shared is not None and all(e._shared is shared for e in envs)
    watcher = asyncio.create_task(watch(shared))
    try:
        carts = await asyncio.gather(*(shop(e, k) for k, e in enumerate(envs)))
    finally:
        watcher.cancel()
    assert carts == ['{"socks":1}', "None", "None", "None", "None"]
    assert shared.limit >= 4 and 2 <= peak <= shared.limit


# ---- the factory, task sources, configuration -----------------------------------------------------


async def test_factory_passes_the_dataset_dir_and_judge(tmp_path: Path) -> None:
    spec = EnvSpec(env="browser", env_config={"site_dir": str(SITE)}, tasks={"source": "sites"})
    fake = make_llm(LLMConfig(backend="fake", model="judge"))
    made = EnvFactory(spec, output=tmp_path, judge=fake).make()
    assert isinstance(made, BrowserEnv) and made.output_dir == tmp_path and made.judge is fake
    assert "screenshot" in made.observe
    bare = EnvFactory(spec).make()
    assert bare.output_dir is None and bare.judge is None and "screenshot" not in bare.observe
    with pytest.raises(ValueError, match="output directory"):
        EnvFactory(spec.model_copy(update={"env_config": {"observe": ["screenshot"]}})).make()
    with pytest.raises(ValueError, match="unknown key"):
        EnvSpec(env="browser", env_config={"headful": True})


def test_sites_task_source(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    rows = [{"id": "buy", "start_url": "index.html", "instruction": "Buy socks.",
             "evaluation": {"type": "url", "contains": "thanks"},
             "solution": [{"name": "goto", "arguments": {"url": "thanks.html"}}]},
            {"id": "ask", "start_url": "http://127.0.0.1:1/x", "instruction": "Price?",
             "evaluation": [{"type": "answer", "contains": "4.50"}, {"type": "judge"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tasks = load_tasks(TaskSourceConfig(source="sites", path=str(path)), "browser")
    assert [t.id for t in tasks] == ["buy", "ask"]
    assert tasks[0].params == {"start_url": "index.html"}
    assert tasks[0].goal["evaluation"] == [{"type": "url", "contains": "thanks"}]
    assert [c["type"] for c in tasks[1].goal["evaluation"]] == ["answer", "judge"]

    bad = {
        '{"id": "a", "instruction": "x", "evaluation": {"type": "url", "contains": "y"}}': ":1: start_url: Field required",
        '{"id": "a", "start_url": "/", "instruction": "x", "evaluation": {"type": "pixels"}}': ":1: evaluation",
        '{"id": "a", "start_url": "/", "instruction": "x", "evaluation": {"type": "url", "regex": "("}}': "bad regex",
        '{"id": "a", "start_url": "/", "instruction": "x", "evaluation": {"type": "url"}}': "exactly one of",
        "not json": ":1: not JSON",
    }
    for line, message in bad.items():
        path.write_text(line + "\n")
        with pytest.raises(TaskFileError, match=re.escape(message)):
            load_tasks(TaskSourceConfig(source="sites", path=str(path)), "browser")


async def test_site_reference_solution_is_the_tasks_solution(env: BrowserEnv) -> None:
    task = shop_task(evaluation={"type": "url", "contains": "thanks"},
                     actions=[{"name": "goto", "arguments": {"url": "thanks.html?name=Ada"}}])
    actions = await env.reference_solution(task)
    assert actions == [call("goto", url="thanks.html?name=Ada")]
    await env.reset(task)
    for action in actions:
        await env.step(action)
    assert (await env.evaluate()).success


def test_missing_chromium_is_one_line_saying_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRAJFORGE_CHROMIUM", str(tmp_path / "no-chromium"))
    with pytest.raises(ChromiumNotFound) as info:
        find_chromium()
    assert "apt-get install -y chromium" in str(info.value) and "\n" not in str(info.value)
    monkeypatch.delenv("TRAJFORGE_CHROMIUM")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ChromiumNotFound, match="looked for chromium, chromium-browser, google-chrome on PATH"):
        find_chromium()
    assert find_chromium("/usr/bin/chromium") == "/usr/bin/chromium" or not Path("/usr/bin/chromium").exists()


# ---- no Chromium left behind ----------------------------------------------------------------------


def _chromium_under(pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in children if "chrom" in _name(p)]


def _name(process: psutil.Process) -> str:
    try:
        return process.name().lower()
    except psutil.Error:
        return ""


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def _wait_gone(processes: list[psutil.Process], timeout: float = 10.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while _alive(processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _alive(processes)


def test_no_chromium_is_left_after_close() -> None:
    """In a loop of its own (a fresh browser): closed by close(); kept up between episodes, closed by the factory."""
    seen: dict[str, list[psutil.Process]] = {}

    async def run(key: str, idle_s: float) -> None:
        spec = EnvSpec(env="browser", env_config={"site_dir": str(SITE), "browser_idle_s": idle_s})
        factory = EnvFactory(spec)
        others = {p.pid for p in _chromium_under(os.getpid())}  # the module's own browser
        async with factory.make() as env:
            await env.reset(shop_task())
            seen[key] = [p for p in _chromium_under(os.getpid()) if p.pid not in others]
        shared = shared_browser(find_chromium())
        assert shared.running == (idle_s > 0)
        if idle_s > 0:  # the next episode reuses the browser
            browser = shared._browser
            async with factory.make() as env:
                await env.reset(shop_task())
                assert shared._browser is browser
        await factory.aclose()  # the end of a run
        assert not shared.running

    def in_thread(key: str, idle_s: float) -> None:
        errors: list[BaseException] = []

        def target() -> None:
            try:
                asyncio.run(run(key, idle_s))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        worker = threading.Thread(target=target)
        worker.start()
        worker.join()
        if errors:
            raise errors[0]

    for key, idle_s in (("closed at close", 0.0), ("kept up, closed at the end of the run", 60.0)):
        in_thread(key, idle_s)
        assert seen[key], "the browser should have been running"
        assert _wait_gone(seen[key]) == [], key


def test_no_chromium_is_left_after_a_kill_9_of_the_parent(tmp_path: Path) -> None:
    script = tmp_path / "hold_browser.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(REPO)!r})
        from envs.base import Task
        from envs.browser.env import BrowserEnv

        async def main():
            async with BrowserEnv(site_dir={str(SITE)!r}, observe=["axtree"]) as env:
                await env.reset(Task(id="t", env="browser", instruction="x", params={{"start_url": "index.html"}}))
                print("ready", flush=True)
                await asyncio.sleep(120)

        asyncio.run(main())
    """))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        browsers = _chromium_under(child.pid)
        assert browsers, "the child should run Chromium"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        assert _wait_gone(browsers) == []
    finally:
        if child.poll() is None:
            child.kill()
