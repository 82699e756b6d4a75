"""What a judge reads of a trajectory: what the world showed, not what the agent said about itself.

An agent's thoughts ("I have now completed the task") and its unparsed raw answers are its own
account of the episode; a judge that reads them is talked into success. Judges therefore read the
steps with that self-report taken out: each action keeps what it did (the call and its arguments,
the code, the message to the user, which is part of the outcome for a question), each observation
stays as the world returned it. A judge reads the self-report too only when its config asks for it
(`judge.self_report: true`), and the record says which it read.
"""

from __future__ import annotations

from typing import Sequence

from schemas.models import Step, TextObservation

ACTION_KINDS = ("api", "code", "message")
WORLD = "world"  # what the record says a judge read: the world's side only ...
SELF_REPORT = "world+self_report"  # ... or the agent's thoughts as well


def world_only(steps: Sequence[Step]) -> list[Step]:
    """`steps` without the agent's self-report: actions lose their thoughts and reasoning, the agent's unparsed raw
    answers are left out (their parse-error notes stay: they show that nothing happened)."""
    out: list[Step] = []
    for step in steps:
        if step.kind in ACTION_KINDS:
            out.append(step.model_copy(update={"thought": None, "reasoning": None}))
        elif isinstance(step, TextObservation) and step.source == "agent":
            continue
        else:
            out.append(step)
    return out


def judged_steps(steps: Sequence[Step], self_report: bool) -> tuple[list[Step], str]:
    """The steps a judge reads and what they are (`world` / `world+self_report`)."""
    return (list(steps), SELF_REPORT) if self_report else (world_only(steps), WORLD)
