"""Rule filters: well-formed steps, tool calls valid against their JSON Schema, step length,
loop detection, final answer present. Each drops with a specific, stable reason string."""

from __future__ import annotations

import functools
import json
from typing import Any, Iterable

import jsonschema
from jsonschema.validators import validator_for

from filters.base import BaseFilter, Decision, drop, keep, register
from filters.text import arguments_text, step_payload, step_text, token_counter
from schemas.models import ACTION_KINDS, ApiAction, CodeAction, MessageAction, Trajectory

_JSON_TYPES = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
               "object": "object", "array": "array", "null": "null"}


@register("well_formed")
class WellFormed(BaseFilter):
    """At least one action; no empty step content; observations with a tool_call_id answer an earlier action."""

    def __init__(self, require_action: bool = True, check_tool_call_ids: bool = True) -> None:
        self.require_action = require_action
        self.check_tool_call_ids = check_tool_call_ids

    def decide(self, record: Trajectory) -> Decision:
        if not record.steps:
            return drop(record, "no steps")
        if self.require_action and not any(s.kind in ACTION_KINDS for s in record.steps):
            return drop(record, "no action")
        seen_calls: set[str] = set()
        for i, step in enumerate(record.steps):
            payload = step_payload(step)
            if payload is not None and not payload.strip():
                return drop(record, f"empty {step.kind} step {i}")
            if step.tool_call_id is None:
                continue
            if step.kind in ACTION_KINDS:
                seen_calls.add(step.tool_call_id)
            elif self.check_tool_call_ids and step.tool_call_id not in seen_calls:
                return drop(record, f"observation {i} answers unknown tool_call_id {step.tool_call_id!r}")
        return keep(record)


@functools.lru_cache(maxsize=4096)
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    # Use the draft the schema declares ($schema), Draft 2020-12 when it declares none.
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def _type_name(expected: Any) -> str:
    if isinstance(expected, list):
        return " or ".join(_JSON_TYPES.get(t, str(t)) for t in expected)
    return _JSON_TYPES.get(expected, str(expected))


def _schema_error(error: jsonschema.ValidationError, fn: str) -> str:
    """One specific reason for the first schema violation of a call's arguments."""
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "required":
        missing = [k for k in error.validator_value if isinstance(error.instance, dict) and k not in error.instance]
        name = ".".join(filter(None, [where, missing[0] if missing else "?"]))
        return f"missing argument {name!r} for {fn!r}"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        props = error.schema.get("properties", {})
        extra = sorted(k for k in error.instance if k not in props)
        name = ".".join(filter(None, [where, extra[0] if extra else "?"]))
        return f"unexpected argument {name!r} for {fn!r}"
    if error.validator == "type":
        return f"wrong type for {where or 'arguments'!r} in {fn!r} (expected {_type_name(error.validator_value)})"
    return f"invalid argument {where or 'arguments'!r} for {fn!r}: {error.message[:200]}"


@register("tool_calls_valid")
class ToolCallsValid(BaseFilter):
    """Every API call names a declared tool and its arguments validate against the tool's JSON Schema.

    strict: arguments not in `properties` are unexpected unless the schema allows
    additionalProperties explicitly (function-calling APIs reject them).
    allow: function names accepted without a declaration (e.g. `finish`).
    require_tools: records that declare no tools at all are dropped ("no tools declared");
    by default they are kept, as there is nothing to check against.
    """

    def __init__(self, strict: bool = True, allow: Iterable[str] = (), require_tools: bool = False) -> None:
        self.strict = strict
        self.allow = frozenset(allow)
        self.require_tools = require_tools

    def decide(self, record: Trajectory) -> Decision:
        calls = [s for s in record.steps if isinstance(s, ApiAction)]
        if not record.tools:
            if self.require_tools and calls:
                return drop(record, "no tools declared")
            return keep(record)
        tools = {t.name: t for t in record.tools}
        for call in calls:
            reason = self.check_call(call, tools)
            if reason:
                return drop(record, reason)
        return keep(record)

    def check_call(self, call: ApiAction, tools: dict[str, Any]) -> str | None:
        fn = call.function
        tool = tools.get(fn)
        if tool is None:
            return None if fn in self.allow else f"unknown tool {fn!r}"
        schema = tool.parameters
        if not schema:
            return None
        if self.strict and isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema \
                and "patternProperties" not in schema:
            extra = sorted(k for k in call.arguments if k not in schema["properties"])
            if extra:
                return f"unexpected argument {extra[0]!r} for {fn!r}"
        try:
            validator = _validator(json.dumps(schema, sort_keys=True))
        except jsonschema.SchemaError as exc:
            return f"invalid schema for {fn!r}: {exc.message[:200]}"
        # best_match prefers the most specific error, so reasons are stable across runs.
        error = jsonschema.exceptions.best_match(validator.iter_errors(call.arguments))
        return _schema_error(error, fn) if error is not None else None


@register("max_step_tokens")
class MaxStepTokens(BaseFilter):
    """No step longer than max_tokens; optionally no trajectory longer than max_total_tokens."""

    def __init__(self, max_tokens: int = 4096, max_total_tokens: int | None = None, tokenizer: str | None = None) -> None:
        self.max_tokens = max_tokens
        self.max_total_tokens = max_total_tokens
        self.count = token_counter(tokenizer)

    def decide(self, record: Trajectory) -> Decision:
        total = 0
        for i, step in enumerate(record.steps):
            n = self.count(step_text(step))
            if n > self.max_tokens:
                return drop(record, f"step {i} has {n} tokens (max {self.max_tokens})", float(n))
            total += n
        if self.max_total_tokens is not None and total > self.max_total_tokens:
            return drop(record, f"trajectory has {total} tokens (max {self.max_total_tokens})", float(total))
        return keep(record, float(total))


def _action_key(step: Any) -> str | None:
    if isinstance(step, ApiAction):
        return f"{step.function}({arguments_text(step.arguments)})"
    if isinstance(step, CodeAction):
        return f"{step.language}:{step.content.strip()}"
    if isinstance(step, MessageAction):
        return f"say:{step.content.strip()}"
    return None


@register("no_loops")
class NoLoops(BaseFilter):
    """The same action (function + arguments, or the same code) k times in a row is a loop.

    Observations between actions are ignored: an agent repeating a call whatever it gets back
    is the loop this catches.
    """

    def __init__(self, k: int = 3) -> None:
        if k < 2:
            raise ValueError("k must be >= 2")
        self.k = k

    def decide(self, record: Trajectory) -> Decision:
        last, run = None, 0
        for i, step in enumerate(record.steps):
            key = _action_key(step)
            if key is None:
                continue
            run = run + 1 if key == last else 1
            last = key
            if run >= self.k:
                shown = key if len(key) <= 80 else key[:77] + "..."
                return drop(record, f"action repeated {run} times in a row at step {i}: {shown}", float(run))
        return keep(record)


@register("final_answer")
class FinalAnswer(BaseFilter):
    """The last action is a message to the user, or a call to a finish-style function."""

    def __init__(self, finish_functions: Iterable[str] = ("finish", "submit", "final_answer", "answer", "stop"),
                 allow_message: bool = True, allow_code: bool = False) -> None:
        self.finish = frozenset(finish_functions)
        self.allow_message = allow_message
        self.allow_code = allow_code

    def decide(self, record: Trajectory) -> Decision:
        actions = [s for s in record.steps if s.kind in ACTION_KINDS]
        if not actions:
            return drop(record, "no final answer: no action")
        last = actions[-1]
        if isinstance(last, MessageAction) and self.allow_message and last.content.strip():
            return keep(record)
        if isinstance(last, ApiAction) and last.function in self.finish:
            return keep(record)
        if isinstance(last, CodeAction) and self.allow_code:
            return keep(record)
        what = f"api call {last.function!r}" if isinstance(last, ApiAction) else f"{last.kind} action"
        return drop(record, f"no final answer: last action is {what}")


@register("verified")
class Verified(BaseFilter):
    """What the world verified: the environment's reward said success, an Agent-R revision was spliced onto a
    successful path, a task's code verifier passed (each sets `success`). `trajforge improve` keeps these."""

    def decide(self, record: Trajectory) -> Decision:
        if record.success is True:
            return keep(record)
        return drop(record, "not verified: success is " + ("unknown" if record.success is None else "false"))
