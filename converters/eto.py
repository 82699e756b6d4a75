"""ETO trajectories (Yifan Song et al., "Trial and Error"; WebShop / ScienceWorld / ALFWorld) -> interlingua.

Raw format (one object per trajectory; learned from ADP's `datasets/eto/raw_to_standardized.py`,
`schema_raw.py` and sample_raw.json):
- `id`: e.g. "webshop_0" (environment + index).
- `conversations`: list of {`from`: "human" | "gpt", `value`: str}; human turns are the task prompt
  and observations, gpt turns are "Thought: ...\\nAction: ..." text.
- `reward`: final environment reward (float, 0..1); `source`: who produced it (e.g. "human", "gpt4").

Follows ADP: human turns are user text, gpt turns message actions with an empty thought, the last
message is wrapped in `<finish>`. `reward` is copied to the trajectory (success = reward >= 1).
"""

from __future__ import annotations

from typing import Any

from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "eto"
DATASET = "agent-eto/eto-sft-trajectory"


@register(NAME, sources=[DATASET])
@guarded()
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    convs = ctx.dicts(record, "conversations")
    if not convs:
        ctx.fail("`conversations` is empty")
    for i, turn in enumerate(convs):
        who = ctx.str_(turn, "from", f"conversations[{i}]")
        value = ctx.str_(turn, "value", f"conversations[{i}]")
        if who == "human":
            b.text(value, "user")
        elif who == "gpt":
            b.message(value, thought="")
        else:
            ctx.fail(f"`conversations[{i}].from` is {who[:40]!r}, expected human or gpt")
    last = b.last
    if last["kind"] == "message" and "<finish>" not in last["content"]:
        last["content"] = f"<finish> {last['content']} </finish>"
    reward = record.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        ctx.fail(f"`reward` is {type(reward).__name__}, expected a number")
    details = {"source": record["source"]} if isinstance(record.get("source"), str) else {}
    return b.build(reward=reward, success=None if reward is None else reward >= 1.0, details=details)
