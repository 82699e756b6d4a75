"""Export preview: the rows each export format makes of one trajectory or pair.

The rows come from the exporters' own row functions (`converters.export.FORMATS`) with the options
`trajforge export` would resolve for this dataset (e.g. trl-sft's layout: prompt-completion when
any trajectory of the dataset has masked steps), so the preview is what the export writes, or the
reason the export would skip the record.
"""

from __future__ import annotations

from typing import Any

import duckdb

from converters.export.formats import FORMATS
from converters.export.options import FormatOptions
from converters.export.render import Unrenderable
from converters.export.run import ExportConfig, resolve_options
from schemas.models import Pair, Trajectory
from schemas.store import Dataset, StoreError
from viewer.sources import ViewError, unreadable


def formats_for(table: str) -> list[str]:
    """Formats that export records of `table` ("trajectories" or "pairs")."""
    return [name for name, fmt in FORMATS.items() if fmt.table == table]


def options_for(name: str, ds: Dataset) -> FormatOptions:
    """The options an export of `ds` to format `name` would use (a DuckDB pre-scan for trl-sft's layout)."""
    fmt = FORMATS.get(name)
    if fmt is None:
        raise ViewError(f"unknown format {name!r}; formats are {', '.join(FORMATS)}")
    try:
        return resolve_options(fmt, ExportConfig(format=name), ds)
    except StoreError as exc:
        raise ViewError(str(exc)) from None
    except duckdb.Error as exc:
        raise unreadable(ds.path, exc) from None


def describe(name: str, opts: FormatOptions) -> str:
    notes = [FORMATS[name].description]
    if name == "trl-sft":
        notes.append(f"Layout for this dataset: {opts.sft_layout}.")
    notes.append("Reasoning kept." if opts.render.reasoning else "Reasoning dropped.")
    return " ".join(notes)


def preview_trajectory(name: str, traj: Trajectory, opts: FormatOptions) -> dict[str, Any]:
    fmt = FORMATS[name]
    if fmt.table != "trajectories":
        raise ViewError(f"{name} exports pairs, not trajectories")
    return _preview(name, opts, lambda: fmt.rows(traj, opts))


def preview_pair(name: str, pair: Pair, chosen: Trajectory | None, rejected: Trajectory | None,
                 opts: FormatOptions) -> dict[str, Any]:
    fmt = FORMATS[name]
    if fmt.table != "pairs":
        raise ViewError(f"{name} exports trajectories, not pairs")
    if chosen is None or rejected is None:
        missing = "chosen" if chosen is None else "rejected"
        return {"format": name, "about": describe(name, opts), "rows": [], "skipped": f"missing {missing} trajectory"}
    return _preview(name, opts, lambda: fmt.rows(pair, chosen, rejected, opts))


def _preview(name: str, opts: FormatOptions, make_rows: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"format": name, "about": describe(name, opts), "rows": [], "skipped": None}
    try:
        out["rows"] = make_rows()
    except Unrenderable as exc:
        out["skipped"] = str(exc)
    return out
