"""Memoised tool calls: a retail tool's outcome is a pure function of the database content and its call.

Search methods replay the same calls from the same states again and again (sibling rollouts that
converge on one path, the same lookup from the same node). Table content tokens (`RetailDB.tokens`)
name a database content exactly, so a call is keyed by its tool, its canonical arguments and the
tokens of every table. A hit returns the recorded observation text and, for a write, the database
it produced: restoring that image instead of re-running the statements also keeps the content
tokens, so later lookups and the state-hash digests hit their caches too.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from envs.retail.db import DBSnapshot, clear_digest_cache

# Entries that record a write hold a database image (~60 KB); 512 bounds the memo at ~30 MB.
MAX_ENTRIES = 512

CallKey = tuple[str, bytes, tuple[tuple[str, int], ...]]


@dataclass(frozen=True)
class CallOutcome:
    """What a call did: its observation text, or the reason it was refused, and the database after it."""

    content: str | None
    error: str | None = None
    rule_violation: bool = False
    after: DBSnapshot | None = None  # None: the call left the database as it was


class CallMemo:
    """A bounded LRU map from (tool, arguments, table tokens) to the call's outcome."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[CallKey, CallOutcome] = OrderedDict()

    @staticmethod
    def key(function: str, arguments: Any, tokens: tuple[tuple[str, int], ...]) -> CallKey | None:
        """The call's key; None for arguments that have no canonical JSON form (never memoised)."""
        try:
            canonical = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            return None
        return function, canonical, tokens

    def get(self, key: CallKey) -> CallOutcome | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: CallKey, outcome: CallOutcome) -> None:
        self._entries[key] = outcome
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


# Shared by every RetailEnv of the process: tokens are process-wide, so entries are valid for all.
MEMO = CallMemo()


def clear_caches() -> None:
    """Forget memoised calls and table digests (benchmarks start each measured run cold)."""
    MEMO.clear()
    clear_digest_cache()
