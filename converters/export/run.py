"""The streaming export driver: dataset directory -> OUT/data shards + OUT/README.md.

Records are streamed from the store batch by batch (trajectories) or from the DuckDB pair join
(pairs), read column-wise (`records`), selected (`--mix`, failed trajectories), rendered by the
format's pure row function into one message buffer per batch, and written as one Arrow batch
per input batch; nothing holds the whole dataset. Every input record ends up counted: exported,
or skipped with a reason (`records_in == records_exported + sum(skipped)`).
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from converters.export import pairs as pair_join
from converters.export.card import CARD_DATA, write_card
from converters.export.formats import CONVERSATION_COLUMNS, FORMATS, Format, rows_to_batch
from converters.export.lengths import TokenStats, approx_tokens, dict_chars, message_chars, sum_lists
from converters.export.mix import copies
from converters.export.options import DPO_LEVELS, HISTORIES, KTO_MODES, SFT_LAYOUTS, FormatOptions
from converters.export.records import COLUMNS, PAIR_MEMBER, SPOILED, Batch, pair_refs, trains_records
from converters.export.render import Conversation, RenderOptions, Unrenderable
from converters.export.roles import RoleReport
from converters.export.sharegpt import DATASET_INFO
from converters.export.templates import RowFeatures, TemplateReport
from converters.export.tokenized import ChatTokenizer, TokenizerError
from converters.export.tokens import DRIFT_EXAMPLES, TOKEN_SOURCES
from converters.export.usage import UsageReport
from converters.export.writer import DEFAULT_SHARD_ROWS, TEMP_PREFIX, ShardWriter
from schemas.store import Dataset

BATCH_ROWS = 1024
FAILED = "success = false (--include-failed keeps it)"
DUPLICATE = "duplicate of an earlier row"
# A trl-sft messages row would train its train=false steps: TRL's SFTTrainer reads no per-message flag.
MASKED_IN_MESSAGES = "train=false assistant steps (--sft-layout messages would train them)"
# Notes the summary and the card show next to the counts.
TRUNCATED = "rows truncated by --max-length"
QUARANTINED = "quarantined in the source, not exported"
SHAREGPT_INFO = "dataset_info.json"
DROPPED_TURNS = "messages dropped by --max-length"


class ExportError(Exception):
    """Bad input or options; the message is a one-line explanation."""


class NothingToExport(ExportError):
    """No input record gives a row: an export of no row is no dataset (`datasets` cannot load it)."""

    def __init__(self, message: str, report: "ExportReport") -> None:
        super().__init__(message)
        self.report = report


@dataclass
class ExportConfig:
    format: str
    shard_rows: int = DEFAULT_SHARD_ROWS
    mix: dict[str, float] | None = None
    seed: int = 0
    # None: the format's default (kept, except for openai whose format has no field for it).
    reasoning: bool | None = None
    web_max_chars: int = 20_000
    sft_layout: str = "prompt-completion"
    kto_mode: str = "auto"
    dpo_level: str = "step"
    # What a generated record's rows are conditioned on: "request" (what its model was sent) or "full".
    history: str = "request"
    # Supervised formats leave out trajectories with success = false unless this is set.
    include_failed: bool = False
    # `tokenized`: a tokenizer directory (or hub name) and the longest row in tokens.
    tokenizer: str | None = None
    max_length: int | None = None
    # `tokenized`: rows of model calls that recorded their ids take them ("recorded") or the template's render.
    tokens: str = "recorded"
    # Rows the layout or the chat template cannot train as recorded: skipped with the reason, else refused.
    skip_unfit_rows: bool = False
    overwrite: bool = False
    duckdb_memory_limit: str = pair_join.DEFAULT_MEMORY_LIMIT
    # What decontamination dropped upstream (the pipeline flow passes it; else the source's manifest has it).
    decontamination: dict[str, Any] | None = None


@dataclass
class RunningStats:
    count: int = 0
    total: int = 0
    min: int | None = None
    max: int | None = None

    def add(self, value: int) -> None:
        self.count += 1
        self.total += value
        self.min = value if self.min is None else min(self.min, value)
        self.max = value if self.max is None else max(self.max, value)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass
class ExportReport:
    format: str
    output: Path
    records_in: int = 0
    records_exported: int = 0
    rows: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    notes: Counter[str] = field(default_factory=Counter)
    records_by_source: Counter[str] = field(default_factory=Counter)
    rows_by_source: Counter[str] = field(default_factory=Counter)
    steps_by_source: dict[str, RunningStats] = field(default_factory=dict)
    provenance: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    # Over the trajectories behind the exported rows (a pair's two sides both count).
    steps: Counter[int] = field(default_factory=Counter)
    rewards: Counter[float] = field(default_factory=Counter)
    step_labels: Counter[str] = field(default_factory=Counter)
    # Of the written rows: per conversation column, and all of a row's columns together.
    lengths: dict[str, TokenStats] = field(default_factory=dict)
    row_lengths: TokenStats = field(default_factory=TokenStats)
    kto_labels: Counter[bool] = field(default_factory=Counter)
    files: list[Path] = field(default_factory=list)
    sft_layout: str | None = None
    kto_mode: str | None = None
    dpo_level: str | None = None
    tokenizer: dict[str, Any] | None = None
    # `tokenized`: rows by where their ids come from, rows whose render departs from the recorded ids, examples.
    token_truth: dict[str, Any] | None = None
    include_failed: bool = False
    reasoning: bool = True
    # Model usage behind the exported rows and the episodes' success, per method and environment.
    usage: UsageReport = field(default_factory=UsageReport)
    # How TRL's bundled training templates render the written rows (conversational TRL formats).
    templates: TemplateReport = field(default_factory=TemplateReport)
    # Roles beside acting that the acting model played itself, per method (`details.actor_roles`).
    roles: RoleReport = field(default_factory=RoleReport)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


# ---- preparing -------------------------------------------------------------------------------


def _prepare_output(out: Path, src: Path, overwrite: bool) -> None:
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        raise ExportError(f"{out}: the output must not be the input dataset or inside it")
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ExportError(f"{out}: exists and is not empty (use --overwrite to replace an earlier export)")
        _remove_earlier_export(out)
    out.mkdir(parents=True, exist_ok=True)


def _remove_earlier_export(out: Path) -> None:
    """For --overwrite: the files an earlier export lists in its card.json as its own, and the temp shards
    of a killed one; nothing else. A directory no export wrote is refused: it may be anyone's."""
    data = out / "data"
    temps = [f for f in data.glob(f"{TEMP_PREFIX}*") if f.is_file()] if data.is_dir() and not data.is_symlink() else []
    try:
        listed = json.loads((out / CARD_DATA).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    if not isinstance(listed, list) or not all(isinstance(f, str) for f in listed):
        only_temps = {p.name for p in out.iterdir()} == {"data"} and all(
            p.name.startswith(TEMP_PREFIX) for p in data.iterdir()) if data.is_dir() else False
        if not only_temps:
            raise ExportError(f"{out}: not an export trajforge wrote (no {CARD_DATA} listing its files); refusing to "
                              "overwrite it: choose a new or empty directory")
        listed = []
    root = out.resolve()
    for name in listed:
        file = out / name
        # Whatever the card says: only a plain file inside the export directory.
        if (Path(name).is_absolute() or ".." in Path(name).parts or file.is_symlink() or not file.is_file()
                or root not in file.resolve().parents):
            continue
        file.unlink()
    for file in temps:
        file.unlink()


def _check_choice(value: str, choices: tuple[str, ...], what: str) -> None:
    if value not in choices:
        raise ExportError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")


def _is_local_path(spec: str) -> bool:
    """Whether a --tokenizer value can only mean a local path (a hub name is NAME or OWNER/NAME)."""
    return spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec


def resolve_options(fmt: Format, cfg: ExportConfig) -> FormatOptions:
    """The concrete options of one export (checked, tokenizer loaded)."""
    _check_choice(cfg.sft_layout, SFT_LAYOUTS, "SFT layout")
    _check_choice(cfg.kto_mode, KTO_MODES, "KTO mode")
    _check_choice(cfg.dpo_level, DPO_LEVELS, "DPO level")
    _check_choice(cfg.history, HISTORIES, "history")
    _check_choice(cfg.tokens, TOKEN_SOURCES, "token source")
    if fmt.name != "tokenized" and cfg.tokens != "recorded":
        raise ExportError("--tokens applies to --format tokenized only (--format rl always takes the recorded ids)")
    if cfg.web_max_chars < 0:
        raise ExportError(f"--web-max-chars must be >= 0 (0: pages are not cut), got {cfg.web_max_chars}")
    if fmt.name != "tokenized" and (cfg.tokenizer is not None or cfg.max_length is not None):
        raise ExportError("--tokenizer and --max-length apply to --format tokenized only")
    tokenizer = None
    if fmt.name == "tokenized":
        if not cfg.tokenizer:
            raise ExportError("--format tokenized needs --tokenizer PATH (a tokenizer directory with a chat template)")
        if _is_local_path(cfg.tokenizer) and not Path(cfg.tokenizer).expanduser().exists():
            raise ExportError(f"--tokenizer {cfg.tokenizer}: no such directory (give a tokenizer directory with a "
                              "chat template)")
        if cfg.max_length is not None and cfg.max_length < 1:
            raise ExportError(f"--max-length must be >= 1 token, got {cfg.max_length}")
        try:
            tokenizer = ChatTokenizer.load(cfg.tokenizer, cfg.max_length)
        except TokenizerError as exc:
            raise ExportError(str(exc)) from None
    reasoning = fmt.keeps_reasoning if cfg.reasoning is None else cfg.reasoning
    return FormatOptions(RenderOptions(reasoning=reasoning, web_max_chars=cfg.web_max_chars),  # type: ignore[arg-type]
                         cfg.sft_layout, cfg.kto_mode, cfg.dpo_level, tokenizer,  # type: ignore[arg-type]
                         skip_unfit=cfg.skip_unfit_rows, history=cfg.history,  # type: ignore[arg-type]
                         tokens=cfg.tokens)  # type: ignore[arg-type]


# ---- streaming -------------------------------------------------------------------------------


@dataclass
class Inputs:
    """One input batch: the records the export reads (trajectories, or pairs) and, per record,
    the trajectories behind it (`behind`: batches indexed like the records)."""

    ids: list[str]
    sources: list[str]
    behind: list[Batch]
    # Per record: why it gives no row, or None (filled in as the batch is processed).
    reasons: list[str | None]
    # Per record: (opts) -> rows, for formats that make rows record by record.
    makers: list[Callable[[FormatOptions], list[dict[str, Any]]] | None]


def _read_ahead(batches: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """The same items, read `depth` ahead in a background thread (Parquet decoding releases the GIL)."""
    items: queue.Queue[Any] = queue.Queue(depth)
    stop = threading.Event()

    def read() -> None:
        try:
            for item in batches:
                while not stop.is_set():
                    try:
                        items.put((True, item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put((False, None))
        except BaseException as exc:  # re-raised in the reading thread below
            items.put((False, exc))

    thread = threading.Thread(target=read, name="trajforge-export-reader", daemon=True)
    thread.start()
    try:
        while True:
            ok, item = items.get()
            if not ok:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        stop.set()
        thread.join()


def _checked(batch: Batch, ds: Dataset) -> Batch:
    problem = batch.first_problem()
    if problem is not None:
        raise ExportError(f"{ds.path}: record {problem[0]!r} fails validation ({problem[1]}); "
                          f"`trajforge validate {ds.path}` lists every problem")
    return batch


def _by_settings(batch: Batch) -> Iterator[Batch]:
    """The batch, split so that each part's trajectories share their render settings (rendered together)."""
    keys = batch.settings
    if len(set(keys)) <= 1:
        yield batch
        return
    groups: dict[Any, list[int]] = {}
    for r, key in enumerate(keys):
        groups.setdefault(key, []).append(r)
    for members in groups.values():
        yield Batch(batch.rows.take(pa.array(members)))


def _trajectory_inputs(fmt: Format, ds: Dataset) -> Iterator[Inputs]:
    columns = COLUMNS + [c for c in fmt.columns if c not in COLUMNS]
    for arrow_batch in _read_ahead(ds.iter_batches("trajectories", columns=columns, batch_size=BATCH_ROWS)):
        for batch in _by_settings(_checked(Batch(arrow_batch), ds)):
            makers: list[Any] = [None] * len(batch)
            if fmt.rows is not None:
                rows = fmt.rows
                makers = [(lambda o, r=rec: rows(r, o)) for rec in batch.records]
            yield Inputs(batch.py("id"), batch.py("source"), [batch], [None] * len(batch), makers)


def _pair_inputs(fmt: Format, ds: Dataset, cfg: ExportConfig) -> Iterator[Inputs]:
    joined = pair_join.iter_joined_pairs(ds.checked_shard_files("pairs"), ds.checked_shard_files("trajectories"),
                                         cfg.duckdb_memory_limit)
    assert fmt.rows is not None
    rows = fmt.rows
    for arrow_batch in joined:
        chosen = _checked(Batch(arrow_batch.column("chosen")), ds)
        rejected = _checked(Batch(arrow_batch.column("rejected")), ds)
        pairs = pair_refs(arrow_batch.column("pair"))
        reasons: list[str | None] = []
        makers: list[Any] = []
        for pair, c, r in zip(pairs, chosen.records, rejected.records):
            reasons.append("missing chosen trajectory" if c is None else "missing rejected trajectory" if r is None
                           else None)
            makers.append(None if reasons[-1] else (lambda o, p=pair, c=c, r=r: rows(p, c, r, o)))
        yield Inputs([p.id for p in pairs], [p.source for p in pairs], [chosen, rejected], reasons, makers)


def _select(fmt: Format, cfg: ExportConfig, inputs: Inputs) -> np.ndarray:
    """How many copies of each record to export (0: left out, and `inputs.reasons` says why)."""
    n = len(inputs.ids)
    copies_of = np.array([r is None for r in inputs.reasons], dtype=np.int64)
    if cfg.mix is not None:
        for r in np.flatnonzero(copies_of).tolist():
            source = inputs.sources[r]
            if source not in cfg.mix:
                inputs.reasons[r], copies_of[r] = "source not in --mix", 0
            elif (k := copies(cfg.mix[source], cfg.seed, inputs.ids[r])) == 0:
                inputs.reasons[r], copies_of[r] = "sampled out by --mix", 0
            else:
                copies_of[r] = k
    spoiled = np.logical_or.reduce([b.spoiled_by_user for b in inputs.behind])  # a pair: either side
    for r in np.flatnonzero(spoiled & (copies_of > 0)).tolist():
        inputs.reasons[r], copies_of[r] = SPOILED, 0
    if fmt.table == "trajectories" and trains_records(fmt):
        for r in np.flatnonzero(inputs.behind[0].pair_only & (copies_of > 0)).tolist():
            inputs.reasons[r], copies_of[r] = PAIR_MEMBER, 0
    if fmt.supervised and fmt.table == "trajectories" and not cfg.include_failed:
        failed = pc.fill_null(pc.equal(inputs.behind[0].column("success"), False), False).to_numpy(zero_copy_only=False)
        for r in np.flatnonzero(failed & (copies_of > 0)).tolist():
            inputs.reasons[r], copies_of[r] = FAILED, 0
    assert len(copies_of) == n
    return copies_of


def _content_key(row: dict[str, Any]) -> int:
    """What a preference row compares (not where it came from), for dropping repeats."""
    return hash(tuple(tuple(v.keys()) if isinstance(v, Conversation) else v
                      for k, v in row.items() if k in ("prompt", "chosen", "rejected", "tools")))


def _record_rows(opts: FormatOptions, inputs: Inputs, copies_of: np.ndarray,
                 seen: set[int] | None) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Rows of a per-record format, and each row's record (pairs: repeats of earlier rows left out)."""
    rows: list[dict[str, Any]] = []
    owner: list[int] = []
    for r in np.flatnonzero(copies_of).tolist():
        maker = inputs.makers[r]
        assert maker is not None
        try:
            made = maker(opts)
        except Unrenderable as exc:
            inputs.reasons[r] = str(exc)
            continue
        if seen is not None:
            keys = [_content_key(row) for row in made]
            if all(k in seen for k in keys):
                inputs.reasons[r] = DUPLICATE
                continue
            seen.update(keys)
        rows += made
        owner += [r] * len(made)
    return rows, np.array(owner, dtype=np.int64)


def _repeats(owner: np.ndarray, copies_of: np.ndarray) -> np.ndarray | None:
    """Row positions that write each record's rows `copies` times (None: every row once)."""
    if not len(owner) or (copies_of[owner] == 1).all():
        return None
    starts = np.r_[0, np.flatnonzero(np.diff(owner)) + 1]
    stops = np.r_[starts[1:], len(owner)]
    return np.concatenate([np.tile(np.arange(a, b), int(copies_of[owner[a]])) for a, b in zip(starts, stops)])


def _count(report: ExportReport, fmt: Format, opts: FormatOptions, inputs: Inputs, owner: np.ndarray,
           copies_of: np.ndarray) -> None:
    """Fold one batch's outcome into the report (vectorized over the batch)."""
    n = len(inputs.ids)
    report.records_in += n
    report.skipped.update(r for r in inputs.reasons if r is not None)
    exported = np.array([r is None for r in inputs.reasons], dtype=bool)
    report.records_exported += int(exported.sum())
    if fmt.table == "trajectories":
        report.usage.add_outcomes(inputs.behind[0])
    if not exported.any():
        return
    rows_per = np.bincount(owner, minlength=n) * copies_of
    first = inputs.behind[0]
    sources = pa.array(inputs.sources, pa.string()).filter(pa.array(exported)).dictionary_encode()
    group, names = sources.indices.to_numpy(), sources.dictionary.to_pylist()
    steps, rows = first.lengths[exported], rows_per[exported]
    counts = np.bincount(group, minlength=len(names))
    lows, highs = np.full(len(names), np.iinfo(np.int64).max), np.zeros(len(names), dtype=np.int64)
    np.minimum.at(lows, group, steps)
    np.maximum.at(highs, group, steps)
    for g, source in enumerate(names):
        report.records_by_source[source] += int(counts[g])
        report.rows_by_source[source] += int(rows[group == g].sum())
        stats = report.steps_by_source.setdefault(source, RunningStats())
        stats.count += int(counts[g])
        stats.total += int(steps[group == g].sum())
        stats.min = int(lows[g]) if stats.min is None else min(stats.min, int(lows[g]))
        stats.max = int(highs[g]) if stats.max is None else max(stats.max, int(highs[g]))
    keys = pc.binary_join_element_wise(*(pc.fill_null(first.column(c), "-").filter(pa.array(exported))
                                         for c in ("method", "source_dataset", "model")), "\x00").value_counts()
    for key, k in zip(keys.field("values").to_pylist(), keys.field("counts").to_pylist()):
        report.provenance[tuple(key.split("\x00"))] += k  # type: ignore[index]
    for batch in inputs.behind:
        for r in np.flatnonzero(exported).tolist():
            for what, instead in batch.fallbacks[r].items():
                report.notes[f"fallback in {inputs.sources[r]} records: {what}: {instead}"] += 1
        report.steps.update({int(k): int(v) for k, v in zip(*np.unique(batch.lengths[exported], return_counts=True))})
        rewards = pc.value_counts(pc.round(batch.column("reward").filter(pa.array(exported)).drop_null(), 2))
        report.rewards.update(dict(zip(rewards.field("values").to_pylist(), rewards.field("counts").to_pylist())))
        report.step_labels.update(batch.action_labels(exported))
        report.usage.add_usage(batch, exported)
        report.roles.add(batch, exported)


def _masked_in_messages(fmt: Format, cfg: ExportConfig, opts: FormatOptions, inputs: Inputs,
                        copies_of: np.ndarray) -> None:
    """trl-sft messages rows of trajectories with train=false assistant steps: refused, or skipped by option."""
    if fmt.name != "trl-sft" or opts.sft_layout != "messages":
        return
    for r in np.flatnonzero(inputs.behind[0].masked_assistant & (copies_of > 0)).tolist():
        if not cfg.skip_unfit_rows:
            raise ExportError(f"record {inputs.ids[r]!r} has {MASKED_IN_MESSAGES}: TRL's SFTTrainer reads no "
                              "per-message flag; use --sft-layout prompt-completion (the default), or --skip-unfit-rows")
        inputs.reasons[r], copies_of[r] = MASKED_IN_MESSAGES, 0


# The columns whose assistant messages a row trains, for the chat-template check (with the `train` flag).
_TRAINED_COLUMNS: dict[str, Callable[[FormatOptions], tuple[list[str], bool]]] = {
    "trl-sft": lambda o: (["messages"], True) if o.sft_layout == "messages" else (["completion"], False),
    "trl-dpo": lambda o: (["chosen", "rejected"], False),
    "trl-kto": lambda o: (["completion"], False),
}


def _check_templates(report: ExportReport, fmt: Format, opts: FormatOptions, table: pa.RecordBatch) -> None:
    if fmt.name in _TRAINED_COLUMNS:
        columns, flag = _TRAINED_COLUMNS[fmt.name](opts)
        report.templates.add(RowFeatures.of(table, columns, flag))


def _tokenized_notes(report: ExportReport, fmt: Format, rows: list[dict[str, Any]]) -> None:
    if fmt.name == "tokenized":
        truth = report.token_truth
        assert truth is not None
        for row in rows:
            if row["dropped_turns"]:
                report.notes[TRUNCATED] += 1
                report.notes[DROPPED_TURNS] += row["dropped_turns"]
            truth["rows"][row["token_source"]] += 1
            if "_recorded_by" in row:
                truth["recorded_by"][row["_recorded_by"]] += 1
                truth["foreign" if "_foreign" in row else "compared"] += 1
            if "_drift" in row:
                truth["differ"] += 1
                truth["first_difference"].append(row["drift_at"])
                if len(truth["examples"]) < DRIFT_EXAMPLES:
                    truth["examples"].append(row["_drift"])


def _measure(report: ExportReport, fmt: Format, opts: FormatOptions, table: pa.RecordBatch | None,
             lines: list[dict[str, Any]]) -> None:
    """Lengths (and KTO labels) of the rows just written, for the card."""
    if fmt.file_type == "jsonl":
        key = "steps" if fmt.name == "atif" else "messages"
        chars = [dict_chars(line[key]) if key == "messages" else len(json.dumps(line[key])) for line in lines]
        tokens = approx_tokens(np.array(chars, dtype=np.int64))
        per_column = {key: (tokens, np.array([len(line[key]) for line in lines], dtype=np.int64))}
    elif table is None or not table.num_rows:
        return
    elif fmt.name in ("tokenized", "rl"):
        ids, mask = ("input_ids", "assistant_masks") if fmt.name == "tokenized" else ("completion_ids", "completion_mask")
        masks = table.column(mask)
        trained = sum_lists(masks, masks.values.to_numpy(zero_copy_only=False).astype(np.int64))
        lengths = pc.list_value_length(table.column(ids)).to_numpy().astype(np.int64)
        if fmt.name == "rl":
            lengths = lengths + pc.list_value_length(table.column("prompt_ids")).to_numpy().astype(np.int64)
        per_column = {ids: (lengths, trained)}
    else:
        per_column = {}
        for name in CONVERSATION_COLUMNS[fmt.name](opts):
            chars, messages = message_chars(table.column(name))
            per_column[name] = (approx_tokens(chars), messages)
    row = np.zeros(len(next(iter(per_column.values()))[0]), dtype=np.int64)
    for name, (tokens, messages) in per_column.items():
        report.lengths.setdefault(name, TokenStats()).add(tokens, messages)
        row += tokens
    report.row_lengths.add(row, row)
    if fmt.name == "trl-kto" and table is not None:
        counts = pc.value_counts(table.column("label"))
        report.kto_labels.update(dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist())))


def export(src: str | Path, out: str | Path, cfg: ExportConfig,
           progress: Callable[[int], None] | None = None, total: Callable[[int], None] | None = None) -> ExportReport:
    """Export the dataset at `src` into `out`. `total(n)` is told the input count, `progress(k)` after each batch."""
    src, out = Path(src), Path(out)
    fmt = FORMATS.get(cfg.format)
    if fmt is None:
        raise ExportError(f"unknown format {cfg.format!r}; choose one of {', '.join(FORMATS)}")
    if cfg.shard_rows < 1:
        raise ExportError(f"--shard-rows must be >= 1, got {cfg.shard_rows}")
    opts = resolve_options(fmt, cfg)
    ds = Dataset.open(src)
    created = not out.exists()
    _prepare_output(out, src, cfg.overwrite)
    report = ExportReport(format=fmt.name, output=out, reasoning=opts.render.reasoning, include_failed=cfg.include_failed,
                          sft_layout=opts.sft_layout if fmt.name == "trl-sft" else None,
                          kto_mode=opts.kto_mode if fmt.name == "trl-kto" else None,
                          dpo_level=opts.dpo_level if fmt.name == "trl-dpo" else None)
    if opts.tokenizer is not None:
        report.tokenizer = {"path": opts.tokenizer.name, "method": opts.tokenizer.method,
                            "max_length": opts.tokenizer.max_length}
        report.token_truth = {"choice": opts.tokens, "rows": Counter(), "compared": 0, "foreign": 0, "recorded_by": Counter(),
                              "differ": 0, "first_difference": [],
                              "examples": []}
    if total is not None:
        total(ds.count(fmt.table))
    if quarantined := ds.count("quarantine"):
        report.notes[QUARANTINED] = quarantined
    schema = fmt.schema(opts) if fmt.schema is not None else None
    writer = ShardWriter(out / "data", fmt.file_type, schema, cfg.shard_rows)
    seen: set[int] | None = set() if fmt.table == "pairs" else None
    batches = _pair_inputs(fmt, ds, cfg) if fmt.table == "pairs" else _trajectory_inputs(fmt, ds)
    try:
        for inputs in batches:
            copies_of = _select(fmt, cfg, inputs)
            _masked_in_messages(fmt, cfg, opts, inputs, copies_of)
            rows: list[dict[str, Any]] = []
            if fmt.batch is not None:
                reasons, table, owner = fmt.batch(inputs.behind[0], opts, schema, copies_of > 0)
                inputs.reasons = [a if a is not None else b for a, b in zip(inputs.reasons, reasons)]
            else:
                rows, owner = _record_rows(opts, inputs, copies_of, seen)
                table = rows_to_batch(rows, schema) if schema is not None and rows else None
            _count(report, fmt, opts, inputs, owner, copies_of)
            _tokenized_notes(report, fmt, rows)
            repeats = _repeats(owner, copies_of)
            if fmt.file_type == "jsonl":
                lines = rows if repeats is None else [rows[i] for i in repeats.tolist()]
                writer.write_lines(lines)
                report.rows += len(lines)
                _measure(report, fmt, opts, None, lines)
            elif table is not None and table.num_rows:
                if repeats is not None:
                    table = table.take(pa.array(repeats))
                writer.write_batch(table)
                report.rows += table.num_rows
                _measure(report, fmt, opts, table, [])
                _check_templates(report, fmt, opts, table)
            if progress is not None:
                progress(len(inputs.ids))
        if not report.rows:  # an empty export would not load (`datasets` finds no data) nor train
            raise NothingToExport(_nothing_to_export(report, fmt, ds), report)
        report.files = writer.close()
    except TokenizerError as exc:  # the chat template cannot give exact masks: for any record
        writer.abort()
        raise ExportError(f"{cfg.tokenizer}: {exc}") from None
    except BaseException:
        writer.abort()
        if created:  # leave no empty directory behind
            for folder in (out / "data", out):
                with contextlib.suppress(OSError):
                    folder.rmdir()
        raise
    extra = []
    if fmt.name == "sharegpt":
        (out / SHAREGPT_INFO).write_text(json.dumps(DATASET_INFO, indent=2) + "\n")
        extra.append(SHAREGPT_INFO)
    write_card(out, fmt, cfg, report, report.files, source=src, extra_files=extra)
    return report


def _nothing_to_export(report: ExportReport, fmt: Format, ds: Dataset) -> str:
    """Why an export has no row, in one line: what the input holds, why each record gave none."""
    quarantined = report.notes.get(QUARANTINED, 0)
    held = f"; its {quarantined} quarantined records are never exported (`trajforge view {ds.path}` shows why)" \
        if quarantined else ""
    if not report.records_in:
        return f"nothing to export: {ds.path} holds no {fmt.table}{held}"
    why = ", ".join(f"{n} {reason}" for reason, n in report.skipped.most_common(3))
    more = f" and {len(report.skipped) - 3} more reasons" if len(report.skipped) > 3 else ""
    return (f"nothing to export: none of the {report.records_in} {fmt.table} of {ds.path} gives a {fmt.name} row "
            f"({why}{more}){held}")
