"""Go-Browse WebArena trajectories (apurvaga/go-browse-wa-raw): ADP-standardized passthrough.

No raw sample ships with ADP's snapshot (the raw file is a large LFS object), so this converter
takes the ADP-standardized record and passes it through `converters.adp.from_adp` with
source "go-browse-wa". Input format (ADP standardized trajectory):
- `id`: trajectory id (string).
- `content`: ordered steps tagged by `class_` (text_observation goal, web_observation with axtree,
  api_action click / fill / ... with `description` thoughts, message_action answers).
- `details`: free-form metadata.
"""

from __future__ import annotations

from typing import Any

from converters._util import Ctx, check_encodable, guarded
from converters.adp import from_adp
from converters.registry import register
from schemas.models import Trajectory

NAME = "go-browse-wa"
DATASET = "apurvaga/go-browse-wa-raw"


@register(NAME, sources=[DATASET + " (ADP-standardized)"])
@guarded(("id",))  # from_adp can leak TypeError on odd step shapes (e.g. a non-object screenshot)
def convert(record: Any) -> Trajectory:
    traj = from_adp(record, source=NAME)
    traj.provenance.source_dataset = DATASET
    check_encodable(traj, Ctx(record, ("id",)))
    return traj
