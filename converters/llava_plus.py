"""LLaVA-Plus tool-use conversations (LLaVA-VL/llava-plus-data) -> interlingua.

Raw format (one object per conversation, llava-plus-v1-117k-tool-merge.json):
- `unique_id`: string id (e.g. "1699545382.4288898").
- `image`: image file name (e.g. "000000436407.jpg"); pixels are not part of the record.
- `data_source`: image collection (e.g. "coco"); the image path is images/<data_source>/<image>.
- `conversations`: list of {`from`: "human" | "gpt", `value`: str}; gpt turns also carry
  `thoughts` (str) and `actions` (list of {`API_name`: str, `API_params`: object}).

Follows ADP's `datasets/llava_plus/raw_to_standardized.py`: a human turn starting with "<image>\\n"
gives an image observation then the user text; a gpt turn is a message (thought = `thoughts`)
followed by one api action per tool call. `tools` lists the tool names the record calls.
"""

from __future__ import annotations

from typing import Any

from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "llava_plus"
DATASET = "LLaVA-VL/llava-plus-data"
_DESCRIPTIONS = {
    "sam": "Segment Anything: segment the objects inside the given boxes.",
    "inpainting": "Stable-diffusion inpainting: edit the masked region following a prompt.",
}


@register(NAME, sources=[DATASET])
@guarded(("unique_id",))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("unique_id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    used: list[str] = []
    for i, turn in enumerate(ctx.dicts(record, "conversations")):
        where = f"conversations[{i}]"
        who = ctx.str_(turn, "from", where)
        value = ctx.str_(turn, "value", where)
        if who == "human":
            if value.startswith("<image>\n"):
                image = ctx.str_(record, "image")
                folder = ctx.str_(record, "data_source")
                b.image(f"images/{folder}/{image}")
                b.text(value[len("<image>\n") :], "user")
            else:
                b.text(value, "user")
        elif who == "gpt":
            thoughts = ctx.get(turn, "thoughts", str, where, default=None)
            b.message(value, thought=thoughts)
            for j, act in enumerate(ctx.dicts(turn, "actions", where, default=[])):
                name = ctx.str_(act, "API_name", f"{where}.actions[{j}]")
                params = ctx.get(act, "API_params", dict, f"{where}.actions[{j}]", default={})
                b.api(name, params, thought=None)
                if name not in used:
                    used.append(name)
        else:
            ctx.fail(f"`{where}.from` is {who[:40]!r}, expected human or gpt")
    tools = [{"name": n, "description": _DESCRIPTIONS.get(n)} for n in used]
    details = {"image": record.get("image"), "data_source": record.get("data_source")}
    return b.build(tools=tools, details={k: v for k, v in details.items() if isinstance(v, str)})
