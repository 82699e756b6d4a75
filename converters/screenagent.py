"""ScreenAgent dataset (niuzaisheng/ScreenAgent) -> interlingua.

Raw format: ADP's extraction groups a session's items into one JSON list; each *item* is one
trajectory here (use `items(group)`, which adds the item's position as `_index`, as ADP numbers
them). Item keys (learned from ADP's `datasets/screenagent/schema_raw.py`, `raw_to_standardized.py`
and sample_raw.json):
- `session_id`: session id; `_index` (added by `items`): position in the session group.
- `task_prompt` / `task_prompt_en` / `task_prompt_zh`: the task (original / English / Chinese).
- `send_prompt`, `send_prompt_en`, `send_prompt_zh`: the full prompt sent to the model.
- `current_task`: current sub-task ("N/A" when none).
- `LLM_response`, `LLM_response_editer` (+ `_en` / `_zh`): the model's plan and its human-edited version
  (JSON list of actions, often fenced).
- `actions`: JSON string of the executed actions; `video_height`, `video_width`: screen size.
- `saved_image_name`: screenshot file; `screenshot`: path or the "<image>" placeholder.

Follows ADP: the English task is user text, the screenshot (unless "<image>") an image observation,
the edited English response a message action. Id source: "<session_id>_<_index>".
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "screenagent"
DATASET = "niuzaisheng/ScreenAgent"


def items(group: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """A session group (list of items) -> items carrying their `_index`."""
    for i, item in enumerate(group):
        yield {**item, "_index": i} if isinstance(item, dict) else item


def split_row(row: Any) -> list[Any]:
    """One raw row as ADP ships it (a session's list of items) -> its items; any other row is one record."""
    return list(items(row)) if isinstance(row, list) else [row]


def episodes(groups: Iterable[Any]) -> Iterator[Any]:
    """Raw rows as ADP ships them (one list per session) -> one record per item."""
    for group in groups:
        yield from split_row(group)


@register(NAME, sources=[DATASET], split_row=split_row)
@guarded(("session_id",))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("session_id",), require_id=True)
    index = record.get("_index")
    source_id = ctx.rid if index is None else f"{ctx.rid}_{index}"
    if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
        ctx.fail(f"`_index` is {type(index).__name__}, expected integer")
    b = Builder(ctx, NAME, DATASET)
    b.text(ctx.str_(record, "task_prompt_en"), "user")
    shot = ctx.get(record, "screenshot", str, default="")
    if shot and shot != "<image>":
        b.image(shot)
    b.message(ctx.str_(record, "LLM_response_editer_en"), thought=None)
    details = {k: record[k] for k in ("saved_image_name", "current_task", "task_prompt_zh") if isinstance(record.get(k), str)}
    return b.build(details=details, source_id=source_id)
