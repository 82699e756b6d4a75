"""DuckDB over the Parquet shards: filtered, sorted, paged lists, their counts, and single records.

Nothing is loaded whole: a list is one `SELECT ... WHERE ... [ORDER BY] LIMIT/OFFSET` over the
shard files the manifest lists, and its count one `count(*)` with the same WHERE. In dataset
order (the default sort) a page reads only the row groups it shows; a sorted page first finds
where its rows are by the sort key alone (file and row), then reads those rows' columns, only the
leaf fields of the steps the page shows (pyarrow; DuckDB would read every field of the steps). A
sort by steps with no search or filter takes the step counts from one leaf of the steps, per shard.
Per-row summaries (task, masked and labelled steps) are computed only for the rows of the page.

The connection is in memory and the shards are only read: DuckDB's spill directory is a private
temp folder, never the dataset, and its memory is capped.
"""

from __future__ import annotations

import bisect
import functools
import json
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.store import StoreError, duckdb_files
from viewer.sources import Source, ViewError, first_line, unreadable

PAGE_LIMIT = 200
DEFAULT_MEMORY_LIMIT = "2GB"


# ---- what a list request may ask ----------------------------------------------------------------


@dataclass
class ListRequest:
    """A page of one table: search text, filters (by name), sort, offset and limit."""

    q: str = ""
    filters: dict[str, str] = field(default_factory=dict)
    sort: str = "order"
    desc: bool = False
    offset: int = 0
    limit: int = 50

    @classmethod
    def from_params(cls, params: dict[str, str]) -> "ListRequest":
        reserved = {"q", "sort", "desc", "offset", "limit"}
        try:
            offset, limit = int(params.get("offset", 0)), int(params.get("limit", 50))
        except ValueError:
            raise ViewError("offset and limit must be integers") from None
        if offset < 0 or not 1 <= limit <= PAGE_LIMIT:
            raise ViewError(f"offset must be >= 0 and limit between 1 and {PAGE_LIMIT}")
        return cls(
            q=params.get("q", "").strip(),
            filters={k: v for k, v in params.items() if k not in reserved and v != ""},
            sort=params.get("sort", "order") or "order",
            desc=params.get("desc", "") in ("1", "true"),
            offset=offset,
            limit=limit,
        )


def _number(name: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ViewError(f"{name} must be a number, got {value!r}") from None


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ViewError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


# A filter adds one SQL condition; named parameters carry the user's values (never pasted into SQL).
Filter = Callable[[str, dict[str, Any]], str]

# Text of a step that search looks in (html is left out: its markup would match almost anything).
_STEP_TEXT = "lower(concat_ws(' ', s.content, s.function, s.arguments, s.thought, s.reasoning, s.url, s.axtree, s.name))"
# A masked step: train = false, except the system prompt's step (context, never a training target).
_MASKED = "len(list_filter(steps, lambda s: NOT coalesce(s.train, true) AND coalesce(s.name, '') <> 'system')) > 0"


def _success(value: str, p: dict[str, Any]) -> str:
    return {"true": "success", "false": "NOT success", "unknown": "success IS NULL"}[
        _choice("success", value, ("true", "false", "unknown"))]


def _reward_min(value: str, p: dict[str, Any]) -> str:
    p["reward_min"] = _number("reward_min", value)
    return "reward >= $reward_min"


def _reward_max(value: str, p: dict[str, Any]) -> str:
    p["reward_max"] = _number("reward_max", value)
    return "reward <= $reward_max"


def _label(value: str, p: dict[str, Any]) -> str:
    p["label"] = _choice("label", value, ("good", "bad"))
    return "list_contains(list_transform(steps, lambda s: s.label), $label)"


def _masked(value: str, p: dict[str, Any]) -> str:
    return _MASKED if _choice("masked", value, ("yes", "no")) == "yes" else f"NOT {_MASKED}"


def _equals(column: str, key: str) -> Filter:
    def condition(value: str, p: dict[str, Any]) -> str:
        p[key] = value
        return f"{column} = ${key}"
    return condition


def _tool(value: str, p: dict[str, Any]) -> str:
    p["tool"] = value
    return "list_contains(list_transform(steps, lambda s: s.function), $tool)"


_TRAJECTORY_SEARCH = (
    "(contains(lower(id), $q) OR contains(lower(source), $q) OR contains(lower(coalesce(provenance.method, '')), $q)"
    " OR contains(lower(coalesce(provenance.source_dataset, '')), $q)"
    f" OR coalesce(list_bool_or(list_transform(steps, lambda s: contains({_STEP_TEXT}, $q))), false))")


_TRAJECTORY_FILTERS: dict[str, Filter] = {
    "source": _equals("source", "source"),
    "method": _equals("coalesce(provenance.method, '-')", "method"),
    "tool": _tool,
    # The task an episode ran (as an eval report names it): the eval page links each task to its episodes.
    "task": _equals("coalesce(provenance.source_id, json_extract_string(details, '$.task.id'), id)", "task"),
    "success": _success,
    "reward_min": _reward_min,
    "reward_max": _reward_max,
    "label": _label,
    "masked": _masked,
}

_TRAJECTORY_COLUMNS = """id, source, provenance.method AS method, provenance.model AS model, len(steps) AS steps,
    reward, success,
    len(list_filter(steps, lambda s: NOT coalesce(s.train, true) AND coalesce(s.name, '') <> 'system')) AS masked,
    len(list_filter(steps, lambda s: s.label = 'good')) AS good,
    len(list_filter(steps, lambda s: s.label = 'bad')) AS bad,
    left(list_filter(steps, lambda s: s.kind = 'text' AND s.source = 'user')[1].content, 240) AS task,
    json_extract_string(details, '$.role') AS role,
    coalesce(json_exists(details, '$.splice'), false) AS spliced,
    coalesce(json_exists(details, '$.reflection'), false) AS reflection,
    coalesce(json_exists(details, '$.judge'), false) AS judged"""

# Where the text of an export row is: its whole row as JSON.
_ROW_SEARCH = "contains(lower(CAST(to_json(r) AS VARCHAR)), $q)"


@dataclass(frozen=True)
class TableSpec:
    """How one table is listed: its search condition (on `$q`), filters, sort keys and page columns."""

    search: str
    filters: dict[str, Filter]
    sorts: dict[str, str]
    columns: str


TABLES: dict[str, TableSpec] = {
    "trajectories": TableSpec(
        _TRAJECTORY_SEARCH, _TRAJECTORY_FILTERS,
        {"id": "id", "reward": "reward", "steps": "len(steps)", "source": "source"},
        _TRAJECTORY_COLUMNS,
    ),
    "filtered": TableSpec(
        _TRAJECTORY_SEARCH,
        {**_TRAJECTORY_FILTERS, "filter": _equals("filter", "filter"), "reason": _equals("reason", "reason")},
        {"id": "id", "reward": "reward", "steps": "len(steps)", "source": "source", "filter": "filter"},
        _TRAJECTORY_COLUMNS + ", filter, reason, score",
    ),
    "pairs": TableSpec(
        "(contains(lower(id), $q) OR contains(lower(chosen_id), $q) OR contains(lower(rejected_id), $q))",
        {"source": _equals("source", "source"), "level": _equals("level", "level")},
        {"id": "id", "prefix_len": "prefix_len", "source": "source"},
        "id, chosen_id, rejected_id, prefix_len, level, source, chosen_reward, rejected_reward",
    ),
    "quarantine": TableSpec(
        ("(contains(lower(id), $q) OR contains(lower(error), $q) OR contains(lower(coalesce(location, '')), $q)"
         " OR contains(lower(coalesce(raw, '')), $q))"),
        {"stage": _equals("stage", "stage"), "error": _equals("regexp_extract(error, '^[^:(]*')", "error")},
        {"id": "id", "stage": "stage", "created_at": "created_at"},
        "id, stage, error, location, created_at, left(raw, 300) AS raw",
    ),
}


# ---- the connection -----------------------------------------------------------------------------


class Store:
    """One in-memory DuckDB connection over every source; each request uses its own cursor."""

    def __init__(self, sources: list[Source], memory_limit: str = DEFAULT_MEMORY_LIMIT) -> None:
        self.sources = sources
        self._spill = tempfile.TemporaryDirectory(prefix="trajforge-view-")
        self._con = duckdb.connect()
        self._con.execute("SET enable_progress_bar = false")
        self._con.execute(f"SET memory_limit = '{memory_limit}'")
        self._con.execute(f"SET temp_directory = '{self._spill.name}'")
        self._lock = threading.Lock()
        # Shard lists checked once per manifest version: (source index, table) -> (mtime, files).
        self._files: dict[tuple[int, str], tuple[int, list[Path]]] = {}

    def close(self) -> None:
        self._con.close()
        self._spill.cleanup()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            return self._con.cursor()

    def source(self, index: int) -> Source:
        if not 0 <= index < len(self.sources):
            raise ViewError(f"no source {index}; there are {len(self.sources)}")
        return self.sources[index]

    def manifest_version(self, index: int) -> int:
        source = self.source(index)
        marker = source.path / ("_manifest.json" if source.kind == "dataset" else "data")
        try:
            return marker.stat().st_mtime_ns
        except OSError:
            raise ViewError(f"{source.path}: no longer readable") from None

    def files(self, index: int, table: str) -> list[Path]:
        """The table's shard files the manifest lists, footers checked (cached per manifest version)."""
        source = self.source(index)
        if source.kind == "export":
            if table != "rows":
                raise ViewError(f"{source.name} is an export: it has rows, not {table}")
            return source.export_files()
        if table not in TABLES:
            raise ViewError(f"unknown table {table!r}")
        version = self.manifest_version(index)
        cached = self._files.get((index, table))
        if cached is not None and cached[0] == version:
            return cached[1]
        try:
            files = source.dataset().checked_shard_files(table)
        except StoreError as exc:
            raise ViewError(str(exc)) from None
        self._files[(index, table)] = (version, files)
        return files

    def relation(self, index: int, table: str) -> str | None:
        """SQL for the table's rows, or None when it has no shard."""
        files = self.files(index, table)
        if not files:
            return None
        if table == "rows" and files[0].suffix == ".jsonl":
            # OpenAI lines: assistant messages carry keys others lack; keep each column as JSON text.
            return (f"read_json({duckdb_files(files)}, format = 'newline_delimited', "
                    "columns = {'messages': 'JSON', 'tools': 'JSON'})")
        return f"read_parquet({duckdb_files(files)}, union_by_name=true)"  # older shards lack newer step fields

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        cursor = self.cursor()
        try:
            return cursor.sql(sql, params=params or {}).to_arrow_table().to_pylist()
        except duckdb.Error as exc:
            raise ViewError(f"query failed ({first_line(exc)})") from None
        finally:
            cursor.close()

    # ---- lists ----------------------------------------------------------------------------------

    def page(self, index: int, table: str, req: ListRequest) -> dict[str, Any]:
        """{offset, limit, rows, more}: one page (`more`: whether rows follow it). Its count is `count`'s."""
        out = {"offset": req.offset, "limit": req.limit, "rows": [], "more": False}
        relation, where, params = self._select(index, table, req)
        if relation is None:
            return out
        columns, order = "*", ""
        if table != "rows":
            spec = TABLES[table]
            columns = spec.columns
            if req.sort != "order":
                key = spec.sorts.get(req.sort)
                if key is None:
                    raise ViewError(f"sort must be one of order, {', '.join(spec.sorts)}; got {req.sort!r}")
                order = f"ORDER BY {key} {'DESC' if req.desc else 'ASC'} NULLS LAST, id"
        # One row past the page says whether there is a next one, without counting.
        params.update(limit=req.limit + 1, offset=req.offset)
        rows = None
        if order and table in PAGE_LEAVES:
            # By steps with nothing else asked: positions from the shards' step counts (one leaf of the steps).
            lengths = self._step_counts(index, table) if req.sort == "steps" and not where else None
            located = order.replace("len(steps)", "n") if lengths is not None else order
            rows = self._sorted_page(index, table, where, located, params, lengths)
        if rows is None:
            rows = self.rows(f"SELECT {columns} FROM {relation} {where} {order} LIMIT $limit OFFSET $offset", params)
        if table == "rows":
            rows = [export_row(r) for r in rows]
        return {**out, "rows": rows[: req.limit], "more": len(rows) > req.limit}

    def _step_counts(self, index: int, table: str) -> pa.Table:
        """(filename, row, id, n): every row's step count, from the shards' cached counts."""
        parts = []
        for file in self.files(index, table):
            stat = file.stat()
            try:
                counted = shard_step_counts(str(file), stat.st_size, stat.st_mtime_ns)
            except (OSError, pa.ArrowException) as exc:
                raise unreadable(self.source(index).path, exc) from None
            parts.append(counted.append_column("filename", pa.array([str(file)] * len(counted), pa.string())))
        return pa.concat_tables(parts)

    def _sorted_page(self, index: int, table: str, where: str, order: str, params: dict[str, Any],
                     lengths: pa.Table | None = None) -> list[dict[str, Any]] | None:
        """A sorted page in two steps: where its rows are (file, row) by the sort key alone, then the page's
        columns of those rows only, from the leaf columns they need (a sort by reward reads the rewards and
        50 rows' steps, not every step of every row). None when a shard lacks a field the page reads (an
        older shard): the one-query path then unifies the schemas."""
        files = self.files(index, table)
        if lengths is None:
            located = f"read_parquet({duckdb_files(files)}, union_by_name=true, filename=true, file_row_number=true)"
            at = self.rows(f"SELECT filename, file_row_number AS row FROM {located} {where} {order} "
                           "LIMIT $limit OFFSET $offset", params)
        else:
            cursor = self.cursor()
            try:
                cursor.register("counted", lengths)
                at = cursor.sql(f"SELECT filename, row FROM counted {order} LIMIT $limit OFFSET $offset",
                                params=params).to_arrow_table().to_pylist()
            finally:
                cursor.close()
        by_file: dict[str, list[tuple[int, int]]] = {}
        for k, hit in enumerate(at):
            by_file.setdefault(hit["filename"], []).append((k, hit["row"]))
        out: list[tuple[int, dict[str, Any]]] = []
        try:
            with ThreadPoolExecutor(max_workers=2) as pool:  # pyarrow decodes off the GIL
                slices = list(pool.map(lambda item: _rows_of(Path(item[0]), item[1], PAGE_LEAVES[table]),
                                       by_file.items()))
        except (OSError, pa.ArrowException) as exc:
            raise unreadable(self.source(index).path, exc) from None
        for picked in slices:
            if picked is None:
                return None
            cursor = self.cursor()
            try:
                cursor.register("picked", picked)
                found = cursor.sql(f"SELECT __k, {TABLES[table].columns} FROM picked").to_arrow_table().to_pylist()
            except duckdb.Error:
                return None
            finally:
                cursor.close()
            out += [(r.pop("__k"), r) for r in found]
        return [r for _, r in sorted(out, key=lambda kr: kr[0])]

    def count(self, index: int, table: str, req: ListRequest) -> int:
        """How many rows match the request's search and filters (a scan when they look into steps)."""
        relation, where, params = self._select(index, table, req)
        if relation is None:
            return 0
        return self.rows(f"SELECT count(*) AS n FROM {relation} {where}", params)[0]["n"]

    def _select(self, index: int, table: str, req: ListRequest) -> tuple[str | None, str, dict[str, Any]]:
        """(relation, WHERE clause, its parameters) of a list request."""
        params: dict[str, Any] = {}
        if table == "rows":
            relation = self.relation(index, "rows")
            if req.filters:
                raise ViewError("export rows take no filters")
            if relation is None:
                return None, "", params
            # Row numbers are positions in the whole export (what `export_row_at` takes), so they
            # are numbered before the search narrows the rows.
            numbered = f"(SELECT row_number() OVER () - 1 AS row, * FROM {relation} r)"
            if not req.q:
                return numbered, "", params
            params["q"] = req.q.lower()
            return f"{numbered} r", f"WHERE {_ROW_SEARCH}", params
        spec = TABLES.get(table)
        if spec is None:
            raise ViewError(f"unknown table {table!r}")
        conditions = []
        if req.q:
            params["q"] = req.q.lower()
            conditions.append(spec.search)
        for name, value in req.filters.items():
            condition = spec.filters.get(name)
            if condition is None:
                raise ViewError(f"unknown filter {name!r}; filters are {', '.join(spec.filters)}")
            conditions.append(condition(value, params))
        where = "WHERE " + " AND ".join(conditions) if conditions else ""
        return self.relation(index, table), where, params

    # ---- single records -------------------------------------------------------------------------

    def by_id(self, index: int, table: str, record_id: str, limit: int = 1) -> list[dict[str, Any]]:
        relation = self.relation(index, table)
        if relation is None:
            return []
        return self.rows(f"SELECT * FROM {relation} WHERE id = $id LIMIT {int(limit)}", {"id": record_id})

    def pairs_with(self, index: int, trajectory_id: str) -> list[dict[str, Any]]:
        relation = self.relation(index, "pairs")
        if relation is None:
            return []
        return self.rows(
            f"""SELECT id, chosen_id, rejected_id, prefix_len, level FROM {relation}
                WHERE chosen_id = $id OR rejected_id = $id ORDER BY id LIMIT 100""", {"id": trajectory_id})

    def export_row_at(self, index: int, row: int) -> dict[str, Any] | None:
        relation = self.relation(index, "rows")
        if relation is None or row < 0:
            return None
        found = self.rows(f"SELECT * FROM {relation} LIMIT 1 OFFSET $row", {"row": row})
        return export_row({"row": row, **found[0]}) if found else None


@functools.lru_cache(maxsize=4096)
def shard_step_counts(path: str, size: int, mtime_ns: int) -> pa.Table:
    """(row, id, n) of a shard: each row's step count from one leaf of the steps (not every field of
    every step, as DuckDB's len(steps) reads); cached per file version."""
    t = pq.ParquetFile(path).read(columns=["id", "steps.list.element.kind"], use_threads=False)
    return pa.table({"row": pa.array(range(t.num_rows), pa.int64()), "id": t.column("id"),
                     "n": pc.list_value_length(t.column("steps"))})


# The leaf columns a page's columns read (TABLES[...].columns), for the two-step sorted page.
_TRAJECTORY_LEAVES = ("id", "source", "provenance.method", "provenance.model", "reward", "success", "details",
                      *(f"steps.list.element.{f}" for f in ("kind", "source", "content", "train", "name", "label")))
PAGE_LEAVES: dict[str, tuple[str, ...]] = {
    "trajectories": _TRAJECTORY_LEAVES,
    "filtered": (*_TRAJECTORY_LEAVES, "filter", "reason", "score"),
}


def _rows_of(path: Path, hits: list[tuple[int, int]], leaves: tuple[str, ...]) -> pa.Table | None:
    """Rows `hits` ((position in the page, row in the file)) of a shard, with only `leaves`, and the
    position as `__k`; each row group read once. None when the shard lacks one of the leaves."""
    pf = pq.ParquetFile(path)
    present = {pf.schema.column(i).path for i in range(len(pf.schema))}
    if not set(leaves) <= present:
        return None
    starts = [0]
    for g in range(pf.metadata.num_row_groups):
        starts.append(starts[-1] + pf.metadata.row_group(g).num_rows)
    groups: dict[int, list[tuple[int, int]]] = {}
    for k, row in hits:
        g = bisect.bisect_right(starts, row) - 1
        groups.setdefault(g, []).append((k, row - starts[g]))
    parts = []
    for g, picks in groups.items():
        rows = pf.read_row_group(g, columns=list(leaves), use_threads=False).take([r for _, r in picks])
        parts.append(rows.append_column("__k", pa.array([k for k, _ in picks], pa.int64())))
    return pa.concat_tables(parts)


def export_row(row: dict[str, Any]) -> dict[str, Any]:
    """JSON-text columns of a JSONL export decoded, so the page sees the same shapes as Parquet rows."""
    out = dict(row)
    for key in ("messages", "tools"):
        if isinstance(out.get(key), str):
            try:
                out[key] = json.loads(out[key])
            except ValueError:
                pass
    return out
