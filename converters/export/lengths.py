"""Row lengths for the dataset card, measured on the rows as they are written (no second pass).

Approximate tokens are characters / 4 (contents, reasoning, tool-call names and arguments), the
usual rule of thumb for BPE tokenizers on English text; `tokenized` rows count their real tokens.
Per column the card needs count, mean, min, max, total and the median / 95th percentile: those
come from a histogram with exact bins up to 256 tokens and 1%-wide bins above, so memory stays
constant at any size and the percentiles are exact or within 1%.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

CHARS_PER_TOKEN = 4
_EXACT = 256
_GROWTH = 1.01
_BINS = _EXACT + int(math.log(2**40 / _EXACT, _GROWTH)) + 2


def _bin(tokens: np.ndarray) -> np.ndarray:
    above = np.maximum(tokens, _EXACT).astype(np.float64)
    log_bins = _EXACT + np.floor(np.log(above / _EXACT) / math.log(_GROWTH)).astype(np.int64)
    return np.minimum(np.where(tokens < _EXACT, tokens, log_bins), _BINS - 1)


def _lower_edge(b: int) -> int:
    return b if b < _EXACT else math.ceil(_EXACT * _GROWTH ** (b - _EXACT))


class TokenStats:
    """Tokens (and messages) per row of one column, accumulated batch by batch."""

    def __init__(self) -> None:
        self.rows = 0
        self.messages = 0
        self.total = 0
        self.min: int | None = None
        self.max: int | None = None
        self.hist = np.zeros(_BINS, dtype=np.int64)

    def add(self, tokens: np.ndarray, messages: np.ndarray) -> None:
        if not len(tokens):
            return
        self.rows += len(tokens)
        self.messages += int(messages.sum())
        self.total += int(tokens.sum())
        lo, hi = int(tokens.min()), int(tokens.max())
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)
        self.hist += np.bincount(_bin(tokens), minlength=_BINS)

    def quantile(self, q: float) -> int | None:
        if not self.rows:
            return None
        b = int(np.searchsorted(np.cumsum(self.hist), math.ceil(q * self.rows)))
        return max(self.min or 0, min(_lower_edge(b), self.max or 0))

    def summary(self, column: str) -> dict[str, Any]:
        return {"column": column, "rows": self.rows, "messages_mean": self.messages / self.rows if self.rows else None,
                "tokens_mean": self.total / self.rows if self.rows else None, "tokens_p50": self.quantile(0.5),
                "tokens_p95": self.quantile(0.95), "tokens_max": self.max, "tokens_total": self.total}

    def equal_width(self, bins: int = 20) -> dict[str, list]:
        """Rows per equal-width bin over [min, max] (each fine bin counted at its lower edge)."""
        if not self.rows:
            return {"edges": [], "counts": []}
        lo, hi = self.min or 0, self.max or 0
        width = max(1.0, (hi - lo + 1) / bins)
        counts = [0] * bins
        for b in np.flatnonzero(self.hist).tolist():
            value = max(lo, min(_lower_edge(b), hi))
            counts[min(int((value - lo) // width), bins - 1)] += int(self.hist[b])
        last = max(k for k, n in enumerate(counts) if n) + 1
        return {"edges": [lo + k * width for k in range(last + 1)], "counts": counts[:last]}


def sum_lists(list_array: pa.ListArray, values: np.ndarray) -> np.ndarray:
    """Per list, the sum of `values` (one per element of `list_array.values`, the whole child array)."""
    offsets = list_array.offsets.to_numpy()
    sums = np.r_[0, np.cumsum(values)]
    return sums[offsets[1:]] - sums[offsets[:-1]]


def _chars(array: pa.Array) -> np.ndarray:
    if isinstance(array.type, pa.BaseExtensionType):
        array = array.storage
    return pc.fill_null(pc.utf8_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def message_chars(column: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(characters, messages) per row of a conversation column (messages or ShareGPT turns)."""
    values = column.values
    if values.type.get_field_index("value") >= 0:  # ShareGPT {from, value}
        chars = _chars(values.field("value"))
    else:
        chars = _chars(values.field("content"))
        if values.type.get_field_index("reasoning_content") >= 0:
            chars += _chars(values.field("reasoning_content"))
        calls = values.field("tool_calls")
        fn = calls.values.field("function")
        chars += sum_lists(calls, _chars(fn.field("name")) + _chars(fn.field("arguments")))
    return sum_lists(column, chars), np.diff(column.offsets.to_numpy())


def approx_tokens(chars: np.ndarray) -> np.ndarray:
    return -(-chars // CHARS_PER_TOKEN)


def dict_chars(messages: list[dict[str, Any]]) -> int:
    """Characters of OpenAI-style message dicts (the JSONL format)."""
    total = 0
    for m in messages:
        total += len(m.get("content") or "") + len(m.get("reasoning_content") or "")
        for call in m.get("tool_calls") or ():
            total += len(call["function"]["name"]) + len(call["function"]["arguments"])
    return total
