"""The retail state store: an in-memory SQLite database with cheap snapshot/restore and a state hash.

The world is small (a few hundred rows), so per-statement overhead decides an environment
step's cost: SQLite answers a keyed lookup in ~30 us where an analytical engine needs ~0.5 ms,
and search methods take thousands of steps. A snapshot is the serialized database image
(`Connection.serialize`, ~30 us for the whole world) and a restore loads it back
(`deserialize`, ~20 us); images are immutable bytes, so any number of snapshots share nothing
mutable and restore into any database. Every table carries a content token that changes on
each write; the state hash combines per-table digests cached by token (process-wide, as the
tokens are), so a step re-reads only the tables it changed.
"""

from __future__ import annotations

import hashlib
import itertools
import sqlite3
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from envs.retail.data import PRIMARY_KEYS, TABLES, Rows, generate_world

# The tables tools can change; goal states are compared on these (products never change).
GOAL_TABLES = ("users", "payment_methods", "orders", "order_items", "transactions")
# Tokens come from one process-wide counter so equal tokens always mean equal content.
_TOKENS = itertools.count(1)
# (table, token) -> digest of that table content, shared by every database of the process.
_DIGESTS: OrderedDict[tuple[str, int], bytes] = OrderedDict()
_MAX_DIGESTS = 4096


def clear_digest_cache() -> None:
    _DIGESTS.clear()


@dataclass(frozen=True)
class DBSnapshot:
    """The database image and the content token of each table in it."""

    image: bytes
    tokens: tuple[tuple[str, int], ...]


def _connect() -> sqlite3.Connection:
    # Autocommit mode: transactions are explicit (`begin` / `commit` / `rollback`).
    return sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)


def rows_to_snapshot(rows: Rows) -> DBSnapshot:
    con = _connect()
    try:
        for table, cols in TABLES.items():
            con.execute(f"CREATE TABLE {table} ({', '.join(f'{c} {t}' for c, t in cols.items())})")
            con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' for _ in cols)})",
                            [tuple(r[c] for c in cols) for r in rows[table]])
        return DBSnapshot(con.serialize(), tuple((t, next(_TOKENS)) for t in TABLES))
    finally:
        con.close()


@lru_cache(maxsize=16)
def initial_snapshot(seed: int) -> DBSnapshot:
    """The initial world of `seed` (cached: generating it costs ~10 ms)."""
    return rows_to_snapshot(generate_world(seed))


class RetailDB:
    """One SQLite connection holding the retail tables."""

    def __init__(self, snapshot: DBSnapshot) -> None:
        self.con = _connect()
        self._tokens: dict[str, int] = {t: -1 for t in TABLES}
        self._saved_tokens: dict[str, int] | None = None  # the tokens at `begin`, back on `rollback`
        self.restore(snapshot)

    # --- reads -------------------------------------------------------------------------------
    def rows(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        cur = self.con.execute(sql, params or [])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    def one(self, sql: str, params: list[Any] | None = None) -> dict[str, Any] | None:
        found = self.rows(sql, params)
        return found[0] if found else None

    # --- writes ------------------------------------------------------------------------------
    def write(self, table: str, sql: str, params: list[Any] | None = None) -> None:
        """Run a mutating statement on `table`, marking its content as changed."""
        self._tokens[table] = next(_TOKENS)
        self.con.execute(sql, params or [])

    def begin(self) -> None:
        self.con.execute("BEGIN")
        self._saved_tokens = dict(self._tokens)

    def commit(self) -> None:
        self.con.execute("COMMIT")
        self._saved_tokens = None

    def rollback(self) -> None:
        self.con.execute("ROLLBACK")
        # The content is back to what it was at `begin`, so its tokens are too (caches keep hitting).
        if self._saved_tokens is not None:
            self._tokens, self._saved_tokens = self._saved_tokens, None

    # --- snapshot / restore ------------------------------------------------------------------
    def tokens(self) -> tuple[tuple[str, int], ...]:
        """The content token of every table: equal tokens mean equal content."""
        return tuple(self._tokens.items())

    def snapshot(self) -> DBSnapshot:
        return DBSnapshot(self.con.serialize(), self.tokens())

    def restore(self, snapshot: DBSnapshot) -> None:
        self.con.deserialize(snapshot.image)
        self._tokens = dict(snapshot.tokens)

    def state_hash(self, tables: tuple[str, ...] | None = None) -> str:
        """SHA-256 over the per-table digests of `tables` (default all); each cached by its content token."""
        digest = hashlib.sha256()
        for table in tables or tuple(TABLES):
            digest.update(self._table_digest(table))
        return digest.hexdigest()

    def _table_digest(self, table: str) -> bytes:
        key = (table, self._tokens[table])
        cached = _DIGESTS.get(key)
        if cached is not None:
            return cached
        order = ", ".join(PRIMARY_KEYS[table])
        rows = self.con.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
        # Values are str / int / None, whose repr is stable across runs and platforms.
        value = _DIGESTS[key] = hashlib.sha256(f"{table}\x00{rows!r}".encode()).digest()
        if len(_DIGESTS) > _MAX_DIGESTS:
            _DIGESTS.popitem(last=False)
        return value

    def close(self) -> None:
        self.con.close()
