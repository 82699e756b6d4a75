"""Check every record of a dataset against the models; collect counts and the first errors."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import ValidationError

from schemas.arrow import FROM_ROW
from schemas.store import TABLES, Dataset


@dataclass
class ValidationReport:
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def invalid(self) -> int:
        return sum(c["invalid"] for c in self.counts.values())

    @property
    def total(self) -> int:
        return sum(c["records"] for c in self.counts.values())


def _error_line(table: str, row: dict, exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        problem = f"{loc}: {first['msg']}" + (f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else "")
    else:
        problem = f"{type(exc).__name__}: {exc}"
    return f"{table} record {row.get('id')!r}: {problem}"


def validate_dataset(ds: Dataset, *, max_errors: int = 10) -> ValidationReport:
    """Validate all tables; duplicate ids within a table count as invalid records."""
    report = ValidationReport()
    for table in TABLES:
        from_row = FROM_ROW[table]
        counts = {"records": 0, "valid": 0, "invalid": 0}
        seen: set[str] = set()
        for row in ds.iter_rows(table):
            counts["records"] += 1
            problem: str | None = None
            try:
                from_row(row)
            except (ValidationError, ValueError, TypeError, KeyError) as exc:
                problem = _error_line(table, row, exc)
            record_id = row.get("id")
            # A dropped record may legitimately share its id with nothing else; ids stay unique per table.
            if problem is None and record_id in seen:
                problem = f"{table} record {record_id!r}: duplicate id"
            seen.add(record_id)
            if problem is None:
                counts["valid"] += 1
            else:
                counts["invalid"] += 1
                if len(report.errors) < max_errors:
                    report.errors.append(problem)
        report.counts[table] = counts
    return report
