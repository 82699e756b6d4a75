"""Generation against a server that fails 20% of requests (429, 500, stalls past the timeout,
malformed JSON, truncated answers, dropped connections) finishes, and every task is accounted
for: in the output, or quarantined with its reason and recorded in the failure ledger."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from backends.fake_server import FAULT_KINDS, FakeServer, FakeServerConfig, Rule
from generators.runner import generate, load_config
from tests.reliability._checks import (
    assert_clean_layout,
    assert_no_duplicate_ids,
    assert_tasks_accounted,
    assert_visible_state_sound,
)
from tests.reliability._jobs import retail_agent


def test_generation_with_20pct_mixed_faults_accounts_for_every_task(tmp_path, size):
    n_tasks = size(40, 200)
    server = FakeServer(FakeServerConfig(rules=[Rule(fn=retail_agent)], fault_rate=0.2, faults=FAULT_KINDS,
                                         stall_s=2.0, retry_after=0.001, seed=11))
    cfg = load_config({
        "method": "rollout", "env": "retail", "env_config": {"seed": 0}, "tasks": {"n": n_tasks}, "max_steps": 3,
        "keep_failed": True, "unit_tasks": 4, "concurrency": 8,
        # One retry: enough faults still exhaust it, so the quarantine path runs too.
        "llm": {"backend": "openai", "base_url": "", "model": "fake-model", "api_key_env": None, "max_retries": 1,
                "backoff_base_s": 0.001, "backoff_max_s": 0.01, "request_timeout_s": 0.5},
    })
    out = tmp_path / "out"
    with server:
        cfg = cfg.model_copy(update={"llm": cfg.llm.model_copy(update={"base_url": server.base_url})})
        summary = asyncio.run(generate(cfg, out))
        outcomes = Counter(e["outcome"] for e in server.log)

    assert not {k for k in FAULT_KINDS} - set(outcomes), f"a fault kind was never injected: {outcomes}"
    ds = assert_visible_state_sound(out)
    assert ds is not None and ds.complete
    assert summary.tasks == n_tasks
    quarantined = assert_tasks_accounted(ds, n_tasks)
    done = ds.count()
    assert quarantined, "no request exhausted its retry: the quarantine path was not exercised"
    assert done >= n_tasks // 2, f"only {done} of {n_tasks} tasks produced a trajectory"

    ledger = [json.loads(line) for line in (out / "_llm_ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == summary.llm["failures"] >= len(quarantined)
    for task, row in quarantined.items():
        assert row["stage"] == "llm" and row["error"].strip(), f"{task}: quarantined without a reason: {row}"
        assert any(entry["message"] and entry["message"].split(":")[0] in row["error"] for entry in ledger), \
            f"{task}: its failure is not in the ledger: {row['error'][:200]}"
    for entry in ledger:
        assert entry["error_type"] and entry["attempts"] >= 1, entry
    assert_no_duplicate_ids(ds)
    assert_clean_layout(ds)
