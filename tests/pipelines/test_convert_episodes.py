"""Episodes of step rows through the convert pipeline: one trajectory per episode however the rows
fall into chunks and input files; an episode with an unreadable row is quarantined naming it."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from converters.registry import get_converter
from pipelines.convert import run_convert
from pipelines.inputs import plan_chunks, read_chunk
from schemas.store import Dataset
from tests.pipelines._data import write_jsonl

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "adp"


def _rows(name: str) -> list[dict]:
    return orjson.loads((SAMPLES / name / "sample_raw.json").read_bytes())


def _api(name: str, rows: list[dict]) -> dict:
    info = get_converter(name)
    return {t.id: t for t in map(info.fn, info.records(rows))}


def _written(out: Path) -> dict:
    return {t.id: t for t in Dataset.open(out).iter_records()}


def test_episodes_split_over_chunks_and_input_files_are_whole(tmp_path: Path) -> None:
    rows = _rows("nnetnav-wa")  # 68 step rows, 5 episodes of 9, 4, 9, 25 and 21 rows
    # The 2nd file starts inside the 4th episode; the 3rd file (Parquet-free JSON) inside the 5th.
    files = [write_jsonl(tmp_path / "a.jsonl", rows[:30]), tmp_path / "b.json",
             write_jsonl(tmp_path / "c.jsonl", rows[50:])]
    files[1].write_bytes(orjson.dumps(rows[30:50]))
    inputs = [str(f) for f in files]
    chunks = plan_chunks(inputs, 4, get_converter("nnetnav-wa").episode_key)
    read = [raw for c in chunks for _, raw in read_chunk(c)]
    assert read == rows  # every row read once, in order
    summary = run_convert("nnetnav-wa", inputs, str(tmp_path / "out"), chunk_size=4)
    assert (summary.counts["in"], summary.counts["out"], summary.counts["quarantined"]) == (5, 5, 0)
    expected = _api("nnetnav-wa", rows)
    assert _written(tmp_path / "out") == expected
    assert sorted(len([s for s in t.steps if s.kind == "web"]) for t in expected.values()) == [4, 9, 9, 21, 25]
    # compressed JSONL is read from its start, not by byte offset: the same episodes
    packed = [str(write_jsonl(tmp_path / "a.jsonl.gz", rows[:35])), str(write_jsonl(tmp_path / "b.jsonl.zst", rows[35:]))]
    run_convert("nnetnav-wa", packed, str(tmp_path / "packed"), chunk_size=6)
    assert _written(tmp_path / "packed") == expected


def test_episode_rows_in_parquet_and_a_broken_row_quarantines_its_episode(tmp_path: Path) -> None:
    rows = _rows("nnetnav-wa")
    lines = [orjson.dumps(r) for r in rows]
    lines[12] = lines[12][:40]  # a row of the 2nd episode (rows 9-12) cut mid-JSON
    source = tmp_path / "steps.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    summary = run_convert("nnetnav-wa", [str(source)], str(tmp_path / "out"), chunk_size=5)
    c = summary.counts
    assert (c["in"], c["out"], c["quarantined"], c["duplicate"]) == (5, 4, 1, 0)
    ds = Dataset.open(tmp_path / "out")
    (bad,) = list(ds.iter_records("quarantine"))
    episode = rows[9]["id"]
    assert f"episode {episode!r} cannot be completed: row {source}:13 is unreadable" in bad.error
    assert bad.location == f"{source}:10..{source}:13"
    assert orjson.dumps(rows[10]).decode() in bad.raw  # nothing of the episode is lost
    assert summary.quarantine_reasons == {"parse:IncompleteEpisode": 1}
    assert _written(tmp_path / "out") == _api("nnetnav-wa", rows[:9] + rows[13:])

    aitw = _rows("android_in_the_wild")
    pq.write_table(pa.Table.from_pylist(aitw), tmp_path / "aitw.parquet", row_group_size=1)
    run_convert("android_in_the_wild", [str(tmp_path / "aitw.parquet")], str(tmp_path / "aitw"), chunk_size=1)
    (t,) = _written(tmp_path / "aitw").values()
    assert t == next(iter(_api("android_in_the_wild", aitw).values()))


def test_session_lists_are_split_into_their_items(tmp_path: Path) -> None:
    sessions = _rows("screenagent")
    out = tmp_path / "out"
    summary = run_convert("screenagent", [str(SAMPLES / "screenagent" / "sample_raw.json")], str(out), chunk_size=1)
    assert summary.counts["in"] == summary.counts["out"] == sum(len(s) for s in sessions)
    locations = {t.provenance.source_id for t in Dataset.open(out).iter_records()}
    assert f"{sessions[1][3]['session_id']}_3" in locations


def test_the_flow_convert_stage_groups_episodes_across_its_inputs(tmp_path: Path) -> None:
    import yaml

    from flows.pipeline import convert_stage
    from flows.pipeline_config import load_pipeline_config

    rows = _rows("nnetnav-wa")
    first, second = write_jsonl(tmp_path / "a.jsonl", rows[:25]), write_jsonl(tmp_path / "b.jsonl", rows[25:])
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({"output": str(tmp_path / "run"), "convert": [
        {"name": "nav", "source": "nnetnav-wa", "inputs": [str(first), str(second)], "chunk_size": 4}]}))
    state = convert_stage.fn(load_pipeline_config(config), 0)  # the task's body, without a Prefect server
    assert state["counts"]["in"] == state["counts"]["out"] == 5
    assert _written(Path(state["output"])) == _api("nnetnav-wa", rows)


def test_blank_lines_in_compressed_step_rows_do_not_move_episode_starts(tmp_path: Path) -> None:
    rows = _rows("nnetnav-wa")
    lines = [orjson.dumps(r) for r in rows]
    for i in (3, 8, 9, 20):
        lines[i] += b"\n"  # a blank line after rows 3, 8, 9 and 20
    source = tmp_path / "steps.jsonl.gz"
    source.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    chunks = plan_chunks([str(source)], 5, get_converter("nnetnav-wa").episode_key)
    assert [raw for c in chunks for _, raw in read_chunk(c)] == rows
    starts = [next(read_chunk(c))[1]["id"] for c in chunks if c.rows]
    assert starts == list(dict.fromkeys(starts))  # no episode starts in two chunks
