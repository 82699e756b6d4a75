"""Harbor's Agent Trajectory Interchange Format (ATIF, v1.0-v1.4) -> interlingua.

ATIF (the RFC `docs/rfcs/0001-trajectory-format.md` of laude-institute/harbor) is what Harbor and
Terminal-Bench agents, VS Code Copilot Chat's trajectory export and others write: one JSON object
per trajectory (a file each, a JSON list, or JSONL lines), `schema_version` ("ATIF-v1.4"),
`session_id`, `agent` {`name`, `version`, `model_name`?, `extra`?}, `steps`, `notes`?,
`final_metrics`?, `extra`?. A step has `step_id`, `source` (system / user / agent), `message`,
and for agents `reasoning_content`, `tool_calls` [{`tool_call_id`, `function_name`, `arguments`}],
`observation` {`results`: [{`source_call_id`?, `content`?, `subagent_trajectory_ref`?: [{`session_id`,
`trajectory_path`?, `extra`?}]}]}, `metrics` {`prompt_tokens`, `completion_tokens`, `cached_tokens`,
`cost_usd`, `prompt_token_ids`, `completion_token_ids`, `logprobs`, `extra`}, plus `timestamp`,
`model_name`, `reasoning_effort` and `extra` on any step.

Mapping (one ATIF step -> one or more steps):
- system -> a text observation from the environment named "system" (`train` false: a prompt, not
  the agent's words); its observation results (v1.2: subagent delegation, context management)
  follow as environment text observations.
- user -> a user text observation.
- agent with tool calls -> one api action per call (`tool_call_id` kept; the message is the first
  call's `thought`, `reasoning_content` its `reasoning`); without tool calls -> a message action.
  Each observation result -> an environment text observation, named after the call it answers
  (`source_call_id` -> `tool_call_id`), results without a call (non-tool actions) unnamed.
- Everything else is kept, so `trajforge export --format atif` writes the same trajectory back: the
  step's other fields (`step_id`, `timestamp`, `model_name`, `reasoning_effort`, `metrics`, `extra`
  and any field a later version adds) in the first produced step's `extra["atif"]` (every produced
  step carries the ATIF `step_id`), a result's `subagent_trajectory_ref` and other fields in its
  observation's `extra["atif"]["result"]`, and the root fields but `steps` in `details["atif"]`.
  `session_id` is the upstream id, `agent.model_name` the model, `schema_version` the source format.
- Per-step token and cost metrics become the agent step's `usage` (model, prompt and completion
  tokens, cost; `usage_of`), and stay whole in `extra["atif"]["metrics"]` (cached tokens, token
  ids, logprobs, provider extras), which the export writes back as they were.
- A trajectory trajforge exported (`extra["trajforge"]` at the root and on steps) comes back exactly:
  tools, reward, success, details and the steps ATIF cannot say (code, JSON, web and image steps,
  labels, masks) are restored from it.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from converters._util import Ctx, check_encodable, guarded, record_id
from converters.errors import summarize_validation
from converters.registry import register
from schemas.models import Trajectory

NAME = "atif"
DATASET = "Agent Trajectory Interchange Format (harbor ATIF)"
SOURCES = ("system", "user", "agent")
# Step fields that become step content; the rest is kept in extra["atif"].
CONTENT_FIELDS = ("source", "message", "reasoning_content", "tool_calls", "observation")
TRAJFORGE = "trajforge"


def usage_of(metrics: dict[str, Any] | None, model: str | None) -> dict[str, Any] | None:
    """An ATIF step's metrics in the interlingua's usage terms (model, tokens, cost); None without metrics.

    ATIF's `prompt_tokens` includes the cached ones (`cached_tokens` is the cached subset); the rest
    (token ids, logprobs, provider extras) stays in `extra["atif"]["metrics"]`.
    """
    if not isinstance(metrics, dict):
        return None
    return {"model": model, "prompt_tokens": metrics.get("prompt_tokens"),
            "completion_tokens": metrics.get("completion_tokens"), "cost_usd": metrics.get("cost_usd")}


def _arguments(ctx: Ctx, value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):  # some writers put the JSON text of the arguments
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            ctx.fail(f"`{where}` is a string that is not JSON")
    if not isinstance(value, dict):
        ctx.fail(f"`{where}` is {type(value).__name__}, expected an object")
    return value


def step_dicts(ctx: Ctx, step: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The interlingua steps (as dicts) of one ATIF step, before any trajforge overrides."""
    source = ctx.str_(step, "source", where)
    if source not in SOURCES:
        ctx.fail(f"`{where}.source` is {source[:40]!r}, expected one of {', '.join(SOURCES)}")
    message = ctx.get(step, "message", str, where, default="")
    meta = {k: v for k, v in step.items() if k not in CONTENT_FIELDS}
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    if source == "system":
        out.append({"kind": "text", "source": "environment", "name": "system", "content": message, "train": False})
    elif source == "user":
        out.append({"kind": "text", "source": "user", "content": message})
    else:
        reasoning = ctx.get(step, "reasoning_content", str, where, default=None)
        calls = ctx.dicts(step, "tool_calls", where, default=[])
        for j, call in enumerate(calls):
            cw = f"{where}.tool_calls[{j}]"
            name = ctx.str_(call, "function_name", cw)
            call_id = ctx.get(call, "tool_call_id", str, cw, default=None)
            if call_id is not None:
                names[call_id] = name
            entry: dict[str, Any] = {"kind": "api", "function": name,
                                     "arguments": _arguments(ctx, call.get("arguments"), f"{cw}.arguments"),
                                     "tool_call_id": call_id}
            if j == 0:
                entry.update(thought=message or None, reasoning=reasoning)
            extra = {k: v for k, v in call.items() if k not in ("tool_call_id", "function_name", "arguments")}
            if extra:
                entry["extra"] = {"atif": {"call": extra}}
            out.append(entry)
        if not calls:
            out.append({"kind": "message", "content": message, "reasoning": reasoning})
        # The call that made this step: its usage on the first action (as a model call records it).
        out[0]["usage"] = usage_of(step.get("metrics"), step.get("model_name"))
    if "message" not in step:
        meta["no_message"] = True
    observation = ctx.get(step, "observation", dict, where, default=None)
    if observation is not None:
        extra_obs = {k: v for k, v in observation.items() if k != "results"}
        results = ctx.dicts(observation, "results", f"{where}.observation", default=[])
        for k, result in enumerate(results):
            rw = f"{where}.observation.results[{k}]"
            content = ctx.get(result, "content", str, rw, default=None)
            call_id = ctx.get(result, "source_call_id", str, rw, default=None)
            kept = {key: v for key, v in result.items() if key != "content"}
            atif: dict[str, Any] = {"result": kept}
            if content is None:
                atif["no_content"] = True
            if k == 0 and extra_obs:
                atif["observation"] = extra_obs
            out.append({"kind": "text", "source": "environment", "content": content or "", "tool_call_id": call_id,
                        "name": names.get(call_id or ""), "extra": {"atif": atif}})
        if not results:
            meta["empty_observation"] = extra_obs or True
    step_id = step.get("step_id")
    for k, entry in enumerate(out):
        atif = dict(entry.get("extra", {}).get("atif", {}))
        atif["step_id"] = step_id
        if k == 0:
            atif.update({key: v for key, v in meta.items() if key != "step_id"})
        entry["extra"] = {**entry.get("extra", {}), "atif": atif}
    return [{k: v for k, v in e.items() if v is not None or k == "thought"} for e in out]


def _restore(ctx: Ctx, produced: list[dict[str, Any]], saved: Any, where: str) -> list[dict[str, Any]]:
    """The steps trajforge exported for this ATIF step: the saved ones replace the produced ones by position."""
    if not isinstance(saved, dict):
        return produced
    count = saved.get("count", len(produced))
    steps = saved.get("steps") or {}
    if not isinstance(count, int) or not isinstance(steps, dict):
        ctx.fail(f"`{where}.extra.{TRAJFORGE}` is malformed")
    out = []
    for k in range(count):
        if str(k) in steps:
            out.append(steps[str(k)])
        elif k < len(produced):
            out.append(produced[k])
        else:
            ctx.fail(f"`{where}.extra.{TRAJFORGE}` names {count} steps but saves step {k} nowhere")
    return out


def without_atif(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps without the ATIF bookkeeping: a trajectory trajforge made and exported was never ATIF-born."""
    out = []
    for entry in entries:
        extra = {k: v for k, v in (entry.get("extra") or {}).items() if k != "atif"}
        out.append({**{k: v for k, v in entry.items() if k != "extra"}, **({"extra": extra} if extra else {})})
    return out


def atif_steps(ctx: Ctx, steps: list[dict[str, Any]], native: bool = False) -> list[dict[str, Any]]:
    """The interlingua steps of ATIF `steps`; `native`: the file is trajforge's export of its own trajectory."""
    out = []
    for i, step in enumerate(steps):
        where = f"steps[{i}]"
        produced = step_dicts(ctx, step, where)
        if native:
            produced = without_atif(produced)
        extra = step.get("extra")
        saved = extra.get(TRAJFORGE) if isinstance(extra, dict) else None
        if saved is not None:
            # The ATIF step trajforge wrote carries its own bookkeeping: not part of the step's own extra.
            for entry in produced:
                meta = entry.get("extra", {}).get("atif", {})
                if isinstance(meta.get("extra"), dict):
                    meta["extra"] = {k: v for k, v in meta["extra"].items() if k != TRAJFORGE}
                    if not meta["extra"]:
                        del meta["extra"]
            produced = _restore(ctx, produced, saved, where)
        out += produced
    return out


@register(NAME, sources=[DATASET])
@guarded(("session_id",))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("session_id",), require_id=True)
    version = ctx.str_(record, "schema_version")
    if not version.startswith("ATIF-"):
        ctx.fail(f"`schema_version` is {version[:40]!r}, expected ATIF-v1.x")
    agent = ctx.get(record, "agent", dict)
    ctx.str_(agent, "name", "agent")
    root = {k: v for k, v in record.items() if k != "steps"}
    saved = (root.get("extra") or {}).get(TRAJFORGE) if isinstance(root.get("extra"), dict) else None
    if saved is not None:
        root["extra"] = {k: v for k, v in root["extra"].items() if k != TRAJFORGE}
        if not root["extra"]:
            del root["extra"]
    saved = saved if isinstance(saved, dict) else {}
    native = "id" in saved  # trajforge's own trajectory: its ATIF form is the whole of it, no ATIF origin
    steps = atif_steps(ctx, ctx.dicts(record, "steps"), native)
    if not steps:
        ctx.fail("`steps` is empty")
    session = str(record["session_id"])
    provenance = saved.get("provenance") if native else {"source_dataset": DATASET, "source_id": session,
                                                         "source_format": version, "model": agent.get("model_name")}
    obj = {
        "id": saved.get("id") or record_id(NAME, session, record),
        "source": saved.get("source") or NAME,
        "steps": steps,
        "tools": saved.get("tools") or [],
        "reward": saved.get("reward"),
        "success": saved.get("success"),
        "provenance": provenance,
        "details": {**(saved.get("details") or {}), **({} if native else {"atif": root})},
    }
    try:
        traj = Trajectory.model_validate(obj)
    except ValidationError as exc:
        ctx.fail("invalid " + summarize_validation(exc))
    check_encodable(traj, ctx)
    return traj
