"""The export driver end to end: HF-loadable output, dataset card, mixing, sharding, streaming, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from converters.export import ExportConfig, export
from converters.export import writer as writer_mod
from converters.export.mix import MixError, copies, parse_mix
from converters.export.run import FAILED, MASKED_IN_MESSAGES, ExportError
from flows.cli import app
from schemas.store import Dataset, StoreError
from tests.export import _data

FORMATS = ["trl-sft", "trl-dpo", "trl-kto", "openai", "sharegpt"]


def _front_matter(out: Path) -> dict:
    text = (out / "README.md").read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def _load(out: Path) -> datasets.Dataset:
    # A private cache: `datasets` keys a folder's cache by its name, so two exports in folders
    # of the same name would otherwise share a stale cache.
    return datasets.load_dataset(str(out), split="train", cache_dir=str(out.parent / f".hf-cache-{out.name}"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_is_a_loadable_hf_dataset_with_a_card(hand_dataset, tmp_path, fmt):
    out = tmp_path / fmt
    report = export(hand_dataset, out, ExportConfig(format=fmt))
    assert report.records_in == report.records_exported + report.skipped_total
    assert report.rows >= 1
    meta = _front_matter(out)
    assert meta["configs"] == [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}]
    loaded = _load(out)
    assert len(loaded) == report.rows
    ext = "jsonl" if fmt == "openai" else "parquet"
    assert [p.name for p in report.files] == [f"train-00000-of-00001.{ext}"]
    if ext == "parquet":
        direct = datasets.load_dataset("parquet", data_files=[str(p) for p in report.files], split="train",
                                       cache_dir=str(tmp_path / ".hf-cache-direct"))
        assert direct.column_names == loaded.column_names
    card = (out / "README.md").read_text()
    assert "approximate" in card.lower() and "## Source mix" in card and "input records" in card


def test_sft_layouts_skip_reasons_and_masked_steps_refused_in_messages_rows(hand_dataset, tmp_path):
    report = export(hand_dataset, tmp_path / "sft", ExportConfig(format="trl-sft"))
    assert report.sft_layout == "prompt-completion"
    assert report.skipped == {"no assistant turn": 1, FAILED: 2}
    assert report.records_exported == 4 and report.rows == 5  # the interleaved trajectory gives two rows
    rows = _load(tmp_path / "sft")
    assert set(rows.column_names) == {"id", "source", "segment", "prompt", "completion", "tools"}
    assert rows.features["completion"].feature["tool_calls"].feature["function"]["arguments"] == datasets.Json()
    assert not report.notes
    # messages rows would train masked steps (TRL reads no per-message flag): refused in one line, or skipped.
    result = CliRunner().invoke(app, ["export", str(hand_dataset), "--format", "trl-sft", "--sft-layout", "messages",
                                      "--output", str(tmp_path / "refused")])
    assert result.exit_code == 1 and "record 't-masked' has train=false assistant steps" in result.output
    assert not list((tmp_path / "refused").glob("data/train-*"))
    report = export(hand_dataset, tmp_path / "sft-msg", ExportConfig(format="trl-sft", sft_layout="messages",
                                                                     skip_unfit_rows=True))
    assert report.skipped == {"no assistant turn": 1, FAILED: 2, MASKED_IN_MESSAGES: 2} and report.rows == 2
    assert all(m["train"] for row in _load(tmp_path / "sft-msg") for m in row["messages"] if m["role"] == "assistant")
    card = (tmp_path / "sft-msg" / "README.md").read_text()
    assert f"skipped: {MASKED_IN_MESSAGES}" in card and "SFTConfig(assistant_only_loss=True, max_length=None)" in card
    report = export(hand_dataset, tmp_path / "sft-all", ExportConfig(format="trl-sft", include_failed=True))
    assert report.skipped == {"no assistant turn": 1} and report.records_exported == 6


def test_dpo_joins_pairs_and_counts_missing_trajectories(tmp_path):
    pair, chosen, rejected = _data.branch_pair()
    orphan = pair.model_copy(update={"id": "p0-orphan", "rejected_id": "nope"})
    src = _data.store(tmp_path / "src", [rejected, _data.tool_traj(), chosen], [pair, orphan])
    report = export(src, tmp_path / "dpo", ExportConfig(format="trl-dpo"))
    assert (report.records_in, report.records_exported) == (2, 1)
    assert report.skipped == {"missing rejected trajectory": 1}
    (row,) = _load(tmp_path / "dpo")
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "tool"]
    assert row["chosen"][0]["content"] == "The answer is 4."


def test_openai_jsonl_lines(hand_dataset, tmp_path):
    report = export(hand_dataset, tmp_path / "oa", ExportConfig(format="openai"))
    lines = [json.loads(x) for x in report.files[0].read_text().splitlines()]
    assert len(lines) == report.rows == 4
    assert all(set(line) <= {"messages", "tools"} for line in lines)
    weights = [m["weight"] for line in lines for m in line["messages"] if m["role"] == "assistant"]
    assert set(weights) == {0, 1} and weights.count(0) == 2
    assert not any("reasoning_content" in m for line in lines for m in line["messages"])  # openai default


def test_multi_shard_export(adp_dataset, tmp_path):
    report = export(adp_dataset, tmp_path / "out", ExportConfig(format="trl-sft", shard_rows=7))
    n = len(report.files)
    assert n == -(-report.rows // 7) and n > 5
    assert [p.name for p in report.files] == [f"train-{k:05d}-of-{n:05d}.parquet" for k in range(n)]
    assert [pq.ParquetFile(p).metadata.num_rows for p in report.files[:-1]] == [7] * (n - 1)
    assert not list((tmp_path / "out" / "data").glob(".tmp-*"))
    loaded = _load(tmp_path / "out")
    assert len(loaded) == report.rows
    assert report.records_in == Dataset.open(adp_dataset).count()


def test_export_streams_rows_out_before_the_input_is_exhausted(tmp_path, monkeypatch):
    src = _data.store(tmp_path / "src", [_data.tool_traj(f"t{i}") for i in range(2000)], max_rows=100)
    read = 0
    real_iter = Dataset.iter_batches

    def counting(self, table="trajectories", **kw):
        nonlocal read
        for batch in real_iter(self, table, **kw):
            read += batch.num_rows
            yield batch

    seen_at_close: list[int] = []
    real_close = writer_mod.ShardWriter._close_shard

    def close_shard(self):
        seen_at_close.append(read)
        real_close(self)

    monkeypatch.setattr(Dataset, "iter_batches", counting)
    monkeypatch.setattr(writer_mod.ShardWriter, "_close_shard", close_shard)
    report = export(src, tmp_path / "out", ExportConfig(format="trl-sft", shard_rows=50))
    # The first shard was finished when only a fraction of the input had been read (read-ahead and
    # the writer's queue hold a few batches, not the input).
    assert report.rows == 2000 and seen_at_close[0] <= 500


def test_writer_splits_shards_and_row_groups_and_fails_without_partial_shards(tmp_path):
    schema = pa.schema([("id", pa.string())])
    w = writer_mod.ShardWriter(tmp_path / "a", "parquet", schema, shard_rows=40, row_group_rows=10)
    for start in range(0, 95, 30):
        w.write_batch(pa.record_batch([pa.array([str(i) for i in range(start, min(start + 30, 95))])], schema=schema))
    files = w.close()
    assert [pq.ParquetFile(p).metadata.num_rows for p in files] == [40, 40, 15]
    assert all(pq.ParquetFile(p).metadata.row_group(g).num_rows <= 10
               for p in files for g in range(pq.ParquetFile(p).metadata.num_row_groups))
    assert pq.read_table(tmp_path / "a").column("id").to_pylist() == [str(i) for i in range(95)]
    w = writer_mod.ShardWriter(tmp_path / "b", "parquet", schema, shard_rows=40)
    w.write_batch(pa.record_batch([pa.array(["x"])], schema=schema))
    w.write_batch(pa.record_batch([pa.array([1])], names=["id"]))  # the wrong schema: fails in the writer thread
    with pytest.raises((ValueError, pa.ArrowInvalid)):
        w.close()
    w.abort()
    assert not list((tmp_path / "b").iterdir())


def test_mix_is_deterministic_per_seed_and_excludes_unlisted_sources(tmp_path):
    trajs = [_data.tool_traj(f"a{i}", source="a") for i in range(200)]
    trajs += [_data.tool_traj(f"b{i}", source="b") for i in range(50)]
    trajs += [_data.tool_traj(f"c{i}", source="c") for i in range(10)]
    src = _data.store(tmp_path / "src", trajs)

    def ids(seed: int, name: str) -> list[str]:
        report = export(src, tmp_path / name, ExportConfig(format="trl-sft", mix={"a": 0.25, "b": 2}, seed=seed))
        assert report.skipped["source not in --mix"] == 10
        assert report.records_in == report.records_exported + report.skipped_total
        return _load(tmp_path / name)["id"]

    first, again, other = ids(1, "s1"), ids(1, "s1b"), ids(2, "s2")
    assert first == again
    assert first != other
    a_kept = [i for i in first if i.startswith("a")]
    assert 25 <= len(a_kept) <= 75  # about a quarter of 200
    assert sum(i.startswith("b") for i in first) == 100  # every b twice
    assert not any(i.startswith("c") for i in first)
    assert (tmp_path / "s1" / "data").is_dir()
    assert "a=0.25" in (tmp_path / "s1" / "README.md").read_text()


def test_mix_parsing_and_copies():
    assert parse_mix("a=0.5, b=2") == {"a": 0.5, "b": 2.0}
    assert parse_mix(None) is None
    for bad in ("a", "a=x", "a=-1", "=1", "a=inf"):
        with pytest.raises(MixError):
            parse_mix(bad)
    assert copies(3.0, 0, "x") == 3 and copies(0.0, 0, "x") == 0
    assert {copies(1.5, 7, f"r{i}") for i in range(100)} == {1, 2}


def test_bad_input_errors(hand_dataset, tmp_path):
    with pytest.raises(StoreError):
        export(tmp_path / "missing", tmp_path / "o1", ExportConfig(format="trl-sft"))
    with pytest.raises(ExportError, match="unknown format"):
        export(hand_dataset, tmp_path / "o2", ExportConfig(format="alpaca"))
    export(hand_dataset, tmp_path / "o3", ExportConfig(format="trl-sft"))
    with pytest.raises(ExportError, match="not empty"):
        export(hand_dataset, tmp_path / "o3", ExportConfig(format="trl-sft"))
    export(hand_dataset, tmp_path / "o3", ExportConfig(format="openai", overwrite=True))
    assert [p.name for p in (tmp_path / "o3" / "data").iterdir()] == ["train-00000-of-00001.jsonl"]
    with pytest.raises(ExportError, match="inside"):
        export(hand_dataset, hand_dataset / "out", ExportConfig(format="trl-sft"))


def test_cli_export_summary_and_one_line_errors(hand_dataset, tmp_path):
    runner = CliRunner()
    # Wide enough that no path wraps, however long the temp dir (an xdist worker's is longer).
    result = runner.invoke(app, ["export", str(hand_dataset), "--format", "trl-kto", "--output", str(tmp_path / "k"),
                                 "--shard-rows", "2", "--seed", "3"], env={"COLUMNS": "1000"})
    assert result.exit_code == 0, result.output
    assert "records in" in result.output and "no success label" in result.output
    assert f"train: trajforge train {tmp_path / 'k'} --base MODEL" in result.output
    assert "README.md, section Training)" in result.output
    assert len(list((tmp_path / "k" / "data").glob("train-*.parquet"))) == 5  # 10 rows
    for args, message in [
        ([str(tmp_path / "nope"), "--format", "trl-sft"], "no such dataset directory"),
        ([str(hand_dataset), "--format", "alpaca"], "unknown format"),
        ([str(hand_dataset), "--format", "trl-sft", "--mix", "a=b"], "not a number"),
        ([str(hand_dataset), "--format", "tokenized"], "needs --tokenizer PATH"),
        ([str(hand_dataset), "--format", "trl-sft", "--tokenizer", "x"], "apply to --format tokenized only"),
        ([str(hand_dataset), "--format", "tokenized", "--tokenizer", str(tmp_path / "none")], "no such directory"),
        ([str(hand_dataset), "--format", "trl-dpo", "--dpo-level", "pair"], "unknown DPO level"),
        ([str(hand_dataset), "--format", "trl-sft", "--sft-layout", "auto"], "unknown SFT layout"),
    ]:
        result = runner.invoke(app, ["export", *args, "--output", str(tmp_path / "x")])
        assert result.exit_code == 1
        assert message in result.output and "Traceback" not in result.output


def test_adp_samples_export_in_every_trajectory_format(adp_dataset, tmp_path):
    for fmt in ["trl-sft", "openai", "sharegpt"]:
        report = export(adp_dataset, tmp_path / fmt, ExportConfig(format=fmt))
        assert report.records_in == report.records_exported + report.skipped_total
    # No sample has a success label: KTO has nothing to learn from, and says so instead of writing 0 rows.
    with pytest.raises(ExportError, match=r"none of the 126 trajectories .* gives a trl-kto row \(126 no success label\)"):
        export(adp_dataset, tmp_path / "trl-kto", ExportConfig(format="trl-kto"))
    assert not (tmp_path / "trl-kto").exists()
    # Three samples (android_in_the_wild, androidcontrol x2) open with the agent's own message: no prompt
    # to train it from.
    assert export(adp_dataset, tmp_path / "sft2", ExportConfig(format="trl-sft")).skipped == {
        "no prompt before the first assistant turn": 3}
