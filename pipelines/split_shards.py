"""A trajectory shard rewritten as kept rows and filtered rows (dedup, decontaminate).

One place for what both stages must do alike: read a shard in row groups in the current schema
(older shards are cast), write the dropped rows to `filtered` with their decision columns, and
check per unit that every row read was either kept or filtered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.beam_runner import PipelineError
from schemas.arrow import FILTERED_SCHEMA, TRAJECTORY_SCHEMA
from schemas.store import ROW_GROUP_ROWS

DECISION_COLUMNS = ("filter", "reason", "score")


def trajectory_batches(path: str | Path) -> Iterator[pa.Table]:
    """The shard's rows, one row group at a time, in the current trajectory schema."""
    for batch in pq.ParquetFile(path).iter_batches(batch_size=ROW_GROUP_ROWS):
        rows = pa.Table.from_batches([batch])
        yield rows if rows.schema.equals(TRAJECTORY_SCHEMA) else rows.cast(TRAJECTORY_SCHEMA)


def write_split(unit: Any, rows: pa.Table, keep: np.ndarray, decisions: Mapping[str, Any]) -> None:
    """`rows[keep]` to the unit's trajectories, the others to `filtered` with `decisions` (for each of
    `DECISION_COLUMNS`, one value per dropped row, in row order); counts `in` and `kept` (the writer
    counts `filtered`)."""
    unit.write_batch("trajectories", rows.filter(pa.array(keep)))
    unit.counts["kept"] += int(keep.sum())
    unit.counts["in"] += len(rows)
    if not keep.all():
        dropped = rows.filter(pa.array(~keep))
        for name in DECISION_COLUMNS:
            field = FILTERED_SCHEMA.field(name)
            values = decisions[name]
            dropped = dropped.append_column(field, values if isinstance(values, (pa.Array, pa.ChunkedArray))
                                            else pa.array(values, field.type))
        unit.write_batch("filtered", dropped)


def checked_counts(unit: str, counts: Mapping[str, int]) -> dict[str, int]:
    """The unit's counts, once every row read is accounted for as kept or filtered."""
    if counts["in"] != counts["kept"] + counts["filtered"]:
        raise PipelineError(f"unit {unit}: counts do not add up ({dict(counts)})")
    return dict(counts)
