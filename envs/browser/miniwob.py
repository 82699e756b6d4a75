"""MiniWoB++ on the browser environment: the task pages of the PyPI package `miniwob`, served locally.

    tasks:
      source: miniwob
      seed: 0                  # first seed
      options:
        tasks: [click-button, "click-check*"]   # names or glob patterns (default: all)
        exclude: ["*-nodelay"]                  # optional
        seeds: 3                                # seeds per task: seed, seed+1, ...
        held_out_seeds: 3                       # test seeds per page that decontamination reads

A task is one page and one seed (`miniwob/<page>/<seed>`). Seeds from `TEST_SEED_BASE` (100000) on
are the test split: generation refuses them unless `allow_test_split`, `split: test` starts there
(`seed` counts from it), and decontamination reads the instructions of the first
`held_out_seeds` test seeds of each page the config names (as templated: a page draws its
instruction from a few templates, so only n-gram overlaps count, not the same short words on
another seed's page). An episode opens the page, hides the
display meant for people (reward box, timer, start cover), seeds the page's random numbers
(`Math.seedrandom(seed)`), starts it (`core.startEpisodeReal()`) and reads the instruction
(`core.getUtterance()`). The page's own timer would end an episode after 10 s, while a model
thinks; it is set to the longest timeout JavaScript allows (about 24 days): the environment's
`episode_timeout_s` bounds episodes instead.

The reward is the page's own. Once the page ends the episode (`WOB_DONE_GLOBAL`), its raw reward
(`WOB_RAW_REWARD_GLOBAL`, in [-1, 1]; MiniWoB's time-discounted `WOB_REWARD_GLOBAL` measures time
against the disabled timer, so it is recorded but not used) maps to [0, 1] as max(0, raw): a
failure (-1) and an unfinished page (0) score 0, partial credit keeps its value; success means
raw > 0.

Task instructions come from the pages themselves, so loading tasks opens each page once in a
browser (in a thread of its own, since loaders are synchronous); the instructions are cached for
the process.
"""

from __future__ import annotations

import asyncio
import fnmatch
import threading
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from envs.base import EnvError, Evaluation, Task
from envs.browser.server import serve_directory
from envs.tasks import TEST_SPLIT, TaskFileError, TaskSourceConfig, register_held_out, register_task_source

if TYPE_CHECKING:
    from envs.base import Environment

SOURCE = "miniwob"
MAX_TIMEOUT_MS = 2**31 - 1  # setTimeout fires at once for anything longer
HIDE_DISPLAY_CSS = "#reward-display, #click-canvas, #sync-task-cover { display: none !important; }"
START_JS = """([seed, css, maxTime]) => {
  const style = document.createElement('style');
  style.textContent = css;
  document.head.appendChild(style);
  Math.seedrandom(seed);
  core.EPISODE_MAX_TIME = maxTime;
  core.startEpisodeReal();
  core.clearTimer();
}"""
READERS = 4  # pages read at once when loading tasks
READ_TIMEOUT_MS = 30_000
STATE_JS = """() => typeof WOB_DONE_GLOBAL === 'undefined' ? null
  : [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_GLOBAL, WOB_REWARD_REASON]"""
# Seeds from here on are the test split: no training data from them by accident.
TEST_SEED_BASE = 100_000
HELD_OUT_SEEDS = 3
_OPTIONS = {"tasks", "exclude", "seeds", "held_out_seeds"}
# The state of an episode whose agent navigated away from the task page.
LEFT_THE_PAGE: dict[str, Any] = {"done": False, "raw_reward": 0.0, "time_discounted_reward": 0.0,
                                 "reason": "the agent left the task page"}


def html_dir() -> Path:
    """The folder of MiniWoB++'s pages (`miniwob/html`), or a one-line error on how to get it."""
    try:
        import miniwob
    except ImportError:
        raise EnvError("MiniWoB++ is not installed: pip install 'miniwob>=1.1' (the envs extra)") from None
    return Path(miniwob.__file__).parent / "html"


@lru_cache(maxsize=1)
def page_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in (html_dir() / "miniwob").glob("*.html")))


def version() -> str:
    try:
        return metadata.version("miniwob")
    except metadata.PackageNotFoundError:
        return "unknown"


def task_id(page: str, seed: int) -> str:
    return f"{SOURCE}/{page}/{seed}"


def is_miniwob(task: Task) -> bool:
    return "miniwob" in task.params


def page_path(task: Task) -> str:
    page = str(task.params["miniwob"])
    if page not in page_names():
        raise EnvError(f"task {task.id}: no MiniWoB page {page!r}")
    return f"miniwob/{page}.html"


async def start_episode(page: Any, seed: int, timeout_ms: float) -> str:
    """Seed and start the loaded task page; its instruction."""
    await page.evaluate(START_JS, [seed, HIDE_DISPLAY_CSS, MAX_TIMEOUT_MS])
    await page.wait_for_function("() => WOB_TASK_READY", timeout=timeout_ms)
    return str(await page.evaluate("() => core.getUtterance()"))


async def page_state(page: Any) -> dict[str, Any]:
    values = await page.evaluate(STATE_JS)
    return state_of(values) if values is not None else dict(LEFT_THE_PAGE)


def state_of(values: list[Any]) -> dict[str, Any]:
    """The page's [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_GLOBAL, WOB_REWARD_REASON], named."""
    done, raw, discounted, reason = values
    return {"done": bool(done), "raw_reward": float(raw or 0.0), "time_discounted_reward": float(discounted or 0.0),
            "reason": reason}


def evaluation(state: dict[str, Any]) -> Evaluation:
    raw = state["raw_reward"]
    if not state["done"]:
        return Evaluation(0.0, False, state.get("reason") or "the task page has not ended the episode", state)
    why = f" ({state['reason']})" if state.get("reason") else ""
    return Evaluation(max(0.0, min(1.0, raw)), raw > 0, f"MiniWoB reward {raw:+g}{why}", state)


def select_pages(patterns: list[str] | None, exclude: list[str] | None) -> list[str]:
    names = page_names()
    chosen: list[str] = []
    for pattern in patterns or ["*"]:
        matched = fnmatch.filter(names, pattern)
        if not matched:
            raise TaskFileError(f"miniwob: no task page matches {pattern!r} (e.g. click-button, click-*)")
        chosen += [m for m in matched if m not in chosen]
    return [n for n in chosen if not any(fnmatch.fnmatch(n, x) for x in exclude or [])]


_INSTRUCTIONS: dict[tuple[str, int], str] = {}
_INSTRUCTIONS_LOCK = threading.Lock()


def instructions(keys: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """The instruction of each (page, seed), read from the pages (cached for the process).

    The pages are read with the Chromium found through $TRAJFORGE_CHROMIUM or PATH (a task
    source does not see the environment's config).
    """
    with _INSTRUCTIONS_LOCK:
        missing = [k for k in keys if k not in _INSTRUCTIONS]
        if missing:
            found: dict[tuple[str, int], str] = {}
            errors: list[BaseException] = []
            worker = threading.Thread(target=_read_in_thread, args=(missing, found, errors),
                                      name="miniwob instructions", daemon=True)
            worker.start()
            worker.join()
            if errors:
                raise errors[0]
            _INSTRUCTIONS.update(found)
        return {k: _INSTRUCTIONS[k] for k in keys}


def _read_in_thread(keys: list[tuple[str, int]], found: dict[tuple[str, int], str],
                    errors: list[BaseException]) -> None:
    try:
        asyncio.run(_read(keys, found))
    except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
        errors.append(exc)


async def _read(keys: list[tuple[str, int]], found: dict[tuple[str, int], str]) -> None:
    """Open the pages a few at a time in one context (reading needs no isolation) and ask each its instruction."""
    from envs.browser.chromium import find_chromium, shared_browser

    shared = shared_browser(find_chromium())
    await shared.acquire(1)
    try:
        context = await shared.new_context()
        base = serve_directory(html_dir())

        async def read(chunk: list[tuple[str, int]]) -> None:
            page = await context.new_page()
            for name, seed in chunk:
                try:
                    await page.goto(f"{base}miniwob/{name}.html", timeout=READ_TIMEOUT_MS)
                    found[(name, seed)] = await start_episode(page, seed, READ_TIMEOUT_MS)
                except Exception as exc:  # noqa: BLE001 - Playwright's errors, named with the task
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    raise EnvError(f"miniwob task {task_id(name, seed)}: could not read its instruction: {first}") from None

        try:
            await asyncio.gather(*(read(keys[i::READERS]) for i in range(READERS)))
        finally:
            await shared.close_context(context)
    finally:
        await shared.release(0)


def _task(page: str, seed: int, instruction: str, *, templated: bool = False) -> Task:
    metadata = {"source": SOURCE, "miniwob_version": version(), "split": TEST_SPLIT if seed >= TEST_SEED_BASE else "train"}
    if templated:
        metadata["templated_instruction"] = True  # filters/decontam.py: the words alone are no contamination
    return Task(id=task_id(page, seed), env="browser", instruction=instruction, params={"miniwob": page}, seed=seed,
                goal={"type": "miniwob"}, metadata=metadata)


def _whole(options: dict[str, Any], name: str, default: int) -> int:
    value = options.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TaskFileError(f"miniwob: options.{name} must be a whole number >= 1")
    return value


def _pages(config: TaskSourceConfig) -> list[str]:
    options = dict(config.options)
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TaskFileError(f"miniwob: unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(_OPTIONS))})")
    patterns, exclude = options.get("tasks"), options.get("exclude")
    for name, value in (("tasks", patterns), ("exclude", exclude)):
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise TaskFileError(f"miniwob: options.{name} must be a list of task names or patterns")
    return select_pages(patterns, exclude)


@register_task_source(SOURCE)
def miniwob_tasks(config: TaskSourceConfig, env_name: str, env: Environment | None) -> Iterator[Task]:
    pages = _pages(config)
    seeds = _whole(config.options, "seeds", 1)
    if config.split not in (None, "train", TEST_SPLIT):
        raise TaskFileError(f"miniwob: no split {config.split!r} (train: seeds below {TEST_SEED_BASE}, test: from it)")
    first = config.seed + (TEST_SEED_BASE if config.split == TEST_SPLIT else 0)
    keys = [(page, first + k) for page in pages for k in range(seeds)]
    if config.ids is not None:
        wanted = set(config.ids)
        keys = [k for k in keys if task_id(*k) in wanted]
    if config.n is not None:
        keys = keys[: config.n]
    test = [task_id(*k) for k in keys if k[1] >= TEST_SEED_BASE]
    if test and not config.allow_test_split:
        raise TaskFileError(f"miniwob: {len(test)} task(s) of the test split (seeds from {TEST_SEED_BASE}: "
                            f"{', '.join(test[:3])}{', ...' if len(test) > 3 else ''}); training data from test tasks "
                            "is refused unless asked for (--allow-test-split, or tasks.allow_test_split: true)")
    for (page, seed), instruction in instructions(keys).items():
        yield _task(page, seed, instruction)


@register_held_out(SOURCE)
def miniwob_held_out(config: TaskSourceConfig, env_name: str) -> list[Task]:
    """The first `held_out_seeds` test seeds of every page `config` names, with the instructions they show."""
    keys = [(page, TEST_SEED_BASE + k) for page in _pages(config)
            for k in range(_whole(config.options, "held_out_seeds", HELD_OUT_SEEDS))]
    # A page draws its instruction from a few templates, so a train seed often says a test seed's very words
    # over another layout: MiniWoB's protocol, not contamination. Only longer overlaps (n-grams) count.
    return [_task(page, seed, text, templated=True) for (page, seed), text in instructions(keys).items()]
