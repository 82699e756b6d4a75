"""The guard on every shipped method's exports: a trained row holds only what its agent could know.

A dataset is exported as users export it (trl-sft, trl-kto, and trl-dpo where it has pairs); every trained text
(each completion's words, its thoughts and its tool calls' arguments) is checked against what its record keeps
hidden (`filters.grounding.hidden_texts`: a simulated user's scenario, reference calls, tutorials, specs, guides,
verifier, judge and teacher reasons): no span of `SPAN_WORDS` words and no id from there that the row's prompt
(system prompt, tools, user and tool messages) does not hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from converters.export import ExportConfig, export
from converters.export.run import NothingToExport
from filters.grounding import hidden_texts, quoted
from schemas.models import Trajectory
from schemas.store import Dataset

FORMATS = ("trl-sft", "trl-kto", "trl-dpo")


def _text(message: dict[str, Any]) -> str:
    calls = [c.get("function", c) for c in message.get("tool_calls") or ()]
    return "\n".join([str(message.get("content") or ""), *(json.dumps(c, default=str) for c in calls)])


def _seen(prompt: list[dict[str, Any]], tools: Any) -> str:
    """What the agent saw in a row's prompt: everything but its own earlier turns."""
    return "\n".join([str(tools or ""), *(_text(m) for m in prompt if m.get("role") != "assistant")])


def leaks(out: Path, work: Path) -> list[str]:
    """'<format> <record id>: <span or id>' for every trained text of `out`'s exports taken from a hidden part."""
    ds = Dataset.open(out)
    records: dict[str, Trajectory] = {t.id: t for t in ds.iter_records()}
    has_pairs = any(True for _ in ds.iter_records("pairs"))
    found: list[str] = []
    for fmt in FORMATS:
        if fmt == "trl-dpo" and not has_pairs:
            continue
        target = work / f"{out.name}-{fmt}"
        try:
            export(out, target, ExportConfig(format=fmt))
        except NothingToExport:  # no row of this format: nothing trained by it
            continue
        for row in pq.read_table(target / "data").to_pylist():
            ids = [row[k] for k in ("chosen_id", "rejected_id", "id") if row.get(k)]
            hidden = [text for i in ids if i in records for text in hidden_texts(records[i])]
            seen = _seen(row["prompt"], row.get("tools"))
            for key in ("completion", "chosen", "rejected"):
                for message in row.get(key) or ():
                    found += [f"{fmt} {ids[0]}: {q}" for q in quoted(_text(message), hidden, seen)]
    return found
