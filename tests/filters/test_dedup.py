"""Exact and near dedup on planted duplicates: recall, no false merges, clusters file, CLI."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from datasketch import MinHash
from typer.testing import CliRunner

from benchmarks.dedup import write_dataset
from filters.dedup import Signer, bucket_edges, components, lsh_params, shingle_hashes
from flows.cli import app
from pipelines.dedup import CLUSTERS_FILE, run_dedup
from schemas.store import Dataset
from tests.factories import tool_trajectory
from tests.filters.conftest import make_dataset


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("dedup")
    dupes = write_dataset(root / "in", 4000, shard_rows=1000, seed=7)
    summary = run_dedup(str(root / "in"), str(root / "out"))
    return root, dupes, summary


def test_signatures_are_datasketch_minhashes():
    text = "the quick brown fox jumps over the lazy dog " * 3
    signer = Signer(128)
    ref = MinHash(128, seed=1, hashfunc=int, scheme="affine32")
    ref.update_batch(shingle_hashes(text))
    assert np.array_equal(signer.sign(text), ref.hashvalues)


def test_lsh_params_and_helpers():
    p = lsh_params(0.8, 128)
    assert p.bands * p.rows <= 128 and p.curve(0.9) > 0.95 and p.curve(0.5) < 0.05
    edges = bucket_edges(np.array([5, 3, 5, 5, 9], dtype=np.uint64), np.arange(5, dtype=np.uint64))
    assert sorted(map(tuple, edges.tolist())) == [(0, 2), (0, 3)]
    nodes, labels = components(np.array([[30, 20], [10, 20], [70, 80]], dtype=np.uint64))
    assert nodes.tolist() == [10, 20, 30, 70, 80] and labels.tolist() == [0, 0, 0, 1, 1]


def test_components_follow_long_chains():
    # A chain in shuffled order needs many propagation rounds; every node must end in one component.
    rng = np.random.default_rng(3)
    keys = rng.permutation(10_000).astype(np.uint64) + np.uint64(1 << 33)
    edges = np.stack([keys[:-1], keys[1:]], axis=1)[rng.permutation(9_999)]
    extra = np.array([[5, 6], [6, 7]], dtype=np.uint64)
    nodes, labels = components(np.concatenate([edges, extra]))
    assert len(nodes) == 10_003 and labels.tolist() == [0, 0, 0] + [1] * 10_000


def test_planted_near_duplicates_recall_and_no_false_merges(planted):
    root, dupes, summary = planted
    clusters = pq.read_table(root / "out" / CLUSTERS_FILE).to_pylist()
    where = {m: c["cluster_id"] for c in clusters for m in c["members"]}
    near = {d: o for d, (o, kind) in dupes.items() if kind == "near"}
    found = sum(1 for d, o in near.items() if d in where and where.get(o) == where[d])
    assert found / len(near) >= 0.95
    exact = {d: o for d, (o, kind) in dupes.items() if kind == "exact"}
    assert all(where.get(d) is not None and where.get(d) == where.get(o) for d, o in exact.items())
    # No false merges: every cluster holds one original and its planted copies only.
    root_of = lambda i: dupes.get(i, (i,))[0]  # noqa: E731
    assert all(len({root_of(m) for m in c["members"]}) == 1 for c in clusters)
    for c in clusters:
        assert c["representative"] == min(c["members"]) and c["size"] == len(c["members"])


def test_dedup_outputs_and_counts(planted):
    root, dupes, summary = planted
    out = Dataset.open(root / "out")
    c = out.manifest()["counts"]
    assert c["in"] == 4000 == c["kept"] + c["filtered"] + c["quarantined"]
    assert out.count("trajectories") == c["kept"] and out.count("filtered") == c["filtered"]
    decisions = {f.record.id: f.decision for f in out.iter_records("filtered")}
    assert set(decisions) <= set(dupes)
    some_near = next(d for d in decisions.values() if d.filter == "near_dedup")
    assert some_near.reason.startswith("near duplicate of syn-") and "est. jaccard 0." in some_near.reason
    some_exact = next(d for d in decisions.values() if d.filter == "exact_dedup")
    assert some_exact.reason.startswith("exact duplicate of syn-") and some_exact.score == 1.0
    # Re-run: every unit finished, nothing rewritten.
    units = out.manifest()["units"]
    again = run_dedup(str(root / "in"), str(root / "out"))
    assert again.shards_done == 0 and Dataset.open(root / "out").manifest()["units"] == units
    assert again.counts["kept"] == c["kept"]


def test_exact_dupes_ignore_ids_and_tool_call_ids(tmp_path):
    a, b, c = tool_trajectory(1), tool_trajectory(1), tool_trajectory(2)
    b.id = "test/1-copy"
    b.steps[1].tool_call_id = b.steps[2].tool_call_id = "other_call"
    b.steps[3].content = "  Item 1 is   in stock. "
    make_dataset(tmp_path / "in", [c, b, a], per_unit=2)
    result = CliRunner().invoke(app, ["dedup", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--exact-only"])
    assert result.exit_code == 0, result.output
    assert "in 3 = kept 2 + filtered 1" in result.output
    [f] = list(Dataset.open(tmp_path / "out").iter_records("filtered"))
    assert f.record.id == "test/1-copy" and f.decision.filter == "exact_dedup"
    assert f.decision.reason == "exact duplicate of test/1 (cluster 0)"
    [cl] = pq.read_table(tmp_path / "out" / CLUSTERS_FILE).to_pylist()
    assert cl == {"cluster_id": 0, "representative": "test/1", "members": ["test/1", "test/1-copy"], "size": 2,
                  "kind": "exact"}


def test_prefer_reward_picks_best_representative(tmp_path):
    a, b = tool_trajectory(1, success=False), tool_trajectory(1)
    b.id = "test/9"
    make_dataset(tmp_path / "in", [a, b])
    run_dedup(str(tmp_path / "in"), str(tmp_path / "out"), prefer_reward=True)
    [cl] = pq.read_table(tmp_path / "out" / CLUSTERS_FILE).to_pylist()
    assert cl["representative"] == "test/9"  # reward 1.0 beats test/1's 0.0


def test_band_partitions_do_not_change_the_result(planted, tmp_path):
    root, _, _ = planted
    run_dedup(str(root / "in"), str(tmp_path / "parts"), partitions=3)
    assert pq.read_table(tmp_path / "parts" / CLUSTERS_FILE).equals(pq.read_table(root / "out" / CLUSTERS_FILE))
    def decisions(path):
        return sorted((f.record.id, f.decision.reason) for f in Dataset.open(path).iter_records("filtered"))

    assert decisions(tmp_path / "parts") == decisions(root / "out")
