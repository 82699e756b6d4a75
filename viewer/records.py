"""A stored record -> the JSON the page draws: the record itself plus what the page marks on it.

For a trajectory that is: the segment of each step (a spliced Agent-R trajectory: the shared
prefix, the bad segment whose loss is masked, the revision thought, the good continuation; a
reflection trajectory likewise), which steps the export renderer hoists into the system turn and
which step is the task, the roles of its parent ids (the bad and the good source paths of a
splice), and the filter decision of a filtered record. A row that no longer validates is shown
raw, with the validation error, instead of failing the page.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from converters.export.render import Unrenderable, render
from schemas.arrow import pair_from_row, trajectory_from_row
from schemas.models import Trajectory
from viewer.sources import first_line

Segment = str  # "prefix" | "bad" | "revision" | "continuation"
# What converting a stored row that no longer fits the models raises.
INVALID = (ValidationError, ValueError, KeyError, TypeError)


def jsonable(value: Any) -> Any:
    """Arrow rows and models -> strict JSON values (timestamps as ISO text; NaN and infinities as null)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ints(value: Any) -> set[int]:
    return {v for v in value if _int(v) is not None} if isinstance(value, list) else set()


def _revision_block(traj: Trajectory) -> tuple[str, dict[str, Any]] | None:
    """("splice" | "reflection", its details) for a trajectory made by splicing or reflection."""
    for key in ("splice", "reflection"):
        block = traj.details.get(key)
        if isinstance(block, dict):
            return key, block
    return None


def segments(traj: Trajectory) -> list[Segment | None]:
    """Each step's part of a revision trajectory; a plain trajectory marks only revision thoughts."""
    n = len(traj.steps)
    out: list[Segment | None] = [None] * n
    found = _revision_block(traj)
    if found is None:
        for i, step in enumerate(traj.steps):
            if step.extra.get("kind") == "revision":
                out[i] = "revision"
        return out
    kind, block = found
    masked = _ints(block.get("masked"))
    revision = _int(block.get("revision_index" if kind == "splice" else "reflection_index"))
    # A reflection corrects several errors: each correction's reflection is a revision thought.
    reflections = {_int(c.get("reflection_step")) for c in block.get("corrections") or [] if isinstance(c, dict)}
    start = _int(block.get("prefix_len")) if kind == "splice" else _int(block.get("first_error"))
    start = min(masked) if start is None and masked else start
    for i in range(n):
        if i in masked:
            out[i] = "bad"
        elif (revision is not None and i == revision) or i in reflections:
            out[i] = "revision"
        elif revision is not None and i > revision:
            out[i] = "continuation"
        elif start is not None and i < start:
            out[i] = "prefix"
    return out


def parent_roles(traj: Trajectory) -> list[dict[str, str | None]]:
    """Parent ids with what each is to this record (the bad / good source path of a splice)."""
    found = _revision_block(traj)
    roles: dict[str, str] = {}
    if found and found[0] == "splice":
        block = found[1]
        for key, role in (("bad_node", "bad source path"), ("good_node", "good source path")):
            node = _int(block.get(key))
            if node is not None:
                roles[f"/n{node}"] = role
    elif found:
        roles[""] = "source trajectory"
    out = []
    for pid in traj.provenance.parent_ids:
        role = next((r for suffix, r in roles.items() if pid.endswith(suffix)), None)
        out.append({"id": pid, "role": role})
    return out


def prompt_parts(traj: Trajectory) -> dict[str, Any]:
    """The steps the exporters hoist into the system turn, and the step that states the task."""
    try:
        turns = render(traj, require_assistant=False)
    except Unrenderable:
        return {"system_steps": [], "task_step": None}
    system = next((t.steps for t in turns if t.role == "system"), [])
    task = next((t.first_step for t in turns if t.role == "user"), None)
    return {"system_steps": list(system), "task_step": task}


def trajectory_view(row: dict[str, Any]) -> dict[str, Any]:
    """A trajectories (or filtered) row for the page."""
    decision = {k: row[k] for k in ("filter", "reason", "score") if k in row}
    try:
        traj = trajectory_from_row(row)
    except INVALID as exc:
        return {"invalid": first_line(exc), "raw": row, "decision": decision or None}
    return {
        "trajectory": traj.model_dump(mode="json"),
        "segments": segments(traj),
        "revision": _revision_summary(traj),
        "parents": parent_roles(traj),
        **prompt_parts(traj),
        "decision": decision or None,
    }


def _revision_summary(traj: Trajectory) -> dict[str, Any] | None:
    found = _revision_block(traj)
    if found is None:
        return None
    kind, block = found
    return {"kind": kind, **block}


def pair_view(row: dict[str, Any]) -> dict[str, Any]:
    try:
        pair = pair_from_row(row)
    except INVALID as exc:
        return {"invalid": first_line(exc), "raw": row}
    return {"pair": pair.model_dump(mode="json")}
