"""`atif`: Harbor's Agent Trajectory Interchange Format (ATIF-v1.4), one trajectory per JSONL line.

For viewers and tools that read ATIF (Harbor, Terminal-Bench's tooling). The mapping is the
reverse of the `atif` converter (converters/atif.py):

- the system step (`name == "system"`) -> a `system` step; user text -> a `user` step;
- each action -> an `agent` step: an api action's call in `tool_calls` (its thought is the message,
  its reasoning `reasoning_content`), consecutive calls without a result between them in one step;
  a message action -> the message; a code action -> a call of a tool named after its language with
  argument `code`; an unusable answer (a failed step) -> its raw text as the message;
- the observations after an action -> that step's `observation.results` (`source_call_id` from
  `tool_call_id`); JSON as its text, a web page as its accessibility tree (else HTML, else URL), an
  image as its path; observations before any action -> a `system` step with an empty message;
- `step_id` counts from 1; ATIF fields a converted record kept (`extra["atif"]`: timestamps,
  models, metrics, extras, subagent references) are written back where they came from, so an ATIF
  file converted and exported is the same trajectory again;
- a trajectory's id, tools, reward, success, details and provenance go to the root `extra.trajforge`,
  and each step ATIF cannot say (kinds, labels, masks, rewards, step extras) to its step's
  `extra.trajforge`: the `atif` converter restores the trajectory exactly.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from pydantic import TypeAdapter

from converters._util import Ctx
from converters.atif import TRAJFORGE, step_dicts, without_atif
from converters.export.options import FormatOptions
from converters.export.records import Record
from schemas.arrow import trajectory_from_row
from schemas.models import ACTION_KINDS, Step, Trajectory

ATIF_VERSION = "ATIF-v1.4"
_STEP = TypeAdapter(Step)
# Keys of extra["atif"] that are the converter's bookkeeping, not ATIF step fields.
_BOOKKEEPING = ("step_id", "no_message", "empty_observation", "result", "call", "observation", "no_content")


def atif_rows(record: Record, opts: FormatOptions) -> list[dict[str, Any]]:
    return [to_atif(trajectory_from_row(record.batch.rows[record.index].as_py()))]


def _meta(step: Any) -> dict[str, Any]:
    meta = step.extra.get("atif") if isinstance(step.extra, dict) else None
    return meta if isinstance(meta, dict) else {}


def _role(step: Any) -> str:
    if step.kind in ACTION_KINDS or (step.kind == "text" and step.source == "agent"):
        return "agent"
    if step.kind == "text" and step.name == "system" and step.source == "environment":
        return "system"
    if step.kind == "text" and step.source == "user":
        return "user"
    return "env"


def group_steps(steps: list[Any]) -> list[list[Any]]:
    """The interlingua steps of each ATIF step, in order."""
    groups: list[list[Any]] = []
    for step in steps:
        sid = _meta(step).get("step_id")
        if groups:
            last = groups[-1]
            last_sid = _meta(last[0]).get("step_id")
            if sid is not None and sid == last_sid:
                last.append(step)
                continue
            if sid is None or last_sid is None:
                lead, role = last[0], _role(step)
                answered = any(_role(s) == "env" for s in last)
                if role == "env" and _role(lead) in ("agent", "system", "env"):
                    last.append(step)
                    continue
                if (step.kind == "api" and not step.thought and step.reasoning is None and not answered
                        and all(s.kind == "api" for s in last)):
                    last.append(step)  # parallel calls of one answer
                    continue
        groups.append([step])
    return groups


def _result(step: Any) -> dict[str, Any]:
    if step.kind == "text":
        content = step.content
    elif step.kind == "json":
        content = step.content if isinstance(step.content, str) else json.dumps(step.content, ensure_ascii=False)
    elif step.kind == "web":
        content = step.axtree or step.html or step.url or ""
    elif step.kind == "image":
        content = step.image.path
    else:
        content = ""
    meta = _meta(step)
    out: dict[str, Any] = {}
    if step.tool_call_id is not None:
        out["source_call_id"] = step.tool_call_id
    if not meta.get("no_content"):
        out["content"] = content
    out.update(copy.deepcopy(meta.get("result") or {}))
    return out


def _metrics(step: Any) -> dict[str, Any] | None:
    """ATIF metrics from the step's usage (model calls record it; converted ATIF keeps its own metrics)."""
    usage = getattr(step, "usage", None)
    if usage is None:
        return None
    metrics = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
               "cost_usd": usage.cost_usd}
    return {k: v for k, v in metrics.items() if v is not None} or None


def _atif_step(group: list[Any], step_id: int) -> dict[str, Any]:
    lead = group[0]
    role = _role(lead)
    meta = {k: copy.deepcopy(v) for k, v in _meta(lead).items() if k not in _BOOKKEEPING}
    out: dict[str, Any] = {"step_id": step_id}
    observations = [s for s in group if _role(s) == "env"]
    if role == "agent":
        actions = [s for s in group if _role(s) == "agent"]
        out["source"] = "agent"
        if lead.kind in ("api", "code"):
            calls = []
            for k, a in enumerate(actions):
                name, args = (a.function, a.arguments) if a.kind == "api" else (a.language, {"code": a.content})
                call = {"tool_call_id": a.tool_call_id or f"call_{step_id}_{k}", "function_name": name,
                        "arguments": args}
                call.update(copy.deepcopy(_meta(a).get("call") or {}))
                calls.append(call)
            out["message"] = lead.thought or ""
            if lead.reasoning is not None:
                out["reasoning_content"] = lead.reasoning
            out["tool_calls"] = calls
        else:
            out["message"] = lead.content
            if getattr(lead, "reasoning", None) is not None:
                out["reasoning_content"] = lead.reasoning
        if "metrics" not in meta and (metrics := _metrics(lead)) is not None:
            out["metrics"] = metrics
            if lead.usage.model:  # type: ignore[attr-defined]
                out["model_name"] = lead.usage.model  # type: ignore[attr-defined]
    elif role in ("system", "user"):
        out.update(source=role, message=lead.content)
    else:
        out.update(source="system", message="")
    if observations:
        extra_obs = _meta(observations[0]).get("observation") or {}
        out["observation"] = {**copy.deepcopy(extra_obs), "results": [_result(s) for s in observations]}
    elif (empty := _meta(lead).get("empty_observation")) is not None:
        out["observation"] = {**(empty if isinstance(empty, dict) else {}), "results": []}
    if _meta(lead).get("no_message"):
        out.pop("message", None)
    return {**out, **meta} if meta else out


def _same(step: Any, produced: dict[str, Any]) -> bool:
    try:
        again = _STEP.validate_python(produced)
    except ValueError:
        return False
    return again.model_dump(mode="json") == step.model_dump(mode="json")


def _with_overrides(group: list[Any], atif: dict[str, Any], where: str, native: bool) -> dict[str, Any]:
    """`atif` with the steps a conversion back would not rebuild saved in its `extra.trajforge`."""
    produced = step_dicts(Ctx({"session_id": where}, ("session_id",)), atif, where)
    if native:
        produced = without_atif(produced)
    saved = {str(k): s.model_dump(mode="json", exclude_none=True) for k, s in enumerate(group)
             if k >= len(produced) or not _same(s, produced[k])}
    if saved or len(produced) != len(group):
        extra = dict(atif.get("extra") or {})
        extra[TRAJFORGE] = {"count": len(group), "steps": saved}
        atif = {**atif, "extra": extra}
    return atif


def _from_atif(traj: Trajectory) -> bool:
    return traj.source == "atif" and isinstance(traj.details.get("atif"), dict)


def _agent(traj: Trajectory) -> dict[str, Any]:
    p = traj.provenance
    agent = {"name": p.method or traj.source, "version": p.trajforge_version or "unknown"}
    if p.model:
        agent["model_name"] = p.model
    return agent


def _final_metrics(traj: Trajectory, steps: int) -> dict[str, Any]:
    usage = traj.details.get("usage") if isinstance(traj.details.get("usage"), dict) else {}
    metrics = {"total_prompt_tokens": usage.get("prompt_tokens"), "total_completion_tokens": usage.get("completion_tokens"),
               "total_cost_usd": usage.get("cost_usd"), "total_steps": steps}
    return {k: v for k, v in metrics.items() if v is not None}


def to_atif(traj: Trajectory) -> dict[str, Any]:
    """One trajectory as an ATIF object (see the module doc)."""
    native = not _from_atif(traj)
    steps = [_with_overrides(group, _atif_step(group, n), f"{traj.id} step {n}", native)
             for n, group in enumerate(group_steps(list(traj.steps)), 1)]
    details = {k: v for k, v in traj.details.items() if k != "atif"}
    if _from_atif(traj):
        root = copy.deepcopy(traj.details["atif"])
        saved: dict[str, Any] = {}
    else:
        root = {"schema_version": ATIF_VERSION, "session_id": traj.id, "agent": _agent(traj),
                "final_metrics": _final_metrics(traj, len(steps))}
        saved = {"id": traj.id, "source": traj.source,
                 "provenance": traj.provenance.model_dump(mode="json", exclude_none=True)}
    saved |= {k: v for k, v in {"tools": [t.model_dump(mode="json", exclude_none=True) for t in traj.tools],
                                "reward": traj.reward, "success": traj.success, "details": details}.items()
              if v not in (None, [], {})}
    out = {k: v for k, v in root.items() if k not in ("steps", "extra", "notes", "final_metrics")}
    out["steps"] = steps
    for key in ("notes", "final_metrics"):
        if key in root:
            out[key] = root[key]
    extra = dict(root.get("extra") or {})
    if saved:
        extra[TRAJFORGE] = saved
    if extra or "extra" in root:
        out["extra"] = extra
    return out
