"""Orca AgentInstruct (microsoft/orca-agentinstruct-1M-v1) -> interlingua.

Raw format (one object per conversation; ADP adds the id when extracting):
- `id`: e.g. "orca_open_domain_qa165080" (split name + row index).
- `conversations`: list of {`role`: "system" | "user" | "assistant", `content`: str} (the HF
  dataset stores this list as a JSON string in `messages`; a JSON string is accepted here too).

Follows ADP's `datasets/orca_agentinstruct/raw_to_standardized.py`: system turns are dropped
(kept in `details["system"]`), user turns are user text, assistant turns with a fenced block in a
named language become code actions, others messages; the last message is wrapped in `<finish>`.
"""

from __future__ import annotations

from typing import Any

from converters._chat import turns
from converters._codechat import assistant_turn, finish
from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "orca_agentinstruct"
DATASET = "microsoft/orca-agentinstruct-1M-v1"


@register(NAME, sources=[DATASET])
@guarded()
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=False)
    if "conversations" not in record and isinstance(record.get("messages"), str):
        record = {**record, "conversations": ctx.json_loads(record["messages"], "messages")}
        ctx.raw = record
    b = Builder(ctx, NAME, DATASET)
    system = []
    for role, content in turns(ctx, roles=("system", "user", "assistant")):
        if role == "system":
            system.append(content)
        elif role == "user":
            b.text(content, "user")
        else:
            assistant_turn(b, content)
    finish(b)
    return b.build(details={"system": "\n\n".join(system)} if any(system) else {})
