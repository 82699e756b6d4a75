"""A rule-based simulated customer: answers the agent's questions from the task's hidden info, ends when served."""

from __future__ import annotations

import re
from typing import Any

STOP = "###STOP###"

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


class SimulatedUser:
    """Deterministic: the same agent messages always get the same replies."""

    def __init__(self, instruction: str, info: dict[str, Any], max_turns: int = 10) -> None:
        self.instruction = instruction
        self.info = dict(info)
        if "first_name" in info:
            self.info["name_zip"] = f"{info['first_name']} {info['last_name']}, zip code {info.get('zip', '')}"
        self.max_turns = max_turns

    def reply(self, message: str, turn: int) -> tuple[str, bool]:
        """The user's answer to the agent's `turn`-th message and whether the user has left."""
        text = message.lower()
        if turn >= self.max_turns:
            return f"I have to go now. {STOP}", True
        # Completion first: a wrap-up message may mention refunds or addresses without asking for them.
        if _DONE.search(text):
            return f"No, that's all. Thank you! {STOP}", True
        answers = [how.format(self.info[key]) for pattern, key, how in _ANSWERS if key in self.info and pattern.search(text)]
        if _CONFIRM.search(text):
            answers.append("Yes, please go ahead.")
        if answers:
            return " ".join(answers), False
        return f"As I said: {self.instruction}", False
