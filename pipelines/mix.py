"""AgentOhana-style mixing: balanced, seeded sampling across sources, streamed with DuckDB.

Semantics. Let n_s be the number of records of source s (the `source` column, over all inputs)
and w_s its weight (default 1). With temperature T the source probabilities are

    p_s = (n_s * w_s) ** (1 / T) / sum_t (n_t * w_t) ** (1 / T)

so T = 1 samples in proportion to weighted size, T -> infinity gives every source the same
share, and T < 1 favours the large sources further. With N records wanted (`total`; default
the sum of n_s) source s gets target t_s = N * p_s, capped at n_s: records are never repeated
and a capped source's shortfall is not redistributed (the summary shows it).

A record is kept when u(seed, id) < t_s / n_s, where u is the first 53 bits of
md5("seed:id") as a fraction in [0, 1). So the sample is deterministic for a seed,
independent of input order and sharding, nested across totals (a larger total keeps a
superset), and DuckDB evaluates it while streaming the Parquet shards: nothing is
materialized in Python beyond one Arrow batch. Counts per source are therefore t_s in
expectation (binomial spread), not exactly.

Record ids are unique in the output: a record whose id appeared before (inputs in path order,
then shard order, then row order) is dropped before sampling, and the summary counts them.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import duckdb

from schemas.store import Dataset, check_apart, duckdb_files

HASH_SCALE = float(2**53)
# A row's position across all inputs: file order * ROW_SPAN + row number within the file.
ROW_SPAN = 2**32


class MixError(Exception):
    """A fatal problem with a mix run (bad weights, no inputs, an unknown source)."""


@dataclass
class SourceMix:
    name: str
    available: int
    weight: float
    probability: float
    target: float
    written: int = 0


@dataclass
class MixSummary:
    output: str
    sources: list[SourceMix]
    written: int = 0
    seconds: float = 0.0
    counts: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0  # records dropped because an earlier one had the same id


def source_probabilities(sizes: dict[str, int], weights: dict[str, float], temperature: float) -> dict[str, float]:
    """p_s ∝ (n_s * w_s) ** (1/T), normalized (the module docstring states the semantics)."""
    if temperature <= 0:
        raise MixError("temperature must be > 0")
    mass = {s: (n * weights.get(s, 1.0)) ** (1.0 / temperature) for s, n in sizes.items()}
    total = sum(mass.values())
    if total <= 0:
        raise MixError("all sources have zero weight or no records")
    return {s: m / total for s, m in mass.items()}


def _rows_sql(files: Sequence[str]) -> str:
    """The rows of `files` (absolute paths), with the file and row number that place each one in input order."""
    # union_by_name: shards written before a step field existed read it as null (else the first file's
    # columns win and later files lose the field).
    return f"read_parquet({duckdb_files(files)}, filename=true, file_row_number=true, union_by_name=true)"


# Rows (`t`) that are the first occurrence of their id (tables `files` and `firsts`).
_FIRSTS_ONLY = ("FROM {rows} t JOIN files f USING (filename) "
                f"JOIN firsts k ON k.id = t.id AND k.pos = f.ord * {ROW_SPAN} + t.file_row_number")


def run_mix(
    inputs: Sequence[str],
    output: str,
    *,
    weights: dict[str, float] | None = None,
    temperature: float = 1.0,
    seed: int = 0,
    total: int | None = None,
    overwrite: bool = False,
) -> MixSummary:
    started = time.perf_counter()
    weights = dict(weights or {})
    if not inputs:
        raise MixError("no inputs given")
    if any(w < 0 for w in weights.values()):
        raise MixError("weights must be >= 0")
    if total is not None and total < 1:
        raise MixError(f"total must be at least 1 record, not {total}")
    datasets = [Dataset.open(p) for p in inputs]
    check_apart(output, inputs)
    files = {str(ds.path.resolve()): ds.checked_shard_files("trajectories") for ds in datasets}
    # Absolute: DuckDB's `filename` column names each file so, and the `files` table must match it.
    ordered = [os.path.abspath(f) for _, fs in sorted(files.items()) for f in fs]
    if not ordered:
        raise MixError("the inputs hold no trajectories")
    con = duckdb.connect()
    con.execute("CREATE TEMP TABLE files (filename VARCHAR, ord BIGINT)")
    con.executemany("INSERT INTO files VALUES (?, ?)", [(f, n) for n, f in enumerate(ordered)])
    # The first occurrence of every id; later ones are duplicates and never sampled.
    con.execute(f"CREATE TEMP TABLE firsts AS SELECT t.id, min(f.ord * {ROW_SPAN} + t.file_row_number) AS pos "
                f"FROM {_rows_sql(ordered)} t JOIN files f USING (filename) GROUP BY t.id")
    rows_in = con.execute(f"SELECT count(*) FROM {_rows_sql(ordered)}").fetchall()[0][0]
    duplicates = rows_in - con.execute("SELECT count(*) FROM firsts").fetchall()[0][0]
    sizes = dict(con.sql(f"SELECT t.source, count(*) {_FIRSTS_ONLY.format(rows=_rows_sql(ordered))} GROUP BY 1")
                 .fetchall())
    unknown = set(weights) - set(sizes)
    if unknown:
        raise MixError(f"weights name unknown sources {sorted(unknown)}; sources are {sorted(sizes)}")
    probs = source_probabilities(sizes, weights, temperature)
    n_total = sum(sizes.values()) if total is None else total
    mixes = [SourceMix(s, sizes[s], weights.get(s, 1.0), probs[s], min(sizes[s], n_total * probs[s]))
             for s in sorted(sizes)]
    rates = {m.name: (m.target / m.available if m.available else 0.0) for m in mixes}
    key = f"mix\0{sorted(files)}\0{sorted(weights.items())}\0{temperature}\0{seed}\0{total}\0unique-ids"
    out = Dataset.create(output, stage="mix", config_hash=hashlib.sha256(key.encode()).hexdigest(),
                         overwrite=overwrite)
    out.recover()
    con.execute("CREATE TEMP TABLE rates (source VARCHAR, rate DOUBLE)")
    con.executemany("INSERT INTO rates VALUES (?, ?)", list(rates.items()))
    for path, shard_files in sorted(files.items()):
        unit = "mix-" + hashlib.sha256(path.encode()).hexdigest()[:12]
        if out.is_finished(unit) or not shard_files:
            continue
        query = (
            f"SELECT t.* EXCLUDE (filename, file_row_number) "
            f"{_FIRSTS_ONLY.format(rows=_rows_sql([os.path.abspath(f) for f in shard_files]))} "
            f"JOIN rates r ON r.source = t.source "
            f"WHERE (md5_number_lower('{int(seed)}:' || t.id) >> 11)::DOUBLE / {HASH_SCALE} < r.rate"
        )
        reader = con.sql(query).to_arrow_reader(4096)
        with out.unit(unit) as u:
            for batch in reader:
                for row in batch.to_pylist():
                    u.write_row("trajectories", row)
                    u.counts[f"source:{row['source']}"] += 1
    counts = out.unit_counts()
    for m in mixes:
        m.written = counts.get(f"source:{m.name}", 0)
    written = sum(m.written for m in mixes)
    out.mark_complete({"written": written, "duplicate": duplicates, **{f"source:{m.name}": m.written for m in mixes},
                       **{f"available:{m.name}": m.available for m in mixes}})
    return MixSummary(str(out.path), mixes, written, time.perf_counter() - started, counts, duplicates)
