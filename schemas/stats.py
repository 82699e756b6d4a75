"""Dataset statistics with DuckDB over the shard files (no record is loaded into Python)."""

from __future__ import annotations

from typing import Any

import duckdb

from schemas.store import Dataset, duckdb_files

HISTOGRAM_BINS = 20


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cursor = con.execute(sql)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _step_facts(con: duckdb.DuckDBPyConnection, records: int) -> None:
    """Tables `facts` (steps per kind, function, label) and `lengths` (trajectories per step count).

    The steps column is most of a dataset's bytes, so it is read once for all step statistics.
    """
    con.execute(
        """CREATE TEMP TABLE facts AS
           SELECT kind, function, label, n, count(*) AS steps, count(*) FILTER (WHERE i = 0) AS firsts FROM (
               SELECT len(steps) AS n,
                      unnest(list_transform(steps, lambda s: s.kind)) AS kind,
                      unnest(list_transform(steps, lambda s: s.function)) AS function,
                      unnest(list_transform(steps, lambda s: s.label)) AS label,
                      unnest(range(len(steps))) AS i
               FROM t)
           GROUP BY ALL"""
    )
    # A trajectory without steps unnests to nothing: those are the records not counted.
    con.execute(
        f"""CREATE TEMP TABLE lengths AS SELECT * FROM (
                SELECT n, sum(firsts)::BIGINT AS records FROM facts GROUP BY 1
                UNION ALL SELECT 0, {records} - (SELECT coalesce(sum(firsts), 0) FROM facts)::BIGINT)
            WHERE records > 0"""
    )


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
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({duckdb_files(trajectories)})")
        result["sources"] = _rows(con, "SELECT source, count(*) AS records FROM t GROUP BY 1 ORDER BY 2 DESC, 1")
        result["methods"] = _rows(
            con, "SELECT coalesce(provenance.method, '-') AS method, count(*) AS records FROM t GROUP BY 1 ORDER BY 2 DESC, 1"
        )
        _step_facts(con, result["records"])
        steps = _rows(
            con,
            """SELECT min(n) AS min, quantile_cont(n, 0.5) AS p50, quantile_cont(n, 0.9) AS p90,
                      quantile_cont(n, 0.99) AS p99, max(n) AS max, avg(n) AS mean
               FROM (SELECT n FROM lengths, range(lengths.records))""",
        )[0]
        result["steps_per_trajectory"] = {k: (round(v, 2) if v is not None else None) for k, v in steps.items()}
        if steps["max"] is not None:
            result["steps_histogram"] = _histogram(con, int(steps["min"]), int(steps["max"]))
        result["step_kinds"] = _rows(con, "SELECT kind, sum(steps) AS steps FROM facts GROUP BY 1 ORDER BY 2 DESC, 1")
        result["tools_used"] = _rows(
            con,
            """SELECT function, sum(steps) AS calls FROM facts WHERE kind = 'api'
               GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 50""",
        )
        result["labels"] = _rows(con, "SELECT label, sum(steps) AS steps FROM facts GROUP BY 1 ORDER BY 2 DESC, 1")
        result["outcomes"] = _rows(
            con, "SELECT coalesce(CAST(success AS VARCHAR), 'unknown') AS success, count(*) AS records FROM t GROUP BY 1 ORDER BY 1"
        )
        reward = _rows(
            con,
            """SELECT count(reward) AS count, min(reward) AS min, avg(reward) AS mean, max(reward) AS max
               FROM t""",
        )[0]
        result["reward"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in reward.items()}
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
