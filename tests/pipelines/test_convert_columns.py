"""The convert stage's columnar path gives exactly what the row path gives: the Arrow batch,
the quarantine (records Arrow cannot store included), and the shards the store writes."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from converters.registry import get_converter
from pipelines.columns import trajectories_to_batch
from pipelines.convert_work import _to_batch, convert_records, convert_to_batches
from pipelines.inputs import plan_chunks, read_chunk
from schemas.arrow import TRAJECTORY_SCHEMA, trajectory_to_row
from schemas.models import (
    Annotation,
    ApiAction,
    BoundingBox,
    CodeAction,
    ImageObservation,
    ImageRef,
    JsonObservation,
    MessageAction,
    Provenance,
    TextObservation,
    Tokens,
    Tool,
    Trajectory,
    Usage,
    WebObservation,
)
from schemas.store import Dataset
from tests.factories import tool_trajectory
from tests.pipelines._data import write_jsonl


def _row_batch(trajs: list[Trajectory]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([trajectory_to_row(t) for t in trajs], schema=TRAJECTORY_SCHEMA)


def _every_field() -> list[Trajectory]:
    """Every step kind, every optional field both set and unset."""
    shot = ImageRef(path="s.png", annotations=[Annotation(text="OK", element_type="button",
                                                          bounding_box=BoundingBox(x=1, y=2, width=3, height=4))])
    steps = [
        TextObservation(content="héllo ✓", source="user", name="u", reward=0.5, label="good", train=False,
                        extra={"k": [1, None, {"n": 2**70}]}),
        ApiAction(function="f", arguments={"a": 1, "b": [True, None]}, thought="t", reasoning="r", tool_call_id="c1"),
        ApiAction(function="g", usage=Usage(model="m", prompt_tokens=2, tokens=Tokens(
            prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.25], tokenizer="tok", chat_template="ab12"))),
        CodeAction(language="python", content="print(1)", thought=None, reasoning="why"),
        MessageAction(content="done", label="bad", usage=Usage(model="m", cached=True)),
        JsonObservation(content={"x": [1.5, "y"]}, name="tool"),
        JsonObservation(content=None),
        ImageObservation(image=shot),
        ImageObservation(image=ImageRef(path="p.png", source="user")),
        WebObservation(url="http://x", html="<p>", axtree="[1] p", screenshot=shot, viewport=(1280, 720)),
        WebObservation(),
    ]
    full = Trajectory(
        id="t/full", source="test", steps=steps,
        tools=[Tool(name="f", description="d", parameters={"type": "object"}), Tool(name="g")],
        reward=1.0, success=False, details={"note": "ü", "n": 3},
        provenance=Provenance(method="m", source_dataset="ds", source_id="s1", source_format="adp-0", model="mo",
                              prompt_template_hash="h", seed=7, task_id="task", parent_ids=["a", "b"],
                              trajforge_version="0.1", created_at=datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=2)))),
    )
    return [full, Trajectory(id="t/empty", source="test"), tool_trajectory(3, masked=(0,))]


def test_columns_equal_the_row_path(adp_records):
    adp = get_converter("adp").fn
    trajs = _every_field() + [adp(r) for r in adp_records]
    got = trajectories_to_batch(trajs)
    assert got.schema.equals(TRAJECTORY_SCHEMA)
    assert got.equals(_row_batch(trajs))
    assert trajectories_to_batch([]).equals(_row_batch([]))


def test_chunk_with_bad_and_unstorable_records_matches_the_row_path(tmp_path, adp_records):
    too_wide = dict(adp_records[0], id="too-wide")
    # A web step whose viewport does not fit int32: valid for the model, rejected by Arrow.
    too_wide["content"] = [{"class_": "web_observation", "html": None, "axtree": None, "url": "u",
                            "image_observation": None, "viewport_size": [2**40, 1]}]
    records = adp_records[:5] + [{"id": "no-content"}, too_wide] + adp_records[5:9]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    with open(path, "ab") as fh:
        fh.write(b'{"id": "truncated", "content": [\n')
    info = get_converter("adp")
    fn = info.fn
    # Quarantine rows compared without their time, in id order (runs quarantine run by run).
    strip = lambda rows: sorted(({k: v for k, v in r.items() if k != "created_at"} for r in rows),  # noqa: E731
                                key=lambda r: r["id"])
    for chunk in plan_chunks([str(path)], 6):
        # Runs of 4 records: a chunk's second run starts mid-chunk, and a run with an
        # unstorable record is converted again by rows from the right place.
        runs = list(convert_to_batches(chunk, info, 4))
        assert [r[3]["in"] for r in runs] == [4, chunk.stop - chunk.start - 4]
        batch = pa.Table.from_batches([r[0] for r in runs]).combine_chunks().to_batches()[0]
        ids = [i for r in runs for i in r[1]]
        rows, ref_ids, ref_bad, ref_counts = convert_records(read_chunk(chunk), fn)
        ref_batch, ref_ids = _to_batch(rows, ref_ids, ref_bad, ref_counts)
        assert batch.equals(ref_batch) and ids == ref_ids
        assert sum((r[3] for r in runs), Counter()) == ref_counts
        assert strip([row for r in runs for row in r[2]]) == strip(ref_bad)
    # The three bad records are named, each with its problem.
    chunks = plan_chunks([str(path)], 6)
    bad = [row for chunk in chunks for run in convert_to_batches(chunk, info, 4) for row in run[2]]
    errors = {row["location"].rsplit(":", 1)[-1] if ":" in row["location"] else row["location"]: row["error"]
              for row in bad}
    assert len(bad) == 3
    assert "ConversionError" in errors["6"] and "invalid JSON" in errors["12"]
    unstorable = next(row for row in bad if "not storable in Arrow" in row["error"])
    assert unstorable["location"].startswith("adp/too-wide~") and orjson.loads(unstorable["raw"])["id"].startswith(
        "adp/too-wide~")


def _shard_layout(ds: Dataset) -> list[tuple[str, list[int]]]:
    files = ds.shard_files()
    return [(f.name, [pq.ParquetFile(f).metadata.row_group(i).num_rows
                      for i in range(pq.ParquetFile(f).metadata.num_row_groups)]) for f in files]


def test_write_batch_keeps_order_and_the_shard_limits(tmp_path: Path):
    trajs = [tool_trajectory(i) for i in range(23)]
    ds = Dataset.create(tmp_path / "batch")
    with ds.unit("u", max_rows=10, row_group_rows=4) as unit:
        unit.write("trajectories", trajs[0])  # rows written before a batch stay first
        unit.write_batch("trajectories", trajectories_to_batch(trajs[1:]))
    layout = _shard_layout(ds)
    assert [name for name, _ in layout] == ["u-00000.parquet", "u-00001.parquet", "u-00002.parquet"]
    assert [sum(groups) for _, groups in layout] == [10, 10, 3]
    assert all(0 < n <= 4 for _, groups in layout for n in groups)
    assert list(ds.iter_records()) == trajs
    assert ds.finished_units()["u"]["counts"] == {"trajectories": 23}
    assert pq.ParquetFile(ds.shard_files()[0]).metadata.row_group(0).column(0).compression == "ZSTD"


def test_write_batch_rolls_shards_by_bytes_and_refuses_a_foreign_schema(tmp_path: Path):
    ds = Dataset.create(tmp_path / "ds")
    with ds.unit("u", max_bytes=1, row_group_rows=3) as unit:
        unit.write_batch("trajectories", trajectories_to_batch([tool_trajectory(i) for i in range(9)]))
        try:
            unit.write_batch("trajectories", pa.table({"id": ["x"]}))
        except ValueError as exc:
            assert "schema" in str(exc)
        else:
            raise AssertionError("a batch of another schema was accepted")
    assert [sum(groups) for _, groups in _shard_layout(ds)] == [3, 3, 3]
