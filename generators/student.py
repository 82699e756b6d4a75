"""A student model's teacher-forcing loss on a trajectory: how much it still has to learn from it.

The trajectory is rendered as training would render it (`converters.export.render`: its turns and
their loss masks), with tool calls written into the assistant's text (`<tool_call>` blocks, tool
answers as user turns) so that every trained token is plain message content the scorer can find
in the served model's own chat template without its tokenizer. The loss is the mean negative
log-likelihood of the trainable assistant turns' tokens (`backends.scoring.target_loss`), from the
student's prompt logprobs (`LLM.prompt_logprobs`).
"""

from __future__ import annotations

from typing import Any

from backends.base import LLM
from backends.scoring import TargetLoss, target_loss
from converters.export.render import RenderOptions, render
from schemas.models import Trajectory


def scoring_messages(traj: Trajectory) -> tuple[list[dict[str, Any]], list[int]]:
    """(the trajectory as text-form chat messages, the indices of its trainable assistant turns)."""
    turns = render(traj, RenderOptions(reasoning=False, tool_format="text"), require_assistant=False)
    messages = [t.message for t in turns]
    return messages, [i for i, t in enumerate(turns) if t.is_assistant and t.train]


async def trajectory_loss(student: LLM, traj: Trajectory) -> TargetLoss:
    """The student's mean NLL per trained token of `traj` (raises ScoringUnsupported / ScoringError)."""
    messages, targets = scoring_messages(traj)
    return target_loss(await student.prompt_logprobs(messages), messages, targets)
