"""Usage totals: the model calls behind steps, summed per trajectory and over many.

A trajectory's `details["usage"]` holds the totals of its steps' `usage` (the acting model's
calls that made them); `usage_totals` sums them over trajectories for run summaries, export
cards and evaluations. `cost_usd` is None (unknown) as soon as one call that was not served
from the cache has no price; cached calls cost 0. A step shared by several records (search
paths with a common prefix) counts in each of them.
"""

from __future__ import annotations

from typing import Any, Iterable

from schemas.models import Step, Trajectory, Usage

TOTAL_KEYS = ("calls", "cached", "prompt_tokens", "completion_tokens", "latency_s", "cost_usd")


def empty_totals() -> dict[str, Any]:
    return {"calls": 0, "cached": 0, "prompt_tokens": 0, "completion_tokens": 0, "latency_s": 0.0, "cost_usd": 0.0}


def add_totals(total: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """`total` plus `part` (both of `TOTAL_KEYS`; a missing key counts 0), in place."""
    for key in ("calls", "cached", "prompt_tokens", "completion_tokens"):
        total[key] += int(part.get(key) or 0)
    total["latency_s"] = round(total["latency_s"] + float(part.get("latency_s") or 0.0), 6)
    cost = part.get("cost_usd", 0.0) if part.get("calls") else 0.0
    total["cost_usd"] = None if total["cost_usd"] is None or cost is None else total["cost_usd"] + cost
    return total


def call_totals(u: Usage) -> dict[str, Any]:
    """The totals of one model call (a record one call wrote whole keeps them in `details["usage"]`)."""
    return {"calls": 1, "cached": int(u.cached), "prompt_tokens": u.prompt_tokens or 0,
            "completion_tokens": u.completion_tokens or 0, "latency_s": u.latency_s or 0.0,
            "cost_usd": 0.0 if u.cached else u.cost_usd}


def step_totals(steps: Iterable[Step]) -> dict[str, Any] | None:
    """The totals of the steps' usage; None when no step was made by a model call."""
    total, found = empty_totals(), False
    for step in steps:
        if step.usage is not None:
            found = True
            add_totals(total, call_totals(step.usage))
    return total if found else None


def trajectory_totals(trajectory: Trajectory) -> dict[str, Any] | None:
    """A trajectory's totals: its `details["usage"]`, else computed from its steps."""
    stored = trajectory.details.get("usage")
    return stored if isinstance(stored, dict) else step_totals(trajectory.steps)


def with_usage(trajectory: Trajectory) -> Trajectory:
    """`trajectory` with `details["usage"]` filled from its steps (unchanged when set, or when no step has usage)."""
    if "usage" not in trajectory.details and (totals := step_totals(trajectory.steps)) is not None:
        trajectory.details["usage"] = totals
    return trajectory


def usage_totals(trajectories: Iterable[Trajectory]) -> dict[str, Any]:
    """The usage of many trajectories (those without any count nothing)."""
    total = empty_totals()
    for t in trajectories:
        part = trajectory_totals(t)
        if part is not None:
            add_totals(total, part)
    return total


# Dataset manifests keep usage as unit counts (summed over units, so resumed runs add up):
# `usage:<key>`, plus how many uncached calls had no price (their cost is unknown).
COUNT_PREFIX = "usage_"
UNPRICED = "usage_unpriced_calls"


def as_counts(totals: dict[str, Any], unpriced: int = 0) -> dict[str, Any]:
    """Totals as manifest counts (cost 0 with `unpriced` > 0 standing for unknown)."""
    counts = {f"{COUNT_PREFIX}{k}": (totals[k] or 0) for k in TOTAL_KEYS}
    counts[UNPRICED] = unpriced if totals["cost_usd"] is not None else max(unpriced, 1)
    return counts


def from_counts(counts: dict[str, Any]) -> dict[str, Any] | None:
    """The totals `as_counts` wrote (summed over units), or None when the counts hold none."""
    if f"{COUNT_PREFIX}calls" not in counts:
        return None
    totals = {k: counts.get(f"{COUNT_PREFIX}{k}", 0) for k in TOTAL_KEYS}
    if counts.get(UNPRICED):
        totals["cost_usd"] = None
    return totals
