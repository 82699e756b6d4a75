"""AgentInstruct DB split (THUDM/AgentInstruct, "db") -> interlingua.

Raw format (one object per trajectory):
- `id`: e.g. "db_100".
- `conversations`: list of {`role`: "user" | "assistant", `content`: str}; turn 0 is the MySQL task
  prompt ("I will ask you a question, ..."), assistant turns end in "Action: Operation\\n```sql ...```"
  or "Action: Answer\\nFinal Answer: [...]", user turns carry the raw MySQL output.

Follows ADP's `datasets/agenttuning_db/raw_to_standardized.py`: the prompt is rewritten to the
<execute_mysql> / <solution> convention (ADP's text, typos and escaped quotes kept) and its last line
dropped; SQL operations become `mysql` code actions, answers a `<solution>` message (wrapped in
`<finish>` when last). ADP drops trajectories that end on a code action; we keep them (filtering is a
later stage) and record `details["ends_with_code"]`.
"""

from __future__ import annotations

import re
from typing import Any

from converters._chat import turns
from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "agenttuning_db"
DATASET = "THUDM/AgentInstruct"
_ANSWER_TEMPLATE = 'Final Answer: ["ANSWER1", "ANSWER2", ...]'
_SOLUTION_TEMPLATE = '<solution> [\\"ANSWER1\\", \\"ANSWER2\\", ...] </solution>'


def _system_prompt(content: str) -> str:
    head = content[: content.rfind("\n")]
    text = head.replace(_ANSWER_TEMPLATE, _SOLUTION_TEMPLATE)
    start = text.find("```sql\n")
    end = text.rfind("\n```")
    if start >= 0 and end > start:
        sql = text[start + len("```sql\n") : end]
        text = text[:start] + f"<execute_mysql>\n{sql}\n</excute_mysql>" + text[end + len("\n```") :]
    text = text.replace("Action: Operation", "").replace("Action: Answer", "")
    return text + "\n\nOk? Understood?"


def _obs_text(content: str) -> str:
    return content.replace("Thought:", "THOUGHT:").replace("Action:", "ACTION:").replace("Observation:", "OBSERVATION:")


@register(NAME, sources=[DATASET + " (db)"])
@guarded()
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    for role, content in turns(ctx):
        if role not in ("user", "assistant", "system"):
            ctx.fail(f"unknown role {role[:40]!r}")
        if content.startswith("I will ask you a question,") and "\n" in content:
            b.text(_system_prompt(content), "user")
            continue
        act = re.match(r"(.*)Action: Operation\n```sql\n(.*)\n```", content, re.DOTALL)
        answer = None if act else re.match(r"(.*)Action: Answer\nFinal Answer: (.*)", content, re.DOTALL)
        low = content.strip().lower()
        if act:
            b.code("mysql", act.group(2), thought=act.group(1))
        elif answer:
            b.message(f"<solution> {answer.group(2)} </solution>", thought=answer.group(1))
        elif low == "ok." or "ok. i'll follow" in low:
            b.message(content)
        else:
            if role == "assistant" and "Final Answer:" in content:
                at = content.find("Final Answer:")
                rest = content[at + len("Final Answer:") :].lstrip()
                content = content[:at] + f"ACTION: <solution> {rest} </solution>"
            b.text(_obs_text(content), {"user": "user", "assistant": "agent"}.get(role, "environment"))
    details: dict[str, Any] = {}
    last = b.last
    if last and last["kind"] == "message" and "<finish>" not in last["content"]:
        last["content"] = f"<finish> {last['content']} </finish>"
    if last and last["kind"] == "code":
        details["ends_with_code"] = True
    return b.build(details=details)
