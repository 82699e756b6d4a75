"""Fast, lossless JSON encoding for free-form values stored as strings in Arrow."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> str:
    """Encode to compact standard JSON; falls back to the stdlib for ints beyond 64 bits.

    Standard JSON has no NaN or Infinity: such floats inside free-form values become null.
    """
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def loads(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        # The stdlib accepts what orjson rejects on purpose (big ints, NaN); keep those values.
        return json.loads(text)
