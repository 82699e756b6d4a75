"""Model usage and episode outcomes behind an export, per method and environment, for its card.

Usage sums the `usage` of the steps of the trajectories behind the exported rows (a pair's two
sides both count, as for the card's other statistics); outcomes count every input trajectory
whose `success` is known (supervised exports leave failures out, so the success rate is taken
before that selection). The environment is the `details.env.name` a generated record carries.
Shards written before steps had `usage` count no calls. Vectorized over a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from converters.export.records import Batch

# details JSON (compact, as the store writes it): {"env": {"name": "<env>", ...}} of an env method.
_ENV = r'"env":\{"name":"(?P<env>[^"]*)"'
_SUMS = ("calls", "cached", "prompt_tokens", "completion_tokens", "latency_s", "cost_usd", "unpriced")


@dataclass
class UsageReport:
    # (method, env) -> sums of `_SUMS`, and [successes, episodes].
    usage: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    outcomes: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def add_usage(self, batch: Batch, rows: np.ndarray) -> None:
        """The usage of the steps of the trajectories flagged in `rows`."""
        step_type = batch.values.type
        if not rows.any() or step_type.get_field_index("usage") < 0:
            return
        usage = batch.values.field("usage")
        made = usage.is_valid().to_numpy(zero_copy_only=False) & np.repeat(rows, batch.lengths)
        if not made.any():
            return
        group, names = _groups(batch)
        owner = group[batch.owner[made]]
        take = pa.array(np.flatnonzero(made))

        def column(name: str, fill: Any) -> np.ndarray:
            return pc.fill_null(usage.field(name).take(take), fill).to_numpy(zero_copy_only=False)

        cached = column("cached", False)
        cost = usage.field("cost_usd").take(take)
        unpriced = (~cost.is_valid().to_numpy(zero_copy_only=False)) & ~cached
        values = {"calls": np.ones(len(owner)), "cached": cached.astype(float),
                  "prompt_tokens": column("prompt_tokens", 0).astype(float),
                  "completion_tokens": column("completion_tokens", 0).astype(float),
                  "latency_s": column("latency_s", 0.0), "cost_usd": np.where(cached, 0.0, column("cost_usd", 0.0)),
                  "unpriced": unpriced.astype(float)}
        for g, key in enumerate(names):
            mine = owner == g
            if mine.any():
                sums = self.usage.setdefault(key, dict.fromkeys(_SUMS, 0.0))
                for name in _SUMS:
                    sums[name] += float(values[name][mine].sum())

    def add_outcomes(self, batch: Batch) -> None:
        """Successes / episodes of the batch's trajectories whose `success` is known."""
        success = batch.column("success")
        known = success.is_valid().to_numpy(zero_copy_only=False) & batch.valid
        if not known.any():
            return
        won = pc.fill_null(success, False).to_numpy(zero_copy_only=False) & known
        group, names = _groups(batch)
        for g, key in enumerate(names):
            if (episodes := int(known[group == g].sum())) > 0:
                counts = self.outcomes.setdefault(key, [0, 0])
                counts[0] += int(won[group == g].sum())
                counts[1] += episodes

    def as_card(self) -> dict[str, Any]:
        """JSON-ready: per (method, env) rows and totals; cost None (unknown) where a call had no price."""
        rows = []
        for (method, env), sums in sorted(self.usage.items()):
            rows.append({"method": method, "env": env, **_finish(sums)})
        total = dict.fromkeys(_SUMS, 0.0)
        for sums in self.usage.values():
            for name in _SUMS:
                total[name] += sums[name]
        outcomes = [{"method": m, "env": e, "successes": s, "episodes": n, "rate": round(s / n, 4)}
                    for (m, e), (s, n) in sorted(self.outcomes.items())]
        return {"usage": rows, "usage_total": _finish(total) if self.usage else None, "outcomes": outcomes}


def _finish(sums: dict[str, float]) -> dict[str, Any]:
    return {"calls": int(sums["calls"]), "cached": int(sums["cached"]), "prompt_tokens": int(sums["prompt_tokens"]),
            "completion_tokens": int(sums["completion_tokens"]), "latency_s": round(sums["latency_s"], 3),
            "cost_usd": None if sums["unpriced"] else round(sums["cost_usd"], 6)}


def _groups(batch: Batch) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Each trajectory's (method, env) group index, and the groups."""
    method = pc.fill_null(batch.column("method"), "-")
    if batch.rows.type.get_field_index("details") >= 0:
        env = pc.fill_null(pc.struct_field(pc.extract_regex(batch.rows.field("details"), _ENV), "env"), "-")
    else:
        env = pa.array(["-"] * len(batch), pa.string())
    keys = pc.binary_join_element_wise(method, env, "\x00").dictionary_encode()
    names = [tuple(k.split("\x00")) for k in keys.dictionary.to_pylist()]
    return keys.indices.to_numpy(zero_copy_only=False).astype(np.int64), names  # type: ignore[return-value]
