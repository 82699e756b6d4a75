"""A converter and a filter that the tests register from their own code, as a user would: a worker
process's registries never contain them, so a pipeline must carry them to its workers."""

from __future__ import annotations

from typing import Any

from converters.adp import from_adp
from filters.base import BaseFilter, Decision, drop, keep
from schemas.models import Trajectory

CONVERTER = "adp_tagged"
FILTER = "max_steps"


def adp_tagged(record: dict[str, Any]) -> Trajectory:
    """ADP, with a tag in details that says this converter ran."""
    traj = from_adp(record)
    traj.details = {**traj.details, "converted_by": CONVERTER}
    return traj


class MaxSteps(BaseFilter):
    """Drops records with more than `limit` steps."""

    def __init__(self, limit: int = 10) -> None:
        self.limit = limit

    def decide(self, record: Trajectory) -> Decision:
        if len(record.steps) > self.limit:
            return drop(record, f"{len(record.steps)} steps (max {self.limit})")
        return keep(record)
