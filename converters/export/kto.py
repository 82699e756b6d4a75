"""`trl-kto`: TRL KTOTrainer rows `{"prompt", "completion", "label": bool}`, conversational.

Two kinds of example (`kto_mode`):

- `steps`: one example per labeled assistant step (label "good" or "bad"): `prompt` = every
  turn before the step, `completion` = the step's assistant message (rendered with breaks
  around it so it stands alone), `label` = (label == "good"). Masked labeled steps
  (`train = false`) give no example: a masked step is never trained.
- `trajectory`: one example per trajectory with a known `success`: `prompt` = the turns before
  the first trainable assistant turn after the last masked one (the task, plus any masked
  prefix; trainable turns before a masked one become context too, since a KTO completion has
  no per-token mask), `completion` = the rest up to the last assistant turn, `label` = success.
- `auto` (default): `steps` for trajectories with at least one good/bad step label, else
  `trajectory`.

`step` is the labeled step's index (-1 for trajectory examples).
"""

from __future__ import annotations

from typing import Any

from converters.export.options import FormatOptions
from converters.export.render import Turn, Unrenderable, last_assistant, messages, render, split_at
from converters.export.sft import tools_json
from schemas.models import Trajectory

_ACTIONS = ("api", "code", "message")


def labeled_steps(traj: Trajectory) -> list[int]:
    return [i for i, s in enumerate(traj.steps) if s.kind in _ACTIONS and s.label in ("good", "bad")]


def _row(traj: Trajectory, step: int, prompt: list[Turn], completion: list[Turn], label: bool,
         tools: str | None) -> dict[str, Any]:
    return {"id": traj.id, "source": traj.source, "step": step, "prompt": messages(prompt),
            "completion": messages(completion), "label": label, "tools": tools}


def step_rows(traj: Trajectory, opts: FormatOptions) -> list[dict[str, Any]]:
    tools = tools_json(traj)
    rows = []
    for i in labeled_steps(traj):
        step = traj.steps[i]
        if not step.train:
            continue
        prompt, rest = split_at(render(traj, opts.render, breaks=[i, i + 1]), i)
        completion = [t for t in rest if t.first_step == i and t.is_assistant]
        if not prompt or not completion:
            continue
        rows.append(_row(traj, i, prompt, completion, step.label == "good", tools))
    if not rows:
        raise Unrenderable("no trainable labeled step")
    return rows


def trajectory_rows(traj: Trajectory, opts: FormatOptions) -> list[dict[str, Any]]:
    if traj.success is None:
        raise Unrenderable("no success label")
    turns = render(traj, opts.render)
    assistant = [k for k, t in enumerate(turns) if t.is_assistant]
    masked = [k for k in assistant if not turns[k].train]
    start = next((k for k in assistant if not masked or k > masked[-1]), None)
    if start is None:
        raise Unrenderable("no trainable assistant turn")
    if start == 0:
        raise Unrenderable("no prompt before the first assistant turn")
    end = last_assistant(turns) + 1
    return [_row(traj, -1, turns[:start], turns[start:end], bool(traj.success), tools_json(traj))]


def kto_rows(traj: Trajectory, opts: FormatOptions) -> list[dict[str, Any]]:
    mode = opts.kto_mode
    if mode == "auto":
        mode = "steps" if labeled_steps(traj) else "trajectory"
    return step_rows(traj, opts) if mode == "steps" else trajectory_rows(traj, opts)
