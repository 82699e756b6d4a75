"""The decontaminate stage as a Beam pipeline: records that overlap benchmark test data are dropped.

    driver: references -> ReferenceIndex (filters/decontam.py), saved to the staging dir
    Create(todo shards) | Reshuffle | ParDo(DecontaminateShard) -> one unit per input shard
    driver: preference pairs whose two trajectories were both kept -> unit "pairs"

A unit is one input shard, named after it, so a re-run skips finished shards (like dedup). Kept
rows are written as they are (Arrow batches end to end); a matching record goes to `filtered/` as
`decontaminate` with a reason naming the reference and the overlapping words, and a score (1.0 for
an exact instruction, the estimated Jaccard, or the share of the record's n-grams found). Pairs
are carried so a DPO export of the stage's output holds no contaminated trajectory; a pair that
loses a trajectory is counted (`pairs_dropped`). For every unit and in total: in = kept +
filtered. The manifest keeps a `decontamination` report: the settings, the references by source,
the matches by source and kind, and the first examples; the export card shows it.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq

from filters.decontam import Reference, ReferenceIndex, record_texts
from pipelines.beam_runner import DEFAULT_RUNNER, PipelineError, check_portable, run_beam, staging_dir
from pipelines.decontam_report import EXAMPLES
from pipelines.filter import summarize_units, trajforge_version, unit_for_shard
from pipelines.split_shards import checked_counts, trajectory_batches, write_split
from schemas.store import DEFAULT_MAX_ROWS, ROW_GROUP_ROWS, Dataset, check_apart

FILTER = "decontaminate"
INDEX_FILE = "references.json"
PAIRS_UNIT = "pairs"
KEYS = ("in", "kept", "filtered", "quarantined")


class DecontaminateShard(beam.DoFn):
    """Check every record of one input shard against the references; write its unit."""

    def __init__(self, index_path: str, output: str, max_rows: int) -> None:
        self.index_path = index_path
        self.output = output
        self.max_rows = max_rows

    def setup(self) -> None:
        self.index = ReferenceIndex.load(Path(self.index_path))
        self.dataset = Dataset(Path(self.output))

    def process(self, shard: str) -> Iterator[dict[str, int]]:
        path = Path(shard)
        unit = unit_for_shard(path)
        if self.dataset.is_finished(unit):
            return
        with self.dataset.unit(unit, max_rows=self.max_rows) as u:
            examples: list[dict[str, Any]] = []
            for rows in trajectory_batches(path):
                ids = rows.column("id").to_pylist()
                keep = np.ones(len(rows), dtype=bool)
                decided: dict[str, list[Any]] = {"filter": [], "reason": [], "score": []}
                for r, match in enumerate(self.index.match_many(record_texts(rows))):
                    if match is None:
                        continue
                    keep[r] = False
                    decided["filter"].append(FILTER)
                    decided["reason"].append(match.reason(self.index.ngram))
                    decided["score"].append(match.score)
                    u.counts[f"decontaminate:{match.reference.source}"] += 1
                    u.counts[f"decontaminate:{match.kind}"] += 1
                    if sum(e["reference_source"] == match.reference.source for e in examples) < EXAMPLES:
                        examples.append({"id": ids[r], "reference": match.reference.id,
                                         "reference_source": match.reference.source, "kind": match.kind,
                                         "score": match.score, "evidence": match.evidence})
                write_split(u, rows, keep, decided)
                if not keep.all():
                    u.counts[f"filtered:{FILTER}"] += int((~keep).sum())
            u.meta["examples"] = examples
            counts = checked_counts(unit, u.counts)
        yield counts


@dataclass
class DecontamSummary:
    output: str
    shards: int
    shards_done: int
    references: dict[str, int]
    counts: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def balanced(self) -> bool:
        c = self.counts
        return c["in"] == c["kept"] + c["filtered"] + c["quarantined"]

    def by_source(self) -> dict[str, int]:
        return {k.split(":", 1)[1]: v for k, v in sorted(self.counts.items())
                if k.startswith("decontaminate:") and k.split(":", 1)[1] in self.references}


def pick_examples(examples: list[dict[str, Any]], n: int = EXAMPLES) -> list[dict[str, Any]]:
    """Up to `n` examples, taking each reference source in turn (by record id within a source)."""
    by_source: dict[str, list[dict[str, Any]]] = {}
    for e in sorted(examples, key=lambda e: (e["reference_source"], e["id"])):
        by_source.setdefault(e["reference_source"], []).append(e)
    out: list[dict[str, Any]] = []
    while len(out) < n and any(by_source.values()):
        for queue in by_source.values():
            if queue and len(out) < n:
                out.append(queue.pop(0))
    return out


def _copy_pairs(source: Dataset, ds: Dataset) -> None:
    """Unit "pairs": the source's pairs whose chosen and rejected trajectories were both kept."""
    if ds.is_finished(PAIRS_UNIT):
        return
    files = source.checked_shard_files("pairs")
    with ds.unit(PAIRS_UNIT) as u:
        if files:
            kept = ds.ids("trajectories")
            for f in files:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=ROW_GROUP_ROWS):
                    for row in batch.to_pylist():
                        if row["chosen_id"] in kept and row["rejected_id"] in kept:
                            u.write_row("pairs", row)
                        else:
                            u.counts["pairs_dropped"] += 1
        u.counts["pairs_in"] += source.count("pairs") if files else 0


def run_decontam(
    input_dir: str,
    output: str,
    references: Sequence[Reference],
    *,
    ngram: int = 13,
    threshold: float = 0.8,
    num_perm: int = 128,
    min_ngrams: int = 1,
    runner: str = DEFAULT_RUNNER,
    beam_args: Sequence[str] = (),
    max_rows: int = DEFAULT_MAX_ROWS,
    overwrite: bool = False,
) -> DecontamSummary:
    """Drop the records of `input_dir` that overlap `references`, into `output` (resumable per shard)."""
    started = time.perf_counter()
    if not references:
        raise PipelineError("no reference test data to decontaminate against")
    try:
        index = ReferenceIndex(references, ngram=ngram, threshold=threshold, num_perm=num_perm, min_ngrams=min_ngrams)
    except ValueError as exc:
        raise PipelineError(str(exc)) from None
    check_portable(runner, beam_args)
    source = Dataset.open(input_dir)
    check_apart(output, [input_dir])
    shards = [s.resolve() for s in source.checked_shard_files("trajectories")]
    units = [unit_for_shard(s) for s in shards]
    if len(set(units)) != len(units) or PAIRS_UNIT in units:
        raise PipelineError(f"{input_dir}: shard file names repeat (or one is named {PAIRS_UNIT!r}); cannot name "
                            "units after them")
    key = (f"decontaminate\0{ngram}\0{threshold}\0{num_perm}\0{min_ngrams}\0{index.digest()}\0"
           f"{source.path.resolve()}\0{','.join(units)}\0{trajforge_version()}")
    ds = Dataset.create(output, stage=FILTER, config_hash=hashlib.sha256(key.encode()).hexdigest(), overwrite=overwrite)
    ds.recover()
    todo = [str(s) for s, u in zip(shards, units) if not ds.is_finished(u)]
    if todo:
        ds.update_manifest(complete=False)
        staging = staging_dir(ds, FILTER)
        index_path = staging / INDEX_FILE
        index.save(index_path)
        out_path = str(ds.path.resolve())
        try:
            run_beam(lambda p: (
                p
                | "Shards" >> beam.Create(todo)
                | "Spread" >> beam.Reshuffle()
                | "Decontaminate" >> beam.ParDo(DecontaminateShard(str(index_path), out_path, max_rows))
            ), runner=runner, beam_args=beam_args, temp_location=staging / "beam")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    missing = [u for u in units if not ds.is_finished(u)]
    if missing:
        raise PipelineError(f"{len(missing)} shards were not written (first: {missing[0]}); re-run to resume")
    _copy_pairs(source, ds)
    counts = summarize_units(ds, units + [PAIRS_UNIT], KEYS)
    finished = ds.finished_units()
    examples = pick_examples([e for u in units for e in finished[u].get("meta", {}).get("examples", [])])
    references_by_source = dict(sorted(Counter(r.source for r in references).items()))
    summary = DecontamSummary(str(ds.path), len(shards), len(todo), references_by_source, counts, examples,
                              time.perf_counter() - started)
    if not summary.balanced:
        raise PipelineError("counts do not add up: " + ", ".join(f"{k}={counts[k]}" for k in KEYS))
    report = {"settings": {"ngram": ngram, "threshold": threshold, "num_perm": num_perm, "min_ngrams": min_ngrams},
              "references": references_by_source, "records_in": counts["in"], "dropped": counts["filtered"],
              "dropped_by_source": summary.by_source(),
              "dropped_by_kind": {k.split(":", 1)[1]: v for k, v in sorted(counts.items())
                                  if k.startswith("decontaminate:") and k.split(":", 1)[1] not in references_by_source},
              "pairs_dropped": counts["pairs_dropped"], "examples": summary.examples}
    ds.update_manifest(decontamination=report)
    ds.mark_complete({k: v for k, v in counts.items() if k in KEYS or ":" in k or k.startswith("pairs_")})
    return summary

