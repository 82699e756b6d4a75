"""Hand-made and random interlingua records for tests (no I/O)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from converters.adp import from_adp
from schemas.models import (
    ApiAction,
    MessageAction,
    Pair,
    Provenance,
    TextObservation,
    Tool,
    Trajectory,
)

SEARCH_TOOL = Tool(
    name="search",
    description="Search the catalogue.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)


def tool_trajectory(idx: int = 0, *, success: bool = True, masked: tuple[int, ...] = ()) -> Trajectory:
    """A small tool-use trajectory: user asks, agent searches, tool answers, agent replies."""
    steps = [
        TextObservation(content=f"Find item {idx}", source="user"),
        ApiAction(function="search", arguments={"query": f"item {idx}"}, thought="I should search.", tool_call_id=f"call_{idx}"),
        TextObservation(content=f'[{{"id": {idx}}}]', source="environment", name="search", tool_call_id=f"call_{idx}"),
        MessageAction(content=f"Item {idx} is in stock.", thought="Found it."),
    ]
    for i in masked:
        steps[i].train = False
    return Trajectory(
        id=f"test/{idx}",
        source="test",
        steps=steps,
        tools=[SEARCH_TOOL],
        reward=1.0 if success else 0.0,
        success=success,
        provenance=Provenance(
            method="hand-made",
            model="none",
            seed=idx,
            parent_ids=[f"parent/{idx}"],
            trajforge_version="0.1.0",
            created_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc),
        ),
        details={"note": "unicode ✓", "n": idx},
    )


def pair(idx: int = 0) -> Pair:
    return Pair(id=f"pair/{idx}", chosen_id=f"test/{idx}", rejected_id=f"test/{idx + 1}", prefix_len=2, source="test")


def adp_samples(adp_dir: Path) -> Iterator[tuple[str, dict]]:
    """(dataset, raw ADP record) for every shipped ADP-standardized sample."""
    for file in sorted(adp_dir.glob("*/sample_std.json")):
        for record in json.loads(file.read_text()):
            yield file.parent.name, record


def adp_trajectories(adp_dir: Path) -> list[Trajectory]:
    return [from_adp(raw, dataset) for dataset, raw in adp_samples(adp_dir)]
