"""Readers: every input format yields the same records, chunking is stable, bad input is fatal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import datasets
import orjson
import pytest

from pipelines.inputs import InputError, ParseFailure, plan_chunks, read_chunk
from tests.pipelines._data import uniform, write_jsonl, write_parquet

REPO = Path(__file__).resolve().parents[2]


def _read_all(inputs: list[str], chunk_size: int) -> list[tuple[str, object]]:
    return [pair for chunk in plan_chunks(inputs, chunk_size) for pair in read_chunk(chunk)]


@pytest.fixture()
def format_files(tmp_path: Path, adp_records: list[dict]) -> dict[str, Path]:
    records = uniform(adp_records)
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(records).save_to_disk(str(saved))
    return {
        "jsonl": write_jsonl(tmp_path / "r.jsonl", records),
        "gz": write_jsonl(tmp_path / "r.jsonl.gz", records),
        "zst": write_jsonl(tmp_path / "r.jsonl.zst", records),
        "parquet": write_parquet(tmp_path / "r.parquet", records),
        "datasets": saved,
        "json": tmp_path / "r.json",
    }


@pytest.mark.parametrize("chunk_size", [1, 10, 1000])
def test_every_format_reads_the_same_records_in_order(format_files, adp_records, chunk_size):
    records = uniform(adp_records)
    format_files["json"].write_bytes(orjson.dumps(records))
    for name, path in format_files.items():
        got = _read_all([str(path)], chunk_size)
        assert [raw for _, raw in got] == records, name
        locations = [loc for loc, _ in got]
        assert len(set(locations)) == len(records), name
    jsonl = _read_all([str(format_files["jsonl"])], chunk_size)
    assert jsonl[0][0].endswith("r.jsonl:1") and jsonl[-1][0].endswith(f"r.jsonl:{len(records)}")
    assert _read_all([str(format_files["parquet"])], chunk_size)[3][0].endswith("r.parquet@3")
    assert _read_all([str(format_files["json"])], chunk_size)[2][0].endswith("r.json#2")


def test_chunks_are_stable_and_cover_every_line(tmp_path):
    path = write_jsonl(tmp_path / "n.jsonl", [{"i": i} for i in range(23)])
    chunks = plan_chunks([str(path)], 5)
    assert [(c.start, c.stop) for c in chunks] == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 23)]
    assert [c.unit for c in chunks] == [c.unit for c in plan_chunks([str(path)], 5)]
    assert len({c.unit for c in chunks}) == 5
    assert [raw["i"] for c in chunks for _, raw in read_chunk(c)] == list(range(23))
    exact = write_jsonl(tmp_path / "e.jsonl", [{"i": i} for i in range(10)])  # ends on a boundary
    assert len(plan_chunks([str(exact)], 5)) == 2
    no_newline = tmp_path / "nn.jsonl"
    no_newline.write_bytes(b'{"i": 0}\n{"i": 1}')
    assert [raw for c in plan_chunks([str(no_newline)], 1) for _, raw in read_chunk(c)] == [{"i": 0}, {"i": 1}]


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 24])
def test_chunk_offsets_and_line_numbers_do_not_depend_on_the_read_block(tmp_path, monkeypatch, block):
    """Line boundaries are found across read blocks: every record, blank lines skipped, right line numbers."""
    import pipelines.inputs as inputs

    monkeypatch.setattr(inputs, "_BLOCK", block)
    lines = [b'{"i": %d}' % i if i % 4 else b"  " for i in range(1, 30)]
    for name, data in {"trailing": b"\n".join(lines) + b"\n", "no-trailing": b"\n".join(lines),
                       "one": b'{"i": 1}', "empty": b""}.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(data)
        expected = [(f"{path}:{n}", orjson.loads(line)) for n, line in enumerate(data.split(b"\n"), 1)
                    if line.strip()]
        n_lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
        for chunk_size in (1, 3, 29, 100):
            assert _read_all([str(path)], chunk_size) == expected, (name, chunk_size)
            chunks = plan_chunks([str(path)], chunk_size)
            assert sum(c.stop - c.start for c in chunks) == n_lines, (name, chunk_size)
            assert len(chunks) == -(-n_lines // chunk_size), (name, chunk_size)


def test_json_object_and_id_map(tmp_path):
    single = tmp_path / "one.json"
    single.write_bytes(orjson.dumps({"id": "a", "content": []}))
    assert [raw for _, raw in _read_all([str(single)], 10)] == [{"id": "a", "content": []}]
    by_id = tmp_path / "map.json"
    by_id.write_bytes(orjson.dumps({"a": {"x": 1}, "b": {"x": 2}}))
    got = _read_all([str(by_id)], 1)
    assert [loc.rsplit("#", 1)[1] for loc, _ in got] == ["a", "b"]


def test_bad_lines_are_parse_failures_not_errors(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"ok": 1}\n{"trunc": \n\n{"bytes": "\xff\xfe"}\n')
    got = _read_all([str(path)], 2)
    assert got[0][1] == {"ok": 1}
    assert isinstance(got[1][1], ParseFailure) and got[1][0].endswith(":2")
    assert isinstance(got[2][1], ParseFailure) and got[2][0].endswith(":4")
    assert got[2][1].error_class == "UnicodeDecodeError" and "\ufffd" in got[2][1].text


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing.jsonl", "no such file"),
        (lambda d: (d / "x.csv").write_text("a") and d / "x.csv", "unsupported input type"),
        (lambda d: (d / "b.json").write_text("[{") and d / "b.json", "not valid JSON"),
        (lambda d: (d / "t.jsonl.gz").write_bytes(b"\x1f\x8b\x08garbage") and d / "t.jsonl.gz", "cannot read"),
        (lambda d: (d / "p.parquet").write_bytes(b"PAR1 no") and d / "p.parquet", "Parquet"),
        (lambda d: d, "not a saved `datasets` directory"),
    ],
)
def test_unreadable_inputs_are_fatal_with_the_file_named(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(InputError, match=message) as info:
        plan_chunks([str(path)], 10)
    assert str(path.name) in str(info.value) or str(path) in str(info.value)


def test_hub_dataset_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(InputError, match="hf:nobody/no-such-dataset-xyz: cannot load from the Hugging Face hub"):
        plan_chunks(["hf:nobody/no-such-dataset-xyz"], 10)


def test_parquet_row_with_invalid_utf8_is_a_parse_failure_and_the_rest_reads(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Arrow does not check UTF-8 when it writes or reads: a foreign writer can leave bad bytes.
    ids = pa.array([b"a", b"b\xff\xfe", b"c"], pa.binary()).view(pa.string())
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ids, "n": [1, 2, 3]}), path)
    got = _read_all([str(path)], 1000)
    assert [loc for loc, _ in got] == [f"{path}@0", f"{path}@1", f"{path}@2"]
    assert got[0][1] == {"id": "a", "n": 1} and got[2][1] == {"id": "c", "n": 3}
    bad = got[1][1]
    assert isinstance(bad, ParseFailure) and "invalid UTF-8" in bad.error
    assert "'n': 2" in bad.text and "b\ufffd" in bad.text  # the row is kept, bad bytes replaced


def test_planning_a_big_jsonl_file_does_not_map_it_into_memory(tmp_path):
    big = tmp_path / "big.jsonl"
    line = b'{"id": "x", "text": "' + b"y" * 4000 + b'"}\n'
    with open(big, "wb") as fh:
        for _ in range(64):
            fh.write(line * 256)  # 64 MiB in all
    # 1 MiB blocks: what stays resident is a block and its flags, whatever the file's size. The
    # peak is measured from just before planning (writing 5 to clear_refs resets it).
    script = """
import sys
from pipelines import inputs
def status(key):
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1])
inputs._BLOCK = 1 << 20
before = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")
inputs.plan_chunks([sys.argv[1]], 1000)
print(status("VmHWM:") - before)
"""
    grown_kib = int(subprocess.run([sys.executable, "-c", script, str(big)], capture_output=True, text=True,
                                   check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout)
    assert grown_kib < 16 * 1024, f"planning grew resident memory by {grown_kib // 1024} MiB for a 64 MiB file"
