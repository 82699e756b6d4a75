"""The shard store: a dataset directory of zstd Parquet shards plus a manifest.

Layout: `trajectories/`, `pairs/`, `quarantine/`, `filtered/` and `_manifest.json`.
Work is written in *units* (an input chunk, a batch of tasks). A unit's shards are
written under hidden temp names, renamed when the unit completes, and only then
recorded in the manifest, in one locked atomic update. Readers see only shards the
manifest lists, so a killed writer leaves nothing partial visible, and a re-run
skips finished units and rewrites unfinished ones from scratch. A commit journals its shard
names before the renames, so shards of a writer killed between renames and manifest update are
removed by the next run's `recover`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Iterator

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.arrow import FROM_ROW, TABLE_SCHEMAS, TO_ROW, as_current, readable_as
from schemas.models import SCHEMA_VERSION
from schemas.outdir import ForeignDirError, check_output_dir

MANIFEST = "_manifest.json"
TABLES = tuple(TABLE_SCHEMAS)
FORMAT = "trajforge-dataset"
TEMP_PREFIX = ".tmp-"
LOCK_FILE = ".manifest.lock"
# A unit's commit journal: the shard names about to appear, until the manifest lists them.
JOURNAL_PREFIX = ".commit-"
DEFAULT_MAX_ROWS = 100_000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
# Rows buffered before they become one Parquet row group.
ROW_GROUP_ROWS = 2_000


class StoreError(Exception):
    """An expected problem with a dataset directory; the message names the file and the problem."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{TEMP_PREFIX}{path.name}.{uuid.uuid4().hex}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _new_manifest(config_hash: str | None, stage: str | None) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "stage": stage,
        "config_hash": config_hash,
        "complete": False,
        "created_at": _now(),
        "updated_at": _now(),
        "units": {},
        "counts": {},
    }


# Characters DuckDB (and shells) read as a pattern: a shard path holding one could match other files.
GLOB_CHARS = frozenset("*?[]{}")


def _shard_path_problem(file: str) -> str | None:
    """Why a manifest's shard path could name a file other than one shard of its dataset (None if it
    cannot): it must be TABLE/NAME, relative, without '..', NAME a plain file name (no pattern)."""
    parts = PurePosixPath(file).parts
    if file.startswith("/") or "\\" in file or "\x00" in file:
        return "is not a relative path"
    if ".." in parts:
        return "climbs out of the dataset with '..'"
    if len(parts) != 2 or parts[0] not in TABLES:
        return f"is not of the form TABLE/NAME (tables: {', '.join(TABLES)})"
    if GLOB_CHARS & set(file) or not file.isprintable():
        return "is not a plain file name (it holds a pattern or control character)"
    return None


def duckdb_files(files: Iterable[str | os.PathLike[str]]) -> str:
    """A DuckDB list literal naming exactly `files` (absolute, links not followed): DuckDB expands the
    glob characters * ? [ in any path it reads, also in a directory's name (a dataset under `runs[1]`
    would read `runs1`), so each is escaped as a one-character class."""
    def escaped(file: str | os.PathLike[str]) -> str:
        path = os.path.abspath(file)
        return "".join(f"[{c}]" if c in "*?[" else c for c in path).replace("'", "''")

    return "[" + ", ".join(f"'{escaped(f)}'" for f in files) + "]"


def _resolve(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise StoreError(f"{path}: cannot resolve the path ({exc})") from None


def check_apart(output: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]]) -> None:
    """Refuse an output directory that is an input, lies inside one or contains one (links
    resolved), before anything is written: writing it would destroy or re-read the input."""
    out = _resolve(Path(output))
    for given in inputs:
        src = _resolve(Path(given))
        if out == src:
            raise StoreError(f"{output}: the output is the input {given}; write to another directory")
        if src in out.parents:
            raise StoreError(f"{output}: the output lies inside the input {given}; write to a directory outside it")
        if out in src.parents:
            raise StoreError(f"{output}: the output contains the input {given}; write to a directory apart from it")


def _left_by_create(entry: Path) -> bool:
    """Whether a directory entry is what a killed `create` may leave before its manifest (the table
    folders, lock and temp files are trajforge's)."""
    if entry.name == LOCK_FILE or entry.name.startswith(TEMP_PREFIX):
        return True
    return (entry.name in TABLES and entry.is_dir() and not entry.is_symlink()
            and all(child.name.startswith(TEMP_PREFIX) for child in entry.iterdir()))


def _unit_entry_ok(unit: Any) -> bool:
    tables = unit.get("tables") if isinstance(unit, dict) else None
    return (isinstance(tables, dict) and isinstance(unit.get("counts", {}), dict)
            and all(isinstance(es, list) and all(isinstance(e, dict) and isinstance(e.get("file"), str) for e in es)
                    for es in tables.values()))


class Dataset:
    """A dataset directory. Open it with `Dataset.open` (reading) or `Dataset.create` (a stage's output)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.manifest_path = self.path / MANIFEST

    # ---- opening -----------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "Dataset":
        """Open an existing dataset for reading; raises StoreError if it is not a valid one."""
        ds = cls(Path(path))
        if not ds.path.is_dir():
            raise StoreError(f"{ds.path}: no such dataset directory")
        if not ds.manifest_path.exists():
            raise StoreError(f"{ds.manifest_path}: missing manifest; {ds.path} is not a trajforge dataset")
        ds.manifest()  # validates
        return ds

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        stage: str | None = None,
        config_hash: str | None = None,
        overwrite: bool = False,
    ) -> "Dataset":
        """Open a stage's output for writing, creating it if needed.

        An existing output written with another config hash is refused (its finished units
        would not match this run) unless `overwrite`, which starts it afresh: it removes the
        shards the old manifest lists and trajforge's temp files, nothing else. A non-empty
        directory without a trajforge manifest is refused, with or without `overwrite`.
        """
        ds = cls(Path(path))
        try:
            try:
                check_output_dir(ds.path, MANIFEST, "a trajforge dataset", ours=_left_by_create)
            except ForeignDirError as exc:
                raise StoreError(str(exc)) from None
            ds.path.mkdir(parents=True, exist_ok=True)
            for table in TABLES:
                (ds.path / table).mkdir(exist_ok=True)
            with ds._locked():
                if ds.manifest_path.exists() and not overwrite:
                    manifest = ds._read_manifest()
                    if config_hash and manifest.get("config_hash") not in (None, config_hash):
                        raise StoreError(
                            f"{ds.manifest_path}: written with config hash {manifest['config_hash']}, "
                            f"this run has {config_hash}; use another output directory or overwrite it"
                        )
                    if config_hash and manifest.get("config_hash") is None:
                        manifest["config_hash"] = config_hash
                        ds._write_manifest(manifest)
                else:
                    if overwrite and ds.manifest_path.exists():
                        ds._remove_listed_shards()
                    ds._write_manifest(_new_manifest(config_hash, stage))
        except OSError as exc:
            raise StoreError(f"{ds.path}: cannot write the output directory ({exc.strerror or exc})") from None
        return ds

    # ---- manifest ----------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # One lock file serialises manifest updates from concurrent writers (threads, processes).
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / LOCK_FILE, "a+") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _read_manifest(self) -> dict[str, Any]:
        try:
            raw = self.manifest_path.read_bytes()
        except OSError as exc:
            raise StoreError(f"{self.manifest_path}: cannot read manifest ({exc.strerror})") from None
        try:
            manifest = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise StoreError(f"{self.manifest_path}: manifest is truncated or not JSON ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise StoreError(f"{self.manifest_path}: not a trajforge manifest (no format {FORMAT!r})")
        version = manifest.get("schema_version")
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"{self.manifest_path}: schema version {version!r} is not supported "
                f"(this trajforge reads {SCHEMA_VERSION!r})"
            )
        if not isinstance(manifest.get("units"), dict):
            raise StoreError(f"{self.manifest_path}: manifest has no units table")
        for key in ("counts", "meta"):
            if not isinstance(manifest.get(key, {}), dict):
                raise StoreError(f"{self.manifest_path}: manifest field {key!r} is not an object")
        for name, unit in manifest["units"].items():
            if not _unit_entry_ok(unit):
                raise StoreError(f"{self.manifest_path}: unit {name!r} is malformed (needs tables of shard entries)")
            for entries in unit["tables"].values():
                for entry in entries:
                    if (problem := _shard_path_problem(entry["file"])) is not None:
                        raise StoreError(f"{self.manifest_path}: unit {name!r} lists the shard {entry['file']!r}, "
                                         f"which {problem}; shards must be plain files inside the dataset directory")
        return manifest

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        manifest["updated_at"] = _now()
        _atomic_write(self.manifest_path, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))

    def manifest(self) -> dict[str, Any]:
        return self._read_manifest()

    def update_manifest(self, **fields: Any) -> None:
        """Set top-level manifest fields (e.g. `complete`, `counts`) under the lock."""
        with self._locked():
            manifest = self._read_manifest()
            manifest.update(fields)
            self._write_manifest(manifest)

    def mark_complete(self, counts: dict[str, Any] | None = None) -> None:
        self.update_manifest(complete=True, counts=counts or {}, completed_at=_now())

    @property
    def config_hash(self) -> str | None:
        return self.manifest().get("config_hash")

    @property
    def complete(self) -> bool:
        return bool(self.manifest().get("complete"))

    # ---- units -------------------------------------------------------------------

    def finished_units(self) -> dict[str, Any]:
        return self.manifest()["units"]

    def is_finished(self, unit: str) -> bool:
        return unit in self.finished_units()

    def unit(self, name: str, **limits: int) -> "UnitWriter":
        """A writer for one unit of work; use as a context manager."""
        return UnitWriter(self, name, **limits)

    def commit_staged(self, name: str, staged: dict[str, Any]) -> None:
        """Commit a unit that `UnitWriter.stage` wrote (possibly in another process): its shards
        are renamed into place and listed in the manifest together, as `UnitWriter.commit` does."""
        self._commit_unit(name, staged["tables"], staged["counts"], staged["meta"])

    def _commit_unit(
        self, name: str, shards: dict[str, list[dict[str, Any]]], counts: dict[str, int], meta: dict[str, Any]
    ) -> None:
        with self._locked():
            manifest = self._read_manifest()
            if name in manifest["units"]:
                # Another attempt finished this unit first; drop our copy so nothing appears twice.
                for entries in shards.values():
                    for entry in entries:
                        with contextlib.suppress(FileNotFoundError):
                            (self.path / entry["tmp"]).unlink()
                return
            # A writer killed between the renames and the manifest update would leave shards no
            # manifest lists, under names a re-run need not reuse (generation units are named at
            # random): the journal names them for `recover` to remove.
            journal = self.path / f"{JOURNAL_PREFIX}{uuid.uuid4().hex}.json"
            files = [entry["file"] for entries in shards.values() for entry in entries]
            _atomic_write(journal, orjson.dumps({"unit": name, "files": files}))
            for entries in shards.values():
                for entry in entries:
                    os.replace(self.path / entry.pop("tmp"), self.path / entry["file"])
            manifest["units"][name] = {"tables": shards, "counts": counts, "meta": meta, "finished_at": _now()}
            self._write_manifest(manifest)
            journal.unlink()

    def recover(self) -> list[Path]:
        """Remove leftovers of killed writers: files trajforge names as temporary, and the shards a
        writer killed between renaming them into place and listing them had journaled (never any
        file the manifest lists or outside the table folders; no other file: it may be someone's own).
        """
        removed = []
        for table in TABLES:
            folder = self.path / table
            if not folder.is_dir() or folder.is_symlink():
                continue
            for file in folder.iterdir():
                if file.name.startswith(TEMP_PREFIX) and file.is_file():
                    file.unlink()
                    removed.append(file)
        # A writer killed while replacing the manifest or writing a commit journal leaves its
        # temp copy beside it (a journal cut short was written before any rename: nothing to undo).
        for pattern in (f"{TEMP_PREFIX}{MANIFEST}.*", f"{TEMP_PREFIX}{JOURNAL_PREFIX}*"):
            for file in self.path.glob(pattern):
                file.unlink()
                removed.append(file)
        removed += self._undo_cut_commits()
        return removed

    def _undo_cut_commits(self) -> list[Path]:
        """Shards a writer renamed into place but was killed before listing: its journal names them."""
        removed: list[Path] = []
        if not any(self.path.glob(f"{JOURNAL_PREFIX}*.json")):
            return removed
        with self._locked():
            journals = list(self.path.glob(f"{JOURNAL_PREFIX}*.json"))
            units = self._read_manifest()["units"]
            listed = {e["file"] for unit in units.values() for es in unit["tables"].values() for e in es}
            for journal in journals:
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    entry = orjson.loads(journal.read_bytes())
                    if entry["unit"] not in units:
                        for name in entry["files"]:
                            # Whatever a journal says: only an unlisted shard file in a table folder.
                            if type(name) is not str or name in listed or _shard_path_problem(name) is not None:
                                continue
                            file = self.path / name
                            if not file.parent.is_symlink() and file.is_file() and not file.is_symlink():
                                file.unlink()
                                removed.append(file)
                with contextlib.suppress(FileNotFoundError):
                    journal.unlink()
        return removed

    def _remove_listed_shards(self) -> None:
        """For `overwrite`: the old manifest's shards and trajforge's temp files, nothing else."""
        try:
            manifest = orjson.loads(self.manifest_path.read_bytes())
        except orjson.JSONDecodeError:
            raise StoreError(f"{self.manifest_path}: manifest is not JSON; not overwriting what it may not describe "
                             "(remove the directory yourself to start afresh)") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise StoreError(f"{self.manifest_path}: not a trajforge manifest; not overwriting a foreign directory")
        for unit in (manifest.get("units") or {}).values():
            for entries in (unit.get("tables") or {}).values() if _unit_entry_ok(unit) else ():
                for entry in entries:
                    if _shard_path_problem(entry["file"]) is None:
                        with contextlib.suppress(FileNotFoundError):
                            (self.path / entry["file"]).unlink()
        self.recover()

    # ---- reading -----------------------------------------------------------------

    def shard_files(self, table: str = "trajectories") -> list[Path]:
        """The listed shards of `table`; each must resolve (links followed) inside the dataset directory."""
        _check_table(table)
        files = [
            self.path / entry["file"]
            for unit in self.finished_units().values()
            for entry in unit["tables"].get(table, [])
        ]
        root = _resolve(self.path)
        for file in files:
            if root not in _resolve(file).parents:
                raise StoreError(f"{file}: the shard links to {_resolve(file)}, outside the dataset directory")
        return sorted(files)

    def checked_shard_files(self, table: str = "trajectories") -> list[Path]:
        """The shard files, after checking each one's footer: readable and of the table's schema."""
        files = self.shard_files(table)
        for file in files:
            _check_schema(file, _open_parquet(file).schema_arrow, TABLE_SCHEMAS[table])
        return files

    def count(self, table: str = "trajectories") -> int:
        """Rows of `table`, from the shards' own footers (not the manifest's word for it)."""
        return sum(_open_parquet(file).metadata.num_rows for file in self.shard_files(table))

    def iter_batches(
        self, table: str = "trajectories", *, columns: list[str] | None = None, batch_size: int = 4096
    ) -> Iterator[pa.RecordBatch]:
        """Stream record batches of one table, file by file (memory bounded by the batch size)."""
        expected = TABLE_SCHEMAS[table]
        for file in self.shard_files(table):
            parquet = _open_parquet(file)
            _check_schema(file, parquet.schema_arrow, expected)
            try:
                for batch in parquet.iter_batches(batch_size=batch_size, columns=columns):
                    yield as_current(batch, expected)  # type: ignore[misc]  # a batch stays a batch
            except (pa.ArrowInvalid, OSError) as exc:
                raise StoreError(f"{file}: corrupt Parquet data ({exc})") from None

    def iter_rows(self, table: str = "trajectories", **kwargs: Any) -> Iterator[dict[str, Any]]:
        for batch in self.iter_batches(table, **kwargs):
            yield from batch.to_pylist()

    def iter_records(self, table: str = "trajectories", *, batch_size: int = 1024) -> Iterator[Any]:
        """Stream validated models (Trajectory, Pair, Quarantined or Filtered)."""
        from_row = FROM_ROW[table]
        for row in self.iter_rows(table, batch_size=batch_size):
            yield from_row(row)

    def ids(self, table: str = "trajectories") -> set[str]:
        return {i for batch in self.iter_batches(table, columns=["id"]) for i in batch.column(0).to_pylist()}

    def unit_counts(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for unit in self.finished_units().values():
            total.update(unit.get("counts", {}))
        return total


def _check_table(table: str) -> None:
    if table not in TABLE_SCHEMAS:
        raise StoreError(f"unknown table {table!r}; tables are {', '.join(TABLES)}")


def _open_parquet(file: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(file)
    except FileNotFoundError:
        raise StoreError(f"{file}: shard listed in the manifest is missing") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise StoreError(f"{file}: not a readable Parquet file ({exc})") from None


def _check_schema(file: Path, actual: pa.Schema, expected: pa.Schema) -> None:
    if actual.names != expected.names:
        raise StoreError(f"{file}: foreign Parquet schema (columns {actual.names}, expected {expected.names})")
    for field in expected:
        if not readable_as(actual.field(field.name).type, field.type):
            raise StoreError(
                f"{file}: column {field.name!r} has type {actual.field(field.name).type}, expected {field.type}"
            )


class UnitWriter:
    """Streams records of one unit of work into shards of bounded rows and bytes, per table.

    Nothing becomes visible until the unit closes without error; then all its shards are
    renamed and listed in the manifest together.
    """

    def __init__(
        self,
        dataset: Dataset,
        name: str,
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        row_group_rows: int = ROW_GROUP_ROWS,
        staging: Path | None = None,
    ) -> None:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad unit name {name!r}")
        self.dataset = dataset
        # Where temp shards live until the commit (default: hidden next to their table). A
        # staging dir must be on the dataset's filesystem, so the commit is still a rename.
        self.staging = staging
        self.name = name
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.row_group_rows = min(row_group_rows, max_rows)
        self.counts: Counter[str] = Counter()
        # Facts about the unit recorded with it in the manifest (e.g. which tasks it covers).
        self.meta: dict[str, Any] = {}
        self._token = uuid.uuid4().hex[:8]
        self._buffers: dict[str, list[dict[str, Any]]] = {}
        self._writers: dict[str, pq.ParquetWriter] = {}
        self._current: dict[str, dict[str, Any]] = {}
        self._shards: dict[str, list[dict[str, Any]]] = {}

    def __enter__(self) -> "UnitWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def write(self, table: str, record: Any) -> None:
        """Add one model (Trajectory, Pair, Quarantined, Filtered) to `table`."""
        self.write_row(table, TO_ROW[table](record))

    def write_row(self, table: str, row: dict[str, Any]) -> None:
        """Add one row already in the table's Arrow layout (the fast path)."""
        buffer = self._buffers.setdefault(table, [])
        buffer.append(row)
        self.counts[table] += 1
        if len(buffer) >= self.row_group_rows:
            self._flush(table)

    def write_many(self, table: str, records: Iterable[Any]) -> None:
        for record in records:
            self.write(table, record)

    def write_batch(self, table: str, batch: pa.RecordBatch | pa.Table) -> None:
        """Add rows already in Arrow form with the table's schema (no per-row Python objects).

        Rows buffered by `write_row` go first, so order is kept; shards obey the same row and
        byte limits, and row groups hold at most `row_group_rows` rows. Rows read from shards
        written before a field existed are cast to the current schema.
        """
        _check_table(table)
        expected = TABLE_SCHEMAS[table]
        if not batch.schema.equals(expected):
            if batch.schema.names != expected.names or not all(
                    readable_as(f.type, expected.field(f.name).type) for f in batch.schema):
                raise ValueError(f"batch for {table!r} has schema {batch.schema}, expected {expected}")
            batch = as_current(batch, expected)
        self._flush(table)
        self.counts[table] += batch.num_rows
        data = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        start = 0
        while start < data.num_rows:
            start += self._write_arrow(table, data.slice(start, self.row_group_rows))

    def _flush(self, table: str) -> None:
        buffer = self._buffers.get(table)
        if not buffer:
            return
        start = 0
        while start < len(buffer):
            # A whole buffer when the current shard has room for it (one row group, as before).
            room = self.max_rows - (self._current.get(table) or {"rows": 0})["rows"]
            chunk = buffer[start : start + room]
            start += self._write_arrow(table, pa.Table.from_pylist(chunk, schema=TABLE_SCHEMAS[table]))
        buffer.clear()

    def _write_arrow(self, table: str, data: pa.Table) -> int:
        """Write the rows of `data` that fit the current shard as one row group; returns how many."""
        current = self._current.get(table) or self._open_shard(table)
        n = min(data.num_rows, self.max_rows - current["rows"])
        self._writers[table].write_table(data.slice(0, n), row_group_size=n)
        current["rows"] += n
        if current["rows"] >= self.max_rows or self._size(current) >= self.max_bytes:
            self._close_shard(table)
        return n

    def _open_shard(self, table: str) -> dict[str, Any]:
        seq = len(self._shards.get(table, []))
        file = f"{table}/{self.name}-{seq:05d}.parquet"
        if self.staging is None:
            tmp = f"{table}/{TEMP_PREFIX}{self.name}-{seq:05d}-{self._token}.parquet"
        else:
            tmp = str(self.staging.resolve() / f"{self.name}.{table}-{seq:05d}-{self._token}.parquet")
        self._writers[table] = pq.ParquetWriter(
            self.dataset.path / tmp, TABLE_SCHEMAS[table], compression="zstd", write_statistics=["id"]
        )
        self._current[table] = {"file": file, "tmp": tmp, "rows": 0}
        return self._current[table]

    def _size(self, current: dict[str, Any]) -> int:
        with contextlib.suppress(FileNotFoundError):
            return (self.dataset.path / current["tmp"]).stat().st_size
        return 0

    def _close_shard(self, table: str) -> None:
        writer = self._writers.pop(table)
        writer.close()
        current = self._current.pop(table)
        with open(self.dataset.path / current["tmp"], "rb") as fh:
            os.fsync(fh.fileno())
        current["bytes"] = self._size(current)
        self._shards.setdefault(table, []).append(current)

    def commit(self) -> None:
        self.dataset.commit_staged(self.name, self.stage())

    def stage(self) -> dict[str, Any]:
        """Finish writing but commit nothing: the unit's shards (under their temp names), counts
        and meta, for `Dataset.commit_staged` later. Nothing is visible until then."""
        for table in list(self._buffers):
            self._flush(table)
        for table in list(self._writers):
            self._close_shard(table)
        return {"tables": self._shards, "counts": dict(self.counts), "meta": self.meta}

    def abort(self) -> None:
        for writer in self._writers.values():
            with contextlib.suppress(Exception):
                writer.close()
        for entries in [*self._shards.values(), *([c] for c in self._current.values())]:
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    (self.dataset.path / entry["tmp"]).unlink()
        self._writers.clear()
        self._current.clear()
        self._shards.clear()
