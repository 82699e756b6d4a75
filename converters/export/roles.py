"""Roles the acting model played behind an export (its own judge, teacher, task writer), for its card.

A generation method records in each record's `details["actor_roles"]` the roles beside acting (a
judge, a teacher, a proposer, ...) that the acting model played itself, or a model of the same
weights with settings of its own, because the config named no other model for them. A reader of
the card must know when the data was graded or written by the policy it trains. Counted per
method and role over the trajectories behind the exported rows; vectorized over a batch (the
regex runs in Arrow; only the distinct role lists are parsed).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from converters.export.records import Batch

# details JSON (compact, as the store writes it): {"actor_roles": ["judge", ...]}.
_ACTOR_ROLES = r'"actor_roles":(?P<roles>\[[^\]]*\])'


@dataclass
class RoleReport:
    # (method, role) -> records whose role the acting model played.
    actor: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, batch: Batch, rows: np.ndarray) -> None:
        """The actor roles of the trajectories flagged in `rows`."""
        if not rows.any() or batch.rows.type.get_field_index("details") < 0:
            return
        found = pc.struct_field(pc.extract_regex(batch.rows.field("details"), _ACTOR_ROLES), "roles")
        found = pc.if_else(pa.array(rows), found, pa.nulls(len(rows), pa.string()))
        method = pc.fill_null(batch.column("method"), "-")
        keys = pc.binary_join_element_wise(method, found, "\x00").drop_null().value_counts()
        for key, n in zip(keys.field("values").to_pylist(), keys.field("counts").to_pylist()):
            name, roles = key.split("\x00", 1)
            for role in orjson.loads(roles):
                self.actor[(name, str(role))] += int(n)

    def as_card(self) -> list[dict[str, Any]]:
        return [{"method": m, "role": r, "records": n} for (m, r), n in sorted(self.actor.items())]


def roles_section(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown: the roles the acting model played itself, with how many exported records it touched."""
    if not rows:
        return []
    lines = "\n".join(f"| {r['method']} | {r['role']} | {r['records']:,} |" for r in rows)
    return ["## Roles played by the acting model", "",
            "These roles beside acting were played by the acting model itself (or its weights with settings of "
            "their own): no other model was configured for them (a method's `judge.llm` / `teacher.llm`). Data "
            "graded, corrected or written by the policy it trains inherits its blind spots; `details.roles` of "
            "each record names the model of every role.", "",
            "| method | role | records |", "|---|---|---|", lines, ""]
