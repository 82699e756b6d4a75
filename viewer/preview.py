"""Export preview: the rows each export format makes of one trajectory or pair.

The rows come from the exporter's own `converters.export.preview` with the options `trajforge
export` uses by default, so the preview is what the export writes (as a trainer loads it), or the
reason the export would skip the record.
"""

from __future__ import annotations

from typing import Any

from converters.export import preview
from converters.export.formats import FORMATS
from converters.export.options import FormatOptions
from converters.export.run import ExportConfig, ExportError, resolve_options
from schemas.models import Pair, Trajectory
from schemas.store import Dataset
from viewer.sources import ViewError


def formats_for(table: str) -> list[str]:
    """Formats that export records of `table` ("trajectories" or "pairs")."""
    return [name for name, fmt in FORMATS.items() if fmt.table == table]


def options_for(name: str, ds: Dataset) -> FormatOptions:
    """The options an export of `ds` to format `name` would use (its defaults)."""
    fmt = FORMATS.get(name)
    if fmt is None:
        raise ViewError(f"unknown format {name!r}; formats are {', '.join(FORMATS)}")
    if name == "tokenized":
        return FormatOptions()  # the tokenizer is the page's (--tokenizer)
    try:
        return resolve_options(fmt, ExportConfig(format=name))
    except ExportError as exc:
        raise ViewError(str(exc)) from None


def describe(name: str, opts: FormatOptions) -> str:
    notes = [FORMATS[name].description]
    if name == "trl-sft":
        notes.append(f"Layout: {opts.sft_layout}.")
    notes.append("Reasoning kept." if opts.render.reasoning else "Reasoning dropped.")
    return " ".join(notes)


def _kwargs(opts: FormatOptions) -> dict[str, Any]:
    return {"sft_layout": opts.sft_layout, "kto_mode": opts.kto_mode, "dpo_level": opts.dpo_level,
            "reasoning": opts.render.reasoning, "web_max_chars": opts.render.web_max_chars}


def preview_trajectory(name: str, traj: Trajectory, opts: FormatOptions) -> dict[str, Any]:
    fmt = FORMATS[name]
    if fmt.table != "trajectories":
        raise ViewError(f"{name} exports pairs, not trajectories")
    p = preview(traj, name, **_kwargs(opts))
    return {"format": name, "about": describe(name, opts), "rows": p.rows, "skipped": p.skipped}


def preview_pair(name: str, pair: Pair, chosen: Trajectory | None, rejected: Trajectory | None,
                 opts: FormatOptions) -> dict[str, Any]:
    fmt = FORMATS[name]
    if fmt.table != "pairs":
        raise ViewError(f"{name} exports trajectories, not pairs")
    if chosen is None or rejected is None:
        missing = "chosen" if chosen is None else "rejected"
        return {"format": name, "about": describe(name, opts), "rows": [], "skipped": f"missing {missing} trajectory"}
    p = preview(chosen, name, pair=pair, rejected=rejected, **_kwargs(opts))
    return {"format": name, "about": describe(name, opts), "rows": p.rows, "skipped": p.skipped}
