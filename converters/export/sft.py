"""`trl-sft`: TRL SFTTrainer rows, conversational. Train with `SFTConfig(assistant_only_loss=True)`.

Two layouts (one per export: a dataset has one schema):

- `prompt-completion`: `{"prompt": [...], "completion": [...], "tools": ...}`. A trajectory becomes
  one row per *trainable segment*: a run of messages that starts at a trainable assistant message
  and ends at the last trainable assistant message before the next masked one. `prompt` = every
  message before the segment (the task, masked steps, earlier segments as context); `completion`
  = the segment. So a masked assistant message is never in a completion. TRL computes loss on the
  completion (`completion_only_loss`, its default for this layout) and, with
  `assistant_only_loss=True`, only on the assistant tokens of it: the two masks combine, so tool
  results and user turns inside a completion carry no loss.
- `messages`: `{"messages": [...], "tools": ...}`; every assistant message carries `train`. TRL's
  SFTTrainer does not read it: with `assistant_only_loss=True` it trains every assistant message,
  so the driver refuses (or, with `--skip-unfit-rows`, skips) trajectories with a masked assistant
  step in this layout; loss never falls on a masked step.

Messages after the last assistant message carry no training signal and are left out. Tool-call
arguments load as mappings (`formats`); `tools` is JSON text of `[{"type": "function",
"function": {...}}]` (TRL 1.16's trainers `json.loads` a string `tools` column), null without
tools. `id`, `source` (and `segment`) are provenance columns the trainers drop.

Rows are made for a whole batch at once from the rendered messages' roles and masks; only
trajectories with masked assistant messages are split into segments one by one.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from converters.export.options import FormatOptions
from converters.export.records import Batch
from converters.export.render import ASSISTANT, Conversation, Rendered

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


def sft_batch(batch: Batch, opts: FormatOptions, schema: pa.Schema,
              selected: np.ndarray) -> tuple[list[str | None], pa.RecordBatch, np.ndarray]:
    """(why each selected trajectory gives no row, or None; the rows; each row's trajectory)."""
    rendered = batch.rendered(opts.render)
    n = len(batch)
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

    reasons: list[str | None] = [None] * n
    ok = selected.copy()
    for r in np.flatnonzero(selected).tolist():
        if rendered.errors[r] is not None:
            reasons[r], ok[r] = rendered.errors[r], False
    for r in np.flatnonzero(ok & ~trainable).tolist():
        reasons[r], ok[r] = NO_TRAINABLE, False
    message_type = schema.field("messages" if opts.sft_layout == "messages" else "prompt").type
    if opts.sft_layout == "messages":
        owner = np.flatnonzero(ok)
        columns = {"messages": ranges(rendered, moff[owner], last_a[owner] + 1, message_type)}
    else:
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
            order = np.lexsort((segment, owner))
            owner, segment, p_start, p_stop, c_stop = (a[order] for a in (owner, segment, p_start, p_stop, c_stop))
        columns = {"segment": pa.array(segment, pa.int32()),
                   "prompt": ranges(rendered, p_start, p_stop, message_type),
                   "completion": ranges(rendered, p_stop, c_stop, message_type)}
    take = pa.array(owner)
    columns |= {"id": batch.column("id").take(take), "source": batch.column("source").take(take),
                "tools": batch.column("tools_json").take(take)}
    table = pa.RecordBatch.from_arrays([columns[f.name] for f in schema], schema=schema)
    return reasons, table, owner
