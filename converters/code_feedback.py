"""Code-Feedback (m-a-p/Code-Feedback) -> interlingua.

Raw format (one object per conversation):
- `id`: integer (or string) conversation id; the trajectory id is its string form.
- `messages`: list of {`role`: "user" | "assistant", `content`: str}; user turns are requests or
  "Execution result: \\n..." feedback, assistant turns are prose with fenced code blocks.

Follows ADP's `datasets/code_feedback/raw_to_standardized.py`: the first fenced block with a
language in an assistant turn becomes a code action in that language (text before it = thought),
other assistant turns are messages; execution results are environment observations; a trajectory
that ends on code gets ADP's closing turns (picked from the id), a final message is wrapped in
`<finish>`.
"""

from __future__ import annotations

from typing import Any

from converters._chat import turns
from converters._codechat import assistant_turn, finish
from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "code_feedback"
DATASET = "m-a-p/Code-Feedback"


@register(NAME, sources=[DATASET])
@guarded()
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    for role, content in turns(ctx, "messages", roles=("user", "assistant")):
        if role == "user":
            if content.startswith("Execution result: \n"):
                b.text(content[len("Execution result: \n") :], "environment")
            else:
                b.text(content, "user")
        else:
            assistant_turn(b, content)
    finish(b)
    return b.build()
