"""mini-coder trajectories (ricdomolm/mini-coder-trajs-400k) -> interlingua.

Raw format (one object per trajectory, mini-SWE-agent bash-only runs on SWE-smith tasks):
- `id`: trajectory id (here equal to `instance_id`).
- `instance_id`: SWE-smith task instance.
- `messages`: list of {`role`: "system" | "user" | "assistant", `content`: str}; assistant turns are
  "THOUGHT: ...\\n\\n```bash\\n<command>\\n```" (or `<function=submit>`), user turns are the task or
  "<returncode>N</returncode>\\n<output>...</output>" results.
- `patch`: the final diff; `model`: the generating model; `verified`: whether the patch passed.

Follows ADP's `datasets/mini-coder/raw_to_standardized.py`: the system prompt is dropped (kept in
`details["system"]`), the first bash block is a `bash` code action (thought = text before it, without
"THOUGHT: "), `<function=name>` an api action, command results environment text (the <output>
body); a trajectory ending on submit gets ADP's closing turns (picked from the id). ADP keeps only
trajectories that end on submit; we convert all and set `success` from `verified`.
"""

from __future__ import annotations

import re
from typing import Any

from converters._chat import turns
from converters._swe import SUBMIT
from converters._util import Builder, Ctx, guarded
from converters.registry import register
from schemas.models import Trajectory

NAME = "mini-coder"
DATASET = "ricdomolm/mini-coder-trajs-400k"


@register(NAME, sources=[DATASET])
@guarded(("id", "instance_id"))
def convert(record: Any) -> Trajectory:
    ctx = Ctx(record, ("id", "instance_id"), require_id=True)
    b = Builder(ctx, NAME, DATASET)
    system = []
    for role, content in turns(ctx, "messages", roles=("system", "user", "assistant")):
        if role == "system":
            system.append(content)
        elif role == "user":
            code = re.search(r"<returncode>(\d+)</returncode>", content)
            output = re.search(r"<output>(.*?)</output>", content, re.DOTALL) if code else None
            if code and output:
                b.text(output.group(1).strip(), "environment")
            else:
                b.text(content, "user")
        else:
            bash = re.search(r"```bash\n(.*?)\n```", content, re.DOTALL)
            call = None if bash else re.search(r"<function=([^>]+)>", content)
            if bash:
                thought = content[: bash.start()].strip()
                if thought.startswith("THOUGHT: "):
                    thought = thought[len("THOUGHT: ") :].strip()
                b.code("bash", bash.group(1).strip(), thought=thought or None)
            elif call:
                thought = content[: call.start()].strip()
                b.api(call.group(1), {}, thought=thought or None)
            else:
                b.message(content)
    last = b.last
    if last and last["kind"] == "api" and last["function"] == "submit":
        b.closing("content")
    verified = record.get("verified")
    details = {k: record[k] for k in ("instance_id", "model", "patch") if isinstance(record.get(k), str)}
    if system:
        details["system"] = "\n\n".join(system)
    return b.build(tools=[SUBMIT], success=verified if isinstance(verified, bool) else None,
                   details=details, task_id=details.get("instance_id"), model=details.get("model"))
