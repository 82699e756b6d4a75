"""Observations too long to use whole: cut at a limit where an environment hands them out, the cut
recorded on the step, the whole text kept once per trajectory.

An environment answers every action with an observation; a tool may answer with megabytes (a
dump, a page). `cut_observation` keeps the first `limit` characters of each long text field (a
text observation's `content`, a page's `html` and `axtree`) and appends a marker, so the agent's
prompt, the stored step and every export see the same cut text. The step records the cut in
`extra["cut"]`: per field, its whole length, what was kept and the sha256 of the whole text. The
whole text travels with the step in memory (never serialized with it) and lands once in its
trajectory's `details["full_observations"]` (sha256 -> text), however many steps show it.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable

DEFAULT_MAX_OBSERVATION_CHARS = 256 * 1024
FULL_OBSERVATIONS = "full_observations"
CUT = "cut"
_FIELDS = {"text": ("content",), "web": ("html", "axtree")}


def marker(total: int, kept: int) -> str:
    return f"\n...[cut: {total - kept:,} of {total:,} characters not shown]"


def cut_observation(observation: Any, limit: int | None) -> Any:
    """`observation`, or a copy whose text fields longer than `limit` characters are cut (None: no limit)."""
    if limit is None:
        return observation
    fields = [f for f in _FIELDS.get(observation.kind, ()) if len(getattr(observation, f) or "") > limit]
    if not fields:
        return observation
    update: dict[str, Any] = {}
    cuts: dict[str, Any] = {}
    whole: dict[str, str] = {}
    for name in fields:
        text = getattr(observation, name)
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        update[name] = text[:limit] + marker(len(text), limit)
        cuts[name] = {"chars": len(text), "kept": limit, "sha256": digest}
        whole[digest] = text
    cut = observation.model_copy(update={**update, "extra": {**observation.extra, CUT: cuts}})
    cut._full_texts = {**(observation._full_texts or {}), **whole}
    return cut


def full_texts(steps: Iterable[Any]) -> dict[str, str]:
    """The whole texts behind the cut steps among `steps`, by sha256 (empty when none was cut)."""
    out: dict[str, str] = {}
    for step in steps:
        texts = getattr(step, "_full_texts", None)
        if texts:
            out.update(texts)
    return out
