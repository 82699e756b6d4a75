"""Trajectories -> one Arrow batch of the trajectory table, converted in one call.

The result is equal to `pa.RecordBatch.from_pylist([trajectory_to_row(t) ...], TRAJECTORY_SCHEMA)` (a test
holds them together) at a fraction of the cost: a trajectory becomes one nested tuple in
schema field order (its steps, tools and provenance tuples too) instead of dicts that Arrow
looks up field by field, and the whole batch is converted by a single `pa.array` call into
the table's struct type.

Converters may build these tuples themselves, without models (`ConverterInfo.to_row`, built
with `schemas.rows`); `BatchBuilder.add_row` takes such a row.
"""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from schemas import jsonutil
from schemas.arrow import TRAJECTORY_SCHEMA
from schemas.models import ImageRef, Trajectory

_dumps = jsonutil.dumps
_ROW_TYPE = pa.struct(list(TRAJECTORY_SCHEMA))


def _json_or_none(value: Any) -> str | None:
    return _dumps(value) if value else None


def _image_row(image: ImageRef | None) -> dict[str, Any] | None:
    if image is None:
        return None
    annotations = None
    if image.annotations is not None:
        annotations = _dumps([a.model_dump() for a in image.annotations])
    return {"path": image.path, "source": image.source, "annotations": annotations}


def _step(s: Any) -> tuple[Any, ...]:
    """One step in STEP_TYPE field order (the fields `schemas.arrow.step_to_row` sets, the rest None)."""
    kind = s.kind
    thought = reasoning = function = arguments = language = content = source = name = None
    url = html = axtree = image = viewport = None
    if kind == "api":
        thought, reasoning, function, arguments = s.thought, s.reasoning, s.function, _dumps(s.arguments)
    elif kind == "code":
        thought, reasoning, language, content = s.thought, s.reasoning, s.language, s.content
    elif kind == "message":
        thought, reasoning, content = s.thought, s.reasoning, s.content
    elif kind == "text":
        content, source, name = s.content, s.source, s.name
    elif kind == "json":
        content, source, name = _dumps(s.content), s.source, s.name
    elif kind == "image":
        image = _image_row(s.image)
    elif kind == "web":
        url, html, axtree, image = s.url, s.html, s.axtree, _image_row(s.screenshot)
        viewport = list(s.viewport) if s.viewport is not None else None
    return (kind, s.tool_call_id, thought, reasoning, function, arguments, language, content, source, name,
            url, html, axtree, image, viewport, s.reward, s.label, s.train, _json_or_none(s.extra),
            None if s.usage is None else tuple(s.usage.model_dump().values()))


class BatchBuilder:
    """Collects trajectories as plain tuples (so the models can be freed at once) and builds
    the batch at the end.

    `add` raises what `trajectory_to_row` raises for a value JSON cannot encode, and adds
    nothing then; `finish` raises what `pa.array` raises for a value Arrow cannot store
    (e.g. an int beyond 64 bits).
    """

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def add(self, t: Trajectory) -> None:
        # Everything that can fail is computed before anything is appended.
        steps = list(map(_step, t.steps))
        tools = [(tool.name, tool.description, _dumps(tool.parameters) if tool.parameters is not None else None)
                 for tool in t.tools]
        details = _json_or_none(t.details)
        p = t.provenance
        provenance = (p.method, p.source_dataset, p.source_id, p.source_format, p.model, p.prompt_template_hash,
                      p.seed, p.task_id, list(p.parent_ids), p.trajforge_version, p.created_at,
                      p.schema_version, p.task_split)
        self.rows.append((t.id, t.source, steps, tools, t.reward, t.success, provenance, details))

    def add_row(self, row: tuple[Any, ...]) -> None:
        """Add a row a converter built without models (`schemas.rows`)."""
        self.rows.append(row)

    def finish(self) -> pa.RecordBatch:
        """The batch of the rows added so far; the builder is empty afterwards (also when Arrow
        rejects a value), so the rows' memory goes at once."""
        rows, self.rows = self.rows, []
        return pa.RecordBatch.from_struct_array(pa.array(rows, type=_ROW_TYPE))


def trajectories_to_batch(trajs: Sequence[Trajectory]) -> pa.RecordBatch:
    builder = BatchBuilder()
    for t in trajs:
        builder.add(t)
    return builder.finish()
