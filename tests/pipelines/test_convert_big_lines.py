"""A JSONL line above the record size limit is quarantined with its size, never read whole: the
convert command's memory stays bounded by the limit, not by the longest line."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import orjson
from typer.testing import CliRunner

from converters.registry import get_converter
from flows.cli import app
from pipelines.inputs import plan_chunks, read_chunk
from schemas.store import Dataset
from tests.pipelines._data import write_jsonl

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples" / "adp"


def _big(record: dict, size: int) -> bytes:
    """`record` as one JSONL line of about `size` bytes (a long field)."""
    return orjson.dumps({**record, "padding": "x" * size})


def test_a_line_above_the_limit_is_quarantined_with_its_size(tmp_path, adp_records):
    good = adp_records[:4]
    big = _big(good[3], 3_000_000)
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join([*(orjson.dumps(r) for r in good[:3]), big, orjson.dumps(good[0])]) + b"\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["convert", "--source", "adp", "--input", str(source), "--output", str(out),
                                      "--chunk-size", "2", "--max-record-bytes", "1000000"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "in 5 = out 3 + quarantined 1 + duplicates 1" in result.output and "parse:RecordTooLarge" in result.output
    (q,) = Dataset.open(out).iter_records("quarantine")
    assert q.location == f"{source}:4"
    assert q.error == f"{source}:4: record too large: {len(big):,} bytes (the limit is 1,000,000; --max-record-bytes raises it)"
    assert q.raw.startswith(big[:4096].decode()) and q.raw.endswith(f"...[{len(big) - 4096:,} more bytes not kept]")


def test_compressed_and_episode_inputs_read_past_a_long_line(tmp_path):
    """Compressed JSONL and step-row episodes (which look back and forth across chunk starts) too."""
    rows = orjson.loads((SAMPLES / "nnetnav-wa" / "sample_raw.json").read_bytes())[:20]
    long_row = len(orjson.dumps(rows[10])) + 10
    rows[10] = {**rows[10], "padding": "y" * 100_000}
    plain = write_jsonl(tmp_path / "steps.jsonl", rows)
    packed = tmp_path / "steps.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for source in (plain, packed):
        chunks = plan_chunks([str(source)], 4, get_converter("nnetnav-wa").episode_key, max_record_bytes=long_row)
        read = [raw for chunk in chunks for _, raw in read_chunk(chunk)]
        assert len(read) == 20
        assert [type(r).__name__ for r in read].count("ParseFailure") == 1
        assert read[10].error.startswith(f"record too large: {len(orjson.dumps(rows[10])):,} bytes")


# The command's own peak (VmHWM: its memory map's, begun at exec; ru_maxrss would keep the peak of
# the test process it was forked from).
_PEAK = """
import re, sys
from flows.cli import app
sys.argv = ["trajforge", *sys.argv[1:]]
try:
    app()
finally:
    status = open("/proc/self/status").read()
    print("peak-rss-kb", re.search(r"VmHWM:\\s+(\\d+) kB", status)[1], file=sys.stderr)
"""


def _peak_rss_kb(tmp_path: Path, source: Path, out: str, *extra: str) -> int:
    result = subprocess.run([sys.executable, "-c", _PEAK, "convert", "--source", "adp", "--input", str(source),
                             "--output", str(tmp_path / out), *extra], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return int(result.stderr.rsplit("peak-rss-kb", 1)[1].split()[0])


def test_memory_is_bounded_by_the_limit_not_by_the_line(tmp_path, adp_records):
    """Parsed, a line costs several times its size; read past, nothing that grows with it. Both lines
    exceed the planner's scan block (16 MiB), so what planning holds is the same for both files."""
    records = b"".join(orjson.dumps(r) + b"\n" for r in adp_records[:3])
    peaks = []
    for name, size in (("20mb", 20_000_000), ("80mb", 80_000_000)):
        source = tmp_path / f"{name}.jsonl"
        source.write_bytes(records + _big(adp_records[0], size) + b"\n")
        peaks.append(_peak_rss_kb(tmp_path, source, name, "--max-record-bytes", "1000000"))
        source.unlink()
    assert peaks[1] - peaks[0] < 30_000, peaks  # KB: 60 MB more of line, less than 30 MB more memory
    assert [Dataset.open(tmp_path / name).count("quarantine") for name in ("20mb", "80mb")] == [1, 1]
