"""AndroidControl episodes (google-research android_control, TFRecords) -> interlingua.

Raw format (one object per episode; learned from ADP's `datasets/androidcontrol/raw_to_standardized.py`,
`schema_raw.py` and sample_raw.json):
- `episode_id`: integer episode id.
- `goal`: the high-level task.
- `screenshots`: list of screenshot paths (one per state, N states).
- `screenshot_widths`, `screenshot_heights`: their sizes.
- `accessibility_trees`: per state, a list of UI elements {`text`, `content_description`, `hint_text`,
  `tooltip`, `class_name`, `resource_id`, `is_checked`, ... , `bbox_pixels`: {`x_min`, `y_min`,
  `width`, `height`, ...}}.
- `actions`: N-1 actions {`action_type`: click | long_press | scroll | input_text | navigate_home |
  navigate_back | open_app | wait, `x`, `y`, `direction`, `text`, `app_name`}.
- `step_instructions`: N-1 low-level instructions (used as each action's thought).

Follows ADP: the goal is a first message action (as ADP does); each state is an annotated screenshot
(element text chosen from text / content description / hint / tooltip / switch state / resource id,
as ADP does; ADP's screenshots carry source "user"); each action an api call (long_press -> click,
navigate_back -> back).
"""

from __future__ import annotations

from typing import Any

from converters._util import Builder, Ctx, guarded, py_tool
from converters.registry import register
from schemas.models import Trajectory

NAME = "androidcontrol"
DATASET = "google-research/android_control"
TOOLS = [
    py_tool("click", "Tap the screen at (x, y) pixels.", {"x": "integer", "y": "integer"}),
    py_tool("scroll", "Scroll in a direction (up, down, left, right).", {"direction": "string"}),
    py_tool("input_text", "Type text into the focused field.", {"text": "string"}),
    py_tool("navigate_home", "Go to the home screen."),
    py_tool("back", "Press the back button."),
    py_tool("open_app", "Open an app by name.", {"app_name": "string"}),
    py_tool("wait", "Wait for the screen to update."),
]
_NUM = (int, float)


def element_text(el: dict[str, Any]) -> str:
    def s(key: str) -> str:
        v = el.get(key)
        return v if isinstance(v, str) else ""

    if s("text"):
        text = s("text")
        if len(text) == 1 and len(s("content_description")) > 1:
            return s("content_description")
        return text
    if s("content_description"):
        return s("content_description")
    if s("hint_text"):
        return s("hint_text")
    if s("tooltip"):
        return s("tooltip")
    if s("class_name").endswith("Switch"):
        return "Switch:" + ("on" if el.get("is_checked") else "off")
    if s("resource_id"):
        return s("resource_id").split("/")[-1]
    if s("class_name").endswith("EditText"):
        return s("edit text")
    return ""


@register(NAME, sources=[DATASET])
@guarded(("episode_id",))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("episode_id",), require_id=True)
    shots = ctx.items(record, "screenshots")
    trees = ctx.items(record, "accessibility_trees")
    actions = ctx.items(record, "actions", default=[])
    steps = ctx.items(record, "step_instructions", default=[])
    b = Builder(ctx, NAME, DATASET)
    b.message(ctx.str_(record, "goal"), thought=None)
    n = min(len(shots), len(trees))
    for i in range(n):
        where = f"accessibility_trees[{i}]"
        if not isinstance(shots[i], str):
            ctx.fail(f"`screenshots[{i}]` is {type(shots[i]).__name__}, expected string")
        if not isinstance(trees[i], list):
            ctx.fail(f"`{where}` is {type(trees[i]).__name__}, expected a list")
        annotations = []
        for j, el in enumerate(trees[i]):
            if not isinstance(el, dict):
                ctx.fail(f"`{where}[{j}]` is {type(el).__name__}, expected an object")
            bbox = ctx.get(el, "bbox_pixels", dict, f"{where}[{j}]")
            box = {}
            for key, out in (("x_min", "x"), ("y_min", "y"), ("width", "width"), ("height", "height")):
                v = ctx.get(bbox, key, _NUM, f"{where}[{j}].bbox_pixels")
                box[out] = v
            cls = el.get("class_name")
            annotations.append({"text": element_text(el), "element_type": cls if isinstance(cls, str) else "", "bounding_box": box})
        b.image(shots[i], annotations, source="user")
        if i == n - 1:
            break
        if i >= len(actions):
            ctx.fail(f"no action after screenshot {i}")
        act = actions[i]
        aw = f"actions[{i}]"
        if not isinstance(act, dict):
            ctx.fail(f"`{aw}` is {type(act).__name__}, expected an object")
        thought = steps[i] if i < len(steps) and isinstance(steps[i], str) else None
        kind = ctx.str_(act, "action_type", aw)
        if kind in ("click", "long_press"):
            b.api("click", {"x": ctx.get(act, "x", _NUM, aw), "y": ctx.get(act, "y", _NUM, aw)}, thought=thought)
        elif kind == "scroll":
            b.api("scroll", {"direction": ctx.str_(act, "direction", aw)}, thought=thought)
        elif kind == "input_text":
            b.api("input_text", {"text": ctx.str_(act, "text", aw)}, thought=thought)
        elif kind == "navigate_home":
            b.api("navigate_home", {}, thought=thought)
        elif kind == "navigate_back":
            b.api("back", {}, thought=thought)
        elif kind == "open_app":
            b.api("open_app", {"app_name": ctx.str_(act, "app_name", aw)}, thought=thought)
        elif kind == "wait":
            b.api("wait", {}, thought=thought)
        else:
            ctx.fail(f"unknown action type {kind[:40]!r}")
    return b.build(tools=TOOLS)
