"""`trl-sft`: TRL SFTTrainer rows, conversational. Train with `SFTConfig(assistant_only_loss=True)`.

Two layouts (one per export: a dataset has one schema):

- `prompt-completion`: `{"prompt": [...], "completion": [...], "tools": ...}`.
  - A record that says how its acting model's prompts were rendered (`details["render"]`: every
    trajectory generated in an environment) gives one row per trainable assistant message:
    `prompt` = exactly the messages of the request that produced it (its system prompt, its
    history window, pages cut as they were, `converters.export.request`), `completion` = that
    message. This is the default (`history="request"`).
  - Any other record (converted data, or every record with `history="full"`) gives one row per
    *trainable segment*: a run of messages that starts at a trainable assistant message and ends
    at the last trainable assistant message before the next masked one. `prompt` = every message
    before the segment (the task, masked steps, earlier segments as context); `completion` = the
    segment. Each assistant message of a segment is conditioned on the whole history before it.
  So a masked assistant message is never in a completion. TRL computes loss on the completion
  (`completion_only_loss`, its default for this layout) and, with `assistant_only_loss=True`,
  only on the assistant tokens of it: the two masks combine, so tool results and user turns
  inside a completion carry no loss.
- `messages`: `{"messages": [...], "tools": ...}`; every assistant message carries `train`. TRL's
  SFTTrainer does not read it: with `assistant_only_loss=True` it trains every assistant message,
  so the driver refuses (or, with `--skip-unfit-rows`, skips) trajectories with a masked assistant
  step in this layout; loss never falls on a masked step.

Messages after the last assistant message carry no training signal and are left out. Tool-call
arguments load as mappings (`formats`); `tools` is JSON text of `[{"type": "function",
"function": {...}}]` (TRL 1.16's trainers `json.loads` a string `tools` column), null without
tools. `id`, `source` (and `segment`: the row's number within its trajectory) are provenance
columns the trainers drop.

Rows are made for a whole batch at once from the rendered messages' roles and masks; only
trajectories with masked assistant messages are split into segments one by one, and request rows
are made record by record (the request function is the agent's own).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from converters.export.options import FormatOptions
from converters.export.records import Batch
from converters.export.render import ASSISTANT, Conversation, Rendered
from converters.export.request import render_options, request_positions
from schemas.models import RenderSettings

NO_TRAINABLE = "no trainable assistant turn"
NO_PROMPT = "no prompt before the first assistant turn"


def trainable_segments(conv: Conversation) -> list[tuple[int, int]]:
    """[start, end) message ranges of each trainable segment (see module docstring)."""
    segments: list[tuple[int, int]] = []
    start: int | None = None
    last: int = -1
    for k in conv.assistant_positions():
        if conv.train(k):
            if start is None:
                start = k
            last = k
        elif start is not None:
            segments.append((start, last + 1))
            start = None
    if start is not None:
        segments.append((start, last + 1))
    return segments


def ranges(rendered: Rendered, starts: np.ndarray, stops: np.ndarray, list_type: pa.ListType) -> pa.ListArray:
    """One list per row: the rendered messages starts[i]:stops[i]."""
    lengths = stops - starts
    offsets = np.r_[0, np.cumsum(lengths)]
    indices = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), rendered.to_arrow(list_type.value_type, indices),
                                    type=list_type)


def lists(rendered: Rendered, index_lists: list[list[int]], list_type: pa.ListType) -> pa.ListArray:
    """One list per row: the rendered messages at each row's indices."""
    lengths = np.fromiter((len(x) for x in index_lists), dtype=np.int64, count=len(index_lists))
    offsets = np.r_[0, np.cumsum(lengths)]
    indices = np.fromiter((m for x in index_lists for m in x), dtype=np.int64, count=int(offsets[-1]))
    values = rendered.to_arrow(list_type.value_type, indices)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values, type=list_type)


def _empty(data_type: pa.DataType) -> pa.Array:
    """An empty array of any type (`pa.array([], type)` cannot make extension types such as `arrow.json`)."""
    if isinstance(data_type, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(data_type, _empty(data_type.storage_type))
    if pa.types.is_struct(data_type):
        return pa.StructArray.from_arrays([_empty(f.type) for f in data_type], fields=list(data_type))
    if pa.types.is_list(data_type):
        return pa.ListArray.from_arrays(pa.array([0], pa.int32()), _empty(data_type.value_type), type=data_type)
    return pa.array([], data_type)


# Rows of some of a batch's trajectories: (each row's trajectory, its segment number, its columns).
_Part = tuple[np.ndarray, np.ndarray, dict[str, pa.Array]]


def _whole_rows(rendered: Rendered, opts: FormatOptions, list_type: pa.ListType, selected: np.ndarray,
                reasons: list[str | None]) -> _Part:
    """The `messages` layout, or full-history segments, of the selected trajectories (see module docstring)."""
    n = len(selected)
    moff = rendered.offsets
    msg_traj = np.repeat(np.arange(n), np.diff(moff))
    assistant = rendered.role == ASSISTANT
    a_idx = np.flatnonzero(assistant)
    n_assistant = np.bincount(msg_traj[a_idx], minlength=n)
    ends = np.cumsum(n_assistant)
    has = n_assistant > 0
    first_a, last_a = np.full(n, -1), np.full(n, -1)
    first_a[has] = a_idx[(ends - n_assistant)[has]]
    last_a[has] = a_idx[(ends - 1)[has]]
    trainable = np.bincount(msg_traj[assistant & (rendered.train == 1)], minlength=n) > 0
    masked = np.bincount(msg_traj[assistant & (rendered.train == 0)], minlength=n) > 0

    ok = selected.copy()
    for r in np.flatnonzero(selected).tolist():
        if rendered.errors[r] is not None:
            reasons[r], ok[r] = rendered.errors[r], False
    for r in np.flatnonzero(ok & ~trainable).tolist():
        reasons[r], ok[r] = NO_TRAINABLE, False
    if opts.sft_layout == "messages":
        owner = np.flatnonzero(ok)
        return owner, np.zeros(len(owner), dtype=np.int64), {
            "messages": ranges(rendered, moff[owner], last_a[owner] + 1, list_type)}
    simple = ok & ~masked
    for r in np.flatnonzero(simple & (first_a == moff[:-1])).tolist():
        reasons[r], ok[r], simple[r] = NO_PROMPT, False, False
    owner, segment = np.flatnonzero(simple), np.zeros(int(simple.sum()), dtype=np.int64)
    p_start, p_stop, c_stop = moff[owner], first_a[owner], last_a[owner] + 1
    split = []  # (trajectory, segment, prompt start, prompt stop, completion stop), in batch positions
    for r in np.flatnonzero(ok & masked).tolist():
        conv = rendered.conversation(r)
        segments = trainable_segments(conv)
        if segments[0][0] == 0:
            reasons[r], ok[r] = NO_PROMPT, False
            continue
        base = int(moff[r])
        split += [(r, k, base, base + a, base + b) for k, (a, b) in enumerate(segments)]
    if split:
        extra = np.array(split, dtype=np.int64).T
        owner, segment = np.r_[owner, extra[0]], np.r_[segment, extra[1]]
        p_start, p_stop, c_stop = np.r_[p_start, extra[2]], np.r_[p_stop, extra[3]], np.r_[c_stop, extra[4]]
    return owner, segment, {"prompt": ranges(rendered, p_start, p_stop, list_type),
                            "completion": ranges(rendered, p_stop, c_stop, list_type)}


def trained_requests(conv: Conversation, settings: RenderSettings) -> list[tuple[list[int], int]]:
    """(the request's message positions, the answer's position) of each trainable assistant message."""
    return [(request_positions(conv, k, settings), k) for k in conv.assistant_positions() if conv.train(k)]


def _request_rows(batch: Batch, settings: RenderSettings, opts: FormatOptions, list_type: pa.ListType,
                  selected: np.ndarray, reasons: list[str | None]) -> _Part:
    """One row per trainable assistant message of the selected trajectories: its request, then it."""
    sent = batch.rendered(render_options(settings))  # the prompts: as sent (earlier reasoning per the settings)
    answered = batch.rendered(render_options(settings, reasoning=opts.render.reasoning))  # same messages
    owner, segment, prompts, completions = [], [], [], []
    for r in np.flatnonzero(selected).tolist():
        if sent.errors[r] is not None:
            reasons[r] = sent.errors[r]
            continue
        conv = sent.conversation(r)
        rows = trained_requests(conv, settings)
        if not rows:
            reasons[r] = NO_TRAINABLE
            continue
        if not any(prompt for prompt, _ in rows):
            reasons[r] = NO_PROMPT
            continue
        base = int(sent.offsets[r])
        for j, (prompt, k) in enumerate(row for row in rows if row[0]):
            owner.append(r)
            segment.append(j)
            prompts.append([base + m for m in prompt])
            completions.append([base + k])
    return (np.array(owner, dtype=np.int64), np.array(segment, dtype=np.int64),
            {"prompt": lists(sent, prompts, list_type), "completion": lists(answered, completions, list_type)})


def sft_batch(batch: Batch, opts: FormatOptions, schema: pa.Schema,
              selected: np.ndarray) -> tuple[list[str | None], pa.RecordBatch, np.ndarray]:
    """(why each selected trajectory gives no row, or None; the rows; each row's trajectory)."""
    n = len(batch)
    reasons: list[str | None] = [None] * n
    list_type = schema.field("messages" if opts.sft_layout == "messages" else "prompt").type
    # Trajectories with the same render settings are rendered together (the driver batches them so).
    groups: dict[RenderSettings | None, list[int]] = {}
    for r in np.flatnonzero(selected).tolist():
        groups.setdefault(batch.settings[r], []).append(r)
    parts: list[_Part] = []
    for settings, members in groups.items():
        mask = np.zeros(n, dtype=bool)
        mask[members] = True
        if settings is not None and opts.sft_layout != "messages" and opts.history == "request":
            parts.append(_request_rows(batch, settings, opts, list_type, mask, reasons))
        else:
            rendered = batch.rendered(batch.options(opts.render, members[0]))
            parts.append(_whole_rows(rendered, opts, list_type, mask, reasons))
    names = ["messages"] if opts.sft_layout == "messages" else ["prompt", "completion"]
    if parts:
        owner = np.concatenate([p[0] for p in parts])
        segment = np.concatenate([p[1] for p in parts])
        columns = {name: pa.concat_arrays([p[2][name] for p in parts]) for name in names}
    else:
        owner, segment = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        columns = {name: _empty(schema.field(name).type) for name in names}
    order = np.lexsort((segment, owner))
    if len(parts) > 1 or not np.array_equal(order, np.arange(len(order))):
        owner, segment = owner[order], segment[order]
        columns = {name: column.take(pa.array(order)) for name, column in columns.items()}
    if opts.sft_layout != "messages":
        columns["segment"] = pa.array(segment, pa.int32())
    take = pa.array(owner)
    columns |= {"id": batch.column("id").take(take), "source": batch.column("source").take(take),
                "tools": batch.column("tools_json").take(take)}
    table = pa.RecordBatch.from_arrays([columns[f.name] for f in schema], schema=schema)
    return reasons, table, owner
