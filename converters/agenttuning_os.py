"""AgentInstruct OS split (THUDM/AgentInstruct, "os") -> interlingua.

Raw format (one object per trajectory):
- `id`: e.g. "os_42".
- `conversations`: list of {`role`: "user" | "assistant", `content`: str}; turn 0 is the prompt
  ("You are an assistant that will act like a person... Now, my problem is:\\n<task>"), assistant
  turns are "Think: ...\\n\\nAct: bash\\n\\n```bash\\n...\\n```" / "Act: answer(...)" / "Act: finish",
  user turns are "The output of the OS:\\n..." (or few-shot examples).

Follows ADP's `datasets/agenttuning_os/raw_to_standardized.py`: the prompt is reduced to the task
plus a `<solution>` instruction; bash blocks become `bash` code actions, `answer(x)` a `<solution>`
message (wrapped in `<finish>` when last), `finish` a `<finish></finish>` message; OS output is an
environment text observation.
"""

from __future__ import annotations

import re
from typing import Any

from converters._chat import turns
from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "agenttuning_os"
DATASET = "THUDM/AgentInstruct"
_SOLUTION_NOTE = "If you think you have got the answer to the question, you should print like this:\n\n<solution> Your solution here </solution>"
_BASH = re.compile(r"bash\n\n```bash\n(.*)\n```|bash \n\n```bash\n(.*)\n```|bash\n  \n```bash\n(.*)\n```", re.DOTALL)


@register(NAME, sources=[DATASET + " (os)"])
@guarded()
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id",), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    for role, content in turns(ctx):
        if role not in ("user", "assistant", "system"):
            ctx.fail(f"unknown role {role[:40]!r}")
        marker = "\n\nNow, my problem is:\n"
        if content.startswith("You are an assistant") and marker in content:
            task = content[content.rfind(marker) + len(marker) :]
            b.text(task.strip().replace("?bash:`", "?") + "\n\n" + _SOLUTION_NOTE, "user")
            continue
        act = re.match(r"Think: (.*)\n\nAct: (.*)", content, re.DOTALL)
        if act:
            thought, command = act.group(1), act.group(2)
            bash = _BASH.match(command)
            answer = re.match(r"answer\((.*)\)", command, re.DOTALL)
            if bash:
                b.code("bash", bash.group(1) or bash.group(2) or bash.group(3) or "", thought=thought)
            elif answer:
                b.message(f"<solution> {answer.group(1)} </solution>", thought=thought)
            elif command.startswith("finish"):
                b.message("<finish></finish>", thought=thought)
            else:
                ctx.fail(f"cannot parse action {command[:80]!r}")
        elif content.startswith("The output of the OS:\n"):
            b.text(content[len("The output of the OS:\n") :], "environment")
        else:
            text = content.replace("Thought:", "THOUGHT:").replace("Action:", "ACTION:").replace("Observation:", "OBSERVATION:")
            b.text(text, "agent" if role == "assistant" else "user")
    last = b.last
    if last and last["kind"] == "message" and "<solution>" in last["content"]:
        last["content"] = f"<finish> {last['content']} </finish>"
    return b.build()
