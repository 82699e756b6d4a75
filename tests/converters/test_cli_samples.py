"""`trajforge convert` gives what the Python API gives, and so what ADP gives, for every dataset.

Every shipped raw sample goes through the CLI as a user runs it, in chunks of 3 rows so that
episodes of step rows (nnetnav, android_in_the_wild) cross chunk boundaries and session lists
(screenagent) are split; the written records must equal the API's records (same ids, same
content) and ADP's standardized sample step by step (`_compare.assert_matches_adp`). Every
converter fixture goes through the CLI as JSONL and must equal the API's records.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))

from _compare import ADP_DIR, FIXTURES, assert_matches_adp, load, sample_datasets, units
from converters.registry import get_converter
from flows.cli import app
from schemas.store import Dataset

runner = CliRunner()


def _cli_convert(name: str, inputs: list[Path], out: Path, rows: int | None = None) -> list[Any]:
    args = ["convert", "--source", name, "--output", str(out), "--chunk-size", "3"]
    for path in inputs:
        args += ["--input", str(path)]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "quarantined 0 " in result.output, result.output
    if rows is not None:  # rows grouped into episodes or split into records: the summary says how many
        assert re.search(rf"rows read\W+{rows}\b", result.output), result.output
    return list(Dataset.open(out).iter_records())


def _api_convert(name: str, raws: list[Any]) -> dict[str, Any]:
    fn = get_converter(name).fn
    out: dict[str, Any] = {}
    for record in units(name, raws):
        t = fn(record)
        out.setdefault(t.id, t)  # the pipeline keeps the first copy of a repeated record
    return out


@pytest.mark.parametrize("name", sample_datasets())
def test_cli_matches_api_and_adp_for_every_shipped_sample(name: str, tmp_path: Path) -> None:
    raw_file = ADP_DIR / name / "sample_raw.json"
    raws = load(raw_file)
    grouped = len(units(name, raws)) != len(raws)
    written = _cli_convert(name, [raw_file], tmp_path / "out", len(raws) if grouped else None)
    assert {t.id: t for t in written} == _api_convert(name, raws)
    assert len({t.id for t in written}) == len(written)
    assert_matches_adp(name, written)


FIXTURE_SOURCES = {"apigen_mt": "apigen_mt", "xlam": "xlam", "xlam_fc": "xlam_fc", "turkingbench": "turkingbench",
                   "agenttuning_mind2web": "agenttuning_mind2web", "androidcontrol": "androidcontrol",
                   "eto": "eto", "nnetnav_live": "nnetnav-live", "omniact": "omniact",
                   "screenagent": "screenagent", "swe_play_trajectories": "swe-play-trajectories"}


def test_every_fixture_has_a_source() -> None:
    assert {p.stem for p in FIXTURES.glob("*.json")} == set(FIXTURE_SOURCES)


@pytest.mark.parametrize("fixture", sorted(FIXTURE_SOURCES))
def test_cli_matches_api_for_every_converter_fixture(fixture: str, tmp_path: Path) -> None:
    name = FIXTURE_SOURCES[fixture]
    records = load(FIXTURES / f"{fixture}.json")["records"]
    jsonl = tmp_path / f"{fixture}.jsonl"
    jsonl.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    written = _cli_convert(name, [jsonl], tmp_path / "out")
    expected = _api_convert(name, records)
    assert expected and {t.id: t for t in written} == expected


def test_go_browse_wa_standardized_input_through_the_cli(tmp_path: Path) -> None:
    std = ADP_DIR / "go-browse-wa" / "sample_std.json"
    written = _cli_convert("go-browse-wa", [std], tmp_path / "out")
    assert {t.id: t for t in written} == _api_convert("go-browse-wa", load(std))
