"""A scripted model for any environment, served by the fake OpenAI-compatible server.

- Structured requests (judges, simulators, task writers, verifiers) get a valid instance of the
  JSON Schema they ask for: the first enum value, the first non-null alternative, "x" strings,
  numbers at their minimum or 1, true booleans, one-item arrays. Scripts may override fields.
- Agent requests (tools in the request) follow the task's reference solution where the test gives
  one (`references`: task instruction -> actions): the next reference action not yet taken
  successfully. In an n-sample request, odd samples give up instead (a premature final message),
  so searches see good and bad siblings; so does a request sampled with an odd seed (an independent
  draw: curriculum attempts, Monte Carlo step values), so draws vary. Without a reference, the agent calls the
  first tool with schema-valid arguments once, then answers.
- A teacher reviewing a step (reflection) calls it wrong when it is not the next reference action
  (a premature final message included) and corrects it with that action; without references, a
  final message before any tool call is wrong and the correction calls the first tool.
- A curriculum writer asked for tau2-style criteria writes the seed's criteria plus its first action
  once more (a new task the world can check; its one wrong solution does nothing).
- An agent in `agent_mode: text` (its tools listed in its system prompt, `<tool_call>` blocks in its
  history) is answered the same way, in text: a thought and one `<tool_call>` block.
- Anything else (a persona user, a model-written revision) gets a short text; a persona user
  asks for help, then leaves with ###STOP###.
"""

from __future__ import annotations

import json
import re
from typing import Any

from backends.fake_server import Samples, ToolCallAnswer
from generators.transcript import FORMAT_HELP
from schemas.models import ApiAction, MessageAction

GIVE_UP = "I am done here. Is there anything else?"


def instance(schema: Any, defs: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None) -> Any:
    """A small valid instance of a JSON Schema (enough of the keywords pydantic and tools use)."""
    defs = defs if defs is not None else (schema.get("$defs", {}) if isinstance(schema, dict) else {})
    overrides = overrides or {}
    if not isinstance(schema, dict):
        return "x"
    if "$ref" in schema:
        return instance(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, overrides)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return instance(options[0], defs, overrides)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties", {})
        return {k: overrides[k] if k in overrides else instance(v, defs, overrides) for k, v in props.items()}
    if kind == "array":
        n = max(1, int(schema.get("minItems", 1)))
        return [instance(schema.get("items", {}), defs, overrides) for _ in range(n)]
    if kind == "string":
        return "x" * max(1, int(schema.get("minLength", 1)))
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1))
    if kind == "boolean":
        return True
    return None


def _next_reference(refs: list[Any], done: list[tuple[str, str]], said: list[str] = ()) -> Any:
    """The first reference action not yet taken successfully (`done`: (name, sorted-JSON arguments); `said`: the
    agent's messages so far, for a reference message that comes before the last one), or None."""
    done, said = list(done), list(said)
    for i, step in enumerate(refs):
        if isinstance(step, ApiAction):
            key = (step.function, json.dumps(step.arguments, sort_keys=True))
            if key in done:
                done.remove(key)
                continue
        elif isinstance(step, MessageAction) and i < len(refs) - 1 and step.content in said:
            said.remove(step.content)
            continue
        return step
    return None


def _done_calls(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(name, sorted-JSON arguments) of the calls that were answered without an error, in order."""
    answers = {m.get("tool_call_id"): str(m.get("content", "")) for m in messages if m.get("role") == "tool"}
    out = []
    for m in messages:
        for c in m.get("tool_calls") or []:
            answer = answers.get(c["id"])
            if answer is not None and not answer.startswith("Error"):
                args = json.loads(c["function"]["arguments"] or "{}")
                out.append((c["function"]["name"], json.dumps(args, sort_keys=True)))
    return out


class GenericModel:
    """The fake server's rule function (`Rule(fn=GenericModel(...))`)."""

    def __init__(self, references: dict[str, list[Any]] | None = None, overrides: dict[str, Any] | None = None,
                 judge: Any = None) -> None:
        self.references = references or {}
        self.overrides = overrides or {}
        self.judge = judge  # optional fn(body) -> dict | None for structured answers
        self.sample = 0

    def __call__(self, body: dict[str, Any]) -> Any:
        fmt = body.get("response_format")
        if fmt:
            special = (self.judge(body) if self.judge else None) or self._teacher(body) or self._evolve(body)
            if special is not None:
                return special
            schema = fmt.get("json_schema", {}).get("schema", {})
            return instance(schema, overrides=self.overrides)
        messages = body["messages"]
        system = str(messages[0].get("content", "")) if messages else ""
        if "playing a customer" in system:
            # The persona opens with a request (an opening that already stops is a broken user) and
            # leaves at its next turn.
            if not any(m["role"] == "assistant" for m in messages):
                return "Hi, I need some help with an order of mine."
            return "Thanks, that is all. ###STOP###"
        if body.get("tools"):
            return self._agent(body)
        if TEXT_AGENT in system:  # an agent in agent_mode: text (tools listed in its system prompt)
            return _as_text(self._agent({**body, "messages": _from_text(messages), "tools": _listed_tools(system)}))
        last = str(messages[-1].get("content") or "")
        if "Example conversation:" in last and "Write the new conversation now." in last:
            # A trajectory writer (Simia): the example itself is a valid conversation of these tools.
            return last.split("Example conversation:\n", 1)[1].split(f"\n\n{FORMAT_HELP}", 1)[0].strip()
        return "I see that step was wrong, so I will go back and do it the right way."

    def _agent(self, body: dict[str, Any]) -> Any:
        best = self._next(body)
        if int(body.get("n") or 1) > 1:
            return Samples([best, GIVE_UP])
        return GIVE_UP if int(body.get("seed") or 0) % 2 else best

    def _next(self, body: dict[str, Any]) -> Any:
        messages = body["messages"]
        text = " ".join(str(m.get("content") or "") for m in messages if m["role"] in ("user", "system"))
        refs = next((r for instr, r in self.references.items() if instr in text), None)
        if refs is None:
            if not any(m.get("tool_calls") for m in messages):
                tool = body["tools"][0]["function"]
                return ToolCallAnswer(tool["name"], instance(tool.get("parameters") or {}))
            return GIVE_UP
        said = [str(m.get("content") or "") for m in messages if m["role"] == "assistant" and not m.get("tool_calls")]
        step = _next_reference(refs, _done_calls(messages), said)
        if isinstance(step, ApiAction):
            return ToolCallAnswer(step.function, step.arguments)
        return step.content if isinstance(step, MessageAction) else GIVE_UP

    def _teacher(self, body: dict[str, Any]) -> dict[str, Any] | None:
        prompt = str(body["messages"][-1].get("content") or "")
        if not prompt.startswith("REVIEW THE AGENT'S STEP"):
            return None
        history = prompt.split("(agent steps are numbered):\n", 1)[1].split("\n\nThe step to review:", 1)[0]
        step = prompt.split("The step to review:\n", 1)[1].split("\n\nWhat it produced:", 1)[0]
        correct = {"verdict": "correct", "reason": "it moves the task forward", "reflection": "", "action": None}
        refs = next((r for instr, r in self.references.items() if instr in prompt), None)
        if refs is None:
            if "AGENT: call " in history or _CALL.search(step):
                return correct
            system = str(body["messages"][0].get("content") or "")
            tool = json.loads(system.split("(JSON, one per line)\n", 1)[1].splitlines()[0])
            return self._wrong("nothing was looked up before answering", tool["name"],
                               instance(tool.get("parameters") or {}))
        done = [(m.group(1), json.dumps(json.loads(m.group(2)), sort_keys=True))
                for m, seen in _calls_and_answers(history) if "Error" not in seen]
        ref = _next_reference(refs, done)
        if isinstance(ref, ApiAction):
            found = _CALL.search(step)
            if found and (found.group(1), json.loads(found.group(2))) == (ref.function, ref.arguments):
                return correct
            return self._wrong(f"the next step is {ref.function}", ref.function, ref.arguments)
        if isinstance(ref, MessageAction) and "say to the user" not in step:
            return {**correct, "reason": "an extra lookup"}
        return correct

    @staticmethod
    def _evolve(body: dict[str, Any]) -> dict[str, Any] | None:
        prompt = str(body["messages"][-1].get("content") or "")
        if not prompt.startswith("EVOLVE TASK") or "Seed criteria (tau2-style):\n" not in prompt:
            return None
        seed = prompt.split("Seed task: ", 1)[1].split("\n", 1)[0]
        criteria = json.loads(prompt.split("Seed criteria (tau2-style):\n", 1)[1].split("\n", 1)[0])
        actions = criteria["actions"] + criteria["actions"][:1]
        return {"instruction": f"Once more: {seed}", **criteria, "actions": actions, "wrong_solutions": [[]]}

    @staticmethod
    def _wrong(reason: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"verdict": "wrong", "reason": reason, "reflection": f"I should not have done that; {reason}.",
                "action": {"tool": tool, "arguments": arguments, "message": None}}


_CALL = re.compile(r"call (\w+)\((\{.*\})\)")
# What the system prompt of an agent in agent_mode: text says (converters.export.request.TEXT_FORMAT).
TEXT_AGENT = '<tool_call>{"name": "<tool name>"'
_TEXT_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def _from_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A text-mode conversation as function calling has it: `<tool_call>` blocks as tool calls, the "TOOL: "
    user messages after them as their answers (ids positional)."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for i, m in enumerate(messages):
        content = str(m.get("content") or "")
        if m["role"] == "assistant" and _TEXT_CALL.search(content):
            calls = []
            for k, block in enumerate(_TEXT_CALL.findall(content)):
                call = json.loads(block)
                calls.append({"id": f"t{i}_{k}", "type": "function",
                              "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments") or {})}})
            pending = [c["id"] for c in calls]
            out.append({"role": "assistant", "content": _TEXT_CALL.sub("", content).strip(), "tool_calls": calls})
        elif m["role"] == "user" and content.startswith("TOOL: ") and pending:
            out.append({"role": "tool", "tool_call_id": pending.pop(0), "content": content[len("TOOL: "):]})
        else:
            out.append(m)
    return out


def _listed_tools(system: str) -> list[dict[str, Any]]:
    """The tools a text-mode system prompt lists (JSON lines), as function specs."""
    tools = []
    for line in system.splitlines():
        if line.startswith('{"name":'):
            try:
                spec = json.loads(line)
            except json.JSONDecodeError:
                continue
            tools.append({"type": "function", "function": spec})
    return tools


def _as_text(answer: Any) -> Any:
    """An agent's answer as a text-mode agent writes it: a thought, then one `<tool_call>` block."""
    def one(a: Any) -> Any:
        if isinstance(a, ToolCallAnswer):
            args = a.arguments if isinstance(a.arguments, dict) else json.loads(a.arguments)
            return f"I will call {a.name}.\n<tool_call>{json.dumps({'name': a.name, 'arguments': args})}</tool_call>"
        return a
    return Samples([one(a) for a in answer]) if isinstance(answer, Samples) else one(answer)


def _calls_and_answers(history: str) -> list[tuple[re.Match[str], str]]:
    """Each `[i] AGENT: call f({...})` line of a numbered path with the SEEN line after it."""
    lines = history.splitlines()
    out = []
    for i, line in enumerate(lines):
        found = _CALL.search(line) if "AGENT:" in line else None
        if found:
            seen = next((x for x in lines[i + 1:i + 2] if "SEEN:" in x), "")
            out.append((found, seen))
    return out
