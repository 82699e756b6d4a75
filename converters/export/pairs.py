"""Stream preference pairs joined with their chosen and rejected trajectories, in bounded memory.

A pair references two trajectories by id; they may sit in any shard. Instead of an in-memory
index of all trajectories, DuckDB joins the pairs' Parquet shards with the trajectories' shards
(`LEFT JOIN` twice, on chosen_id and rejected_id) and streams the result as Arrow batches.
DuckDB runs the join out of core: `memory_limit` caps its working memory and it spills to a temp
directory beyond that; results are ordered by pair id (an external sort), so the export is
deterministic. A pair whose trajectory is missing comes back with that side null; the driver
counts it as skipped. The lookup is by id, so a trajectory id must be unique (the store's ids are).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Iterator

import duckdb
import pyarrow as pa

from schemas.arrow import TRAJECTORY_SCHEMA
from schemas.store import duckdb_files

DEFAULT_MEMORY_LIMIT = "1GB"
_BATCH_ROWS = 256


def iter_joined_pairs(
    pair_files: list[Path], trajectory_files: list[Path], memory_limit: str = DEFAULT_MEMORY_LIMIT,
) -> Iterator[pa.RecordBatch]:
    """Batches of (pair, chosen, rejected) struct columns, ordered by pair id; a missing side is null."""
    if not pair_files:
        return
    with tempfile.TemporaryDirectory(prefix="trajforge-dpo-") as spill:
        con = duckdb.connect()
        try:
            con.execute(f"SET memory_limit = '{memory_limit}'")
            con.execute(f"SET temp_directory = '{spill}'")
            if trajectory_files:
                # union_by_name: older shards (no step `usage`) and newer ones read as one table.
                trajectories = f"read_parquet({duckdb_files(trajectory_files)}, union_by_name=true)"
            else:  # no trajectories at all: every pair is missing both sides
                con.register("no_trajectories", TRAJECTORY_SCHEMA.empty_table())
                trajectories = "no_trajectories"
            query = f"""
                SELECT p AS pair, c AS chosen, r AS rejected
                FROM read_parquet({duckdb_files(pair_files)}) p
                LEFT JOIN {trajectories} c ON c.id = p.chosen_id
                LEFT JOIN {trajectories} r ON r.id = p.rejected_id
                ORDER BY p.id
            """
            yield from con.sql(query).to_arrow_reader(_BATCH_ROWS)
        finally:
            con.close()
