"""Bad input, generated with hypothesis: converters, input readers and the CLI's file inputs.

tests/converters/test_fuzz.py checks that a converter raises only ConversionError on mutated
records. This module checks what the stages around the converters promise on bad input:

- converter batches (every registered source): every record is converted or quarantined with
  an error that names its location, and both kinds of rows fit their Arrow tables;
- input files (corrupt JSON/JSONL/.gz/.zst/Parquet, empty files, directories that are not
  datasets): reading either works, with every record accounted for, or fails with InputError
  naming the file;
- the CLI (`convert`, `validate`, `stats`, `export`, `generate` with a tasks file), run in
  process: a clear one-line error or success, never a traceback;
- classes found by hand, kept fixed: outputs that cannot be written (a file, under a file, a
  symlink loop, read-only) for every writing command; filter/dedup/mix on missing, directory,
  foreign or damaged shards; export of records that fail validation; generate configs that
  cannot run (deep YAML, alias bombs, unknown env or env setting, a device as tasks file, too many
  tasks, an unreachable or malformed base_url, a config too big or a directory) and a job where
  every task fails; filter configs and card paths of the wrong kind.

Sizes: the fast run draws a few hundred cases; `--reliability-full` draws more than 10,000.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
import zstandard
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from converters.registry import all_converters
from pipelines.convert_work import _to_batch, convert_records
from pipelines.inputs import InputError, ParseFailure, plan_chunks, read_chunk
from schemas.arrow import QUARANTINE_SCHEMA
from schemas.store import Dataset
from backends.fake_server import FakeServer, FakeServerConfig, Rule
from tests.conftest import REPO
from tests.factories import pair, tool_trajectory
from tests.reliability._jobs import retail_agent

sys.path.insert(0, str(REPO / "tests" / "converters"))
from _compare import available  # noqa: E402
from _fuzz import replaced, value_paths  # noqa: E402
from test_fuzz import json_values, seeds  # noqa: E402

SETTINGS = dict(deadline=None, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
ADP_STD = sorted((REPO / "samples" / "adp").glob("*/sample_std.json"))


def _run(test: Any, n: int) -> None:
    """Run a @given function `n` times from a fixed seed (a failure reproduces with the same size)."""
    seed(20240610)(settings(max_examples=n, **SETTINGS)(test))()


@functools.lru_cache(maxsize=None)
def _seed_records(name: str) -> list[Any]:
    if name in available():
        with contextlib.suppress(FileNotFoundError):  # a source with neither sample nor fixture yet
            return seeds(name)
    # Otherwise (e.g. the ADP converter itself) ADP std records: real structure to splice into.
    return [r for p in ADP_STD[:3] for r in json.loads(p.read_text())[:1]]


# ---- converter batches -------------------------------------------------------------------------

_SOURCES = sorted(all_converters())


@st.composite
def _record(draw: Any, name: str) -> tuple[Any, bool]:
    """(a record for `name`, whether it may convert): spliced samples, arbitrary values, parse failures."""
    kind = draw(st.sampled_from(["sample", "splice", "splice", "garbage", "unparsable"]))
    if kind == "unparsable":
        text = draw(st.text(max_size=30))
        return ParseFailure(text=text, error="invalid JSON: unexpected character", error_class="JSONDecodeError"), False
    if kind == "garbage":
        return draw(json_values), True
    base = draw(st.sampled_from(_seed_records(name)))
    if kind == "sample":
        return base, True
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(value_paths(base)))
        value = draw(json_values)
        try:
            base = replaced(base, path, lambda _: value)
        except (KeyError, IndexError, TypeError):
            continue
    return base, True


def test_converter_batches_account_for_every_record(size):
    converters = all_converters()

    @given(data=st.data())
    def check(data: Any) -> None:
        name = data.draw(st.sampled_from(_SOURCES))
        batch = data.draw(st.lists(_record(name), min_size=1, max_size=6))
        records = [(f"in.jsonl:{i + 1}", raw) for i, (raw, _) in enumerate(batch)]
        rows, ids, bad, counts = convert_records(records, converters[name].fn)
        table, ids = _to_batch(rows, ids, bad, counts)
        assert counts["in"] == len(records) == table.num_rows + len(bad), (name, counts)
        assert len(ids) == table.num_rows
        pa.RecordBatch.from_pylist(bad, schema=QUARANTINE_SCHEMA)  # quarantine rows are storable
        for row in bad:
            assert row["error"].startswith(row["location"] + ":"), f"{name}: error does not name its record: {row}"
            detail = row["error"][len(row["location"]) + 1:].strip()
            assert detail and "Traceback" not in detail, row
        for (location, raw), (_, may_convert) in zip(records, batch):
            if not may_convert:
                assert any(r["location"] == location and "invalid JSON" in r["error"] for r in bad)
        # A converter bug shows as a ConversionError, not as an accidental crash of its code.
        crashed = [r["error"] for r in bad if ": ConversionError:" not in r["error"] and "invalid JSON" not in r["error"]
                   and "not storable in Arrow" not in r["error"]]
        assert not crashed, f"{name}: converter crashed instead of rejecting: {crashed[0][:300]}"

    _run(check, size(100, 4000))


# ---- input files -------------------------------------------------------------------------------

_GOOD_LINE = json.dumps(json.loads(ADP_STD[0].read_text())[0])


@st.composite
def _jsonl_bytes(draw: Any) -> bytes:
    lines = draw(st.lists(st.one_of(
        st.just(_GOOD_LINE.encode()),
        st.builds(lambda v: json.dumps(v).encode(), json_values),
        st.binary(max_size=40).filter(lambda b: b"\n" not in b),
        st.just(b""), st.just(b"   "), st.just(_GOOD_LINE[: len(_GOOD_LINE) // 2].encode()),
    ), max_size=8))
    text = b"\n".join(lines)
    return text + draw(st.sampled_from([b"", b"\n", b"\r\n"]))


def _damage(data: bytes, draw: Any) -> bytes:
    how = draw(st.sampled_from(["none", "truncate", "flip", "prefix", "empty"]))
    if how == "truncate" and data:
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "flip" and data:
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    if how == "prefix":
        return draw(st.binary(min_size=1, max_size=16)) + data
    if how == "empty":
        return b""
    return data


def _parquet_bytes(draw: Any) -> bytes:
    rows = draw(st.lists(st.fixed_dictionaries({"id": st.text(max_size=8), "n": st.integers(-5, 5)}), max_size=5))
    table = pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.string()), ("n", pa.int64())]))
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=2)
    return sink.getvalue()


@st.composite
def _input_file(draw: Any) -> tuple[str, bytes | None]:
    """(file name, content) or (directory name, None) for a directory input."""
    kind = draw(st.sampled_from(["jsonl", "gz", "zst", "json", "parquet", "dir", "dir-state", "dir-dict"]))
    if kind == "jsonl":
        return "in.jsonl", _damage(draw(_jsonl_bytes()), draw)
    if kind == "gz":
        return "in.jsonl.gz", _damage(gzip.compress(draw(_jsonl_bytes())), draw)
    if kind == "zst":
        return "in.jsonl.zst", _damage(zstandard.ZstdCompressor().compress(draw(_jsonl_bytes())), draw)
    if kind == "json":
        return "in.json", _damage(json.dumps(draw(json_values)).encode(), draw)
    if kind == "parquet":
        return "in.parquet", _damage(_parquet_bytes(draw), draw)
    return kind, None


def _materialize(root: Path, name: str, content: bytes | None, draw: Any) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    path = root / name
    if content is not None:
        path.write_bytes(content)
        return path
    path.mkdir()
    if name == "dir-state":
        (path / "state.json").write_bytes(draw(st.binary(max_size=30)))
    elif name == "dir-dict":
        (path / "dataset_dict.json").write_text('{"splits": ["train"]}')
    return path


def _read_all(path: Path) -> tuple[int, list[tuple[str, Any]]]:
    chunks = plan_chunks([str(path)], chunk_size=3)
    records = [r for chunk in chunks for r in read_chunk(chunk)]
    return len(chunks), records


def test_input_files_read_or_fail_naming_the_file(tmp_path, size):
    adp = all_converters()["adp"].fn

    @given(data=st.data())
    def check(data: Any) -> None:
        name, content = data.draw(_input_file())
        path = _materialize(tmp_path / "case", name, content, data.draw)
        try:
            _, records = _read_all(path)
        except InputError as exc:
            assert str(path) in str(exc) or path.name in str(exc), f"error does not name the file: {exc}"
            assert str(exc).strip() and "\n" not in str(exc).strip(), repr(str(exc))
            return
        if name.startswith("in.jsonl") and content is not None and name.endswith(".jsonl"):
            assert len(records) == sum(1 for line in content.split(b"\n") if line.strip())
        assert all(str(path) in location for location, _ in records)
        rows, _, bad, counts = convert_records(records, adp)
        assert counts["in"] == len(records) == len(rows) + len(bad)

    _run(check, size(100, 3500))


# ---- the CLI -----------------------------------------------------------------------------------


def _cli(args: list[str]) -> Any:
    from flows.cli import app

    return CliRunner().invoke(app, args)


def _assert_clean_exit(result: Any, names: tuple[str, ...]) -> None:
    """Success, or exit 1 with one `error:` line naming the input; never an unhandled exception."""
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"unhandled {type(result.exception).__name__}: {result.exception}\n{result.output[-2000:]}")
    assert "Traceback" not in result.output, result.output[-2000:]
    if result.exit_code != 0:
        assert result.exit_code == 1, result.output[-2000:]
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert errors, f"no `error:` line:\n{result.output[-2000:]}"
        assert any(n in result.output for n in names), f"the error names none of {names}:\n{result.output[-2000:]}"


@pytest.fixture(scope="module")
def good_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("good") / "ds"
    ds = Dataset.create(path, stage="test")
    for u in range(2):
        with ds.unit(f"u{u}") as unit:
            unit.write_many("trajectories", [tool_trajectory(3 * u + i) for i in range(3)])
            unit.write("pairs", pair(u))
    ds.mark_complete()
    return path


def _corrupt_dataset(draw: Any, root: Path, good: Path) -> Path:
    path = root / "ds"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(good, path)
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    target = draw(st.sampled_from(files))
    how = draw(st.sampled_from(["bytes", "delete", "manifest-json", "to-dir"]))
    if how == "delete":
        target.unlink()
    elif how == "to-dir":
        target.unlink()
        target.mkdir()
    elif how == "manifest-json":
        manifest = json.loads((path / "_manifest.json").read_text())
        key = draw(st.sampled_from(["units", "format", "schema_version", "counts", "complete"]))
        manifest[key] = draw(json_values)
        if key == "units" and draw(st.booleans()) and isinstance(manifest["units"], dict):
            manifest["units"]["u9"] = draw(json_values)
        (path / "_manifest.json").write_text(json.dumps(manifest))
    else:
        target.write_bytes(_damage(target.read_bytes(), draw))
    return path


def test_store_commands_on_corrupt_datasets_fail_cleanly(tmp_path, good_dataset, size):
    @given(data=st.data())
    def check(data: Any) -> None:
        path = _corrupt_dataset(data.draw, tmp_path / "case", good_dataset)
        command = data.draw(st.sampled_from(["validate", "stats", "stats-json", "export"]))
        if command == "export":
            args = ["export", str(path), "--format", "trl-sft", "--output", str(tmp_path / "case" / "export")]
        else:
            args = ["stats", str(path), "--json"] if command == "stats-json" else [command, str(path)]
        _assert_clean_exit(_cli(args), (str(path),))

    _run(check, size(12, 2500))


def test_store_commands_on_paths_that_are_not_datasets(tmp_path):
    empty, file = tmp_path / "empty", tmp_path / "file.parquet"
    empty.mkdir()
    file.write_bytes(b"PAR1 not really")
    for path in (empty, file, tmp_path / "missing"):
        for args in (["validate", str(path)], ["stats", str(path)],
                     ["export", str(path), "--format", "openai", "--output", str(tmp_path / "x")]):
            result = _cli(args)
            assert result.exit_code == 1, (args, result.output)
            _assert_clean_exit(result, (str(path),))


def test_convert_cli_on_corrupt_inputs(tmp_path, size):
    @given(data=st.data())
    def check(data: Any) -> None:
        name, content = data.draw(_input_file())
        path = _materialize(tmp_path / "case", name, content, data.draw)
        out = tmp_path / "case" / "out"
        result = _cli(["convert", "--source", "adp", "--input", str(path), "--output", str(out)])
        _assert_clean_exit(result, (str(path), path.name))
        if result.exit_code == 0:
            counts = Dataset.open(out).manifest()["counts"]
            assert counts["in"] == counts["out"] + counts["quarantined"] + counts["duplicate"], counts

    _run(check, size(2, 60))


@st.composite
def _tasks_file(draw: Any) -> bytes:
    task = {"instruction": "Where is my order?", "env": "retail"}
    lines = draw(st.lists(st.one_of(
        st.just(json.dumps(task).encode()),
        st.builds(lambda v: json.dumps(v).encode(), json_values),
        st.binary(max_size=30).filter(lambda b: b"\n" not in b),
        st.just(json.dumps({**task, "id": "same"}).encode()),
    ), max_size=5))
    return _damage(b"\n".join(lines), draw)


def _runs_a_real_model(config: bytes) -> bool:
    """A damaged config that still loads but no longer names the openai backend would run the embedded model
    (the methods' default): not a bad-input case. Judged with the loader the command itself uses."""
    from generators.runner import load_config

    try:
        cfg = load_config(yaml.safe_load(config) or {}, "rollout")
    except Exception:  # any load failure is the command's to report: a bad-input case
        return False
    return cfg.llm.backend != "openai"


def test_generate_cli_on_corrupt_task_and_config_files(tmp_path, size):
    server = FakeServer(rules=[Rule(fn=retail_agent)])
    llm = {"backend": "openai", "base_url": "", "model": "fake-model", "api_key_env": None, "max_retries": 0}
    @given(data=st.data())
    def check(data: Any) -> None:
        root = tmp_path / "case"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        tasks, config = root / "tasks.jsonl", root / "config.yaml"
        tasks.write_bytes(data.draw(_tasks_file()))
        cfg = {"method": "rollout", "env": "retail", "tasks": {"source": "jsonl", "path": str(tasks)}, "max_steps": 1, "unit_tasks": 2,
               "llm": llm}
        text = yaml.safe_dump(cfg).encode()
        damaged = _damage(text, data.draw) if data.draw(st.booleans()) else text
        config.write_bytes(damaged if not _runs_a_real_model(damaged) else text)
        result = _cli(["generate", "--method", "rollout", "--config", str(config), "--output", str(root / "out")])
        _assert_clean_exit(result, (str(tasks), str(config)))

    with server:
        llm["base_url"] = server.base_url
        _run(check, size(10, 600))


# ---- outputs that cannot be written, damaged shards, bad configs: classes found by hand, kept fixed --------------


def _unwritable_outputs(root: Path) -> dict[str, Path]:
    """An output path of each kind that cannot be a dataset directory."""
    file = root / "a-file"
    file.write_text("not a directory")
    loop = root / "loop"
    loop.symlink_to(root / "loop2")
    (root / "loop2").symlink_to(loop)
    if os.geteuid() == 0:  # root writes through permissions: a kernel file system refuses instead
        read_only = Path("/sys/trajforge-out")
    else:
        locked = root / "locked"
        locked.mkdir(mode=0o555)
        read_only = locked / "out"
    return {"file": file, "under-a-file": file / "out", "symlink-loop": loop / "out", "read-only": read_only}


def test_unwritable_outputs_fail_cleanly_for_every_writing_command(tmp_path, good_dataset):
    server = FakeServer(rules=[Rule(fn=retail_agent)])
    outputs = _unwritable_outputs(tmp_path)
    filters_yaml = tmp_path / "filters.yaml"
    filters_yaml.write_text("- {name: well_formed}\n")
    gen_yaml = tmp_path / "gen.yaml"
    sample = REPO / "samples" / "adp" / "agenttuning_os" / "sample_std.json"
    with server:
        gen_yaml.write_text(yaml.safe_dump({"env": "retail", "tasks": {"n": 1}, "max_steps": 1, "llm": {
            "backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None}}))
        for kind, out in outputs.items():
            for args in (["convert", "--source", "adp", "--input", str(sample), "--output", str(out)],
                         ["filter", str(good_dataset), "--config", str(filters_yaml), "--output", str(out)],
                         ["dedup", str(good_dataset), "--output", str(out)],
                         ["mix", str(good_dataset), "--output", str(out)],
                         ["generate", "--method", "rollout", "--config", str(gen_yaml), "--output", str(out)]):
                result = _cli(args)
                assert result.exit_code == 1, (kind, args[0], result.output)
                _assert_clean_exit(result, (str(out), out.name))


def _damaged_shard(root: Path, good: Path, how: str) -> Path:
    path = root / how / "ds"
    shutil.copytree(good, path)
    shard = Dataset.open(path).shard_files()[0]
    if how == "missing":
        shard.unlink()
    elif how == "directory":
        shard.unlink()
        shard.mkdir()
    elif how == "foreign":
        pq.write_table(pa.table({"x": [1, 2]}), shard)
    elif how == "footer":
        shard.write_bytes(shard.read_bytes()[:-20])
    else:  # pages: the footer reads, a column's compressed data does not
        chunk = pq.ParquetFile(shard).metadata.row_group(0).column(2)
        data = bytearray(shard.read_bytes())
        for at in range(chunk.data_page_offset + 30, chunk.data_page_offset + chunk.total_compressed_size - 2):
            data[at] ^= 0x5A
        shard.write_bytes(bytes(data))
        pq.ParquetFile(shard)  # still opens: only reading the rows fails
    return path


@pytest.mark.parametrize("how", ["missing", "directory", "foreign", "footer", "pages"])
def test_stages_on_damaged_shards_fail_cleanly(how, tmp_path, good_dataset):
    path = _damaged_shard(tmp_path, good_dataset, how)
    filters_yaml = tmp_path / "filters.yaml"
    filters_yaml.write_text("- {name: well_formed}\n")
    for args in (["filter", str(path), "--config", str(filters_yaml), "--output", str(tmp_path / how / "f")],
                 ["dedup", str(path), "--output", str(tmp_path / how / "d")],
                 ["mix", str(path), "--output", str(tmp_path / how / "m")]):
        result = _cli(args)
        assert result.exit_code == 1, (how, args[0], result.output)
        _assert_clean_exit(result, (str(path),))


def test_export_of_records_that_fail_validation_fails_cleanly(tmp_path):
    from schemas.arrow import TO_ROW

    path = tmp_path / "ds"
    ds = Dataset.create(path, stage="test")
    with ds.unit("u0") as unit:
        unit.write("trajectories", tool_trajectory(0))
        row = TO_ROW["trajectories"](tool_trajectory(1))
        row["id"] = ""  # storable in Arrow, refused by the model
        unit.write_row("trajectories", row)
    ds.mark_complete()
    result = _cli(["export", str(path), "--format", "trl-sft", "--output", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    _assert_clean_exit(result, (str(path),))


def _generate_config_cases(root: Path, base_url: str) -> dict[str, Any]:
    """Config texts (or paths) of a rollout job that cannot run, each with what the error must name."""
    good = {"env": "retail", "tasks": {"n": 1}, "max_steps": 1,
            "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": None,
                    "max_retries": 0, "request_timeout_s": 5}}
    deep = "a: " + "[" * 1200 + "]" * 1200 + "\n"
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + "env_config: {seed: *i}\n"
    cases: dict[str, Any] = {
        "deep-yaml": (deep, "nested too deeply"),
        "alias-bomb": (bomb, "expands to more than"),
        "self-alias": ("a: &a [*a]\n", "contains itself"),
        "env-nosuch": (yaml.safe_dump({**good, "env": "nosuch"}), "unknown environment 'nosuch'"),
        "env-config-key": (yaml.safe_dump({**good, "env_config": {"colour": "red"}}), "unknown key(s) colour"),
        "tasks-dev-zero": (yaml.safe_dump({**good, "tasks": {"source": "jsonl", "path": "/dev/zero"}}), "not a regular file"),
        "tasks-directory": (yaml.safe_dump({**good, "tasks": {"source": "jsonl", "path": str(root)}}), "not a regular file"),
        "n-tasks-huge": (yaml.safe_dump({**good, "tasks": {"n": 1_000_000_000_000}}), "less than or equal to 1000000"),
        "unreachable-url": (yaml.safe_dump({**good, "llm": {**good["llm"], "base_url": "http://127.0.0.1:9/v1"}}),
                            "http://127.0.0.1:9/v1"),
        "malformed-url": (yaml.safe_dump({**good, "llm": {**good["llm"], "base_url": "localhost:8000"}}),
                          "not an http(s) URL"),
        "oversized": ("# " + "x" * (2 << 20) + "\n", "more than"),
    }
    return cases


def test_generate_configs_that_cannot_run_fail_cleanly_before_starting(tmp_path):
    server = FakeServer(rules=[Rule(fn=retail_agent)])
    with server:
        for name, (text, said) in _generate_config_cases(tmp_path, server.base_url).items():
            config = tmp_path / f"{name}.yaml"
            config.write_text(text)
            started = time.monotonic()
            result = _cli(["generate", "--method", "rollout", "--config", str(config), "--output", str(tmp_path / name)])
            assert result.exit_code == 1, (name, result.output)
            _assert_clean_exit(result, (str(config),))
            assert said in result.output, (name, result.output)
            assert time.monotonic() - started < 30, name
            assert not (tmp_path / name).exists(), f"{name}: the output was made before the config was checked"
        asked = len(server.log)
    assert asked == 0, "a config that cannot run still reached the model"
    config = tmp_path / "dir-config"
    config.mkdir()
    result = _cli(["generate", "--method", "rollout", "--config", str(config), "--output", str(tmp_path / "o")])
    _assert_clean_exit(result, (str(config),))
    assert result.exit_code == 1 and "is a directory" in result.output


def test_a_job_where_every_task_fails_exits_non_zero(tmp_path):
    server = FakeServer(FakeServerConfig(fault_rate=1.0, faults=("500",)))
    with server:
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({"env": "retail", "tasks": {"n": 3}, "max_steps": 1, "llm": {
            "backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None,
            "max_retries": 0}}))
        result = _cli(["generate", "--method", "rollout", "--config", str(config), "--output", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    _assert_clean_exit(result, (str(tmp_path / "out"),))
    assert "nothing succeeded: all 3 task(s)" in result.output


def test_filter_config_and_card_paths_of_the_wrong_kind_fail_cleanly(tmp_path, good_dataset):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + "filters: *i\n")
    for config in (tmp_path, bomb, tmp_path / "missing.yaml"):
        result = _cli(["filter", str(good_dataset), "--config", str(config), "--output", str(tmp_path / "out")])
        assert result.exit_code == 1, result.output
        _assert_clean_exit(result, (str(config),))
    file = tmp_path / "card.json"
    file.write_text("{}")
    for target in (file, tmp_path / "missing"):
        result = _cli(["card", str(target)])
        assert result.exit_code == 1, result.output
        _assert_clean_exit(result, (str(target),))
