"""MiniWoB++ in the browser environment: the task source, the page's reward, replay, and the
envs-check run of configs/browser_miniwob.yaml (reference solutions pass, doing nothing does not)."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import AsyncIterator

import pytest
import yaml

from envs.base import EnvError, Task, checkpoint, restore
from envs.browser.env import BrowserEnv
from envs.browser.miniwob import MAX_TIMEOUT_MS, html_dir
from envs.browser.server import served_target, stable_base
from envs.browser.solvers import SOLVERS, parse_axtree
from envs.spec import EnvFactory, EnvSpec
from envs.tasks import TaskFileError, TaskSourceConfig, held_out_tasks, load_tasks
from schemas.models import ApiAction

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "browser_miniwob.yaml"

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[BrowserEnv]:
    async with BrowserEnv(observe=["axtree"]) as e:
        yield e


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    """The module's MiniWoB tasks, loaded at once (reading their instructions opens each page once)."""
    loaded = load_tasks(TaskSourceConfig(source="miniwob", seed=3, options={
        "tasks": ["click-test", "click-test-2", "click-checkboxes", "enter-text*"], "exclude": ["*-dynamic"],
        "seeds": 2}), "browser")
    return {t.id: t for t in loaded}


def test_task_source_picks_pages_by_name_and_pattern(tasks: dict[str, Task]) -> None:
    assert list(tasks) == [f"miniwob/{page}/{seed}" for page in ("click-test", "click-test-2", "click-checkboxes",
                                                                 "enter-text", "enter-text-2") for seed in (3, 4)]
    first = tasks["miniwob/click-test/3"]
    assert first.instruction == "Click the button." and first.seed == 3
    assert first.params == {"miniwob": "click-test"} and first.metadata["miniwob_version"]
    assert first.metadata["split"] == "train"
    # The test split (seeds from 100000) as decontamination reads it: the instructions of the first test seeds.
    held_out = held_out_tasks(TaskSourceConfig(source="miniwob", options={"tasks": ["enter-text"],
                                                                          "held_out_seeds": 2}), "browser")
    assert [t.id for t in held_out or []] == ["miniwob/enter-text/100000", "miniwob/enter-text/100001"]
    assert {t.metadata["split"] for t in held_out or []} == {"test"} and held_out[0].instruction.startswith('Enter "')
    texts = tasks["miniwob/enter-text/3"].instruction, tasks["miniwob/enter-text/4"].instruction
    assert texts[0].startswith('Enter "') and texts[0] != texts[1]
    # Same keys again: the instructions are not read twice, whatever selects them.
    only = load_tasks(TaskSourceConfig(source="miniwob", seed=3, ids=["miniwob/enter-text/4"],
                                       options={"tasks": ["enter-text"], "seeds": 2}), "browser")
    assert only == [tasks["miniwob/enter-text/4"]]
    capped = load_tasks(TaskSourceConfig(source="miniwob", seed=3, n=3, options={"tasks": ["click-test*"], "seeds": 2,
                                                                                 "exclude": ["*-transfer"]}), "browser")
    assert [t.id for t in capped] == ["miniwob/click-test/3", "miniwob/click-test/4", "miniwob/click-test-2/3"]
    bad = {"tasks": ["no-such-page"]}, {"seeds": 0}, {"pages": ["click-test"]}, {"tasks": "click-test"}
    for options in bad:
        with pytest.raises(TaskFileError, match="miniwob: "):
            load_tasks(TaskSourceConfig(source="miniwob", options=options), "browser")


async def test_reward_is_the_pages_own_mapped_to_0_1(env: BrowserEnv, tasks: dict[str, Task]) -> None:
    task = tasks["miniwob/click-test-2/3"]
    page = (await env.reset(task))[-1]
    assert env.page_instruction == task.instruction and task.instruction in page.axtree
    # The page's 10 s timer is off: episodes wait for the agent, however long it thinks.
    assert await env._page.evaluate("core.EPISODE_MAX_TIME") == MAX_TIMEOUT_MS
    assert "Time left" not in page.axtree and "START" not in page.axtree
    unfinished = await env.evaluate()
    assert (unfinished.reward, unfinished.success) == (0.0, False) and "not ended" in unfinished.reason
    wanted = task.instruction.split()[-1].rstrip(".")
    wrong = next(n.bid for n in parse_axtree(page.axtree) if n.role == "button" and n.name != wanted)
    result = await env.step(ApiAction(function="click", arguments={"bid": wrong}))
    assert result.done and result.info["miniwob"]["raw_reward"] == -1.0
    failed = await env.evaluate()
    assert (failed.reward, failed.success) == (0.0, False) and "-1" in failed.reason
    await env.reset(task)
    right = next(n.bid for n in parse_axtree(page.axtree) if n.role == "button" and n.name == wanted)
    assert (await env.step(ApiAction(function="click", arguments={"bid": right}))).done
    solved = await env.evaluate()
    assert (solved.reward, solved.success) == (1.0, True) and solved.details["raw_reward"] == 1.0


async def test_pages_open_at_an_origin_that_is_the_same_every_run(env: BrowserEnv, tasks: dict[str, Task]) -> None:
    """The local server's port changes from run to run; the URL the model reads must not, or the same task
    would be another prompt in each run (a greedy eval would not repeat itself, no cache would answer)."""
    task = tasks["miniwob/click-test/3"]
    [page] = [o for o in await env.reset(task) if o.kind == "web"]
    assert page.url == "http://miniwob.localhost/miniwob/click-test.html"
    served = served_target(page.url)
    assert served is not None and re.fullmatch(r"http://127\.0\.0\.1:\d+/miniwob/click-test\.html", served)
    # Sub-resources come from the same server: the page's own script runs and rewards a click.
    button = next(n.bid for n in parse_axtree(page.axtree or "") if n.role == "button")
    assert (await env.step(ApiAction(function="click", arguments={"bid": button}))).done
    assert (await env.evaluate()).success
    # Another folder of the same name gets its own origin; a URL outside every served folder maps to nothing.
    with tempfile.TemporaryDirectory() as other:
        twin = Path(other) / "html"
        twin.mkdir()
        assert stable_base(twin, "miniwob") == "http://miniwob-2.localhost/"
    assert stable_base(html_dir(), "miniwob") == "http://miniwob.localhost/"
    assert served_target("http://example.com/miniwob/click-test.html") is None


async def test_replay_of_a_prefix_gives_the_same_page(env: BrowserEnv, tasks: dict[str, Task]) -> None:
    task = tasks["miniwob/click-checkboxes/3"]
    steps = list(await env.reset(task))
    actions = SOLVERS["click-checkboxes"](task.instruction, steps[-1].axtree)
    assert len(actions) >= 2  # some boxes, then Submit
    result = await env.step(actions[0])
    steps += [actions[0], result.observation]
    point = checkpoint(env, steps)
    async with BrowserEnv(observe=["axtree", "html"]) as fresh:
        await restore(fresh, point)
        assert fresh.replays == 1
        assert fresh.history[-1].axtree == steps[-1].axtree and "checked" in steps[-1].axtree
        for action in actions[1:]:
            await fresh.step(action)
        assert (await fresh.evaluate()).success


async def test_solvers_of_ones_own_are_used_for_their_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             tasks: dict[str, Task]) -> None:
    (tmp_path / "my_solvers.py").write_text(
        "from envs.browser.solvers import click, first, parse_axtree\n"
        "SOLVERS = {'click-test': lambda instruction, axtree: [click(first(parse_axtree(axtree), 'button').bid)]}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = tasks["miniwob/click-test/3"]
    async with BrowserEnv(observe=[]) as plain:
        assert await plain.reference_solution(task) is None  # no shipped solver for click-test
    async with BrowserEnv(observe=[], solvers=["my_solvers"]) as env:
        actions = await env.reference_solution(task)
        assert actions and actions[0].function == "click"
        await env.reset(task)
        for action in actions:
            await env.step(action)
        assert (await env.evaluate()).success
    async with BrowserEnv(observe=[], solvers=["no_such_solvers"]) as env:
        with pytest.raises(ValueError, match="env_config.solvers: 'no_such_solvers'"):
            await env.reference_solution(task)


async def test_a_page_that_asks_something_else_than_its_task_is_env_error(env: BrowserEnv,
                                                                            tasks: dict[str, Task]) -> None:
    task = tasks["miniwob/enter-text/3"].model_copy(update={"instruction": "Enter something else."})
    with pytest.raises(EnvError, match="not deterministic under its seed"):
        await env.reset(task)


def test_envs_check_of_the_miniwob_config() -> None:
    """`trajforge envs check` on configs/browser_miniwob.yaml: every task's scripted reference solution
    solves it, and doing nothing solves none."""
    from typer.testing import CliRunner

    from flows.cli import app

    tasks = EnvFactory(EnvSpec.model_validate(yaml.safe_load(CONFIG.read_text()))).tasks()
    assert len({t.params["miniwob"] for t in tasks}) >= 10 and all(t.params["miniwob"] in SOLVERS for t in tasks)
    result = CliRunner().invoke(app, ["envs", "check", "--config", str(CONFIG), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tasks"] == len(tasks) and report["healthy"], report
    assert report["reference"]["passed"] == report["reference"]["total"] == len(tasks), report["reference"]["failed"]
    assert report["do_nothing"]["passed"] == 0, report["do_nothing"]


async def test_pages_decode_as_utf8_unless_they_declare_their_own_charset(env: BrowserEnv, tmp_path: Path) -> None:
    """The static server sends `charset=utf-8` for text; MiniWoB's unicode-test reads as the page says it,
    and a page that declares windows-1252 keeps it."""
    [task] = load_tasks(TaskSourceConfig(source="miniwob", seed=0, options={"tasks": ["unicode-test"], "seeds": 1}),
                        "browser")
    assert task.instruction == 'Click on the "ÖK" button.'
    [page] = [o for o in await env.reset(task) if o.kind == "web"]
    buttons = {node.name for node in parse_axtree(page.axtree or "") if node.role == "button"}
    assert {"ÖK", "Cancél", "ヘルプ"} <= buttons, page.axtree

    (tmp_path / "latin.html").write_bytes('<html><head><meta charset="windows-1252"><title>t</title></head>'
                                          '<body><button>Ölçü façade</button></body></html>'.encode("cp1252"))
    async with BrowserEnv(site_dir=str(tmp_path), observe=["axtree"]) as latin:
        [shown] = [o for o in await latin.reset(Task(id="latin", env="browser", instruction="read",
                                                     params={"start_url": "latin.html"})) if o.kind == "web"]
    assert "button 'Ölçü façade'" in (shown.axtree or ""), shown.axtree
