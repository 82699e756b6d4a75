"""WebArena successful trajectories (ADP's webarena_successful collection) -> interlingua.

Evaluation data upstream (WebArena test tasks): use it for tests, never in training mixes.

Raw format (one object per trajectory):
- `task_id`: WebArena task id (int); not unique across trajectories (several agents per task).
- `intent`: the task in natural language.
- `source`: the agent / model that produced the run (e.g. "gpt-4o", "SteP").
- `trajectory`: alternating items: a state {`url`, `axtree`, `screenshot_path`} and an action
  {`action`: {`action_name`, `element_id`, `text` (list of key ids), `url`, `key_comb`,
  `direction`, `page_number`, `answer`, ...}, `metadata`: {`cot`: str}}.

Follows ADP's `datasets/webarena_successful/raw_to_standardized.py`: the intent is a user text
observation; a state is a web observation (the `axtree` text goes to `html` as ADP does, screenshot
path with "demo_trajs/images/" mapped to ADP's screenshot folder, viewport 1280x720); an action is
an api call (type's key ids decoded with WebArena's charset, special keys ignored as ADP does;
thought = `cot`). `success` is True, `reward` 1.0 (all runs are successful). The task id is the
source id (it repeats across runs; the trajectory id's content hash keeps ids unique).
ADP skips the "SteP" source (no screenshots); we keep it.
"""

from __future__ import annotations

from typing import Any

from converters._util import Builder, Ctx, guarded, py_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "webarena_successful"
DATASET = "webarena_successful (ADP collection of WebArena successful runs)"
SCREENSHOT_ROOT = "datasets/webarena_successful/screenshots"
# WebArena's key vocabulary: 15 special keys, then printable ASCII, then code points 129..999, then "\n".
_SPECIAL = 15
_CHARSET = [""] * _SPECIAL + [chr(x) for x in range(32, 128)] + [chr(x) for x in range(129, 1000)] + ["\n"]
TOOLS = [
    py_tool("click", "Click the element with the given id.", {"element_id": "string"}),
    py_tool("type", "Type text into the element with the given id.", {"element_id": "string", "text": "string"}),
    py_tool("hover", "Hover over the element with the given id.", {"element_id": "string"}),
    py_tool("scroll", "Scroll by (dx, dy) pixels.", {"dx": "number", "dy": "number"}),
    py_tool("press", "Press a key combination.", {"key_comb": "string"}),
    py_tool("stop", "Stop, giving the answer if the task asks for one.", {"answer": "string"}, []),
    py_tool("goto", "Navigate to a URL.", {"url": "string"}),
    py_tool("new_tab", "Open a new tab.", {"url": "string"}),
    py_tool("tab_focus", "Focus the tab with the given number.", {"page_number": "integer"}),
    py_tool("tab_close", "Close the current tab."),
    py_tool("go_back", "Go back in history."),
    py_tool("go_forward", "Go forward in history."),
]


def _action(ctx: Ctx, b: Builder, element: dict, where: str) -> None:
    act = ctx.get(element, "action", dict, where)
    meta = element.get("metadata")
    thought = meta.get("cot", "") if isinstance(meta, dict) else ""
    if not isinstance(thought, str):
        ctx.fail(f"`{where}.metadata.cot` is {type(thought).__name__}, expected string")
    w = f"{where}.action"
    fn = ctx.str_(act, "action_name", w)
    if fn == "stop":
        kwargs = {"answer": ctx.get(act, "answer", object, w)}
    elif fn == "type":
        keys = ctx.items(act, "text", w)
        if not all(isinstance(k, int) and not isinstance(k, bool) for k in keys):
            ctx.fail(f"`{w}.text` must be a list of key ids")
        text = "".join(_CHARSET[k] for k in keys if _SPECIAL <= k < len(_CHARSET))
        kwargs = {"text": text, "element_id": ctx.get(act, "element_id", object, w)}
    elif fn in ("hover", "click"):
        kwargs = {"element_id": ctx.get(act, "element_id", object, w)}
    elif fn == "scroll":
        direction = ctx.str_(act, "direction", w)
        kwargs = {"dx": 0, "dy": 100 if direction.lower() == "down" else -100}
    elif fn in ("key_press", "press"):
        fn, kwargs = "press", {"key_comb": ctx.get(act, "key_comb", object, w)}
    elif fn in ("new_tab", "goto", "goto_url"):
        kwargs = {"url": ctx.get(act, "url", object, w)}
        fn = "goto" if fn == "goto_url" else fn
    elif fn in ("tab_focus", "page_focus"):
        fn, kwargs = "tab_focus", {"page_number": ctx.get(act, "page_number", object, w)}
    elif fn in ("go_back", "page_close", "go_forward"):
        fn, kwargs = ("tab_close" if fn == "page_close" else fn), {}
    else:
        ctx.fail(f"unknown action {fn[:40]!r}")
    b.api(fn, kwargs, thought=thought)


@register(NAME, sources=["ADP datasets/webarena_successful (WebArena test-set runs)"])
@guarded(("task_id",))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("task_id",), require_id=True)
    task_id = ctx.rid
    b = Builder(ctx, NAME, DATASET)
    b.text(ctx.str_(record, "intent"), "user")
    for i, element in enumerate(ctx.dicts(record, "trajectory")):
        where = f"trajectory[{i}]"
        if "action" in element:
            _action(ctx, b, element, where)
        elif "url" in element:
            shot = ctx.str_(element, "screenshot_path", where).replace("demo_trajs/images/", SCREENSHOT_ROOT)
            b.web(url=ctx.str_(element, "url", where), html=ctx.get(element, "axtree", str, where, default=None),
                  screenshot={"path": shot, "source": "environment", "annotations": []}, viewport=(1280, 720))
        else:
            ctx.fail(f"`{where}` is neither a state nor an action")
    details = {"source": record["source"]} if isinstance(record.get("source"), str) else {}
    details["eval_only"] = True
    return b.build(tools=TOOLS, success=True, reward=1.0, details=details, task_id=task_id)
