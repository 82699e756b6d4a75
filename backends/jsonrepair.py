"""Recover a JSON object from model text that wraps it in fences or chatter."""

from __future__ import annotations

import re
from typing import Any

import orjson

_FENCE = re.compile(r"```[A-Za-z0-9_-]*\s*\n?(.*?)```", re.DOTALL)


def first_balanced_object(text: str) -> str | None:
    """The first `{...}` whose braces balance, ignoring braces inside JSON strings."""
    start = text.find("{")
    while start != -1:
        depth = 0
        in_str = False
        escaped = False
        for i in range(start, len(text)):
            c = text[i]
            if in_str:
                if escaped:
                    escaped = False
                elif c == "\\":
                    escaped = True
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    candidate = text[start : i + 1]
                    try:
                        orjson.loads(candidate)
                        return candidate
                    except orjson.JSONDecodeError:
                        break  # balanced but not JSON (e.g. prose braces): try the next "{"
        start = text.find("{", start + 1)
    return None


def extract_json(text: str) -> Any:
    """Parse `text` as JSON, else its fenced block, else its first balanced object.

    Raises ValueError when nothing parseable is found.
    """
    candidates = [text.strip()]
    candidates += [m.strip() for m in _FENCE.findall(text)]
    for c in candidates:
        try:
            return orjson.loads(c)
        except orjson.JSONDecodeError:
            pass
    obj = first_balanced_object(text)
    if obj is not None:
        return orjson.loads(obj)
    raise ValueError("no JSON object found in the answer")
