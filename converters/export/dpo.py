"""`trl-dpo`: TRL DPOTrainer rows `{"prompt", "chosen", "rejected"}`, conversational, from pairs.

`prompt` = the shared prefix: the chosen trajectory's first `prefix_len` steps, rendered;
`chosen` / `rejected` = each trajectory's steps from `prefix_len` on, rendered in the context of
the prefix (so a tool result at the start of a continuation answers the prefix's call). Both
are rendered with a forced message break at `prefix_len`, so no message straddles the split.

Skipped (with the reason): the prefixes render differently ("prefix mismatch": the pair does
not really share `prefix_len` steps), an empty prompt or continuation, a continuation with a
masked step (DPO has no per-token mask, and a masked step must never be trained), or a missing
trajectory (reported by the driver). `tools` comes from the chosen trajectory.
"""

from __future__ import annotations

from typing import Any

from converters.export.options import FormatOptions
from converters.export.render import Unrenderable, messages, render, split_at
from converters.export.sft import tools_json
from schemas.models import Pair, Trajectory


def _continuation_masked(traj: Trajectory, start: int) -> bool:
    return any(not s.train for s in traj.steps[start:])


def dpo_rows(pair: Pair, chosen: Trajectory, rejected: Trajectory, opts: FormatOptions) -> list[dict[str, Any]]:
    k = pair.prefix_len
    c_prompt, c_rest = split_at(render(chosen, opts.render, breaks=[k]), k)
    r_prompt, r_rest = split_at(render(rejected, opts.render, breaks=[k]), k)
    prompt = messages(c_prompt)
    if prompt != messages(r_prompt):
        raise Unrenderable("prefix mismatch")
    if not prompt:
        raise Unrenderable("empty prompt")
    if not c_rest or not r_rest:
        raise Unrenderable("empty continuation")
    if not any(t.is_assistant for t in c_rest) or not any(t.is_assistant for t in r_rest):
        raise Unrenderable("continuation has no assistant turn")
    if _continuation_masked(chosen, k) or _continuation_masked(rejected, k):
        raise Unrenderable("masked step in a continuation")
    return [{
        "id": pair.id,
        "source": pair.source,
        "level": pair.level,
        "chosen_id": chosen.id,
        "rejected_id": rejected.id,
        "prompt": prompt,
        "chosen": messages(c_rest),
        "rejected": messages(r_rest),
        "tools": tools_json(chosen),
    }]
