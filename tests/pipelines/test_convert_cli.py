"""`trajforge convert` and `trajforge sources`: bad records are quarantined (exit 0),
fatal problems give one error line and a non-zero exit, re-runs skip finished chunks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
from typer.testing import CliRunner

from flows.cli import app
from schemas.store import Dataset
from tests.pipelines._data import direct

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_sources_lists_registered_converters():
    result = runner.invoke(app, ["sources"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "adp" in result.output and "neulab/agent-data-protocol" in result.output


def test_bad_lines_are_quarantined_and_rerun_skips_everything(tmp_path, adp_records):
    good = adp_records[:6]
    lines = [orjson.dumps(r) for r in good[:3]]
    lines += [
        orjson.dumps(good[3])[:50],  # truncated JSON
        b'{"id": "bytes-\xff\xfe", "content": []}',  # not UTF-8
        orjson.dumps({"id": "no-content"}),  # valid JSON the converter rejects
        b"",  # blank: not a record
    ]
    lines += [orjson.dumps(r) for r in good[4:]]
    source = tmp_path / "mixed.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    output = tmp_path / "out"
    args = ["convert", "--source", "adp", "--input", str(source), "--output", str(output), "--chunk-size", "3"]

    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "in 8 = out 5 + quarantined 3 + duplicates 0" in result.output
    assert "parse:JSONDecodeError" in result.output and "convert:ConversionError" in result.output

    ds = Dataset.open(output)
    assert {t.id: t for t in ds.iter_records()} == direct(good[:3] + good[4:])
    quarantined = {q.location.rsplit(":", 1)[1]: q for q in ds.iter_records("quarantine")}
    assert set(quarantined) == {"4", "5", "6"}
    truncated, bad_bytes, rejected = quarantined["4"], quarantined["5"], quarantined["6"]
    assert truncated.stage == "parse" and truncated.raw == orjson.dumps(good[3])[:50].decode()
    assert bad_bytes.stage == "parse" and "\ufffd" in bad_bytes.raw and "bytes-" in bad_bytes.raw
    assert rejected.stage == "convert" and "ConversionError" in rejected.error
    assert f"{source}:6" in rejected.error and orjson.loads(rejected.raw) == {"id": "no-content"}
    counts = ds.unit_counts()
    assert counts["in"] == counts["out"] + counts["quarantined"] + counts["duplicate"] == 8

    again = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert again.exit_code == 0, again.output
    assert "(0 done, 3 skipped)" in again.output
    assert "in 8 = out 5 + quarantined 3 + duplicates 0" in again.output
    assert Dataset.open(output).count() == 5 and Dataset.open(output).count("quarantine") == 3


def test_missing_input_is_one_error_line_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", "convert", "--source", "adp", "--input", str(tmp_path / "nope.jsonl"),
         "--output", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "nope.jsonl" in lines[0], result.stderr


def test_workers_with_another_runner_is_an_error_before_the_output_is_made(tmp_path, adp_files):
    out = tmp_path / "o"
    result = runner.invoke(
        app, ["convert", "--source", "adp", "-i", str(adp_files[0]), "-o", str(out), "--workers", "2",
              "--runner", "DataflowRunner"],
        env={"COLUMNS": "1000"},
    )
    assert result.exit_code == 1
    assert "--workers is for the local FnApiRunner, but the runner is DataflowRunner" in result.output
    assert not out.exists()


def test_unknown_source_lists_the_known_ones(tmp_path, adp_files):
    result = runner.invoke(
        app, ["convert", "--source", "no-such", "-i", str(adp_files[0]), "-o", str(tmp_path / "o")],
        env={"COLUMNS": "1000"},
    )
    assert result.exit_code != 0
    assert "no converter named 'no-such'" in result.output and "adp" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_second_value_after_input_is_one_error_line_not_ignored(tmp_path, adp_files):
    """`--input a.json b.json` used to convert a.json alone (b.json went to Beam, which dropped it)."""
    a, b = str(adp_files[0]), str(adp_files[1])
    out = tmp_path / "o"
    for extra in ([], ["--project", "p"], ["--streaming"]):
        result = runner.invoke(app, ["convert", "--source", "adp", "--input", a, b, "-o", str(out), *extra],
                               env={"COLUMNS": "1000"})
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert result.output.strip() == (f"error: unexpected argument {b!r}: an option takes one value (repeat it "
                                         "for more, e.g. --input a.json --input b.json)")
        assert not out.exists()
    result = runner.invoke(app, ["convert", "--source", "adp", "--input", a, "--input", b, "-o", str(out)],
                           env={"COLUMNS": "1000"})
    assert result.exit_code == 0, result.output
    expected = len(orjson.loads(adp_files[0].read_bytes())) + len(orjson.loads(adp_files[1].read_bytes()))
    assert Dataset.open(out).count() + Dataset.open(out).count("quarantine") == expected
