"""AgentInstruct Mind2Web split (THUDM/AgentInstruct, "mind2web") -> interlingua.

Raw format (one object per single-step example; learned from ADP's
`datasets/agenttuning_mind2web/raw_to_standardized.py` and its sample_raw.json):
- `id`: e.g. "mind2web_96".
- `conversations`: exactly [{`role`: "user", `content`: "'''<html> ... '''\\nBased on the HTML webpage
  above, try to complete the following task: ... multiple choice options A. / B. ..."},
  {`role`: "assistant", `content`: "Thought: ...\\nAnswer: B.\\nAction: CLICK"}].

Follows ADP: the user turn is user text; the assistant turn is a `<finish> answer </finish>` message
with the thought. ADP drops examples whose chosen option letter is absent from the prompt; we keep
them and set `details["option_in_prompt"]`.
"""

from __future__ import annotations

import re
from typing import Any

from converters._chat import turns
from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "agenttuning_mind2web"
DATASET = "THUDM/AgentInstruct"


@register(NAME, sources=[DATASET + " (mind2web)"])
@guarded()
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    prompt = ""
    for role, content in turns(ctx, roles=("user", "assistant")):
        if role == "user":
            prompt = content
            b.text(content, "user")
        else:
            m = re.search(r"Thought:\s*(.*?)\s*Answer:\s*(.*)", content, re.DOTALL)
            if not m:
                ctx.fail("assistant turn lacks 'Thought: ... Answer: ...'")
            b.message(f"<finish> {m.group(2).strip()} </finish>", thought=m.group(1).strip())
    details: dict[str, Any] = {}
    last = b.last
    if last["kind"] == "message":
        key = re.search(r"\b([A-Z])\.", last["content"])
        details["option_in_prompt"] = bool(key and f"{key.group(1)}." in prompt)
    return b.build(details=details)
