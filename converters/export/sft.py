"""`trl-sft`: TRL SFTTrainer rows, conversational.

Two layouts (one per export: a dataset has one schema):

- `messages`: `{"messages": [...], "tools": <JSON string>}`. TRL trains on the whole
  conversation (or the assistant turns with `assistant_only_loss`). A trajectory with masked
  steps (`train = false`) is skipped in this layout ("masked steps need prompt-completion"),
  since nothing here could keep its loss at zero.
- `prompt-completion`: `{"prompt": [...], "completion": [...], "tools": ...}`; with
  `completion_only_loss` (TRL's default for this layout) loss falls on the completion only.
  A trajectory becomes one row per *trainable segment*: a run of turns that starts at a
  trainable assistant turn and ends at the last trainable assistant turn before the next masked
  one. `prompt` = every turn before the segment (the task, masked steps, earlier segments as
  context); `completion` = the segment. A trajectory whose masked steps all come first gives one
  row; masked steps interleaved after trainable ones split it, so a masked step is never in a
  completion. Observations inside a segment (tool results) are part of the completion, as TRL
  treats every completion token alike; trailing observations after the last trainable turn
  carry no training signal and are left out.

`tools` is a JSON string of `[{"type": "function", "function": {...}}]` (TRL 1.16's SFT, DPO and
KTO trainers `json.loads` a string `tools` column and pass it to the chat template); null when
the trajectory has no tools. `id`, `source` (and `segment`) are provenance columns the trainers
drop.
"""

from __future__ import annotations

from typing import Any

from converters.export.options import FormatOptions
from converters.export.render import Turn, Unrenderable, dumps, messages, render
from converters.export.tools import openai_tools
from schemas.models import Trajectory


def tools_json(traj: Trajectory) -> str | None:
    tools = openai_tools(traj)
    return dumps(tools) if tools else None


def has_masked_steps(traj: Trajectory) -> bool:
    return any(not s.train for s in traj.steps)


def trainable_segments(turns: list[Turn]) -> list[tuple[int, int]]:
    """[start, end) turn ranges of each trainable segment (see module docstring)."""
    segments: list[tuple[int, int]] = []
    start: int | None = None
    last_trained: int | None = None
    for k, turn in enumerate(turns):
        if not turn.is_assistant:
            continue
        if turn.train:
            if start is None:
                start = k
            last_trained = k
        elif start is not None:
            segments.append((start, last_trained + 1))  # type: ignore[operator]
            start = last_trained = None
    if start is not None:
        segments.append((start, last_trained + 1))  # type: ignore[operator]
    return segments


def sft_rows(traj: Trajectory, opts: FormatOptions) -> list[dict[str, Any]]:
    turns = render(traj, opts.render)
    tools = tools_json(traj)
    if opts.sft_layout == "messages":
        if has_masked_steps(traj):
            raise Unrenderable("masked steps need the prompt-completion layout")
        return [{"id": traj.id, "source": traj.source, "messages": messages(turns), "tools": tools}]
    segments = trainable_segments(turns)
    if not segments:
        raise Unrenderable("no trainable assistant turn")
    rows = []
    for n, (start, end) in enumerate(segments):
        prompt = turns[:start]
        if not prompt:
            raise Unrenderable("no prompt before the first assistant turn")
        rows.append({
            "id": traj.id,
            "source": traj.source,
            "segment": n,
            "prompt": messages(prompt),
            "completion": messages(turns[start:end]),
            "tools": tools,
        })
    return rows
