"""`trl-kto`: TRL KTOTrainer rows `{"prompt", "completion", "label": bool}`, conversational.

KTO, like DPO, has no per-token mask: every completion token carries the label. So by default a
completion is one assistant message, rendered in place (the trajectory is rendered whole; no tool
call is cut from its answer), and `prompt` is every message before it.

- `steps`: one row per trainable assistant message whose steps carry a good/bad label
  (`label` = good). Parallel calls share a message; when their labels disagree the message gives
  no row. Masked steps (`train = false`) give no row: a masked step is never trained.
- `turns`: one row per trainable assistant message, labelled with the trajectory's `success`
  (outcome supervision for trajectories without step labels); `success = null` -> skipped.
- `trajectory`: one row per trajectory with a known `success`: `prompt` = the messages before
  the first trainable assistant message after the last masked one (the task, plus any masked
  prefix), `completion` = the rest through the last assistant message. Tool results and user
  turns inside it carry the label too; the card says so.
- `auto` (default): `steps` for trajectories with at least one good/bad step label, else `turns`.

`prompt`, for a record that carries render settings (generated in an environment; `history="request"`,
the default), is the request that produced the completion's first message, exactly as sent.

`step` is the first step of the completion's message (-1 for trajectory rows).
"""

from __future__ import annotations

from typing import Any

from converters.export.options import FormatOptions
from converters.export.records import Record
from converters.export.render import ACTION_KINDS, Conversation, Unrenderable
from converters.export.request import request_positions


def has_step_labels(record: Record) -> bool:
    return any(record.step("kind", j) in ACTION_KINDS and record.step("label", j) in ("good", "bad")
               for j in range(len(record)))


def _message_label(conv: Conversation, k: int, record: Record) -> bool | None:
    """good -> True, bad -> False, none or disagreeing -> None."""
    labels = {record.step("label", j) for j in conv.steps(k)} & {"good", "bad"}
    return labels.pop() == "good" if len(labels) == 1 else None


def _prompt(record: Record, opts: FormatOptions, conv: Conversation, k: int) -> Conversation:
    """What message k of `conv` is conditioned on: the request that produced it where the record says how
    its requests were rendered (`history="request"`), else every message before it."""
    settings = record.settings
    if settings is None or opts.history != "request":
        return conv[:k]
    sent = record.render_request()
    return sent[request_positions(sent, k, settings)]


def _row(record: Record, k: int, prompt: Conversation, completion: Conversation, label: bool,
         tools: str | None, step: int) -> dict[str, Any]:
    return {"id": record.id, "source": record.source, "step": step, "prompt": prompt,
            "completion": completion, "label": label, "tools": tools}


def message_rows(record: Record, opts: FormatOptions, outcome: bool) -> list[dict[str, Any]]:
    """One row per trainable assistant message: labelled by its steps, or by the outcome."""
    if outcome and record.success is None:
        raise Unrenderable("no success label")
    conv = record.render(opts.render)
    tools = record.tools_json()
    rows = []
    for k in conv.assistant_positions():
        label = bool(record.success) if outcome else _message_label(conv, k, record)
        if k == 0 or label is None or not conv.train(k):
            continue
        rows.append(_row(record, k, _prompt(record, opts, conv, k), conv[k:k + 1], label, tools, conv.first_step(k)))
    if not rows:
        raise Unrenderable("no trainable assistant turn with a prompt" if outcome else "no trainable labeled step")
    return rows


def trajectory_rows(record: Record, opts: FormatOptions) -> list[dict[str, Any]]:
    if record.success is None:
        raise Unrenderable("no success label")
    conv = record.render(opts.render)
    assistant = conv.assistant_positions()
    masked = [k for k in assistant if not conv.train(k)]
    start = next((k for k in assistant if not masked or k > masked[-1]), None)
    if start is None:
        raise Unrenderable("no trainable assistant turn")
    if start == 0:
        raise Unrenderable("no prompt before the first assistant turn")
    row = _row(record, -1, _prompt(record, opts, conv, start), conv[start:].through_last_assistant(),
               bool(record.success), record.tools_json(), -1)
    return [row]


def kto_rows(record: Record, opts: FormatOptions) -> list[dict[str, Any]]:
    mode = opts.kto_mode
    if mode == "auto":
        mode = "steps" if has_step_labels(record) else "turns"
    if mode == "trajectory":
        return trajectory_rows(record, opts)
    return message_rows(record, opts, outcome=mode == "turns")
