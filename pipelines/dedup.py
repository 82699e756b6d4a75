"""The dedup stage as Beam pipelines: exact (normalized content hash) and near (MinHash LSH).

    1. Create(shards) | Reshuffle | ParDo(SignShard)        -> spill: signatures, band hashes, exact hashes
                      | GroupByKey((band, part) -> shards)  -> ParDo(FindBuckets): candidate edges per band
    2. driver: verify near edges (estimated Jaccard from the full signatures >= threshold),
       union-find over exact + verified edges, one representative per cluster, `clusters.parquet`
    3. Create(todo shards) | Reshuffle | ParDo(WriteShard)  -> one unit per input shard

Scaling: signing streams each shard to memory-mapped .npy files, so worker memory is bounded
by a shard. Grouping sorts one band's (hash, key) arrays at a time (16 bytes per record per
band; `partitions` splits a band further by hash). Only candidate edges reach the driver:
their number grows with the duplicates, not the input, so union-find in the driver is cheap
(a few hundred bytes per duplicate). For inputs where even the duplicates do not fit one
machine, the edges would go through rounds of min-label propagation in Beam instead.

The representative of a cluster is its smallest id (or, with prefer_reward, highest reward
then smallest id). Other members go to `filtered/` as exact_dedup / near_dedup with a reason
naming the representative, the cluster and the estimated Jaccard to it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from filters.dedup import (
    DEFAULT_NUM_PERM,
    DEFAULT_THRESHOLD,
    LshParams,
    Signer,
    UnionFind,
    band_hashes,
    batch_texts,
    bucket_edges,
    exact_hash,
    lsh_params,
)
from pipelines.filter import (
    DEFAULT_RUNNER,
    PipelineError,
    run_beam,
    staging_dir,
    summarize_units,
    trajforge_version,
    unit_for_shard,
)
from schemas.store import DEFAULT_MAX_ROWS, Dataset

CLUSTERS_FILE = "clusters.parquet"
EXACT_BAND = -1
SIGN_BATCH = 2048
CLUSTER_SCHEMA = pa.schema([
    pa.field("cluster_id", pa.int64()),
    pa.field("representative", pa.string()),
    pa.field("members", pa.list_(pa.string())),
    pa.field("size", pa.int64()),
    pa.field("kind", pa.string()),  # exact | near | mixed
])
DEDUP_KEYS = ("in", "kept", "filtered", "quarantined")


def _key(shard: int, rows: np.ndarray) -> np.ndarray:
    return (np.uint64(shard) << np.uint64(32)) | rows.astype(np.uint64)


class SignShard(beam.DoFn):
    """Exact hashes, MinHash signatures and band hashes of one shard, written as .npy spill files."""

    def __init__(self, spill: str, num_perm: int, params: LshParams | None, partitions: int) -> None:
        self.spill = spill
        self.num_perm = num_perm
        self.params = params
        self.partitions = partitions

    def setup(self) -> None:
        self.signer = Signer(self.num_perm)

    def process(self, item: tuple[int, str]) -> Iterator[tuple[tuple[int, int], int]]:
        index, path = item
        spill = Path(self.spill)
        pf = pq.ParquetFile(path)
        n = pf.metadata.num_rows
        exact = np.empty(n, dtype=np.uint64)
        rewards = np.full(n, np.nan)
        sigs = bands = None
        if self.params is not None:
            sigs = np.lib.format.open_memmap(spill / f"sig-{index:06d}.npy", "w+", np.uint32, (n, self.num_perm))
            # Band-major, so a grouping task reads one contiguous band (n x 8 bytes), not the whole file.
            bands = np.lib.format.open_memmap(spill / f"band-{index:06d}.npy", "w+", np.uint64, (self.params.bands, n))
        ids: list[pa.Array] = []
        at = 0
        for batch in pf.iter_batches(batch_size=SIGN_BATCH, columns=["id", "steps", "reward"]):
            m = len(batch)
            exact_texts, near_texts = batch_texts(batch)
            exact[at : at + m] = [exact_hash(t) for t in exact_texts]
            rewards[at : at + m] = batch.column("reward").to_numpy(zero_copy_only=False).astype(float)
            ids.append(batch.column("id"))
            if sigs is not None and bands is not None and self.params is not None:
                s = self.signer.sign_many(near_texts)
                sigs[at : at + m] = s
                bands[:, at : at + m] = band_hashes(s, self.params).T
            at += m
        np.save(spill / f"exact-{index:06d}.npy", exact)
        np.save(spill / f"reward-{index:06d}.npy", rewards)
        pq.write_table(pa.table({"id": pa.concat_arrays(ids) if ids else pa.array([], pa.string())}),
                       spill / f"ids-{index:06d}.parquet")
        for arr in (sigs, bands):
            if arr is not None:
                arr.flush()
        band_ids = [EXACT_BAND] + (list(range(self.params.bands)) if self.params else [])
        for band in band_ids:
            for part in range(self.partitions):
                yield (band, part), index


class FindBuckets(beam.DoFn):
    """Candidate edges of one (band, partition): keys sharing a band hash, found by sorting."""

    def __init__(self, spill: str, partitions: int) -> None:
        self.spill = spill
        self.partitions = partitions

    def process(self, item: tuple[tuple[int, int], Any]) -> Iterator[str]:
        (band, part), shards = item
        spill = Path(self.spill)
        hashes, keys = [], []
        for index in sorted(set(shards)):
            if band == EXACT_BAND:
                h = np.load(spill / f"exact-{index:06d}.npy")
            else:
                h = np.array(np.load(spill / f"band-{index:06d}.npy", mmap_mode="r")[band])
            k = _key(index, np.arange(len(h)))
            if self.partitions > 1:
                mine = (h % np.uint64(self.partitions)) == part
                h, k = h[mine], k[mine]
            hashes.append(h)
            keys.append(k)
        edges = bucket_edges(np.concatenate(hashes), np.concatenate(keys)) if hashes else np.empty((0, 2), np.uint64)
        out = spill / f"edges-{band + 1:04d}-{part:04d}.npy"
        np.save(out, edges)
        yield str(out)


class WriteShard(beam.DoFn):
    """Write one input shard's unit: kept rows as they are, duplicates to `filtered/`."""

    def __init__(self, output: str, spill: str, max_rows: int) -> None:
        self.output = output
        self.spill = spill
        self.max_rows = max_rows

    def setup(self) -> None:
        self.dataset = Dataset(Path(self.output))

    def process(self, item: tuple[int, str]) -> Iterator[dict[str, int]]:
        index, path = item
        unit = unit_for_shard(Path(path))
        if self.dataset.is_finished(unit):
            return
        drops_file = Path(self.spill) / f"drops-{index:06d}.parquet"
        drops: dict[int, dict[str, Any]] = {}
        if drops_file.exists():
            drops = {r["row"]: r for r in pq.read_table(drops_file).to_pylist()}
        with self.dataset.unit(unit, max_rows=self.max_rows) as u:
            row_index = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    u.counts["in"] += 1
                    drop = drops.get(row_index)
                    if drop is None:
                        u.write_row("trajectories", row)
                        u.counts["kept"] += 1
                    else:
                        row.update(filter=drop["filter"], reason=drop["reason"], score=drop["score"])
                        u.write_row("filtered", row)  # the writer counts "filtered"
                        u.counts[f"filtered:{drop['filter']}"] += 1
                    row_index += 1
            c = u.counts
            if c["in"] != c["kept"] + c["filtered"]:
                raise PipelineError(f"unit {unit}: counts do not add up ({dict(c)})")
            counts = dict(c)
        yield counts


@dataclass
class DedupSummary:
    output: str
    shards: int
    shards_done: int
    clusters: int
    params: LshParams | None
    counts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    candidate_edges: int = 0
    verified_edges: int = 0

    @property
    def balanced(self) -> bool:
        c = self.counts
        return c["in"] == c["kept"] + c["filtered"] + c["quarantined"]


class _Spill:
    """Driver-side random access to the spill files.

    Signature rows are read with pread, not through a memory map: duplicates are scattered, and
    touching one 512-byte row per page of a map would make the whole signature file resident.
    """

    def __init__(self, spill: Path) -> None:
        self.spill = spill
        self._cache: dict[tuple[str, int], Any] = {}
        self._sig_files: dict[int, tuple[int, int, int]] = {}  # shard -> (fd, data offset, row bytes)

    def _sig_file(self, shard: int) -> tuple[int, int, int]:
        if shard not in self._sig_files:
            path = self.spill / f"sig-{shard:06d}.npy"
            with open(path, "rb") as fh:
                version = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, _ = read(fh)
                offset = fh.tell()
            self._sig_files[shard] = (os.open(path, os.O_RDONLY), offset, shape[1] * 4)
        return self._sig_files[shard]

    def close(self) -> None:
        for fd, _, _ in self._sig_files.values():
            os.close(fd)
        self._sig_files.clear()

    def _get(self, what: str, shard: int) -> Any:
        key = (what, shard)
        if key not in self._cache:
            if what == "ids":
                value: Any = pq.read_table(self.spill / f"ids-{shard:06d}.parquet").column("id").combine_chunks()
            else:
                value = np.load(self.spill / f"{what}-{shard:06d}.npy", mmap_mode="r")
            self._cache[key] = value
        return self._cache[key]

    def id(self, key: int) -> str:
        return self._get("ids", key >> 32)[key & 0xFFFFFFFF].as_py()

    def value(self, what: str, key: int) -> Any:
        return self._get(what, key >> 32)[key & 0xFFFFFFFF]

    def sigs(self, keys: np.ndarray) -> np.ndarray:
        fd, offset, width = self._sig_file(int(keys[0] >> np.uint64(32)))
        buf = bytearray(len(keys) * width)
        for i, key in enumerate(keys.tolist()):
            fd, offset, width = self._sig_file(key >> 32)
            buf[i * width : (i + 1) * width] = os.pread(fd, width, offset + (key & 0xFFFFFFFF) * width)
        return np.frombuffer(bytes(buf), dtype=np.uint32).reshape(len(keys), width // 4)


def _load_edges(spill: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """(exact edges, near candidate edges, candidate count), each as unique (a, b) rows with a < b."""
    def uniq(files: list[Path]) -> np.ndarray:
        arrays = [np.load(f) for f in files]
        e = np.concatenate(arrays) if arrays else np.empty((0, 2), np.uint64)
        if not len(e):
            return e.reshape(0, 2)
        e = np.sort(e, axis=1)
        return np.unique(e, axis=0)

    exact = uniq(sorted(spill.glob("edges-0000-*.npy")))
    near = uniq([f for f in sorted(spill.glob("edges-*.npy")) if not f.name.startswith("edges-0000-")])
    return exact, near, len(near)


def _verify(near: np.ndarray, spill: _Spill, threshold: float, batch: int = 200_000) -> np.ndarray:
    """Near candidates whose estimated Jaccard (full signature) reaches the threshold."""
    keep = []
    for start in range(0, len(near), batch):
        e = near[start : start + batch]
        sim = (spill.sigs(e[:, 0]) == spill.sigs(e[:, 1])).mean(axis=1)
        keep.append(e[sim >= threshold])
    return np.concatenate(keep) if keep else near


def cluster(spill_dir: Path, output: Path, threshold: float, prefer_reward: bool, near_enabled: bool
            ) -> tuple[int, int, int]:
    """Union-find over the edges; write drops per shard and `clusters.parquet`. Returns (clusters, candidates, verified)."""
    spill = _Spill(spill_dir)
    exact, near, candidates = _load_edges(spill_dir)
    verified = _verify(near, spill, threshold) if near_enabled and len(near) else np.empty((0, 2), np.uint64)
    uf = UnionFind()
    for a, b in exact.tolist():
        uf.union(a, b)
    for a, b in verified.tolist():
        uf.union(a, b)
    groups = uf.groups()

    def rank(key: int) -> tuple[Any, ...]:
        ident = spill.id(key)
        if prefer_reward:
            r = float(spill.value("reward", key))
            return (-(r if r == r else float("-inf")), ident)
        return (ident,)

    clusters = []
    for members in groups:
        ranked = sorted(members, key=rank)
        clusters.append((spill.id(ranked[0]), ranked))
    clusters.sort(key=lambda c: c[0])
    drops: dict[int, list[dict[str, Any]]] = defaultdict(list)
    rows: dict[str, list[Any]] = {name: [] for name in CLUSTER_SCHEMA.names}
    for cid, (rep_id, ranked) in enumerate(clusters):
        rep = ranked[0]
        rep_exact = int(spill.value("exact", rep))
        kinds = set()
        others = ranked[1:]
        sims = np.ones(len(others))
        if near_enabled:
            sims = (spill.sigs(np.array(others, dtype=np.uint64)) == spill.sigs(np.array([rep], dtype=np.uint64))).mean(axis=1)
        for key, sim in zip(others, sims):
            if int(spill.value("exact", key)) == rep_exact:
                kinds.add("exact")
                entry = ("exact_dedup", f"exact duplicate of {rep_id} (cluster {cid})", 1.0)
            else:
                kinds.add("near")
                entry = ("near_dedup", f"near duplicate of {rep_id} (cluster {cid}, est. jaccard {sim:.2f})", float(sim))
            drops[key >> 32].append({"row": key & 0xFFFFFFFF, "filter": entry[0], "reason": entry[1], "score": entry[2]})
        rows["cluster_id"].append(cid)
        rows["representative"].append(rep_id)
        rows["members"].append(sorted(spill.id(k) for k in ranked))
        rows["size"].append(len(ranked))
        rows["kind"].append("mixed" if len(kinds) > 1 else kinds.pop())
    spill.close()
    for shard, entries in drops.items():
        pq.write_table(pa.Table.from_pylist(entries), spill_dir / f"drops-{shard:06d}.parquet")
    tmp = output / f".tmp-{CLUSTERS_FILE}"
    pq.write_table(pa.table(rows, schema=CLUSTER_SCHEMA), tmp, compression="zstd")
    tmp.replace(output / CLUSTERS_FILE)
    return len(clusters), candidates, len(verified)


def run_dedup(
    input_dir: str,
    output: str,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    num_perm: int = DEFAULT_NUM_PERM,
    exact_only: bool = False,
    prefer_reward: bool = False,
    partitions: int = 1,
    runner: str = DEFAULT_RUNNER,
    beam_args: Sequence[str] = (),
    max_rows: int = DEFAULT_MAX_ROWS,
    overwrite: bool = False,
) -> DedupSummary:
    """Deduplicate the dataset at `input_dir` into `output` (resumable per input shard)."""
    started = time.perf_counter()
    if not 0.0 < threshold <= 1.0:
        raise PipelineError(f"threshold must be in (0, 1], got {threshold}")
    source = Dataset.open(input_dir)
    shards = [s.resolve() for s in source.shard_files("trajectories")]
    units = [unit_for_shard(s) for s in shards]
    if len(set(units)) != len(units):
        raise PipelineError(f"{input_dir}: shard file names repeat; cannot name units after them")
    params = None if exact_only else lsh_params(threshold, num_perm)
    key = (f"dedup\0{threshold}\0{num_perm}\0{exact_only}\0{prefer_reward}\0{source.path.resolve()}\0"
           f"{','.join(units)}\0{trajforge_version()}")
    ds = Dataset.create(output, stage="dedup", config_hash=hashlib.sha256(key.encode()).hexdigest(),
                        overwrite=overwrite)
    ds.recover()
    todo = [(i, str(s)) for i, (s, u) in enumerate(zip(shards, units)) if not ds.is_finished(u)]
    n_clusters, candidates, verified = -1, 0, 0
    if todo or not (ds.path / CLUSTERS_FILE).exists():
        ds.update_manifest(complete=False)
        staging = staging_dir(ds, "dedup")
        spill = staging / "spill"
        spill.mkdir()
        all_shards = [(i, str(s)) for i, s in enumerate(shards)]
        try:
            # Clustering is global, so every shard is signed even when only some units remain;
            # it is deterministic, so finished units stay consistent with the new clusters.
            run_beam(lambda p: (
                p
                | "Shards" >> beam.Create(all_shards)
                | "Spread" >> beam.Reshuffle()
                | "Sign" >> beam.ParDo(SignShard(str(spill), num_perm, params, partitions))
                | "ByBand" >> beam.GroupByKey()
                | "Buckets" >> beam.ParDo(FindBuckets(str(spill), partitions))
            ), runner=runner, beam_args=beam_args, staging=staging / "beam")
            n_clusters, candidates, verified = cluster(spill, ds.path, threshold, prefer_reward, not exact_only)
            if todo:
                out_path = str(ds.path.resolve())
                run_beam(lambda p: (
                    p
                    | "Shards" >> beam.Create(todo)
                    | "Spread" >> beam.Reshuffle()
                    | "Write" >> beam.ParDo(WriteShard(out_path, str(spill), max_rows))
                ), runner=runner, beam_args=beam_args, staging=staging / "beam")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    missing = [u for u in units if not ds.is_finished(u)]
    if missing:
        raise PipelineError(f"{len(missing)} shards were not written (first: {missing[0]}); re-run to resume")
    if n_clusters < 0:
        n_clusters = pq.ParquetFile(ds.path / CLUSTERS_FILE).metadata.num_rows
    counts = summarize_units(ds, units, DEDUP_KEYS)
    summary = DedupSummary(str(ds.path), len(shards), len(todo), n_clusters, params, counts,
                           time.perf_counter() - started, candidates, verified)
    if not summary.balanced:
        raise PipelineError("counts do not add up: " + ", ".join(f"{k}={counts[k]}" for k in DEDUP_KEYS))
    ds.mark_complete({k: counts[k] for k in DEDUP_KEYS} | {k: v for k, v in counts.items() if ":" in k}
                     | {"clusters": n_clusters})
    return summary
