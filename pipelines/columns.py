"""Trajectories -> one Arrow batch of the trajectory table, built column by column.

The result is equal to `pa.RecordBatch.from_pylist([trajectory_to_row(t) ...], TRAJECTORY_SCHEMA)` (a test
holds them together) at a fraction of the cost: a step becomes one tuple in schema field
order instead of a dict that Arrow then looks up field by field, and each leaf column is
converted by one `pa.array` call.
"""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from schemas import jsonutil
from schemas.arrow import PROVENANCE_TYPE, STEP_TYPE, TOOL_TYPE, TRAJECTORY_SCHEMA
from schemas.models import ImageRef, Trajectory

_dumps = jsonutil.dumps
_STEP_FIELDS = list(STEP_TYPE)
_TOOL_FIELDS = list(TOOL_TYPE)
_PROVENANCE_FIELDS = list(PROVENANCE_TYPE)


def _json_or_none(value: Any) -> str | None:
    return _dumps(value) if value else None


def _image(image: ImageRef | None) -> dict[str, Any] | None:
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
        image = _image(s.image)
    elif kind == "web":
        url, html, axtree, image = s.url, s.html, s.axtree, _image(s.screenshot)
        viewport = list(s.viewport) if s.viewport is not None else None
    return (kind, s.tool_call_id, thought, reasoning, function, arguments, language, content, source, name,
            url, html, axtree, image, viewport, s.reward, s.label, s.train, _json_or_none(s.extra))


def _struct(columns: Sequence[Sequence[Any]], fields: list[pa.Field]) -> pa.StructArray:
    arrays = [pa.array(values, type=f.type) for values, f in zip(columns, fields)]
    return pa.StructArray.from_arrays(arrays, fields=fields)


def _lists(items: list[tuple[Any, ...]], offsets: list[int], fields: list[pa.Field], item: pa.DataType) -> pa.Array:
    columns = list(zip(*items)) if items else [()] * len(fields)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), _struct(columns, fields), type=pa.list_(item))


class BatchBuilder:
    """Collects trajectories as plain tuples (so the models can be freed at once) and builds
    the batch at the end.

    `add` raises what `trajectory_to_row` raises for a value JSON cannot encode, and adds
    nothing then; `finish` raises what `pa.array` raises for a value Arrow cannot store
    (e.g. an int beyond 64 bits).
    """

    def __init__(self) -> None:
        self.top: list[tuple[Any, ...]] = []
        self.steps: list[tuple[Any, ...]] = []
        self.step_offsets = [0]
        self.tools: list[tuple[Any, ...]] = []
        self.tool_offsets = [0]
        self.provenance: list[tuple[Any, ...]] = []

    def add(self, t: Trajectory) -> None:
        # Everything that can fail is computed before anything is appended.
        steps = list(map(_step, t.steps))
        tools = [(tool.name, tool.description, _dumps(tool.parameters) if tool.parameters is not None else None)
                 for tool in t.tools]
        details = _json_or_none(t.details)
        p = t.provenance
        self.provenance.append((p.method, p.source_dataset, p.source_id, p.source_format, p.model,
                                p.prompt_template_hash, p.seed, p.task_id, list(p.parent_ids), p.trajforge_version,
                                p.created_at))
        self.top.append((t.id, t.source, t.reward, t.success, details))
        self.steps.extend(steps)
        self.step_offsets.append(len(self.steps))
        self.tools.extend(tools)
        self.tool_offsets.append(len(self.tools))

    def finish(self) -> pa.RecordBatch:
        ids, sources, rewards, successes, details = zip(*self.top) if self.top else [()] * 5
        provenance = list(zip(*self.provenance)) if self.provenance else [()] * len(_PROVENANCE_FIELDS)
        columns = [
            pa.array(ids, pa.string()),
            pa.array(sources, pa.string()),
            _lists(self.steps, self.step_offsets, _STEP_FIELDS, STEP_TYPE),
            _lists(self.tools, self.tool_offsets, _TOOL_FIELDS, TOOL_TYPE),
            pa.array(rewards, pa.float64()),
            pa.array(successes, pa.bool_()),
            _struct(provenance, _PROVENANCE_FIELDS),
            pa.array(details, pa.string()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=TRAJECTORY_SCHEMA)


def trajectories_to_batch(trajs: Sequence[Trajectory]) -> pa.RecordBatch:
    builder = BatchBuilder()
    for t in trajs:
        builder.add(t)
    return builder.finish()
