"""Android in the Wild (google-research/android_in_the_wild, TFRecords) -> interlingua.

Raw format: one object per *step* (flattened tf.train.Example); a trajectory is the run of
consecutive steps with the same `episode_id` (use `episodes(rows)`; `convert` takes the list of an
episode's steps, or a single step object as a one-step episode). Step keys:
- `episode_id`: episode id (string of digits); `step_id`: step index; `episode_length`: steps.
- `goal_info`: the task in natural language (same for all steps of an episode).
- `image/encoded`: screenshot path stem (ADP writes the PNG next to it); `image/width`,
  `image/height`, `image/channels`: screenshot size.
- `image/ui_annotations_positions`: list of [y, x, height, width] boxes (relative);
  `image/ui_annotations_text`, `image/ui_annotations_ui_types`: the element texts and types.
- `results/action_type`: "dual-point gesture" | "type" | "go_back" | "go_home" | "enter" |
  "task_complete" | "task_impossible"; `results/yx_touch`, `results/yx_lift`: [y, x];
  `results/type_action`: typed text.
- `current_activity`, `device_type`, `android_api_level`: device metadata.

Follows ADP's `datasets/android_in_the_wild/raw_to_standardized.py`: the goal is a first message
action (as ADP does), then per step the annotated screenshot and one api action
(touch_and_lift / type / press / end).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from converters._util import Builder, Ctx, guarded, py_tool
from converters.registry import KeyField, group_consecutive, register
from schemas.models import Trajectory

NAME = "android_in_the_wild"
DATASET = "google-research/android_in_the_wild"
TOOLS = [
    py_tool("touch_and_lift", "Touch the screen at (x0, y0) and lift at (x1, y1) (relative coordinates).",
            {"x0": "number", "y0": "number", "x1": "number", "y1": "number"}),
    py_tool("type", "Type text with the keyboard.", {"text": "string"}),
    py_tool("press", "Press a special key: go_back, go_home or enter.", {"key_name": "string"}),
    py_tool("end", "End the task, saying whether it succeeded.", {"succeeds": "boolean"}),
]
_NUM = (int, float)


EPISODE_KEY = KeyField("episode_id")


def episodes(rows: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Group consecutive step rows by `episode_id`."""
    return group_consecutive(rows, EPISODE_KEY)


def _point(ctx: Ctx, row: dict, key: str, where: str) -> list[float]:
    value = ctx.get(row, key, list, where)
    if len(value) != 2 or not all(isinstance(v, _NUM) and not isinstance(v, bool) for v in value):
        ctx.fail(f"`{where}.{key}` must be two numbers")
    return value


@register(NAME, sources=[DATASET], episode_key=EPISODE_KEY)
@guarded(("episode_id",))
def convert(record: Any) -> Trajectory:
    rows = record if isinstance(record, list) else [record]
    first = rows[0] if rows else None
    ctx = Ctx(first if isinstance(first, dict) else record, ("episode_id",), require_id=True)
    if not rows:
        ctx.fail("empty episode")
    ctx.raw = record  # the id's content hash covers the whole episode
    episode_id = ctx.rid
    b = Builder(ctx, NAME, DATASET)
    goal = None
    for i, row in enumerate(rows):
        where = f"steps[{i}]"
        if not isinstance(row, dict):
            ctx.fail(f"`{where}` is {type(row).__name__}, expected an object")
        if str(row.get("episode_id")) != episode_id:
            ctx.fail(f"`{where}.episode_id` differs from the episode's")
        row_goal = ctx.str_(row, "goal_info", where)
        if goal is None:
            goal = row_goal
            b.message(goal, thought=None)
        elif row_goal != goal:
            ctx.fail(f"`{where}.goal_info` differs within the episode")
        texts = ctx.items(row, "image/ui_annotations_text", where, default=[])
        types = ctx.items(row, "image/ui_annotations_ui_types", where, default=[])
        boxes = ctx.items(row, "image/ui_annotations_positions", where, default=[])
        annotations = []
        for text, kind, pos in zip(texts, types, boxes):
            if not (isinstance(text, str) and isinstance(kind, str) and isinstance(pos, list) and len(pos) == 4
                    and all(isinstance(v, _NUM) and not isinstance(v, bool) for v in pos)):
                ctx.fail(f"`{where}` has a malformed UI annotation")
            annotations.append({"text": text, "element_type": kind,
                                "bounding_box": {"x": pos[1], "y": pos[0], "width": pos[3], "height": pos[2]}})
        b.image(f"{ctx.str_(row, 'image/encoded', where)}.png", annotations)
        action = ctx.str_(row, "results/action_type", where)
        if action == "dual-point gesture":
            touch, lift = _point(ctx, row, "results/yx_touch", where), _point(ctx, row, "results/yx_lift", where)
            b.api("touch_and_lift", {"x0": touch[1], "y0": touch[0], "x1": lift[1], "y1": lift[0]})
        elif action == "type":
            b.api("type", {"text": ctx.get(row, "results/type_action", str, where, default="")})
        elif action in ("go_back", "go_home", "enter"):
            b.api("press", {"key_name": action})
        elif action in ("task_complete", "task_impossible"):
            b.api("end", {"succeeds": action == "task_complete"})
        else:
            ctx.fail(f"unknown action type {action[:40]!r}")
    meta = {k: first.get(k) for k in ("device_type", "current_activity", "android_api_level", "episode_length")}
    return b.build(tools=TOOLS, details={k: v for k, v in meta.items() if isinstance(v, (str, int)) and not isinstance(v, bool)})
