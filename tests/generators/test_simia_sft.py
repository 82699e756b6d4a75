"""Simia-SFT end to end against the fake OpenAI-compatible server: parsing, strict checks, resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import yaml

from backends.fake_server import FakeServer, Rule
from generators.runner import generate, load_config
from generators.transcript import TranscriptError, parse_transcript
from schemas.store import Dataset
from tests.conftest import REPO
from tests.factories import SEARCH_TOOL, tool_trajectory


def _seed_file(tmp_path, n: int = 3) -> str:
    """Seeds as a dataset directory of small tool-use trajectories with a `search` tool."""
    ds = Dataset.create(tmp_path / "seeds")
    with ds.unit("u0") as unit:
        unit.write_many("trajectories", [tool_trajectory(i) for i in range(n)])
    return str(ds.path)


def _good(query: str) -> str:
    return (
        f"USER: please look up {query}\n"
        "ASSISTANT: <think>the user wants a search</think>I will search.\n"
        f'<tool_call>{{"name": "search", "arguments": {{"query": "{query}"}}}}</tool_call>\n'
        'TOOL: [{"id": 7}]\n'
        f"ASSISTANT: Found {query}."
    )


def _answer_by_seed_and_variation(body: dict) -> str:
    """Deterministic scripted answers: each (seed, variation) gets its own kind of transcript."""
    prompt = body["messages"][-1]["content"]
    variation = int(prompt.split("Variation #")[1].split(".")[0])
    seed = prompt.split("Find item ")[1].split("\n")[0]
    kind = {("0", 1): "good", ("0", 2): "unknown", ("1", 1): "missing", ("1", 2): "garbage", ("2", 1): "good2", ("2", 2): "dup"}
    what = kind.get((seed, variation), "good")
    if what == "good":
        return _good(f"thing {seed}-{variation}")
    if what == "good2":
        return "```\n" + _good("fenced thing") + "\n```"
    if what == "dup":
        return _good("thing 0-1")  # the same transcript as seed 0 / variation 1
    if what == "unknown":
        return 'USER: hi\nASSISTANT: <tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>\nTOOL: ok\nASSISTANT: done'
    if what == "missing":
        return 'USER: hi\nASSISTANT: {"name": "search", "arguments": {"q": "x"}}\nTOOL: []\nASSISTANT: nothing'
    return "I cannot write that conversation."


def _config(seeds: str, base_url: str, **extra) -> dict:
    return {
        "method": "simia_sft",
        "seeds": [seeds],
        "samples_per_seed": 2,
        "concurrency": 2,
        "unit_tasks": 1,
        "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": "TRAJFORGE_TEST_KEY",
                "max_retries": 2, "backoff_base_s": 0.01, "request_timeout_s": 5},
        **extra,
    }


def test_parse_transcript_handles_hermes_json_and_reasoning():
    steps = parse_transcript(_good("x"))
    assert [s.kind for s in steps] == ["text", "api", "text", "message"]
    assert steps[1].reasoning == "the user wants a search" and steps[1].thought == "I will search."
    assert steps[2].tool_call_id == steps[1].tool_call_id and steps[2].name == "search"
    assert "<think>" not in steps[1].thought
    bare = parse_transcript('USER: a\nASSISTANT: ```json\n{"name": "search", "arguments": "{\\"query\\": \\"q\\"}"}\n```\nTOOL: r\nASSISTANT: ok')
    assert bare[1].arguments == {"query": "q"}
    with pytest.raises(TranscriptError, match="no USER:/ASSISTANT:/TOOL: turns"):
        parse_transcript("just prose")


def test_simia_sft_end_to_end_counts_rejections_by_reason(tmp_path):
    seeds = _seed_file(tmp_path)
    with FakeServer(rules=[Rule(fn=_answer_by_seed_and_variation)]) as server:
        cfg = load_config(_config(seeds, server.base_url))
        out = tmp_path / "out"
        summary = asyncio.run(generate(cfg, out))
    ds = Dataset.open(out)
    kept = list(ds.iter_records())
    assert summary.tasks == 6 and summary.processed == 6
    assert len(kept) == 2  # seed 0 / v1 and seed 2 / v1 (fenced)
    for t in kept:
        assert t.source == "simia_sft" and t.tools == [SEARCH_TOOL]
        assert t.provenance.method == "simia_sft" and t.provenance.parent_ids[0].startswith("test/")
        assert t.provenance.prompt_template_hash and t.provenance.model == "openai:fake-model"
        assert t.steps[1].kind == "api" and t.steps[1].function == "search"
    decisions = sorted((f.decision.filter, f.decision.reason.split(":")[0]) for f in ds.iter_records("filtered"))
    assert decisions[0][0] == "dedup" and decisions[0][1].startswith("duplicate of simia_sft/")
    assert decisions[1:] == [("tool_call_check", "missing argument"), ("tool_call_check", "unknown tool")]
    quarantined = list(ds.iter_records("quarantine"))
    assert len(quarantined) == 1 and quarantined[0].stage == "parse"
    assert "I cannot write that conversation." in quarantined[0].raw
    # Every task is accounted for: kept + rejected + quarantined.
    assert len(kept) + len(decisions) + len(quarantined) == 6
    assert summary.llm["calls"] == 6 and summary.llm["completion_tokens"] > 0
    assert Dataset.open(out).complete


_RESUME_SERVER = """
import sys, time, json
sys.path.insert(0, {repo!r})
from backends.fake_server import FakeServer, Rule
def answer(body):
    prompt = body["messages"][-1]["content"]
    seed = prompt.split("Find item ")[1].split("\\n")[0]
    variation = prompt.split("Variation #")[1].split(".")[0]
    q = f"thing {{seed}}-{{variation}}"
    return ("USER: look up " + q + "\\nASSISTANT: ok\\n<tool_call>" + json.dumps({{"name": "search", "arguments": {{"query": q}}}})
            + "</tool_call>\\nTOOL: []\\nASSISTANT: done " + q)
server = FakeServer(rules=[Rule(fn=answer)], latency=0.05, log_path={log!r}).start(port={port})
print(server.base_url, flush=True)
time.sleep(3600)
"""


def test_killed_generate_resumes_without_duplicates_or_repeated_calls(tmp_path):
    seeds = _seed_file(tmp_path, n=20)
    log = tmp_path / "requests.jsonl"
    server = subprocess.Popen(
        [sys.executable, "-c", _RESUME_SERVER.format(repo=str(REPO), log=str(log), port=0)], stdout=subprocess.PIPE, text=True
    )
    try:
        base_url = server.stdout.readline().strip()
        config = tmp_path / "simia.yaml"
        config.write_text(yaml.safe_dump(_config(seeds, base_url)))
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "flows.cli", "generate", "--method", "simia_sft", "--config", str(config), "--output", str(out)]
        env = {**os.environ, "TRAJFORGE_TEST_KEY": "sk-test-resume"}
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if len(Dataset.open(out).finished_units()) >= 5:
                    break
            except Exception:
                pass
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        partial = Dataset.open(out)
        assert 5 <= len(partial.finished_units()) < 40
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    finally:
        server.kill()
    ds = Dataset.open(out)
    ids = [r["id"] for r in ds.iter_rows(columns=["id"])]
    assert len(ids) == 40 and len(set(ids)) == 40
    tasks = sorted(t.provenance.task_id for t in ds.iter_records())
    assert len(set(tasks)) == 40
    # No completed request was sent twice: identical request bodies appear once in the log,
    # except the few in flight at the kill (at most `concurrency`: sent, never cached).
    bodies = Counter(json.dumps(json.loads(line)["body"]["messages"], sort_keys=True) for line in log.read_text().splitlines())
    repeated = [b for b, n in bodies.items() if n > 1]
    assert len(repeated) <= 2, f"{len(repeated)} requests repeated after resume"
    assert len(bodies) == 40
    assert "sk-test-resume" not in log.read_text()


def test_simia_sft_takes_tools_from_an_environment(tmp_path):
    seeds = _seed_file(tmp_path, n=2)
    transcript = (
        "USER: what did I order?\n"
        'ASSISTANT: <tool_call>{"name": "find_user_id_by_email", "arguments": {"email": "a@b.c"}}</tool_call>\n'
        "TOOL: user_1\nASSISTANT: done"
    )
    with FakeServer(rules=[Rule(answer=transcript)]) as server:
        cfg = load_config(_config(seeds, server.base_url, env="retail", samples_per_seed=1))
        asyncio.run(generate(cfg, tmp_path / "out"))
    ds = Dataset.open(tmp_path / "out")
    kept = list(ds.iter_records())
    assert len(kept) == 1  # the second seed wrote the same transcript: a duplicate
    assert "cancel_pending_order" in {t.name for t in kept[0].tools}
    assert "search" not in {t.name for t in kept[0].tools}  # the seed's own tools are not used
    assert [f.decision.filter for f in ds.iter_records("filtered")] == ["dedup"]
