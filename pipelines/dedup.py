"""The dedup stage as Beam pipelines: exact (normalized content hash) and near (MinHash LSH).

    1. Create(shards) | Reshuffle | ParDo(SignShard)        -> spill: signatures, band hashes, exact hashes
                      | GroupByKey((band, part) -> shards)  -> ParDo(FindBuckets): candidate edges per band
    2. driver: verify near edges (estimated Jaccard from the full signatures >= threshold),
       connected components of exact + verified edges, one representative per cluster,
       `clusters.parquet` and per-shard drop lists
    3. Create(todo shards) | Reshuffle | ParDo(WriteShard)  -> one unit per input shard

Scaling: signing streams each shard to memory-mapped .npy files, so worker memory is bounded
by a shard. Grouping sorts one (band, partition) of (hash, key) arrays at a time; partitions
are chosen so a task holds at most BUCKET_ROWS records, so this too stays flat as input grows.
Only candidate edges reach the driver, and the driver keeps them, the components and the
clustered records' ids as compact numpy / Arrow arrays (tens of bytes per clustered record,
nothing per unique record); signatures are read back in fixed-size slices. For inputs where
even the duplicates do not fit one machine, the edges would go through rounds of min-label
propagation in Beam instead.

The representative of a cluster is its smallest id (or, with prefer_reward, highest reward
then smallest id). Other members go to `filtered/` as exact_dedup / near_dedup with a reason
naming the representative, the cluster and the estimated Jaccard to it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from filters.dedup import (
    DEFAULT_NUM_PERM,
    DEFAULT_THRESHOLD,
    LshParams,
    Signer,
    band_hashes,
    batch_texts,
    bucket_edges,
    components,
    estimated_jaccard,
    exact_hash,
    lsh_params,
)
from pipelines.beam_runner import DEFAULT_RUNNER, PipelineError, check_portable, run_beam, staging_dir
from pipelines.filter import (
    summarize_units,
    trajforge_version,
    unit_for_shard,
)
from pipelines.split_shards import DECISION_COLUMNS, checked_counts, trajectory_batches, write_split
from schemas.store import DEFAULT_MAX_ROWS, Dataset, check_apart

CLUSTERS_FILE = "clusters.parquet"
EXACT_BAND = -1
SIGN_BATCH = 2048
BUCKET_ROWS = 1 << 18  # records per (band, partition) grouping task: ~40 MiB of sort arrays
VERIFY_BATCH = 8192  # signature pairs compared at once: 2 x 8192 x 512 bytes
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
    """Write one input shard's unit: kept rows as they are, duplicates to `filtered/`.

    Rows stay Arrow batches end to end (a row group at a time), so memory is one row group,
    not one Python dict per row.
    """

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
        drops = pq.read_table(drops_file).sort_by("row") if drops_file.exists() else None
        drop_rows = drops.column("row").to_numpy() if drops is not None else np.empty(0, np.int64)
        with self.dataset.unit(unit, max_rows=self.max_rows) as u:
            at = 0
            for rows in trajectory_batches(path):
                lo, hi = np.searchsorted(drop_rows, [at, at + len(rows)])
                keep = np.ones(len(rows), dtype=bool)
                keep[drop_rows[lo:hi] - at] = False
                decided = drops.slice(lo, hi - lo) if drops is not None and hi > lo else None
                write_split(u, rows, keep, {} if decided is None else
                            {name: decided.column(name) for name in DECISION_COLUMNS})
                if decided is not None:
                    for name, n in Counter(decided.column("filter").to_pylist()).items():
                        u.counts[f"filtered:{name}"] += n
                at += len(rows)
            counts = checked_counts(unit, u.counts)
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


class _Signatures:
    """Signature rows read with pread, not through a memory map: duplicates are scattered, and
    touching one 512-byte row per page of a map would make the whole signature file resident."""

    def __init__(self, spill: Path) -> None:
        self.spill = spill
        self._files: dict[int, tuple[int, int, int]] = {}  # shard -> (fd, data offset, row bytes)

    def _file(self, shard: int) -> tuple[int, int, int]:
        if shard not in self._files:
            path = self.spill / f"sig-{shard:06d}.npy"
            with open(path, "rb") as fh:
                version = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, _ = read(fh)
                offset = fh.tell()
            self._files[shard] = (os.open(path, os.O_RDONLY), offset, shape[1] * 4)
        return self._files[shard]

    def close(self) -> None:
        for fd, _, _ in self._files.values():
            os.close(fd)
        self._files.clear()

    def rows(self, keys: np.ndarray) -> np.ndarray:
        _, _, width = self._file(int(keys[0] >> np.uint64(32)))
        buf = bytearray(len(keys) * width)
        for i, key in enumerate(keys.tolist()):
            fd, offset, _ = self._file(key >> 32)
            buf[i * width : (i + 1) * width] = os.pread(fd, width, offset + (key & 0xFFFFFFFF) * width)
        return np.frombuffer(buf, dtype=np.uint32).reshape(len(keys), width // 4)

    def similarity(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Estimated Jaccard of key pairs, read in slices so memory stays a few MiB at any size."""
        out = np.ones(len(a))
        for start in range(0, len(a), VERIFY_BATCH):
            part = slice(start, start + VERIFY_BATCH)
            out[part] = estimated_jaccard(self.rows(a[part]), self.rows(b[part]))
        return out


def _unique_edges(files: list[Path], nodes: np.ndarray) -> np.ndarray:
    """Unique edges as one uint64 code each: node index of the smaller end << 32 | of the larger.

    Codes are merged file by file, so memory holds the unique edges, not every band's copy of them.
    """
    codes = np.empty(0, dtype=np.uint64)
    for f in files:
        e = np.searchsorted(nodes, np.load(f)).astype(np.uint64)
        e.sort(axis=1)
        codes = np.union1d(codes, (e[:, 0] << np.uint64(32)) | e[:, 1])
    return codes


def _load_edges(spill: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """(exact edges, near candidate edges, candidate count), each as unique (a, b) key rows with a < b."""
    exact_files = sorted(spill.glob("edges-0000-*.npy"))
    near_files = [f for f in sorted(spill.glob("edges-*.npy")) if not f.name.startswith("edges-0000-")]
    nodes = np.empty(0, dtype=np.uint64)
    for f in exact_files + near_files:
        nodes = np.union1d(nodes, np.load(f))

    def decode(codes: np.ndarray) -> np.ndarray:
        return np.stack([nodes[(codes >> np.uint64(32)).astype(np.int64)],
                         nodes[(codes & np.uint64(0xFFFFFFFF)).astype(np.int64)]], axis=1).reshape(-1, 2)

    near = decode(_unique_edges(near_files, nodes))
    return decode(_unique_edges(exact_files, nodes)), near, len(near)


def _members(spill: Path, keys: np.ndarray, labels: np.ndarray) -> pa.Table:
    """One row per clustered record (key, component, id, reward, exact hash), read shard by shard."""
    shards = (keys >> np.uint64(32)).astype(np.int64)
    rows = (keys & np.uint64(0xFFFFFFFF)).astype(np.int64)
    ids, rewards, exact = [], [], []
    for shard in np.unique(shards).tolist():
        mine = rows[shards == shard]
        ids.append(pq.read_table(spill / f"ids-{shard:06d}.parquet").column("id").take(pa.array(mine)))
        rewards.append(np.load(spill / f"reward-{shard:06d}.npy", mmap_mode="r")[mine])
        exact.append(np.load(spill / f"exact-{shard:06d}.npy", mmap_mode="r")[mine])
    reward = np.concatenate(rewards) if rewards else np.empty(0)
    return pa.table({
        "key": keys, "component": labels,
        "id": pa.chunked_array([c for a in ids for c in a.chunks], pa.string()),
        # Sort key for prefer_reward: higher reward first, missing reward last.
        "neg_reward": np.where(np.isnan(reward), np.inf, -reward),
        "exact": np.concatenate(exact) if exact else np.empty(0, np.uint64),
    })


def _write_drops(spill: Path, keys: np.ndarray, exact: np.ndarray, rep_ids: list[str], cluster_ids: np.ndarray,
                 sims: np.ndarray) -> None:
    """`drops-<shard>.parquet` (row, filter, reason, score) for every dropped record, one shard at a time."""
    order = np.argsort(keys)
    shards = (keys[order] >> np.uint64(32)).astype(np.int64)
    bounds = np.flatnonzero(np.diff(shards)) + 1
    for part in np.split(order, bounds):
        if not len(part):
            continue
        entries: dict[str, list[Any]] = {"row": [], "filter": [], "reason": [], "score": []}
        for i in part.tolist():
            cid, rep = int(cluster_ids[i]), rep_ids[i]
            entries["row"].append(int(keys[i] & np.uint64(0xFFFFFFFF)))
            if exact[i]:
                entries["filter"].append("exact_dedup")
                entries["reason"].append(f"exact duplicate of {rep} (cluster {cid})")
                entries["score"].append(1.0)
            else:
                entries["filter"].append("near_dedup")
                entries["reason"].append(f"near duplicate of {rep} (cluster {cid}, est. jaccard {sims[i]:.2f})")
                entries["score"].append(float(sims[i]))
        shard = int(keys[part[0]] >> np.uint64(32))
        pq.write_table(pa.table(entries), spill / f"drops-{shard:06d}.parquet")


def cluster(spill_dir: Path, output: Path, threshold: float, prefer_reward: bool, near_enabled: bool
            ) -> tuple[int, int, int]:
    """Components of the exact and verified near edges; write drops per shard and `clusters.parquet`.

    Everything held here is a compact array over the clustered records (the duplicates and their
    representatives), never over the whole input. Returns (clusters, candidates, verified).
    """
    sigs = _Signatures(spill_dir)
    try:
        exact, near, candidates = _load_edges(spill_dir)
        verified = near[:0]
        if near_enabled and len(near):
            verified = near[sigs.similarity(near[:, 0], near[:, 1]) >= threshold]
        del near
        keys, labels = components(np.concatenate([exact, verified]))
        del exact
        if not len(keys):
            table = CLUSTER_SCHEMA.empty_table()
            return _write_clusters(table, output), candidates, 0
        members = _members(spill_dir, keys, labels)
        rank = [("component", "ascending")] + ([("neg_reward", "ascending")] if prefer_reward else [])
        members = members.take(pc.sort_indices(members, sort_keys=rank + [("id", "ascending")]))
        comp = members.column("component").to_numpy()
        starts = np.flatnonzero(np.r_[True, comp[1:] != comp[:-1]])
        sizes = np.diff(np.r_[starts, len(comp)])
        first = np.repeat(starts, sizes)  # row of each record's representative
        reps = members.column("id").take(pa.array(starts))
        # Clusters are numbered in the order of their representatives' ids.
        cluster_of_comp = np.empty(len(starts), dtype=np.int64)
        cluster_of_comp[pc.sort_indices(reps).to_numpy()] = np.arange(len(starts))
        cluster_ids = np.repeat(cluster_of_comp, sizes)
        key = members.column("key").to_numpy()
        same_exact = members.column("exact").to_numpy() == members.column("exact").to_numpy()[first]
        dropped = np.ones(len(key), dtype=bool)
        dropped[starts] = False
        sims = np.ones(len(key))
        if near_enabled:
            sims[dropped] = sigs.similarity(key[dropped], key[first[dropped]])
        rep_ids = reps.to_pylist()
        comp_index = np.repeat(np.arange(len(starts)), sizes)
        _write_drops(spill_dir, key[dropped], same_exact[dropped],
                     [rep_ids[c] for c in comp_index[dropped].tolist()], cluster_ids[dropped], sims[dropped])
        del rep_ids
        # Kind per cluster from the counts of its exact and near drops.
        n_exact = np.bincount(cluster_ids[dropped & same_exact], minlength=len(starts))
        n_near = np.bincount(cluster_ids[dropped & ~same_exact], minlength=len(starts))
        kind = np.where(n_near == 0, "exact", np.where(n_exact == 0, "near", "mixed"))
        # Members listed by id within each cluster, clusters in cluster-id order.
        by_cluster = pc.sort_indices(pa.table({"c": cluster_ids, "id": members.column("id")}),
                                     sort_keys=[("c", "ascending"), ("id", "ascending")])
        member_ids = members.column("id").take(by_cluster).combine_chunks()
        cluster_sizes = np.bincount(cluster_ids, minlength=len(starts))
        offsets = pa.array(np.r_[0, np.cumsum(cluster_sizes)].astype(np.int32))
        table = pa.table({
            "cluster_id": np.arange(len(starts), dtype=np.int64),
            "representative": reps.take(pa.array(np.argsort(cluster_of_comp))),
            "members": pa.ListArray.from_arrays(offsets, member_ids),
            "size": cluster_sizes.astype(np.int64),
            "kind": pa.array(kind, pa.string()),
        }, schema=CLUSTER_SCHEMA)
        return _write_clusters(table, output), candidates, len(verified)
    finally:
        sigs.close()
        # Arrow's allocator keeps freed blocks; give them back before the write phase needs memory.
        pa.default_memory_pool().release_unused()


def _write_clusters(table: pa.Table, output: Path) -> int:
    tmp = output / f".tmp-{CLUSTERS_FILE}"
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(output / CLUSTERS_FILE)
    return table.num_rows


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
    check_portable(runner, beam_args)
    source = Dataset.open(input_dir)
    check_apart(output, [input_dir])
    shards = [s.resolve() for s in source.checked_shard_files("trajectories")]
    units = [unit_for_shard(s) for s in shards]
    if len(set(units)) != len(units):
        raise PipelineError(f"{input_dir}: shard file names repeat; cannot name units after them")
    params = None if exact_only else lsh_params(threshold, num_perm)
    # Enough partitions that one grouping task sorts at most BUCKET_ROWS records, whatever the input size.
    total = sum(pq.ParquetFile(s).metadata.num_rows for s in shards)
    partitions = max(partitions, -(-total // BUCKET_ROWS))
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
            ), runner=runner, beam_args=beam_args, temp_location=staging / "beam")
            n_clusters, candidates, verified = cluster(spill, ds.path, threshold, prefer_reward, not exact_only)
            if todo:
                out_path = str(ds.path.resolve())
                run_beam(lambda p: (
                    p
                    | "Shards" >> beam.Create(todo)
                    | "Spread" >> beam.Reshuffle()
                    | "Write" >> beam.ParDo(WriteShard(out_path, str(spill), max_rows))
                ), runner=runner, beam_args=beam_args, temp_location=staging / "beam")
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
