"""Render trajectories as chat messages, the rules every output format shares.

- **system**: text observations before the first action that are named "system" or come from
  the environment become one `system` message (joined with blank lines) placed first — chat
  templates accept a system message only at the start. Later ones are ordinary observations.
- **user**: other observations that answer no tool call (the task, user follow-ups, the output
  of a code action) become `user` messages.
- **api action** -> an assistant message with `tool_calls=[{"id", "type": "function",
  "function": {"name", "arguments": <JSON text>}}]`; its thought is the message `content`.
  Consecutive api actions with no observation between them (and the same loss mask) share one
  assistant message (parallel calls); so does an api action right after a message action. The
  call id is the step's `tool_call_id`, else `call_<step>`. Arguments stay JSON text here (the
  OpenAI wire format); formats for chat templates store them so that they load as mappings.
- **tool**: observations that follow tool calls answer them in order (whatever their `source`:
  some datasets label tool output as "user"), as `role: tool` messages with the matching
  `tool_call_id` (the observation's own `tool_call_id` when it names a pending call). A call
  still unanswered when the next assistant message starts gets an empty tool message, so every
  call is answered (OpenAI and most chat templates require it).
- **code action** -> an assistant message with the code in a fenced block (```` ```<language> ````),
  after the thought. We chose fenced code over an invented `execute_<language>` tool: it is the
  CodeAct convention the source datasets use, needs no synthetic tool specs, and works with
  models that have no tool-call syntax. Its output (an observation) is a `user` message.
- **message action** -> an assistant message (thought, if any, then the text).
- **agent text observations** (source "agent") are text the agent wrote -> assistant messages.
- **reasoning** goes into `reasoning_content` on the assistant message, or is dropped
  (`RenderOptions.reasoning=False`).
- **observation content**: text as is; json as JSON text; images as `[image: <path>]` (never
  pixels); web pages as `URL: <url>` plus the accessibility tree (else the html), truncated to
  `web_max_chars` with a marker, plus `[screenshot: <path>]`.
- **loss mask**: an assistant message carries the `train` flag of its steps (steps with different
  flags never share a message); other messages carry none.
- **text tool format** (`RenderOptions.tool_format="text"`, for models served without function
  calling): every message then goes through `text_message`: tool results become user messages
  starting "TOOL: ", tool calls `<tool_call>` blocks in the assistant's text.

A whole batch of stored trajectories is rendered at once (`render_batch`), column-wise with
numpy and pyarrow: each step's message text is built by vectorized string kernels, and which
steps open, join or answer which message is decided with array arithmetic over the batch; only
the rare irregular cases (parallel calls, observations that name a call out of order, web pages,
hoisted system text) touch Python values one by one. The result (`Rendered`) keeps the messages
as Arrow columns, so an export writes them without building a Python object per message.
`render(trajectory)` runs the same code on one model object and returns `Turn`s.

A trajectory with no assistant turn cannot be rendered: `Unrenderable` carries the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

KINDS = ("api", "code", "message", "text", "json", "image", "web")
API, CODE, MESSAGE, TEXT, JSON, IMAGE, WEB = range(len(KINDS))
ACTION_KINDS = frozenset(KINDS[:3])
ROLES = ("system", "user", "assistant", "tool")
SYSTEM, USER, ASSISTANT, TOOL = range(len(ROLES))
# The hoisted system message belongs to every prompt, whatever the split point.
SYSTEM_STEP = -1
_KIND_SET = pa.array(KINDS)
_ROLE_NAMES = pa.array(ROLES)
_CALL_TYPE = pa.struct([("id", pa.string()), ("type", pa.string()),
                        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
# The message fields Python consumers of a rendered batch read (arguments as text).
_PY_TYPE = pa.struct([("content", pa.string()), ("tool_calls", pa.list_(_CALL_TYPE)),
                      ("tool_call_id", pa.string()), ("reasoning_content", pa.string())])


class Unrenderable(Exception):
    """The record cannot become a training example; the message is the (short, stable) reason."""


@dataclass(frozen=True)
class RenderOptions:
    reasoning: bool = True
    web_max_chars: int = 20_000
    # "text": for models served without function calling (see `text_message`).
    tool_format: str = "tools"


def text_message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message as a model without function calling sees it: a tool result becomes a user
    message starting "TOOL: ", tool calls become `<tool_call>{"name", "arguments"}</tool_call>`
    blocks after the assistant's text; call ids and reasoning are not sent."""
    if message["role"] == "tool":
        return {"role": "user", "content": f"TOOL: {message['content']}"}
    if message.get("tool_calls"):
        # Arguments in one spelling whatever JSON text they were stored as (the batch keeps it compact).
        calls = "".join(
            f'<tool_call>{{"name": {orjson.dumps(c["function"]["name"]).decode()}, '
            f'"arguments": {json.dumps(json.loads(c["function"]["arguments"]), ensure_ascii=False)}}}</tool_call>'
            for c in message["tool_calls"]
        )
        return {"role": "assistant", "content": f"{message.get('content') or ''}\n{calls}".strip()}
    return {"role": message["role"], "content": message.get("content") or ""}


# ---- the rendered batch --------------------------------------------------------------------------


class Rendered:
    """The messages of a batch of trajectories: where each message's fields are (indices into
    string pools, no copy yet) plus numpy metadata per message.

    Trajectory r's messages are `offsets[r]:offsets[r + 1]`, in order; `errors[r]` is the reason
    it cannot be rendered, if any. Per message: `role` (index into `ROLES`), `train` (1, 0, or -1
    for non-assistant messages), `first` / `last` step (relative to the trajectory; -1 for the
    hoisted system message); its calls are `calls[call_offsets[m]:call_offsets[m + 1]]`."""

    def __init__(self, texts: "_Pool", content: np.ndarray, reasonings: "_Pool", reasoning: np.ndarray,
                 call_ids: pa.Array, answers: np.ndarray, calls: pa.StructArray, call_offsets: np.ndarray,
                 role: np.ndarray, train: np.ndarray, first: np.ndarray, last: np.ndarray, offsets: np.ndarray,
                 errors: list[str | None]) -> None:
        self._texts, self._content, self._reasonings, self._reasoning = texts, content, reasonings, reasoning
        self._call_ids, self._answers = call_ids, answers
        self.calls, self.call_offsets = calls, call_offsets  # calls: struct<id, type, function<name, arguments>>
        self.role, self.train, self.first, self.last = role, train, first, last
        self.offsets = offsets
        self.errors = errors
        self._py: dict[str, list[Any]] = {}

    def __len__(self) -> int:
        return len(self.role)

    def conversation(self, r: int) -> "Conversation":
        if self.errors[r] is not None:
            raise Unrenderable(self.errors[r])
        return Conversation(self, range(int(self.offsets[r]), int(self.offsets[r + 1])))

    def py(self, name: str) -> list[Any]:
        """One per-message column as a Python list (built once per batch, on first use)."""
        if name not in self._py:
            if name in ("role", "train", "first", "last"):
                self._py[name] = getattr(self, name).tolist()
            else:
                full = self.to_arrow(_PY_TYPE)
                self._py.update({f.name: full.field(f.name).to_pylist() for f in _PY_TYPE})
        return self._py[name]

    def message(self, m: int, object_arguments: bool = False) -> dict[str, Any]:
        """Message m as an OpenAI-style dict (only the keys that apply); arguments as JSON text or mappings."""
        out: dict[str, Any] = {"role": ROLES[self.py("role")[m]], "content": self.py("content")[m]}
        calls = self.py("tool_calls")[m]
        if calls:
            out["tool_calls"] = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["function"]["name"],
                              "arguments": orjson.loads(c["function"]["arguments"]) if object_arguments
                              else c["function"]["arguments"]}}
                for c in calls]
        if (call_id := self.py("tool_call_id")[m]) is not None:
            out["tool_call_id"] = call_id
        if reasoning := self.py("reasoning_content")[m]:
            out["reasoning_content"] = reasoning
        return out

    def as_text(self) -> "Rendered":
        """The same messages in the text tool format (`text_message` applied to each)."""
        n = len(self.role)
        roles, calls = self.py("role"), self.py("tool_calls")
        content = self.py("content")
        texts = []
        for m in range(n):
            if roles[m] == TOOL or calls[m]:
                texts.append(text_message(self.message(m))["content"])
            else:
                texts.append(content[m] or "")
        pool = _Pool([pa.array(texts, pa.string())])
        none = np.full(n, -1)
        role = np.where(self.role == TOOL, USER, self.role).astype(np.int8)
        return Rendered(pool, np.arange(n), _Pool([pa.nulls(0, pa.string())]), none, self._call_ids, none, self.calls,
                        np.zeros(n + 1, dtype=np.int64), role, self.train, self.first, self.last, self.offsets,
                        self.errors)

    def key(self, m: int) -> tuple:
        """What message m says (not where it came from): equal keys render identically."""
        calls = self.py("tool_calls")[m]
        return (self.py("role")[m], self.py("content")[m], self.py("reasoning_content")[m],
                self.py("tool_call_id")[m], tuple((c["id"], c["function"]["name"], c["function"]["arguments"])
                                                  for c in calls or ()))

    def to_arrow(self, message_type: pa.StructType, indices: np.ndarray | None = None) -> pa.StructArray:
        """Messages `indices` (all by default) as one struct array of `message_type` (fields: a
        subset of role, content, tool_calls, tool_call_id, reasoning_content, train; arguments as
        text or `arrow.json`). Each string is copied once, here."""
        if indices is None:
            indices = np.arange(len(self.role))
        arrays = []
        for field in message_type:
            name = field.name
            if name == "role":
                arrays.append(_ROLE_NAMES.take(pa.array(self.role[indices])))
            elif name == "content":
                arrays.append(self._texts.take(self._content[indices]))
            elif name == "reasoning_content":
                arrays.append(self._reasonings.take(self._reasoning[indices]))
            elif name == "tool_call_id":
                answers = self._answers[indices]
                arrays.append(self._call_ids.take(pa.array(answers, mask=answers < 0)))
            elif name == "train":
                train = self.train[indices]
                arrays.append(pa.array(train == 1, mask=train < 0))
            else:
                arrays.append(self._tool_calls(indices, field.type))
        return pa.StructArray.from_arrays(arrays, fields=list(message_type))

    def _tool_calls(self, indices: np.ndarray, list_type: pa.ListType) -> pa.ListArray:
        starts = self.call_offsets[indices]
        counts = self.call_offsets[indices + 1] - starts
        offsets = np.r_[0, np.cumsum(counts)]
        taken = self.calls.take(pa.array(np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1])))
        call_type = list_type.value_type
        fn_type = call_type.field("function").type
        fn = taken.field("function")
        args = fn.field("arguments")
        if isinstance(fn_type.field("arguments").type, pa.BaseExtensionType):
            args = pa.ExtensionArray.from_storage(fn_type.field("arguments").type, args)
        function = pa.StructArray.from_arrays([fn.field("name"), args], fields=list(fn_type))
        structs = pa.StructArray.from_arrays([taken.field("id"), taken.field("type"), function], fields=list(call_type))
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), structs, type=list_type,
                                        mask=pa.array(counts == 0))


class Conversation:
    """One rendered trajectory (or part of it): positions of its messages in a `Rendered` batch."""

    __slots__ = ("r", "idx")

    def __init__(self, rendered: Rendered, idx: range | list[int]) -> None:
        self.r = rendered
        self.idx = idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, part: slice | list[int]) -> "Conversation":
        """A slice of the messages, or the messages at a list of positions (a request)."""
        if isinstance(part, list):
            return Conversation(self.r, [self.idx[k] for k in part])
        return Conversation(self.r, self.idx[part])

    def __add__(self, other: "Conversation") -> "Conversation":
        assert other.r is self.r
        return Conversation(self.r, [*self.idx, *other.idx])

    def train(self, k: int) -> bool:
        """Whether message k is a trainable assistant message."""
        return self.r.py("train")[self.idx[k]] == 1

    def steps(self, k: int) -> range:
        """The steps message k came from (empty for the hoisted system message)."""
        m = self.idx[k]
        first = self.r.py("first")[m]
        return range(first, self.r.py("last")[m] + 1) if first >= 0 else range(0)

    def first_step(self, k: int) -> int:
        return self.r.py("first")[self.idx[k]]

    def assistant_positions(self) -> list[int]:
        roles = self.r.py("role")
        return [k for k, m in enumerate(self.idx) if roles[m] == ASSISTANT]

    def through_last_assistant(self) -> "Conversation":
        """Without the trailing non-assistant messages (they carry no training signal)."""
        positions = self.assistant_positions()
        return self[: positions[-1] + 1] if positions else self[:0]

    def keys(self) -> list[tuple]:
        return [self.r.key(m) for m in self.idx]

    def messages(self, object_arguments: bool = False) -> list[dict[str, Any]]:
        return [self.r.message(m, object_arguments) for m in self.idx]


# ---- rendering -------------------------------------------------------------------------------------


def _np(array: pa.Array, fill: Any) -> np.ndarray:
    return pc.fill_null(array, fill).to_numpy(zero_copy_only=False)


def _with_thought(thought: pa.Array, text: pa.Array) -> pa.Array:
    if thought.null_count == len(thought):
        return text
    has = pc.fill_null(pc.not_equal(thought, ""), False)
    return pc.if_else(has, pc.binary_join_element_wise(thought, "\n\n", text, ""), text)


def _truncate(text: str, limit: int) -> str:
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}\n...[truncated {len(text) - limit} chars]"


def _web_text(url: str | None, html: str | None, axtree: str | None, shot: str | None, limit: int) -> str:
    parts = []
    if url:
        parts.append(f"URL: {url}")
    body = axtree or html
    if body:
        parts.append(_truncate(body, limit))
    if shot is not None:
        parts.append(f"[screenshot: {shot}]")
    return "\n\n".join(parts)


def _ranks(groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """For items sorted by group: each item's rank within its group, and the count per group."""
    counts = np.bincount(groups, minlength=n_groups)
    starts = np.cumsum(counts) - counts
    return np.arange(len(groups)) - starts[groups], counts


class _Pool:
    """String chunks addressed by one running index (no copy until `take`)."""

    def __init__(self, chunks: list[pa.Array]) -> None:
        self.chunks = chunks
        self.size = sum(len(c) for c in chunks)

    def add(self, chunk: pa.Array) -> int:
        """Append a chunk; returns the index of its first string."""
        base = self.size
        self.chunks.append(chunk.cast(pa.string()))
        self.size += len(chunk)
        return base

    def take(self, index: np.ndarray) -> pa.Array:
        """The strings at `index` (-1: null)."""
        taken = pa.chunked_array(self.chunks, pa.string()).take(pa.array(index, mask=index < 0))
        return taken.combine_chunks() if isinstance(taken, pa.ChunkedArray) else taken


def _join_groups(parts: pa.Array, part_group: np.ndarray, order: np.ndarray) -> pa.Array:
    """Per group (in sorted group order), its non-empty parts joined with blank lines ("" when
    none); parts are taken in `order`, which sorts them by group, stably."""
    uniques = part_group[order][np.r_[True, np.diff(part_group[order]) != 0]]
    index = np.searchsorted(uniques, part_group)
    n_groups = len(uniques)
    parts = parts.take(pa.array(order))
    keep = pc.fill_null(pc.not_equal(parts, ""), False)
    counts = np.bincount(index[order][keep.to_numpy(zero_copy_only=False)], minlength=n_groups)
    lists = pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(counts)].astype(np.int32)), parts.filter(keep))
    return pc.binary_join(lists, "\n\n")


def render_batch(steps: pa.ListArray | pa.ChunkedArray, opts: RenderOptions,
                 require_assistant: bool = True) -> Rendered:
    """Render every trajectory of a `list<step>` column (`schemas.arrow.STEP_TYPE`) at once."""
    if isinstance(steps, pa.ChunkedArray):
        steps = steps.combine_chunks()
    raw = steps.offsets.to_numpy()
    offs = (raw - raw[0]).astype(np.int64)
    values = steps.values.slice(int(raw[0]), int(raw[-1] - raw[0]))
    n_traj, n = len(offs) - 1, len(values)
    lengths = np.diff(offs)
    traj = np.repeat(np.arange(n_traj), lengths)
    s = np.arange(n) - np.repeat(offs[:-1], lengths)
    f = {name: values.field(name) for name in ("kind", "tool_call_id", "thought", "reasoning", "function",
                                              "arguments", "language", "content", "source", "name", "train")}
    kind = _np(pc.index_in(f["kind"], value_set=_KIND_SET), -1)
    train = _np(f["train"], True).astype(bool)
    agent = _np(pc.equal(f["source"], "agent"), False).astype(bool)
    env = _np(pc.equal(f["source"], "environment"), False).astype(bool)
    named_system = _np(pc.equal(f["name"], "system"), False).astype(bool)

    # Which steps open an assistant message, join the previous one, or are observations.
    is_api = kind == API
    opens = (kind == API) | (kind == CODE) | (kind == MESSAGE) | ((kind == TEXT) & agent)
    prev_kind = np.r_[-1, kind[:-1]]
    prev_train = np.r_[True, train[:-1]]
    merge = is_api & (s > 0) & ((prev_kind == API) | (prev_kind == MESSAGE)) & (train == prev_train)
    opener = opens & ~merge
    seen = np.cumsum(opens) - opens
    seen_before = (seen - np.repeat(np.r_[seen, 0][offs[:-1]], lengths)) > 0
    system = ~seen_before & (kind == TEXT) & ~agent & (named_system | env)
    obs = ~opens & ~system & (kind >= 0)
    group = np.cumsum(opener) - 1  # the latest opened assistant message, batch-wide
    opener_idx = np.flatnonzero(opener)
    n_groups = len(opener_idx)

    # Tool calls, in step order = message order; ids default to call_<step>.
    api_idx = np.flatnonzero(is_api)
    call_group = group[api_idx]
    call_rank, n_calls = _ranks(call_group, n_groups)
    call_start = np.cumsum(n_calls) - n_calls
    api_take = pa.array(api_idx)
    given = f["tool_call_id"].take(api_take)
    default = pc.binary_join_element_wise("call_", pc.cast(pa.array(s[api_idx]), pa.string()), "")
    call_ids = pc.if_else(pc.fill_null(pc.not_equal(given, ""), False), given, default)
    args = f["arguments"].take(api_take)
    args = pc.if_else(pc.fill_null(pc.not_equal(args, ""), False), args, "{}")
    call_values = pa.StructArray.from_arrays(
        [call_ids, pa.array(["function"] * len(api_idx), pa.string()),
         pa.StructArray.from_arrays([f["function"].take(api_take), args], names=["name", "arguments"])],
        names=["id", "type", "function"])

    # Observations after an assistant message answer its calls, first come first served.
    gobs = np.flatnonzero(obs & seen_before)
    obs_group = group[gobs]
    obs_rank, n_obs = _ranks(obs_group, n_groups)
    is_tool = obs_rank < n_calls[obs_group]
    answered = np.where(is_tool, call_start[obs_group] + obs_rank, -1)  # call index answered, in order
    call_answered = np.zeros(len(api_idx), dtype=bool)
    call_answered[answered[is_tool]] = True
    obs_ids = f["tool_call_id"].take(pa.array(gobs[is_tool]))
    expected = call_ids.take(pa.array(answered[is_tool]))
    named = pc.fill_null(pc.and_(pc.not_equal(obs_ids, ""), pc.not_equal(obs_ids, expected)), False)
    for g in np.unique(obs_group[is_tool][_np(named, False).astype(bool)]).tolist():
        _match_by_id(g, gobs, obs_group, is_tool, answered, call_answered, call_start, n_calls,
                     f["tool_call_id"], call_ids)
    has_next = np.zeros(n_groups, dtype=bool)
    if n_groups > 1:
        has_next[:-1] = traj[opener_idx[1:]] == traj[opener_idx[:-1]]
    flushed = np.flatnonzero(~call_answered & has_next[call_group])

    # Each step's own message text, built column-wise per kind (web pages in Python) into a pool
    # of string chunks; `src[i]` is where step i's text is in the pool.
    content, thought = f["content"].cast(pa.string()), f["thought"]
    image = pc.struct_field(values.field("image"), ["path"])
    texts = _Pool([content])
    src = np.arange(n)

    def per_kind(k: int, make: Any) -> None:
        idx = np.flatnonzero(kind == k)
        if len(idx):
            src[idx] = texts.add(make(pa.array(idx), idx)) + np.arange(len(idx))

    per_kind(API, lambda t, _: pc.fill_null(thought.take(t), ""))
    per_kind(CODE, lambda t, _: _with_thought(thought.take(t), pc.binary_join_element_wise(
        "```", f["language"].take(t), "\n", content.take(t), "\n```", "")))
    per_kind(MESSAGE, lambda t, _: _with_thought(thought.take(t), content.take(t)))
    per_kind(IMAGE, lambda t, _: pc.binary_join_element_wise("[image: ", image.take(t), "]", ""))
    per_kind(WEB, lambda t, _: pa.array(
        [_web_text(*row, opts.web_max_chars) for row in zip(*(values.field(k).take(t).to_pylist()
                                                               for k in ("url", "html", "axtree")),
                                                            image.take(t).to_pylist())], pa.string()))
    reasonings = _Pool([f["reasoning"].cast(pa.string()) if opts.reasoning else pa.nulls(n, pa.string())])

    # Messages: one per opener and per observation, a system message per trajectory that has
    # hoisted text, an empty tool message per flushed call.
    step_msgs = np.flatnonzero(opener | obs)
    role = np.where(opener[step_msgs], ASSISTANT, USER)
    tool_pos = np.searchsorted(step_msgs, gobs[is_tool])
    role[tool_pos] = TOOL
    content_src = src[step_msgs]
    reasoning_src = np.where(opener[step_msgs], step_msgs, -1)
    call_src = np.full(len(step_msgs), -1)
    call_src[tool_pos] = answered[is_tool]
    last = s[step_msgs].copy()
    merged = np.flatnonzero(merge)
    if len(merged):
        # An opener with api actions joined to it: its text, then their thoughts (reasoning alike).
        groups = np.unique(group[merged])
        pos = np.searchsorted(step_msgs, opener_idx[groups])
        part_group = np.concatenate([groups, group[merged]])
        order_parts = np.argsort(part_group, kind="stable")
        parts = np.concatenate([opener_idx[groups], merged])
        content_src[pos] = texts.add(_join_groups(texts.take(src[parts]), part_group, order_parts)) + \
            np.arange(len(groups))
        if opts.reasoning and f["reasoning"].null_count < n:
            joined = _join_groups(reasonings.take(parts), part_group, order_parts)
            reasoning_src[pos] = reasonings.add(pc.if_else(pc.equal(joined, ""), pa.scalar(None, pa.string()),
                                                           joined)) + np.arange(len(groups))
        last_merged = np.zeros(n_groups, dtype=np.int64)
        last_merged[group[merged]] = s[merged]  # later steps overwrite earlier ones
        last[pos] = last_merged[groups]
    # Hoisted system text: one message per trajectory, joined.
    sys_idx = np.flatnonzero(system)
    sys_traj = np.unique(traj[sys_idx])
    sys_src = np.zeros(0, dtype=np.int64)
    if len(sys_idx):
        sys_order = np.arange(len(sys_idx))
        sys_src = texts.add(_join_groups(content.take(pa.array(sys_idx)), traj[sys_idx], sys_order)) + \
            np.arange(len(sys_traj))
    flush_src = np.full(len(flushed), texts.add(pa.array([""])) if len(flushed) else 0)

    # Order: per trajectory, system first, then by step; flushed calls just before the next opener.
    next_opener_step = np.r_[s[opener_idx[1:]], 0][call_group[flushed]] if len(flushed) else np.zeros(0, np.int64)
    m_traj = np.concatenate([sys_traj, traj[step_msgs], traj[api_idx[flushed]]])
    m_pos = np.concatenate([np.full(len(sys_traj), -2), 2 * s[step_msgs], 2 * next_opener_step - 1])
    # Flushed calls come last and in call order, so a stable sort keeps them in pending order.
    order = np.argsort((m_traj.astype(np.int64) << 32) + (m_pos + 2), kind="stable")
    m_role = np.concatenate([np.full(len(sys_traj), SYSTEM), role, np.full(len(flushed), TOOL)])[order]
    m_content = np.concatenate([sys_src, content_src, flush_src])[order]
    m_reasoning = np.concatenate([np.full(len(sys_traj), -1), reasoning_src, np.full(len(flushed), -1)])[order]
    m_call = np.concatenate([np.full(len(sys_traj), -1), call_src, flushed])[order]
    m_first = np.concatenate([np.full(len(sys_traj), SYSTEM_STEP), s[step_msgs], s[api_idx[flushed]]])[order]
    m_last = np.concatenate([np.full(len(sys_traj), SYSTEM_STEP), last, s[api_idx[flushed]]])[order]
    assistant = m_role == ASSISTANT
    m_train = np.where(assistant, 0, -1).astype(np.int8)
    opener_steps = np.concatenate([np.full(len(sys_traj), -1), step_msgs, np.full(len(flushed), -1)])[order]
    m_train[assistant] = train[opener_steps[assistant]]
    n_msg_calls = np.zeros(len(order), dtype=np.int64)
    n_msg_calls[assistant] = n_calls[group[opener_steps[assistant]]]

    m_counts = np.bincount(m_traj[order], minlength=n_traj)
    errors = _errors(kind, traj, lengths, f["kind"], np.bincount(m_traj[order][assistant], minlength=n_traj),
                     require_assistant)
    rendered = Rendered(texts, m_content, reasonings, m_reasoning, call_ids, m_call, call_values,
                        np.r_[0, np.cumsum(n_msg_calls)], m_role.astype(np.int8), m_train, m_first, m_last,
                        np.r_[0, np.cumsum(m_counts)], errors)
    return rendered.as_text() if opts.tool_format == "text" else rendered


def _match_by_id(g: int, gobs: np.ndarray, obs_group: np.ndarray, is_tool: np.ndarray, answered: np.ndarray,
                 call_answered: np.ndarray, call_start: np.ndarray, n_calls: np.ndarray,
                 obs_ids: pa.Array, call_ids: pa.Array) -> None:
    """Observations of group g that name a pending call answer that one; the others the first pending."""
    calls = list(range(int(call_start[g]), int(call_start[g] + n_calls[g])))
    pending = [(call_ids[c].as_py(), c) for c in calls]
    call_answered[calls] = False
    for k in np.flatnonzero((obs_group == g) & is_tool).tolist():
        name = obs_ids[int(gobs[k])].as_py()
        at = next((j for j, p in enumerate(pending) if p[0] == name), 0) if name else 0
        answered[k] = pending.pop(at)[1]
        call_answered[answered[k]] = True


def _errors(kind: np.ndarray, traj: np.ndarray, lengths: np.ndarray, kinds: pa.Array, n_assistant: np.ndarray,
            require_assistant: bool) -> list[str | None]:
    errors: list[str | None] = [None] * len(lengths)
    for r in np.flatnonzero(lengths == 0).tolist():
        errors[r] = "empty trajectory"
    for i in np.flatnonzero(kind < 0).tolist():
        errors[int(traj[i])] = errors[int(traj[i])] or f"unknown step kind {kinds[i].as_py()}"
    if require_assistant:
        for r in np.flatnonzero((n_assistant == 0) & (lengths > 0)).tolist():
            errors[r] = errors[r] or "no assistant turn"
    return errors


# ---- one trajectory ------------------------------------------------------------------------------


@dataclass
class Turn:
    """One chat message plus the steps it came from (inclusive) and its loss mask."""

    message: dict[str, Any]
    first_step: int
    last_step: int
    train: bool = True
    steps: list[int] = field(default_factory=list)  # the steps it came from (the hoisted system text's too)

    @property
    def role(self) -> str:
        return self.message["role"]

    @property
    def is_assistant(self) -> bool:
        return self.message["role"] == "assistant"


def observation_text(step: Any, opts: RenderOptions) -> str:
    """An observation step as the text of its message (a page: its URL, its tree or HTML cut at the limit)."""
    return _observation_text(step, opts)


def _observation_text(step: Any, opts: RenderOptions) -> str:
    kind = step.kind
    if kind == "text":
        return step.content
    if kind == "json":
        return json.dumps(step.content, ensure_ascii=False)
    if kind == "image":
        return f"[image: {step.image.path}]"
    if kind == "web":
        return _web_text(step.url, step.html, step.axtree, step.screenshot.path if step.screenshot else None,
                         opts.web_max_chars)
    raise Unrenderable(f"unknown step kind {kind}")


def _joined(a: str | None, b: str | None) -> str:
    return f"{a}\n\n{b}" if a and b else a or b or ""


def render(traj: Any, opts: RenderOptions = RenderOptions(), *, require_assistant: bool = True) -> list[Turn]:
    """A trajectory (`schemas.models.Trajectory`) as chat turns, arguments as JSON text.

    The same rules as `render_batch`, executed step by step: at the size of one trajectory (an
    agent's prompt, rendered for every model call) a loop costs a fraction of a millisecond where
    the column-wise machinery costs several. `tests/export/test_export_render.py` checks the two
    agree on the shipped samples and on thousands of random trajectories.
    `require_assistant=False` renders a history that has no agent turn yet (an agent's prompt).
    """
    if not traj.steps:
        raise Unrenderable("empty trajectory")
    turns: list[Turn] = []
    system: list[str] = []
    system_steps: list[int] = []
    pending: list[tuple[str, int]] = []  # calls awaiting an answer: (call id, step)
    seen_action = False

    def assistant(i: int, message: dict[str, Any], train: bool) -> None:
        for call_id, step in pending:  # every call is answered before the next assistant message
            turns.append(Turn({"role": "tool", "content": "", "tool_call_id": call_id}, step, step, steps=[step]))
        pending.clear()
        turns.append(Turn(message, i, i, train, [i]))

    for i, step in enumerate(traj.steps):
        kind = step.kind
        if kind in ACTION_KINDS:
            seen_action = True
            reasoning = step.reasoning if opts.reasoning else None
            if kind == "api":
                call_id = step.tool_call_id or f"call_{i}"
                call = {"id": call_id, "type": "function",
                        "function": {"name": step.function, "arguments": json.dumps(step.arguments, ensure_ascii=False)}}
                last = turns[-1] if turns else None
                if (last is not None and last.is_assistant and last.last_step == i - 1 and last.train == step.train
                        and traj.steps[i - 1].kind in ("api", "message")):
                    last.message["content"] = _joined(last.message["content"], step.thought)
                    last.message.setdefault("tool_calls", []).append(call)
                    if reasoning or last.message.get("reasoning_content"):
                        last.message["reasoning_content"] = _joined(last.message.get("reasoning_content"), reasoning)
                    last.last_step = i
                    last.steps.append(i)
                else:
                    message = {"role": "assistant", "content": step.thought or "", "tool_calls": [call]}
                    if reasoning:
                        message["reasoning_content"] = reasoning
                    assistant(i, message, step.train)
                pending.append((call_id, i))
                continue
            text = f"```{step.language}\n{step.content}\n```" if kind == "code" else step.content
            message = {"role": "assistant", "content": f"{step.thought}\n\n{text}" if step.thought else text}
            if reasoning:
                message["reasoning_content"] = reasoning
            assistant(i, message, step.train)
        elif kind == "text" and step.source == "agent":
            seen_action = True
            assistant(i, {"role": "assistant", "content": step.content}, step.train)
        elif pending:
            match = next((p for p in pending if p[0] == step.tool_call_id), None) if step.tool_call_id else None
            call_id = pending.pop(pending.index(match) if match else 0)[0]
            turns.append(Turn({"role": "tool", "content": _observation_text(step, opts), "tool_call_id": call_id}, i, i,
                              steps=[i]))
        elif not seen_action and kind == "text" and (step.name == "system" or step.source == "environment"):
            system.append(step.content)
            system_steps.append(i)
        else:
            turns.append(Turn({"role": "user", "content": _observation_text(step, opts)}, i, i, steps=[i]))
    if system:
        turns.insert(0, Turn({"role": "system", "content": "\n\n".join(system)}, SYSTEM_STEP, SYSTEM_STEP,
                             steps=system_steps))
    if require_assistant and not any(t.is_assistant for t in turns):
        raise Unrenderable("no assistant turn")
    if opts.tool_format == "text":
        for turn in turns:
            turn.message = text_message(turn.message)
    return turns


def messages(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    return [t.message for t in turns]
