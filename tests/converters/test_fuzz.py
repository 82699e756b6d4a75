"""Robustness: mutated records never leak anything but ConversionError, and errors name the record.

For each registered converter, 500 mutations of real samples / fixtures (dropped keys, wrong types,
truncated strings incl. JSON strings, ~1 MB strings, lone surrogates / bytes, None, nested garbage)
are generated with a seeded `random.Random` (cheap path-copying, no deep copies); a smaller
hypothesis strategy splices arbitrary JSON-like values into records.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from _compare import ADP_DIR, FIXTURES, available, load, module, units
from _fuzz import DROP, value_paths, replaced, mutated
from converters.errors import ConversionError
from schemas.models import Trajectory

N_MUTATIONS = 500
# keys a converter reads the record id from (first readable wins)
ID_KEYS = {
    "llava_plus": ("unique_id",), "android_in_the_wild": ("episode_id",),
    "nebius_SWE-agent-trajectories": ("instance_id",), "swe-gym_openhands_sampled_trajectories": ("instance_id",),
    "webarena_successful": ("task_id",), "synatra": (), "xlam": ("unique_trajectory_id", "id"),
    "mini-coder": ("id", "instance_id"), "swe-smith": ("id", "traj_id"), "toucan_1_5m": ("id", "uuid"),
    "apigen_mt": ("id",), "screenagent": ("session_id",), "turkingbench": ("_id",),
}


def seeds(name: str) -> list[Any]:
    raw = ADP_DIR / name / "sample_raw.json"
    if name == "go-browse-wa":
        return load(ADP_DIR / name / "sample_std.json")[:2]
    if raw.exists():
        recs = units(name, load(raw))
    else:
        recs = units(name, load(FIXTURES / f"{name.replace('-', '_')}.json")["records"])
    # keep the seeds small: big SWE samples make 500 mutations slow without adding coverage
    recs = sorted(recs, key=lambda r: len(json.dumps(r)))[:3]
    return recs


def readable_ids(name: str, record: Any) -> list[str]:
    rec = record[0] if isinstance(record, list) and record and isinstance(record[0], dict) else record
    if not isinstance(rec, dict):
        return []
    out = []
    for key in ID_KEYS.get(name, ("id",)):
        v = rec.get(key)
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            out.append(str(v))
        elif isinstance(v, str) and v.strip() and len(v) <= 1000:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                continue
            out.append(v)
    return out


def check(name: str, conv, record: Any) -> str:
    try:
        t = conv(record)
    except ConversionError as exc:
        msg = str(exc)
        assert msg, name
        ids = readable_ids(name, record)
        if ids and name != "go-browse-wa":
            assert any(i in msg or repr(i) in msg for i in ids), f"{name}: error does not name the record {ids[:1]}: {msg[:200]}"
        elif name != "go-browse-wa":
            assert "record" in msg, msg[:200]
        return "error"
    assert isinstance(t, Trajectory)
    json.dumps(t.model_dump(mode="json"), ensure_ascii=False).encode("utf-8")
    return "ok"


@pytest.mark.parametrize("name", available())
def test_mutations_raise_only_conversion_error(name: str) -> None:
    conv = module(name).convert
    base = seeds(name)
    assert base
    outcomes = {"ok": 0, "error": 0}
    for record in mutated(base, N_MUTATIONS, f"fuzz/{name}"):
        outcomes[check(name, conv, record)] += 1
    assert outcomes["error"] > 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_hypothesis_splices(data) -> None:
    names = available()
    name = data.draw(st.sampled_from(names))
    base = seeds(name)
    record = data.draw(st.sampled_from(base))
    path = data.draw(st.sampled_from(value_paths(record)))
    value = data.draw(json_values)
    record = replaced(record, path, lambda _: value)
    check(name, module(name).convert, None if record is DROP else record)


def test_whole_record_garbage() -> None:
    for name in available():
        conv = module(name).convert
        for junk in (None, 3, "text", [], [None], {}, {"id": "x"}):
            try:
                conv(junk)
            except ConversionError as exc:
                assert str(exc)
