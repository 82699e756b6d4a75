"""OmniACT desktop/web automation (Writer/omniact) -> interlingua.

Raw format (one object per example; learned from ADP's `datasets/omniact/raw_to_standardized.py`,
`omniact.py` and sample_raw.json):
- `id`: e.g. "train_0".
- `task`: "Task: <instruction>\\nOutput Script:\\n<pyautogui script>" (a few spacing variants).
- `image`: screenshot path, e.g. "data/data/web/asics/screen1.png".
- `box`: UI boxes {`top_left`: [[x, y], ...], `bottom_right`: [[x, y], ...], `label`: [str, ...]}.
- `ocr`, `color`, `icon`: {`text`: [...], `value`: [...]} extra detections (kept in details only by count).

Follows ADP: an annotated screenshot (element_type "button", width/height from the corners), the
instruction as user text, and the script as a python code action with thought "Output Script".
"""

from __future__ import annotations

import re
from typing import Any

from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "omniact"
DATASET = "Writer/omniact"
_TASK = re.compile(
    r"Task: (.*)\nOutput Script:\n(.*)|Task: (.*)\nOutput Script: \n(.*)|Task: (.*)\nOutput Script: (.*)"
    r"|Task: (.*)\n(.*)\n|Task: (.*)\n(.*)",
    re.DOTALL,
)
_NUM = (int, float)


def _xy(ctx: Ctx, value: Any, where: str) -> tuple[float, float]:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, _NUM) and not isinstance(v, bool) for v in value)):
        ctx.fail(f"`{where}` must be an [x, y] pair of numbers")
    return value[0], value[1]


@register(NAME, sources=[DATASET])
@guarded()
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    task = ctx.str_(record, "task")
    m = _TASK.match(task)
    if not m:
        ctx.fail("`task` does not start with 'Task: '")
    instruction = next((g for g in m.groups()[0::2] if g), None)
    script = next((g for g in m.groups()[1::2] if g), None)
    if not instruction or not script:
        ctx.fail("`task` lacks an instruction or an output script")
    box = ctx.get(record, "box", dict)
    labels = ctx.items(box, "label", "box")
    tops, bottoms = ctx.items(box, "top_left", "box"), ctx.items(box, "bottom_right", "box")
    if not (len(tops) >= len(labels) and len(bottoms) >= len(labels)):
        ctx.fail("`box` has fewer corners than labels")
    annotations = []
    for i, label in enumerate(labels):
        if not isinstance(label, str):
            ctx.fail(f"`box.label[{i}]` is {type(label).__name__}, expected string")
        x0, y0 = _xy(ctx, tops[i], f"box.top_left[{i}]")
        x1, y1 = _xy(ctx, bottoms[i], f"box.bottom_right[{i}]")
        annotations.append({"text": label, "element_type": "button",
                            "bounding_box": {"x": x0, "y": y0, "width": x1 - x0, "height": y1 - y0}})
    b = Builder(ctx, NAME, DATASET)
    b.image(ctx.str_(record, "image"), annotations)
    b.text(instruction, "user")
    b.code("python", script, thought="Output Script")
    return b.build()
