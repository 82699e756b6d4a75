"""The retail state store: an in-memory DuckDB database with cheap snapshot/restore and a state hash.

Every table carries a content token that changes on each write. A snapshot holds one
immutable *version* per table: a copy inside the same database (`CREATE TABLE .. AS`,
~0.5 ms) made only for tables changed since their last copy, shared by every snapshot
of that content. A restore reloads only the tables whose token differs. Copies are
dropped once no snapshot refers to them. (Copying through Arrow costs ~4x more per
table, so Arrow is used only for the seed worlds, which are shared across databases.)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import duckdb
import pyarrow as pa

from envs.retail.data import PRIMARY_KEYS, TABLES, Rows, generate_world

_ARROW_TYPES = {"VARCHAR": pa.string(), "BIGINT": pa.int64(), "INTEGER": pa.int32()}
ARROW_SCHEMAS = {t: pa.schema([(c, _ARROW_TYPES[ty]) for c, ty in cols.items()]) for t, cols in TABLES.items()}
# The tables tools can change; goal states are compared on these (products never change).
GOAL_TABLES = ("users", "payment_methods", "orders", "order_items", "transactions")
_COPIES = itertools.count()
# Tokens come from one process-wide counter so equal tokens always mean equal content.
_TOKENS = itertools.count(1)


@dataclass(eq=False)
class TableVersion:
    """One immutable copy of a table's content: an Arrow table, or a copy table inside one database."""

    token: int
    arrow: pa.Table | None = None
    copy_name: str | None = None
    owner: Any = field(default=None, repr=False)  # weakref to the RetailDB holding `copy_name`


@dataclass(frozen=True)
class DBSnapshot:
    """Per table: the version holding its content."""

    tables: dict[str, TableVersion]


def rows_to_snapshot(rows: Rows) -> DBSnapshot:
    return DBSnapshot({
        t: TableVersion(next(_TOKENS), arrow=pa.Table.from_pylist(rows[t], schema=ARROW_SCHEMAS[t])) for t in TABLES
    })


@lru_cache(maxsize=16)
def initial_snapshot(seed: int) -> DBSnapshot:
    """The initial world of `seed` (cached: generating it and building Arrow tables costs ~10 ms)."""
    return rows_to_snapshot(generate_world(seed))


class RetailDB:
    """One DuckDB connection holding the retail tables."""

    def __init__(self, snapshot: DBSnapshot) -> None:
        self.con = duckdb.connect(":memory:")
        for table, cols in TABLES.items():
            self.con.execute(f"CREATE TABLE {table} ({', '.join(f'{c} {t}' for c, t in cols.items())})")
        self._tokens: dict[str, int] = {t: -1 for t in TABLES}
        # The version (if any) whose content equals each live table.
        self._versions: dict[str, TableVersion] = {}
        self._unused: list[str] = []
        self._hashes: OrderedDict[tuple, str] = OrderedDict()
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
        self.con.begin()

    def commit(self) -> None:
        self.con.commit()

    def rollback(self) -> None:
        self.con.rollback()

    # --- snapshot / restore ------------------------------------------------------------------
    def snapshot(self) -> DBSnapshot:
        self._drop_unused()
        tables: dict[str, TableVersion] = {}
        for table in TABLES:
            token = self._tokens[table]
            version = self._versions.get(table)
            local = version is not None and version.copy_name is not None and version.owner() is self
            # Seed-world (Arrow) versions get a local copy too, so restoring to them stays cheap.
            if version is None or version.token != token or not local:
                # Unique per copy: a version restored from another database may be copied here
                # again while an earlier local copy of the same content is still referenced.
                name = f"__v{token}_{next(_COPIES)}_{table}"
                self.con.execute(f"CREATE TABLE {name} AS SELECT * FROM {table}")
                version = TableVersion(token, copy_name=name, owner=weakref.ref(self))
                # When no snapshot refers to the copy any more, queue it for dropping.
                weakref.finalize(version, self._unused.append, name)
                self._versions[table] = version
            tables[table] = version
        return DBSnapshot(tables)

    def restore(self, snapshot: DBSnapshot) -> None:
        statements: list[str] = []
        for table, version in snapshot.tables.items():
            if self._tokens[table] == version.token:
                continue
            owner = version.owner() if version.owner is not None else None
            if version.copy_name is not None and owner is self:
                statements.append(f"DELETE FROM {table}; INSERT INTO {table} SELECT * FROM {version.copy_name}")
            else:
                arrow = version.arrow
                if arrow is None:  # a copy inside another database: read it out through Arrow
                    if owner is None:
                        raise ValueError("snapshot refers to a closed database")
                    arrow = owner.con.sql(f"SELECT * FROM {version.copy_name}").to_arrow_table()
                self.con.register("__restore_src", arrow)
                try:
                    self.con.execute(f"BEGIN; DELETE FROM {table}; INSERT INTO {table} SELECT * FROM __restore_src; COMMIT")
                finally:
                    self.con.unregister("__restore_src")
            self._tokens[table] = version.token
            self._versions[table] = version
        if statements:
            # One round trip and one commit for all in-database copies.
            self.con.execute("BEGIN; " + "; ".join(statements) + "; COMMIT")

    def _drop_unused(self) -> None:
        while self._unused:
            self.con.execute(f"DROP TABLE IF EXISTS {self._unused.pop()}")

    def state_hash(self, tables: tuple[str, ...] | None = None) -> str:
        """SHA-256 over the rows of `tables` (default all) in primary-key order; cached by content tokens."""
        tables = tables or tuple(TABLES)
        key = (tables, tuple(self._tokens[t] for t in tables))
        cached = self._hashes.get(key)
        if cached is not None:
            return cached
        digest = hashlib.sha256()
        for table in tables:
            order = ", ".join(PRIMARY_KEYS[table])
            digest.update(table.encode())
            for row in self.con.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall():
                digest.update(json.dumps(row, default=str).encode())
        value = self._hashes[key] = digest.hexdigest()
        if len(self._hashes) > 4096:
            self._hashes.popitem(last=False)
        return value

    def close(self) -> None:
        self.con.close()
