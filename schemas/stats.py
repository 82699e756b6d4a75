"""Dataset statistics with DuckDB over the shard files (no record is loaded into Python)."""

from __future__ import annotations

from typing import Any

import duckdb

from schemas.store import Dataset


def _files_sql(files: list) -> str:
    return "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cursor = con.execute(sql)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def dataset_stats(ds: Dataset) -> dict[str, Any]:
    """Counts per source, step percentiles, step kinds, tools used, rewards, labels, quarantine reasons."""
    con = duckdb.connect()
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
        "steps_per_trajectory": {},
        "step_kinds": [],
        "tools_used": [],
        "labels": [],
        "outcomes": [],
        "reward": {"count": 0},
        "quarantine_reasons": [],
        "filter_reasons": [],
    }
    if trajectories:
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({_files_sql(trajectories)})")
        result["sources"] = _rows(con, "SELECT source, count(*) AS records FROM t GROUP BY 1 ORDER BY 2 DESC, 1")
        steps = _rows(
            con,
            """SELECT min(n) AS min, quantile_cont(n, 0.5) AS p50, quantile_cont(n, 0.9) AS p90,
                      quantile_cont(n, 0.99) AS p99, max(n) AS max, avg(n) AS mean
               FROM (SELECT len(steps) AS n FROM t)""",
        )[0]
        result["steps_per_trajectory"] = {k: (round(v, 2) if v is not None else None) for k, v in steps.items()}
        con.execute("CREATE VIEW s AS SELECT unnest(steps) AS step FROM t")
        result["step_kinds"] = _rows(con, "SELECT step.kind AS kind, count(*) AS steps FROM s GROUP BY 1 ORDER BY 2 DESC, 1")
        result["tools_used"] = _rows(
            con,
            """SELECT step.function AS function, count(*) AS calls FROM s WHERE step.kind = 'api'
               GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 50""",
        )
        result["labels"] = _rows(con, "SELECT step.label AS label, count(*) AS steps FROM s GROUP BY 1 ORDER BY 2 DESC, 1")
        result["outcomes"] = _rows(
            con, "SELECT coalesce(CAST(success AS VARCHAR), 'unknown') AS success, count(*) AS records FROM t GROUP BY 1 ORDER BY 1"
        )
        reward = _rows(
            con,
            """SELECT count(reward) AS count, min(reward) AS min, avg(reward) AS mean, max(reward) AS max
               FROM t""",
        )[0]
        result["reward"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in reward.items()}
    if quarantine:
        result["quarantine_reasons"] = _rows(
            con,
            f"""SELECT stage, regexp_extract(error, '^[^:(]*') AS error, count(*) AS records
                FROM read_parquet({_files_sql(quarantine)}) GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2""",
        )
    if filtered:
        result["filter_reasons"] = _rows(
            con,
            f"""SELECT filter, reason, count(*) AS records FROM read_parquet({_files_sql(filtered)})
                GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2""",
        )
    return result
