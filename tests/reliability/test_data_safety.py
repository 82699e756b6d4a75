"""Never destroy or read outside a dataset, through the commands users run.

- filter, dedup and mix refuse an output that is, lies inside or contains an input, before writing;
- an output that is a non-empty directory without a trajforge manifest is refused, and recovery
  only ever removes files trajforge names as temporary;
- a manifest's shard paths must resolve inside the dataset (no absolute path, no '..', no link out)
  for every reader: validate, stats, filter, dedup, export, mix;
- stats counts rows from the shards, not the manifest's word for it;
- mix writes each record id once and counts the duplicates it dropped.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from schemas.store import MANIFEST, Dataset
from tests.cli_errors import one_error_line as _one_error_line
from tests.conftest import REPO
from tests.filters.conftest import make_dataset, records

ADP_SAMPLE = REPO / "samples" / "adp" / "agenttuning_os" / "sample_std.json"


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def _snapshot(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    make_dataset(tmp_path / "ds", records(8))
    return tmp_path / "ds"


@pytest.fixture
def filters_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "filters.yaml"
    path.write_text(yaml.safe_dump([{"name": "well_formed"}]))
    return path


def _stage(kind: str, src: Path, out: Path, filters_yaml: Path) -> list[Any]:
    if kind == "filter":
        return ["filter", src, "--config", filters_yaml, "--output", out]
    if kind == "dedup":
        return ["dedup", src, "--output", out]
    return ["mix", src, "--output", out]


@pytest.mark.parametrize("kind", ["filter", "dedup", "mix"])
def test_output_overlapping_the_input_is_refused_before_anything_is_written(kind, dataset, filters_yaml):
    before = _snapshot(dataset)
    for out, said in ((dataset, "is the input"), (dataset / "out", "inside the input"),
                      (dataset.parent, "contains the input")):
        for extra in ([], ["--overwrite"]):
            result = _cli(*_stage(kind, dataset, out, filters_yaml), *extra)
            _one_error_line(result, str(out), said)
            assert _snapshot(dataset) == before, f"{kind} -> {out} {extra} changed the input"
            assert not (dataset / "out").exists()
    # A link to the input is the input.
    link = dataset.parent / "link"
    link.symlink_to(dataset)
    _one_error_line(_cli(*_stage(kind, dataset, link, filters_yaml), "--overwrite"), "is the input")
    assert _snapshot(dataset) == before


def test_a_directory_that_is_not_a_dataset_is_never_written_into(tmp_path):
    """convert -o Y where Y holds the user's own files: refused, with --overwrite too; nothing removed."""
    out = tmp_path / "mine"
    (out / "trajectories").mkdir(parents=True)
    own = out / "trajectories" / "mine.parquet"
    own.write_bytes(b"the user's own data")
    for extra in ([], ["--overwrite"]):
        result = _cli("convert", "--source", "adp", "--input", ADP_SAMPLE, "--output", out, *extra)
        _one_error_line(result, str(out), "not a trajforge dataset")
        assert own.read_bytes() == b"the user's own data" and sorted(p.name for p in out.rglob("*")) == [
            "mine.parquet", "trajectories"]
    # An empty directory (or one a killed run left with only trajforge's own folders) is fine.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _cli("convert", "--source", "adp", "--input", ADP_SAMPLE, "--output", empty).exit_code == 0


def test_recovery_removes_only_trajforge_temp_files(tmp_path):
    """A resumed or overwritten stage removes its own temp files and listed shards, never a stranger's file."""
    out = tmp_path / "out"
    assert _cli("convert", "--source", "adp", "--input", ADP_SAMPLE, "--output", out).exit_code == 0
    own = out / "trajectories" / "mine.parquet"
    own.write_bytes(b"the user's own data")
    temp = out / "trajectories" / ".tmp-u-00000-dead.parquet"
    temp.write_bytes(b"partial")
    rows = Dataset.open(out).count()
    assert _cli("convert", "--source", "adp", "--input", ADP_SAMPLE, "--output", out).exit_code == 0  # resume
    assert own.exists() and not temp.exists()
    assert _cli("convert", "--source", "adp", "--input", ADP_SAMPLE, "--output", out, "--overwrite").exit_code == 0
    assert own.read_bytes() == b"the user's own data"
    assert Dataset.open(out).count() == rows > 0 and own not in Dataset.open(out).shard_files()


def _point_a_shard_at(dataset: Path, target: str) -> None:
    manifest = json.loads((dataset / MANIFEST).read_text())
    unit = next(iter(manifest["units"].values()))
    unit["tables"]["trajectories"][0]["file"] = target
    (dataset / MANIFEST).write_text(json.dumps(manifest))


READERS = ["validate", "stats", "filter", "dedup", "export", "mix"]


def _reader_args(reader: str, dataset: Path, out: Path, filters_yaml: Path) -> list[Any]:
    if reader in ("validate", "stats"):
        return [reader, dataset]
    if reader == "export":
        return ["export", dataset, "--format", "trl-sft", "--output", out]
    return _stage(reader, dataset, out, filters_yaml)


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_shard_paths_outside_the_dataset_are_refused_by_every_reader(how, tmp_path, filters_yaml):
    outside = tmp_path / "outside"
    make_dataset(outside, records(3))
    secret = Dataset.open(outside).shard_files()[0]
    dataset = tmp_path / "ds"
    make_dataset(dataset, [r.model_copy(update={"id": f"mine-{i}"}) for i, r in enumerate(records(8))])
    if how == "dotdot":
        _point_a_shard_at(dataset, f"../outside/{secret.relative_to(outside)}")
    elif how == "absolute":
        _point_a_shard_at(dataset, str(secret))
    else:
        shard = Dataset.open(dataset).shard_files()[0]
        shard.unlink()
        shard.symlink_to(secret)
    for reader in READERS:
        out = tmp_path / f"out-{reader}"
        result = _cli(*_reader_args(reader, dataset, out, filters_yaml))
        line = _one_error_line(result, "outside the dataset" if how == "symlink" else "inside the dataset")
        assert str(dataset) in line
        assert not out.exists() or not list(out.rglob("*.parquet")), f"{reader} wrote rows"


@pytest.fixture
def no_serving(monkeypatch):
    """`trajforge view` runs up to serving; the app it would serve is kept, nothing listens."""
    from viewer import server

    seen: dict[str, Any] = {}

    def record(app_: Any, sock: Any) -> None:
        seen["app"] = app_
        sock.close()

    monkeypatch.setattr(server, "serve", record)
    return seen


@pytest.mark.parametrize("pattern", ["s*.parquet", "s?.parquet", "s[12].parquet", "{s1,s2}.parquet"])
def test_a_shard_path_holding_a_pattern_is_refused_by_every_reader(pattern, tmp_path, filters_yaml, no_serving):
    """DuckDB expands glob characters: `trajectories/s*.parquet` next to a link out would read another
    dataset's rows. A manifest naming a shard by pattern is refused (the file exists under that name)."""
    outside = tmp_path / "outside"
    make_dataset(outside, records(3))
    dataset = tmp_path / "ds"
    make_dataset(dataset, [r.model_copy(update={"id": f"mine-{i}"}) for i, r in enumerate(records(8))])
    shard = Dataset.open(dataset).shard_files()[0]
    shutil.copy(shard, dataset / "trajectories" / pattern)
    shard.rename(dataset / "trajectories" / "s1.parquet")
    (dataset / "trajectories" / "s2.parquet").symlink_to(Dataset.open(outside).shard_files()[0])
    _point_a_shard_at(dataset, f"trajectories/{pattern}")
    for reader in [*READERS, "view"]:
        out = tmp_path / f"out-{reader}"
        args = ["view", dataset, "--port", "0"] if reader == "view" else _reader_args(reader, dataset, out, filters_yaml)
        line = _one_error_line(_cli(*args), str(dataset), f"trajectories/{pattern}", "not a plain file name")
        assert "app" not in no_serving, line
        assert not out.exists() or not list(out.rglob("*.parquet")), f"{reader} wrote rows"


def test_a_dataset_under_a_folder_named_like_a_pattern_reads_its_own_shards(tmp_path, no_serving):
    """`runs[1]/ds` is read as itself, not as the `runs1/ds` DuckDB's glob would match."""
    from starlette.testclient import TestClient

    mine, decoy = tmp_path / "runs[1]" / "ds", tmp_path / "runs1" / "ds"
    make_dataset(mine, records(8))
    make_dataset(decoy, [r.model_copy(update={"id": f"decoy-{i}", "source": "decoy"}) for i, r in enumerate(records(3))])
    result = _cli("stats", mine, "--json")
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["records"] == 8 and stats["sources"] == [{"source": "test", "records": 8}]
    assert _cli("view", mine, "--port", "0").exit_code == 0
    with TestClient(no_serving["app"], base_url="http://127.0.0.1") as c:
        assert c.get("/api/0/count/trajectories").json() == {"total": 8}
        assert all(not r["id"].startswith("decoy") for r in c.get("/api/0/list/trajectories?limit=50").json()["rows"])
    result = _cli("mix", mine, "--output", tmp_path / "m")
    assert result.exit_code == 0, result.output
    assert Dataset.open(tmp_path / "m").count() == 8


def test_stats_counts_rows_from_the_shards_not_the_manifest(dataset):
    manifest = json.loads((dataset / MANIFEST).read_text())
    for unit in manifest["units"].values():
        for entry in unit["tables"]["trajectories"]:
            entry["rows"] = 999999
    (dataset / MANIFEST).write_text(json.dumps(manifest))
    result = _cli("stats", dataset, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["records"] == 8


def test_mix_writes_each_id_once_and_counts_duplicates(tmp_path):
    make_dataset(tmp_path / "a", records(10))
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the same records again, as another input
    result = _cli("mix", tmp_path / "a", tmp_path / "b", "--output", tmp_path / "m")
    assert result.exit_code == 0, result.output
    assert "10 duplicate ids dropped" in result.output
    out = Dataset.open(tmp_path / "m")
    ids = [row["id"] for row in out.iter_rows(columns=["id"])]
    assert len(ids) == len(set(ids)) == 10
    assert out.manifest()["counts"]["duplicate"] == 10
