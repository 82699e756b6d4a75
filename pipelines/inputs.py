"""Input files -> chunks of work -> (location, raw record) pairs.

Supported inputs: JSON (an array, one object, or an object of id -> record), JSONL
(plain, `.gz` or `.zst`), Parquet, a `datasets.Dataset.save_to_disk` directory, and a
Hugging Face hub dataset written `hf:OWNER/NAME[:CONFIG][:SPLIT]`.

`plan_chunks` cuts every input into chunks of N records; each chunk is one unit of work
named `<short sha of the input>-<chunk index>`, so a re-run maps the same chunk to the
same unit. For a converter whose records are episodes of step rows (an `episode_key`), the
inputs are one stream of rows in input order and each chunk is moved to start where an
episode starts: an episode split over two chunks or two input files belongs whole to the
chunk it starts in, which reads on past its end (`Chunk.ranges`).
`read_chunk` yields the chunk's records with a stable location string
(`file:line` for JSONL, `file#index` for JSON, `file@row` for Parquet and datasets).
A JSONL line that is not valid JSON is yielded as a `ParseFailure` (it goes to
quarantine); a missing or unreadable input raises `InputError` (fatal).

A JSONL line longer than `max_record_bytes` is a `ParseFailure` too, with its size and first
bytes: lines are read with a bounded `readline`, so such a line is never held whole, let alone
parsed (a 200 MB line parsed into Python objects takes over a GB).
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import io
import itertools
import mmap
import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator

import numpy as np
import orjson
import pyarrow as pa
import zstandard

HF_PREFIX = "hf:"
DEFAULT_CHUNK_SIZE = 5000
DEFAULT_HF_SPLIT = "train"
# Longest JSONL line read as a record; agent records are tens of KB, a page-heavy one a few MB.
DEFAULT_MAX_RECORD_BYTES = 32 << 20
# What a quarantine record keeps of a line too long to read.
_OVERSIZED_PREFIX = 4096
_BLOCK = 1 << 24  # bytes scanned at a time for JSONL line offsets
_SCAN_THREADS = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
_NEWLINE = ord("\n")
_COMPRESSED = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_JSONL = (".jsonl", ".ndjson")
# A corrupt .gz or .zst stream raises its decoder's own error, which is not an OSError; so do
# damaged Parquet pages (ArrowInvalid) that only show when a row group is decoded.
_DECODE_ERRORS = (zlib.error, zstandard.ZstdError, pa.ArrowException)


class InputError(Exception):
    """A fatal problem with an input (missing, unreadable, unsupported); the message names it."""


@dataclass(frozen=True)
class ParseFailure:
    """A record that cannot be read as a value (a JSONL line that is not JSON, an Arrow row with
    invalid UTF-8): its text (decoded with replacement) and why."""

    text: str
    error: str
    error_class: str


@dataclass(frozen=True)
class Chunk:
    """One unit of work: records [start, stop) of one input (line numbers for JSONL)."""

    input: str  # absolute path, or the hf: spec
    kind: str  # jsonl | jsonl-gzip | jsonl-zstd | json | parquet | datasets | hf
    input_index: int
    index: int
    start: int
    stop: int
    # Byte range of plain JSONL chunks, so a reader seeks instead of scanning.
    byte_start: int = -1
    byte_stop: int = -1
    # Set when episodes move the chunk's rows: the slices of one or more inputs it reads instead
    # of [start, stop) (each a Chunk without ranges of its own); empty tuple: a chunk of no rows.
    ranges: tuple["Chunk", ...] | None = None
    # A JSONL line longer than this is quarantined with its size, never read whole.
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES

    @property
    def unit(self) -> str:
        return unit_name(self.input, self.index)

    @property
    def order(self) -> tuple[int, int]:
        return (self.input_index, self.index)

    @property
    def rows(self) -> int:
        """Rows this chunk reads (records, or lines for JSONL)."""
        if self.ranges is None:
            return self.stop - self.start
        return sum(r.stop - r.start for r in self.ranges)


def input_key(spec: str) -> str:
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def unit_name(spec: str, index: int) -> str:
    return f"{input_key(spec)}-{index:05d}"


# ---- classifying inputs -------------------------------------------------------------


def resolve(spec: str) -> tuple[str, str]:
    """(canonical input string, kind); raises InputError for a missing or unsupported input."""
    if spec.startswith(HF_PREFIX):
        return spec, "hf"
    path = Path(spec).expanduser()
    if not path.exists():
        raise InputError(f"{spec}: no such file or directory (for a Hugging Face dataset write {HF_PREFIX}OWNER/NAME)")
    if not os.access(path, os.R_OK):
        raise InputError(f"{spec}: not readable (permission denied)")
    canonical = str(path.resolve())
    if path.is_dir():
        if (path / "dataset_dict.json").exists():
            raise InputError(f"{spec}: a saved DatasetDict; pass one split's directory, e.g. {spec}/train")
        if (path / "dataset_info.json").exists() or (path / "state.json").exists():
            return canonical, "datasets"
        raise InputError(f"{spec}: a directory but not a saved `datasets` directory (no state.json)")
    name = path.name.lower()
    suffix = Path(name).suffix
    if suffix in _COMPRESSED:
        return canonical, f"jsonl-{_COMPRESSED[suffix]}"
    if suffix in _JSONL:
        return canonical, "jsonl"
    if suffix == ".json":
        return canonical, "json"
    if suffix == ".parquet":
        return canonical, "parquet"
    raise InputError(
        f"{spec}: unsupported input type {suffix or '(no extension)'!r}; "
        "use .json, .jsonl, .jsonl.gz, .jsonl.zst, .parquet or a saved datasets directory"
    )


# ---- planning -----------------------------------------------------------------------


def plan_chunks(
    inputs: list[str], chunk_size: int = DEFAULT_CHUNK_SIZE, episode_key: Callable[[Any], Any] | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> list[Chunk]:
    """Every input's chunks, in input order. Reads each input once, cheaply, to size it.

    With `episode_key` (a row -> its episode, see `converters.registry`), chunk starts move
    to episode starts (`align_to_episodes`).
    """
    if chunk_size < 1:
        raise InputError(f"chunk size must be >= 1, got {chunk_size}")
    if max_record_bytes < 1:
        raise InputError(f"the record size limit must be >= 1 byte, got {max_record_bytes}")
    chunks: list[Chunk] = []
    for input_index, spec in enumerate(inputs):
        canonical, kind = resolve(spec)
        try:
            chunks.extend(dataclasses.replace(c, max_record_bytes=max_record_bytes)
                          for c in _plan_one(canonical, kind, input_index, chunk_size))
        except InputError:
            raise
        except (OSError, EOFError, ValueError, *_DECODE_ERRORS) as exc:
            raise InputError(f"{spec}: cannot read ({_describe(exc)})") from None
    if episode_key is None:
        return chunks
    try:
        return align_to_episodes(chunks, episode_key)
    except (OSError, EOFError, ValueError, *_DECODE_ERRORS) as exc:
        raise InputError(f"cannot read the inputs to find episode starts ({_describe(exc)})") from None


# ---- episodes across chunks and inputs ------------------------------------------------

# Looking back for the key of the episode a chunk starts in gives up after this many rows
# without a key (unreadable lines); the chunk then starts a new run there.
_MAX_LOOKBACK = 1000
_FORWARD_WINDOW = 256


@dataclass(frozen=True, order=True)
class _Pos:
    """A row of the input stream: (input position in the plan, row, byte offset for plain JSONL)."""

    input: int
    row: int
    byte: int = -1


class _Stream:
    """The plan's inputs as one stream of rows, read at chunk boundaries only."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self.inputs: list[Chunk] = []  # one whole-input Chunk per input with rows
        for c in chunks:
            if not self.inputs or self.inputs[-1].input_index != c.input_index:
                self.inputs.append(dataclasses.replace(c, index=0, start=0))
            last = self.inputs[-1]
            self.inputs[-1] = dataclasses.replace(last, stop=c.stop, byte_stop=c.byte_stop)
        self._where = {c.input_index: i for i, c in enumerate(self.inputs)}

    def pos(self, chunk: Chunk) -> _Pos:
        return _Pos(self._where[chunk.input_index], chunk.start, chunk.byte_start)

    @property
    def end(self) -> _Pos:
        return _Pos(len(self.inputs), 0)

    def forward(self, pos: _Pos) -> Iterator[tuple[_Pos, Any]]:
        """(position, row) from `pos` to the end of the stream; blank JSONL lines are None."""
        for i in range(pos.input, len(self.inputs)):
            whole = self.inputs[i]
            row, byte = (pos.row, pos.byte) if i == pos.input else (0, 0)
            if whole.kind == "jsonl":
                with open(whole.input, "rb") as fh:
                    fh.seek(byte)
                    for number, line in enumerate(_bounded_lines(fh, whole.max_record_bytes), row):
                        yield _Pos(i, number, byte), _parse_row(whole.input, number, line)
                        byte += line.length if isinstance(line, _Oversized) else len(line)
                continue
            for start in range(row, whole.stop, _FORWARD_WINDOW):
                window = dataclasses.replace(whole, start=start, stop=min(start + _FORWARD_WINDOW, whole.stop))
                for number, (location, raw) in enumerate(read_chunk(window), start):
                    if whole.kind.startswith("jsonl-"):  # blank lines are skipped: take the line's number
                        number = int(location.rsplit(":", 1)[1]) - 1
                    yield _Pos(i, number), raw

    def backward(self, pos: _Pos) -> Iterator[Any]:
        """Rows before `pos`, nearest first."""
        for i in range(pos.input, -1, -1):
            whole = self.inputs[i]
            row, byte = (pos.row, pos.byte) if i == pos.input else (whole.stop, whole.byte_stop)
            if whole.kind == "jsonl":
                yield from _lines_before(whole.input, byte, row, whole.max_record_bytes)
                continue
            for number in range(row - 1, -1, -1):
                one = read_chunk(dataclasses.replace(whole, start=number, stop=number + 1))
                yield next(iter(one), (None, None))[1]  # a blank line reads as None


def _parse_row(path: str, number: int, line: bytes | _Oversized) -> Any:
    if not isinstance(line, _Oversized) and (not line or line.isspace()):
        return None
    return next(_parse_lines(path, number, [line]))[1]


def _lines_before(path: str, offset: int, rows: int, limit: int) -> Iterator[Any]:
    """The (at most `rows`) lines of a JSONL file that end before byte `offset`, parsed, nearest first
    (a line longer than `limit` is not copied out of the map)."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        end = offset
        for _ in range(rows):
            if end <= 0:
                return
            start = mm.rfind(b"\n", 0, end - 1) + 1
            size = end - start - (mm[end - 1] == _NEWLINE)
            line = mm[start:end] if size <= limit else _Oversized(mm[start:start + _OVERSIZED_PREFIX], size, limit,
                                                                   end - start)
            yield _parse_row(path, 0, line)
            end = start


def _episode_start(stream: _Stream, pos: _Pos, key_of: Callable[[Any], Any]) -> _Pos:
    """The first row at or after `pos` that starts an episode (see `group_consecutive`)."""
    from converters.registry import KEYLESS

    def key(row: Any) -> Any:
        return KEYLESS if row is None or isinstance(row, ParseFailure) else key_of(row)

    current = KEYLESS
    for n, row in enumerate(stream.backward(pos)):
        if n >= _MAX_LOOKBACK:
            break
        current = key(row)
        if current is not KEYLESS:
            break
    else:
        return pos  # the stream starts here: rows without a key lead a run of their own
    if current is KEYLESS:
        return pos
    for at, row in stream.forward(pos):
        k = key(row)
        if k is not KEYLESS and k != current:
            return at
    return stream.end


def align_to_episodes(chunks: list[Chunk], key_of: Callable[[Any], Any]) -> list[Chunk]:
    """Chunks whose rows are whole episodes: each starts at the first episode start at or after
    its planned start and reads on to where the next chunk starts, across inputs if need be.

    Only rows near chunk starts are read. The backward look for an episode's key reads a JSON
    input's rows by index and a plain JSONL file by byte offset (compressed JSONL is re-read
    from its start per chunk: prefer plain JSONL for big step-per-row inputs).
    """
    if not chunks:
        return chunks
    stream = _Stream(chunks)
    starts = [stream.pos(chunks[0])]
    starts += [max(_episode_start(stream, stream.pos(c), key_of), starts[-1]) for c in chunks[1:]]
    starts.append(stream.end)
    out = []
    for chunk, begin, end in zip(chunks, starts, starts[1:]):
        ranges = []
        for i in range(begin.input, min(end.input, len(stream.inputs) - 1) + 1):
            whole = stream.inputs[i]
            row, byte = (begin.row, begin.byte) if i == begin.input else (0, 0)
            stop, byte_stop = (end.row, end.byte) if i == end.input else (whole.stop, whole.byte_stop)
            if stop > row:
                ranges.append(dataclasses.replace(whole, start=row, stop=stop, byte_start=byte, byte_stop=byte_stop))
        out.append(dataclasses.replace(chunk, ranges=tuple(ranges)))
    return out


def _plan_one(spec: str, kind: str, input_index: int, chunk_size: int) -> list[Chunk]:
    if kind == "jsonl":
        offsets, total = _line_offsets(spec, chunk_size)
        size = os.path.getsize(spec)
        return [
            Chunk(spec, kind, input_index, i, i * chunk_size, min((i + 1) * chunk_size, total),
                  offsets[i], offsets[i + 1] if i + 1 < len(offsets) else size)
            for i in range(len(offsets))
        ]
    total = _count_records(spec, kind)
    return [
        Chunk(spec, kind, input_index, i, start, min(start + chunk_size, total))
        for i, start in enumerate(range(0, total, chunk_size))
    ]


def _line_offsets(path: str, every: int) -> tuple[list[int], int]:
    """Byte offsets of lines 0, every, 2*every, ... and the number of lines.

    Two passes over blocks of the file, each spread over a few threads (reads and numpy's
    comparisons run without the GIL): the first counts the newlines of every block, the
    second finds the wanted offsets in the blocks they fall in (with thousands of lines per
    chunk, a few of them). No Python code runs per line and each thread holds one block, so
    sizing a multi-GB file costs a fraction of reading it (4.8 GiB from the page cache: 0.5 s
    on 2 cores; one thread over a memory map took 0.85 s).
    """
    size = os.path.getsize(path)
    if size == 0:
        return [], 0
    starts = range(0, size, _BLOCK)
    with open(path, "rb", buffering=0) as fh, ThreadPoolExecutor(_SCAN_THREADS) as pool:
        scan = _BlockScanner(fh.fileno(), size)
        counts = list(pool.map(scan.count, starts))
        # Line k*every starts after newline number k*every - 1 (0-based): the block holding it.
        before = np.concatenate(([0], np.cumsum(counts)))
        wanted = np.arange(every - 1, int(before[-1]), every)
        holders = np.searchsorted(before, wanted, side="right") - 1
        need = np.unique(holders).tolist()
        # `holders` is sorted: each block's wanted newlines are one slice of `wanted`.
        cuts = np.searchsorted(holders, need + [len(starts)])
        found = pool.map(lambda i: scan.ends(starts[need[i]], wanted[cuts[i]:cuts[i + 1]] - before[need[i]]),
                         range(len(need)))
        last = os.pread(fh.fileno(), 1, size - 1)
        offsets = [0] + [int(end) + 1 for ends in found for end in ends]
    lines = int(before[-1]) + (last != b"\n")  # a last line without a newline counts
    if offsets[-1] >= size and len(offsets) > 1:
        offsets.pop()  # the file ends exactly on a chunk boundary
    return offsets, lines


class _BlockScanner:
    """Newlines of one block of a file, read with `pread` into a buffer of the calling thread."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.local = threading.local()

    def _flags(self, start: int) -> np.ndarray:
        local = self.local
        if not hasattr(local, "buffer"):
            local.buffer = bytearray(min(_BLOCK, self.size))
            local.data = np.frombuffer(local.buffer, dtype=np.uint8)
            local.flags = np.empty(len(local.buffer), dtype=bool)
        n = min(len(local.buffer), self.size - start)
        view = memoryview(local.buffer)[:n]
        got = 0
        while got < n:  # pread may return less than asked
            read = os.preadv(self.fd, [view[got:]], start + got)
            if read == 0:
                raise OSError(f"file shrank while being read (at byte {start + got})")
            got += read
        flags = local.flags[:n]
        np.equal(local.data[:n], _NEWLINE, out=flags)
        return flags

    def count(self, start: int) -> int:
        return int(np.count_nonzero(self._flags(start)))

    def ends(self, start: int, which: np.ndarray) -> np.ndarray:
        """File positions of the block's newlines number `which` (0-based within the block)."""
        return start + np.flatnonzero(self._flags(start))[which]


def _count_records(spec: str, kind: str) -> int:
    if kind.startswith("jsonl-"):
        with _open_compressed(spec, kind) as fh:
            return _count_lines(fh)
    if kind == "json":
        return len(_load_json(spec, os.path.getmtime(spec)))
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(spec).metadata.num_rows
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise InputError(f"{spec}: not a readable Parquet file ({_describe(exc)})") from None
    if kind in ("datasets", "hf"):
        return len(_load_hf(spec, kind))
    raise InputError(f"{spec}: unknown input kind {kind!r}")


# ---- reading ------------------------------------------------------------------------


_READ_BUFFER = 1 << 20


def _count_lines(fh: IO[bytes]) -> int:
    """Lines of a stream (a last one without a newline counts), read in blocks: no line is held whole."""
    lines, last = 0, b"\n"
    while block := fh.read(_READ_BUFFER):
        lines += block.count(b"\n")
        last = block[-1:]
    return lines + (last != b"\n")


@dataclass(frozen=True)
class _Oversized:
    """A line longer than the record size limit `limit`: its first bytes, its size (newline excluded)
    and the bytes it takes in the file (newline included)."""

    prefix: bytes
    size: int
    limit: int
    length: int


def _bounded_lines(fh: IO[bytes], limit: int) -> Iterator[bytes | _Oversized]:
    """The lines of a binary stream from where it stands; a line longer than `limit` bytes comes as
    `_Oversized`, read past in bounded pieces."""
    while line := fh.readline(limit + 1):
        if len(line) <= limit or line.endswith(b"\n"):
            yield line
            continue
        prefix, length = line[:_OVERSIZED_PREFIX], len(line)
        del line
        ended = False
        while not ended and (piece := fh.readline(_READ_BUFFER)):
            length += len(piece)
            ended = piece.endswith(b"\n")
        yield _Oversized(prefix, length - ended, limit, length)


def read_chunk(chunk: Chunk) -> Iterator[tuple[str, Any]]:
    """(location, raw record) for each record of the chunk; a bad JSONL line yields a ParseFailure."""
    if chunk.ranges is not None:
        for part in chunk.ranges:
            yield from read_chunk(part)
        return
    kind = chunk.kind
    try:
        if kind == "jsonl":
            yield from _read_jsonl_range(chunk)
        elif kind.startswith("jsonl-"):
            with _open_compressed(chunk.input, kind) as fh:
                lines = itertools.islice(_bounded_lines(fh, chunk.max_record_bytes), chunk.start, chunk.stop)
                yield from _parse_lines(chunk.input, chunk.start, lines)
        elif kind == "json":
            records = _load_json(chunk.input, os.path.getmtime(chunk.input))
            for i in range(chunk.start, chunk.stop):
                key, record = records[i]
                yield f"{chunk.input}#{key}", record
        elif kind == "parquet":
            yield from _read_parquet(chunk)
        else:
            table = _load_hf(chunk.input, kind).with_format("arrow")[chunk.start : chunk.stop]
            for i, row in enumerate(_arrow_rows(table), chunk.start):
                yield f"{chunk.input}@{i}", row
    except InputError:
        raise
    except (OSError, EOFError, *_DECODE_ERRORS) as exc:
        raise InputError(f"{chunk.input}: cannot read ({_describe(exc)})") from None


def _read_jsonl_range(chunk: Chunk) -> Iterator[tuple[str, Any]]:
    # Line by line from the buffered file: one copy of each line, not the chunk read whole and split.
    # A 1 MiB buffer: agent records are tens of KB, and the default 8 KiB buffer reads each line in
    # pieces and joins them (measured: 16 us per 25 KB line at 8 KiB, 4 us at 1 MiB).
    with open(chunk.input, "rb", buffering=_READ_BUFFER) as fh:
        fh.seek(chunk.byte_start)
        lines = itertools.islice(_bounded_lines(fh, chunk.max_record_bytes), chunk.stop - chunk.start)
        yield from _parse_lines(chunk.input, chunk.start, lines)


BOM = b"\xef\xbb\xbf"  # the UTF-8 byte order mark: not part of the JSON


def _parse_lines(path: str, first: int, lines: Any) -> Iterator[tuple[str, Any]]:
    loads = orjson.loads
    for number, line in enumerate(lines, first + 1):
        if isinstance(line, _Oversized):
            yield f"{path}:{number}", _too_large(line)
            continue
        if not line or line.isspace():
            continue  # blank lines are not records (`isspace` stops at the first other byte; strip would copy)
        try:
            yield f"{path}:{number}", loads(line)
        except orjson.JSONDecodeError as exc:
            if line.startswith(BOM):  # Windows tools start a file (or each line they append) with one
                try:
                    yield f"{path}:{number}", loads(line[len(BOM):])
                    continue
                except orjson.JSONDecodeError as bom_exc:
                    exc = bom_exc
            yield f"{path}:{number}", _parse_failure(line, exc)


def _too_large(line: _Oversized) -> ParseFailure:
    text = line.prefix.decode("utf-8", errors="replace")
    return ParseFailure(text=f"{text}...[{line.size - len(line.prefix):,} more bytes not kept]",
                        error=f"record too large: {line.size:,} bytes (the limit is {line.limit:,}; "
                              "--max-record-bytes raises it)", error_class="RecordTooLarge")


def _parse_failure(line: bytes, exc: Exception) -> ParseFailure:
    try:
        line.decode("utf-8")
        error_class = type(exc).__name__
    except UnicodeDecodeError:
        error_class = "UnicodeDecodeError"
    text = line.rstrip(b"\r\n").decode("utf-8", errors="replace")
    return ParseFailure(text=text, error=f"invalid JSON: {exc}", error_class=error_class)


def _open_compressed(path: str, kind: str) -> IO[bytes]:
    if kind == "jsonl-gzip":
        return gzip.open(path, "rb")
    import zstandard

    raw = open(path, "rb")
    reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
    return io.BufferedReader(reader, buffer_size=_READ_BUFFER)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=1)
def _load_json(path: str, mtime: float) -> list[tuple[Any, Any]]:
    """The records of a JSON file as (key, record), cached so its chunks parse it once per process."""
    data = Path(path).read_bytes().removeprefix(BOM)
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); a JSONL file lets bad lines be quarantined") from None
    if isinstance(value, list):
        return list(enumerate(value))
    if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        # An object whose values are all objects is a mapping of id -> record.
        return list(value.items())
    return [(0, value)]


def _read_parquet(chunk: Chunk) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(chunk.input)
    meta = pf.metadata
    groups, first, row = [], None, 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if row + n > chunk.start and row < chunk.stop:
            groups.append(g)
            first = row if first is None else first
        row += n
    if not groups:
        return
    table = pf.read_row_groups(groups).slice(chunk.start - first, chunk.stop - chunk.start)
    for i, record in enumerate(_arrow_rows(table), chunk.start):
        yield f"{chunk.input}@{i}", record


def _arrow_rows(table: Any) -> list[Any]:
    """A table's rows as dicts; a row with invalid UTF-8 becomes a ParseFailure (Arrow does not
    check UTF-8 when it reads), so it is quarantined and the others still convert."""
    try:
        return table.to_pylist()
    except UnicodeDecodeError:
        return [_arrow_row(table.slice(i, 1)) for i in range(table.num_rows)]


def _lenient_value(column: Any) -> Any:
    """A one-row column's value, with invalid UTF-8 replaced (kept for the quarantine record)."""
    try:
        return column.to_pylist()[0]
    except UnicodeDecodeError:
        pass
    try:
        raw = column.cast(pa.binary()).to_pylist()[0]
    except (pa.ArrowException, UnicodeDecodeError):
        return "<not decodable>"  # a nested column holding the bad text
    return None if raw is None else raw.decode("utf-8", "replace")


def _arrow_row(row: Any) -> Any:
    try:
        return row.to_pylist()[0]
    except UnicodeDecodeError as exc:
        text = repr({name: _lenient_value(column) for name, column in zip(row.column_names, row.columns)})
        return ParseFailure(text=text, error=f"invalid UTF-8 in a string column ({exc.reason})",
                            error_class="UnicodeDecodeError")


@functools.lru_cache(maxsize=4)
def _load_hf(spec: str, kind: str) -> Any:
    """A `datasets.Dataset` from a saved directory or the hub (memory-mapped, cached per process)."""
    import datasets

    if kind == "datasets":
        try:
            ds = datasets.load_from_disk(spec)
        except Exception as exc:  # datasets raises many types for a bad directory
            raise InputError(f"{spec}: not a loadable datasets directory ({_describe(exc)})") from None
        if isinstance(ds, datasets.DatasetDict):
            raise InputError(f"{spec}: a saved DatasetDict; pass one split's directory")
        return ds
    parts = spec[len(HF_PREFIX) :].split(":")
    name, config, split = parts[0], None, DEFAULT_HF_SPLIT
    if len(parts) == 2:
        split = parts[1]
    elif len(parts) == 3:
        config, split = parts[1], parts[2]
    elif len(parts) > 3 or not name:
        raise InputError(f"{spec}: expected {HF_PREFIX}OWNER/NAME[:CONFIG][:SPLIT]")
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        # Offline, load_dataset can still use a cached copy; say why if there is none.
        hint = " (offline: HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set and the dataset is not cached)"
    else:
        hint = ""
    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # connection, not-found and auth errors have no common base
        raise InputError(f"{spec}: cannot load from the Hugging Face hub{hint}: {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
