"""A rule-based customer for the built-in retail world: answers from the task's hidden info, leaves when served."""

from __future__ import annotations

import re
from typing import Any, Sequence

from envs.base import USER_STOP as STOP
from envs.base import Task, UserReply, UserSimulator
from schemas.models import Step

# The agent signals it is finished: the user thanks it and leaves.
_DONE = re.compile(r"\b(anything else|is there anything|all set|has been (cancelled|canceled|updated|modified|changed|submitted|processed)"
                   r"|i have (cancelled|canceled|updated|modified|changed|submitted))\b")
_CONFIRM = re.compile(r"\b(confirm|proceed|shall i|should i|do you want|would you like|is that (right|correct|ok)|go ahead)\b")
# (pattern over the agent's message, user_info key, how the user says it)
_ANSWERS: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"\be-?mail\b"), "email", "My email is {}."),
    (re.compile(r"\b(name|zip|postal)\b"), "name_zip", "I'm {}."),
    (re.compile(r"\border (id|number)\b|\bwhich order\b"), "order_id", "The order id is {}."),
    (re.compile(r"\b(reason|why)\b"), "reason", "The reason is: {}."),
    (re.compile(r"\baddress\b"), "address", "The new address is {}."),
    (re.compile(r"\b(payment|pay|refund|card)\b"), "payment_method_id", "Please use {}."),
    (re.compile(r"\b(which item|what item|which product|new item|which variant|which one)\b"), "new_item", "I want the {}."),
]


class RuleUser(UserSimulator):
    """Deterministic: the same agent messages always get the same replies (from `metadata["user_info"]`)."""

    kind = "rules"

    def __init__(self, max_turns: int = 10) -> None:
        self.max_turns = max_turns

    async def reply(self, task: Task, conversation: Sequence[Step]) -> UserReply:
        turn = sum(1 for s in conversation if s.kind == "message" and s.extra.get("kind") != "revision")
        text, stop = answer(task.instruction, task.metadata.get("user_info", {}), conversation[-1].content, turn,
                            self.max_turns)
        return UserReply(text=text, stop=stop)


def answer(instruction: str, user_info: dict[str, Any], message: str, turn: int, max_turns: int) -> tuple[str, bool]:
    """The user's answer to the agent's `turn`-th message and whether the user has left."""
    info = dict(user_info)
    if "first_name" in info:
        info["name_zip"] = f"{info['first_name']} {info['last_name']}, zip code {info.get('zip', '')}"
    text = message.lower()
    if turn >= max_turns:
        return f"I have to go now. {STOP}", True
    # Completion first: a wrap-up message may mention refunds or addresses without asking for them.
    if _DONE.search(text):
        return f"No, that's all. Thank you! {STOP}", True
    answers = [how.format(info[key]) for pattern, key, how in _ANSWERS if key in info and pattern.search(text)]
    if _CONFIRM.search(text):
        answers.append("Yes, please go ahead.")
    if answers:
        return " ".join(answers), False
    return f"As I said: {instruction}", False
