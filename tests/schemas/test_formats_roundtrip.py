"""Records round-trip losslessly through pyarrow, DuckDB and `datasets`; the JSON Schema is current."""

from __future__ import annotations

import json

import datasets
import duckdb
import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.arrow import (
    PAIR_SCHEMA,
    TRAJECTORY_SCHEMA,
    pair_from_row,
    pair_to_row,
    trajectory_from_row,
    trajectory_to_row,
)
from schemas.json_schema import committed, interlingua_json_schema, render
from schemas.models import ApiAction, JsonObservation, MessageAction, TextObservation, Trajectory, WebObservation
from tests.factories import adp_trajectories, pair, tool_trajectory


def _all_records(adp_dir) -> list[Trajectory]:
    return adp_trajectories(adp_dir) + [tool_trajectory(i, masked=(1,) if i % 2 else ()) for i in range(5)]


def _write(records: list[Trajectory], path) -> None:
    table = pa.Table.from_pylist([trajectory_to_row(r) for r in records], schema=TRAJECTORY_SCHEMA)
    pq.write_table(table, path, compression="zstd")


def _unique(records):
    return {r.id: r for r in records}


def test_arrow_schema_has_no_map_types():
    def walk(t: pa.DataType):
        assert not pa.types.is_map(t), t
        if pa.types.is_struct(t):
            for f in t:
                walk(f.type)
        elif pa.types.is_list(t):
            walk(t.value_type)

    for field in TRAJECTORY_SCHEMA:
        walk(field.type)
    assert pa.types.is_struct(TRAJECTORY_SCHEMA.field("steps").type.value_type)
    assert "kind" in TRAJECTORY_SCHEMA.field("steps").type.value_type.names


def test_pyarrow_round_trip(adp_dir, tmp_path):
    records = _all_records(adp_dir)
    _write(records, tmp_path / "t.parquet")
    back = [trajectory_from_row(r) for r in pq.read_table(tmp_path / "t.parquet").to_pylist()]
    assert back == records


def test_duckdb_round_trip(adp_dir, tmp_path):
    records = _unique(_all_records(adp_dir))
    _write(list(records.values()), tmp_path / "t.parquet")
    rows = duckdb.sql(f"SELECT * FROM read_parquet('{tmp_path / 't.parquet'}')").to_arrow_table().to_pylist()
    assert len(rows) == len(records)
    for row in rows:
        assert trajectory_from_row(row) == records[row["id"]]
    # Nested fields are queryable as structs, not opaque blobs.
    kinds = duckdb.sql(
        f"SELECT DISTINCT unnest(steps).kind AS k FROM read_parquet('{tmp_path / 't.parquet'}') ORDER BY k"
    ).fetchall()
    assert {k for (k,) in kinds} >= {"api", "code", "message", "text", "web"}


def test_datasets_round_trip(adp_dir, tmp_path):
    records = _unique(_all_records(adp_dir))
    _write(list(records.values()), tmp_path / "t.parquet")
    loaded = datasets.load_dataset("parquet", data_files=str(tmp_path / "t.parquet"), split="train")
    assert len(loaded) == len(records)
    for row in loaded:
        assert trajectory_from_row(row) == records[row["id"]]


def test_pairs_round_trip(tmp_path):
    pairs = [pair(i) for i in range(3)]
    pq.write_table(pa.Table.from_pylist([pair_to_row(p) for p in pairs], schema=PAIR_SCHEMA), tmp_path / "p.parquet")
    assert [pair_from_row(r) for r in pq.read_table(tmp_path / "p.parquet").to_pylist()] == pairs


def test_committed_json_schema_matches_models():
    assert committed() == render(), "schemas/trajectory.schema.json drifted: run `trajforge schema --write`"


def test_records_validate_against_the_json_schema(adp_dir):
    schema = interlingua_json_schema()
    validator = jsonschema.Draft202012Validator(schema)
    for record in _all_records(adp_dir):
        validator.validate(json.loads(record.model_dump_json()))
    bad = json.loads(tool_trajectory().model_dump_json())
    bad["steps"][1]["kind"] = "teleport"
    assert not validator.is_valid(bad)


# ---- property: arbitrary records survive the Arrow layout ----------------------------

_text = st.text(max_size=30)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | _text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_text, children, max_size=3),
    max_leaves=8,
)
_step = st.one_of(
    st.builds(ApiAction, function=_text, arguments=st.dictionaries(_text, _json_value, max_size=3), thought=st.none() | _text),
    st.builds(MessageAction, content=_text, train=st.booleans(), label=st.sampled_from(["good", "bad", "unknown"])),
    st.builds(TextObservation, content=_text, source=st.sampled_from(["user", "agent", "environment"]), name=st.none() | _text),
    st.builds(JsonObservation, content=_json_value),
    st.builds(WebObservation, url=st.none() | _text, axtree=st.none() | _text, viewport=st.none() | st.tuples(st.integers(0, 4000), st.integers(0, 4000))),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(_step, max_size=6),
    reward=st.none() | st.floats(allow_nan=False),
    details=st.dictionaries(_text, _json_value, max_size=3),
)
def test_any_record_survives_the_arrow_layout(steps, reward, details):
    record = Trajectory(id="p", source="prop", steps=steps, reward=reward, details=details)
    table = pa.Table.from_pylist([trajectory_to_row(record)], schema=TRAJECTORY_SCHEMA)
    assert trajectory_from_row(table.to_pylist()[0]) == record
