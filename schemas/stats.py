"""Dataset statistics over the shard files, no record loaded into Python: each shard's tallies read
with pyarrow (leaf columns, dictionaries) and cached per file version, summed with DuckDB."""

from __future__ import annotations

import functools
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.store import Dataset, duckdb_files

HISTOGRAM_BINS = 20


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cursor = con.execute(sql)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


# What the statistics count, read per shard as leaf columns: pyarrow reads one field of the steps
# structs without the others (DuckDB reads every field of a list of structs: most of a dataset's
# bytes), and strings as their dictionaries (counting codes, not hashing text).
_COLUMNS = ("source", "reward", "success", "provenance.method", "steps.list.element.kind",
            "steps.list.element.function", "steps.list.element.label")
_STRINGS = [c for c in _COLUMNS if c not in ("reward", "success")]


@dataclass(frozen=True)
class ShardCounts:
    """One shard's tallies: (what, value) -> n for source, method, outcome, kind, tool, label and length
    (steps per trajectory, > 0), and its rewards' count, min, max and sum."""

    counts: dict[tuple[str, str | None], int]
    reward: tuple[int, float | None, float | None, float]


def _tally(counts: Counter[tuple[str, str | None]], what: str, values: pa.Array, name: Any = None) -> None:
    """Add the count of each value (`name(value)` when given) under `what`: a dictionary array by its
    codes (no string is decoded), anything else by pyarrow's value counts."""
    if pa.types.is_dictionary(values.type):
        codes = pc.drop_null(values.indices).to_numpy(zero_copy_only=False)
        tallies = zip(values.dictionary.to_pylist(), np.bincount(codes, minlength=len(values.dictionary)).tolist())
        if values.null_count:
            tallies = [*tallies, (None, values.null_count)]
    else:
        tallies = ((row["values"], row["counts"]) for row in pc.value_counts(values).to_pylist())
    for value, n in tallies:
        if n:
            counts[(what, name(value) if name else value)] += n


@functools.lru_cache(maxsize=4096)
def shard_counts(path: str, size: int, mtime_ns: int) -> ShardCounts:
    """The tallies of one shard file; cached per file version (`size`, `mtime_ns`), so a dataset that
    grows, or a viewer asked again, reads only shards it has not counted."""
    pf = pq.ParquetFile(path, read_dictionary=_STRINGS)
    present = {pf.schema.column(i).path for i in range(len(pf.schema))}
    columns = [c for c in _COLUMNS if c in present]
    counts: Counter[tuple[str, str | None]] = Counter()
    n_reward, lo, hi, total = 0, None, None, 0.0
    for group in range(pf.num_row_groups):  # one group at a time: a nested dictionary column is one chunk
        t = pf.read_row_group(group, columns=columns, use_threads=False)
        names = t.schema.names
        if "source" in names:
            _tally(counts, "source", t.column("source").chunk(0))
        if "provenance" in names:
            _tally(counts, "method", t.column("provenance").chunk(0).field("method"), lambda v: "-" if v is None else v)
        else:
            counts[("method", "-")] += t.num_rows
        if "success" in names:
            success = t.column("success").chunk(0)
            true = pc.sum(success).as_py() or 0
            for value, n in (("true", true), ("false", len(success) - success.null_count - true),
                             ("unknown", success.null_count)):
                if n:
                    counts[("outcome", value)] += n
        else:
            counts[("outcome", "unknown")] += t.num_rows
        if "reward" in names:
            reward = t.column("reward").chunk(0)
            n = pc.count(reward).as_py()
            if n:
                mm = pc.min_max(reward).as_py()
                n_reward, total = n_reward + n, total + pc.sum(reward).as_py()
                lo = mm["min"] if lo is None else min(lo, mm["min"])
                hi = mm["max"] if hi is None else max(hi, mm["max"])
        if "steps" in names:
            steps = t.column("steps").chunk(0)
            lengths = pc.drop_null(pc.list_value_length(steps)).to_numpy(zero_copy_only=False)
            for n, k in enumerate(np.bincount(lengths).tolist() if len(lengths) else []):
                if n and k:  # empty or missing step lists: counted as 0 steps from the total
                    counts[("length", str(n))] += k
            flat = pc.list_flatten(steps)
            fields = {flat.type.field(k).name for k in range(flat.type.num_fields)}
            if "kind" in fields:
                kind = flat.field("kind")
                _tally(counts, "kind", kind)
                if "function" in fields:
                    _tally(counts, "tool", pc.filter(flat.field("function"), _is_api(kind)))
            if "label" in fields:
                _tally(counts, "label", flat.field("label"))
    return ShardCounts(dict(counts), (n_reward, lo, hi, total))


def _is_api(kind: pa.Array) -> pa.Array:
    """Which steps are tool calls, from the kinds' codes when they are a dictionary."""
    if not pa.types.is_dictionary(kind.type):
        return pc.equal(kind, "api")
    names = kind.dictionary.to_pylist()
    if "api" not in names:
        return pa.array(np.zeros(len(kind), dtype=bool))
    return pc.equal(kind.indices, names.index("api"))


def _shard_tallies(files: list[Path]) -> tuple[Counter[tuple[str, str | None]], tuple[int, float | None, float | None, float]]:
    """The shards' tallies summed; shards not yet counted are read two at a time (pyarrow decodes off the GIL)."""
    def one(file: Path) -> ShardCounts:
        stat = os.stat(file)
        return shard_counts(str(file), stat.st_size, stat.st_mtime_ns)

    with ThreadPoolExecutor(max_workers=2) as pool:
        shards = list(pool.map(one, files))
    counts: Counter[tuple[str, str | None]] = Counter()
    n, lo, hi, total = 0, None, None, 0.0
    for shard in shards:
        counts.update(shard.counts)
        sn, slo, shi, stotal = shard.reward
        if sn:
            n, total = n + sn, total + stotal
            lo = slo if lo is None else min(lo, slo)
            hi = shi if hi is None else max(hi, shi)
    return counts, (n, lo, hi, total)


def _length_summary(lengths: list[dict[str, Any]]) -> dict[str, float | None]:
    """min, p50, p90, p99 (interpolated, as DuckDB's quantile_cont), max and mean of the step counts,
    from (n, records) rows sorted by n."""
    total = sum(r["records"] for r in lengths)
    if not total:
        return {"min": None, "p50": None, "p90": None, "p99": None, "max": None, "mean": None}

    def at(position: int) -> int:  # the step count of the position-th trajectory, in order
        seen = 0
        for r in lengths:
            seen += r["records"]
            if position < seen:
                return r["n"]
        return lengths[-1]["n"]

    def quantile(q: float) -> float:
        h = (total - 1) * q
        lo = int(h)
        return at(lo) + (h - lo) * (at(min(lo + 1, total - 1)) - at(lo))

    return {"min": lengths[0]["n"], "p50": quantile(0.5), "p90": quantile(0.9), "p99": quantile(0.99),
            "max": lengths[-1]["n"], "mean": sum(r["n"] * r["records"] for r in lengths) / total}


def _histogram(con: duckdb.DuckDBPyConnection, lo: int, hi: int) -> list[dict[str, Any]]:
    """Trajectories per bin of step counts: at most HISTOGRAM_BINS bins of equal width over [lo, hi]."""
    width = max(1, -(-(hi - lo + 1) // HISTOGRAM_BINS))
    rows = _rows(con, f"""SELECT {lo} + (n - {lo}) // {width} * {width} AS "from", sum(records)::BIGINT AS records
                          FROM lengths GROUP BY 1 ORDER BY 1""")
    return [{"from": r["from"], "to": r["from"] + width - 1, "records": r["records"]} for r in rows]


def _user_fidelity(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Records whose simulated user was checked, and those it broke (`details.user_fidelity.ok` false: kept,
    marked, and left out of exports); only details that mention it are parsed."""
    row = _rows(con, """SELECT count(*)::BIGINT AS checked,
                               count(*) FILTER (WHERE json_extract_string(details, '$.user_fidelity.ok') = 'false')
                                   ::BIGINT AS broken
                        FROM t WHERE contains(details, '"user_fidelity"')
                                 AND json_extract(details, '$.user_fidelity') IS NOT NULL""")[0]
    return {"checked": row["checked"], "broken": row["broken"]}


def dataset_stats(ds: Dataset) -> dict[str, Any]:
    """Counts per source and method, steps (percentiles, histogram), step kinds, tools, rewards, labels, reasons."""
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # long scans would draw a bar on stdout
    trajectories = ds.checked_shard_files("trajectories")
    quarantine = ds.checked_shard_files("quarantine")
    filtered = ds.checked_shard_files("filtered")
    result: dict[str, Any] = {
        "path": str(ds.path),
        "records": ds.count("trajectories"),
        "pairs": ds.count("pairs"),
        "quarantined": ds.count("quarantine"),
        "filtered": ds.count("filtered"),
        "sources": [],
        "methods": [],
        "steps_per_trajectory": {},
        "steps_histogram": [],
        "step_kinds": [],
        "tools_used": [],
        "labels": [],
        "outcomes": [],
        "reward": {"count": 0},
        "user_fidelity": {"checked": 0, "broken": 0},
        "quarantine_reasons": [],
        "filter_reasons": [],
    }
    if trajectories:
        tallies, (n_reward, lo, hi, total) = _shard_tallies(trajectories)
        con.register("counts", pa.table({
            "what": [w for w, _ in tallies], "value": [v for _, v in tallies], "n": list(tallies.values())},
            schema=pa.schema([("what", pa.string()), ("value", pa.string()), ("n", pa.int64())])))

        def counted(what: str, name: str, label: str, limit: str = "") -> list[dict[str, Any]]:
            return _rows(con, f"""SELECT value AS "{name}", n AS "{label}" FROM counts WHERE what = '{what}'
                                  ORDER BY 2 DESC, 1 {limit}""")

        result["sources"] = counted("source", "source", "records")
        result["methods"] = counted("method", "method", "records")
        # Trajectories per step count; those without steps are the rest of the records.
        con.execute(
            f"""CREATE TEMP TABLE lengths AS SELECT * FROM (
                    SELECT CAST(value AS BIGINT) AS n, n AS records FROM counts WHERE what = 'length'
                    UNION ALL SELECT 0, {result["records"]} - (SELECT coalesce(sum(n), 0) FROM counts
                                                              WHERE what = 'length')::BIGINT)
                WHERE records > 0""")
        steps = _length_summary(_rows(con, "SELECT n, records FROM lengths ORDER BY n"))
        result["steps_per_trajectory"] = {k: (round(v, 2) if v is not None else None) for k, v in steps.items()}
        if steps["max"] is not None:
            result["steps_histogram"] = _histogram(con, int(steps["min"]), int(steps["max"]))
        result["step_kinds"] = counted("kind", "kind", "steps")
        result["tools_used"] = counted("tool", "function", "calls", "LIMIT 50")
        result["labels"] = counted("label", "label", "steps")
        result["outcomes"] = _rows(con, "SELECT value AS success, n AS records FROM counts WHERE what = 'outcome' ORDER BY 1")
        reward = {"count": n_reward, "min": lo, "mean": total / n_reward if n_reward else None, "max": hi}
        result["reward"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in reward.items()}
        # One top-level column (details), which DuckDB reads alone.
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({duckdb_files(trajectories)}, union_by_name=true)")
        result["user_fidelity"] = _user_fidelity(con)
    if quarantine:
        result["quarantine_reasons"] = _rows(
            con,
            f"""SELECT stage, regexp_extract(error, '^[^:(]*') AS error, count(*) AS records
                FROM read_parquet({duckdb_files(quarantine)}) GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2""",
        )
    if filtered:
        result["filter_reasons"] = _rows(
            con,
            f"""SELECT filter, reason, count(*) AS records FROM read_parquet({duckdb_files(filtered)})
                GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2""",
        )
    return result
