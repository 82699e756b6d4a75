"""Shared parsing for chat datasets whose assistant turns may hold one fenced code block."""

from __future__ import annotations

import re

from converters._util import Builder

_FENCE = re.compile(r"(.*?)?```(\w+)?\n(.*?)\n```", re.DOTALL)


def assistant_turn(b: Builder, content: str) -> None:
    """A fenced block with a language -> code action (text before it = thought); else a message."""
    m = _FENCE.match(content) if "```" in content else None
    if m and m.group(2):
        b.code(m.group(2).lower(), m.group(3), thought=m.group(1))
    else:
        b.message(content, thought=None)


def finish(b: Builder) -> None:
    """ADP's ending: closing turns after a code action; a last message is wrapped in <finish>."""
    last = b.last
    if last and last["kind"] == "code":
        b.closing("content")
    last = b.last
    if last and last["kind"] == "message" and "<finish>" not in last["content"]:
        last["content"] = f"<finish> {last['content']} </finish>"
