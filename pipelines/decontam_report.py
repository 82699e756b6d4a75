"""The decontamination report a dataset directory keeps (no Beam import: the flow and the card read it)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterable

EXAMPLES = 10


def decontamination_report(path: str | Path) -> dict[str, Any] | None:
    """The `decontamination` report in the manifest of a dataset the stage wrote, else None."""
    from schemas.store import Dataset, StoreError

    try:
        return Dataset.open(path).manifest().get("decontamination")
    except StoreError:
        return None


def merge_reports(reports: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One report for datasets checked against the same test data (e.g. the inputs of a mix)."""
    reports = list(reports)
    out: dict[str, Any] = {"settings": reports[0]["settings"] if reports else {}, "references": {},
                           "records_in": 0, "dropped": 0, "dropped_by_source": Counter(), "dropped_by_kind": Counter(),
                           "pairs_dropped": 0, "examples": []}
    for r in reports:
        out["references"].update(r.get("references") or {})
        for key in ("records_in", "dropped", "pairs_dropped"):
            out[key] += int(r.get(key) or 0)
        for key in ("dropped_by_source", "dropped_by_kind"):
            out[key].update(r.get(key) or {})
        out["examples"] += r.get("examples") or []
    out["examples"] = out["examples"][:EXAMPLES]
    out["dropped_by_source"] = dict(sorted(out["dropped_by_source"].items()))
    out["dropped_by_kind"] = dict(sorted(out["dropped_by_kind"].items()))
    return out
