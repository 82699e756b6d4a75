"""Simia-SFT end to end against the fake OpenAI-compatible server: seed pre-filter, policy kept, tools from an env
or a file, parsing, strict checks, resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from unittest.mock import ANY

import pytest
import yaml

from backends.fake_server import FakeServer, Rule
from converters.adp import from_adp
from converters.export.render import messages, render
from generators.runner import generate, load_config
from generators.transcript import TranscriptError, parse_transcript
from schemas.models import TextObservation
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


REJECT_REASON = "the assistant reports a result no tool returned"


def _answer_by_seed_and_variation(body: dict) -> str | dict:
    """Deterministic scripted answers: each (seed, variation) gets its own kind of transcript; the pre-filter
    rejects seed 3 and accepts the others."""
    prompt = body["messages"][-1]["content"]
    if prompt.startswith("SEED CHECK"):
        if "Find item 3" in prompt:
            return {"reason": REJECT_REASON, "usable": False}
        return {"reason": "complete, consistent, well-formed", "usable": True}
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
    seeds = _seed_file(tmp_path, n=4)
    with FakeServer(rules=[Rule(fn=_answer_by_seed_and_variation)]) as server:
        cfg = load_config(_config(seeds, server.base_url))
        out = tmp_path / "out"
        summary = asyncio.run(generate(cfg, out))
    ds = Dataset.open(out)
    kept = list(ds.iter_records())
    assert summary.tasks == 8 and summary.processed == 8
    assert len(kept) == 2  # seed 0 / v1 and seed 2 / v1 (fenced)
    for t in kept:
        assert t.source == "simia_sft" and t.tools == [SEARCH_TOOL]
        assert t.provenance.method == "simia_sft" and t.provenance.parent_ids[0].startswith("test/")
        assert t.provenance.prompt_template_hash and t.provenance.model == "openai:fake-model"
        assert t.steps[1].kind == "api" and t.steps[1].function == "search"
        # The verdicts that kept it: the judge's on the seed, the schema check, dedup.
        verdicts = t.details["verdicts"]
        assert verdicts["seed_prefilter"] == {"usable": True, "reason": "complete, consistent, well-formed",
                                              "model": "openai:fake-model"}
        assert verdicts["tool_call_check"]["passed"] and verdicts["dedup"]["passed"]
        assert t.details["tools_source"] == {"kind": "seed", "seed": t.provenance.parent_ids[0]}
    filtered = list(ds.iter_records("filtered"))
    decisions = sorted((f.decision.filter, f.decision.reason.split(":")[0]) for f in filtered)
    assert decisions[0][0] == "dedup" and decisions[0][1].startswith("duplicate of simia_sft/")
    assert decisions[1:] == [("seed_prefilter", "rejected seed"), ("tool_call_check", "missing argument"),
                             ("tool_call_check", "unknown tool")]
    # The rejected seed is filtered once, with the judge's reason; none of its samples was synthesised.
    (rejected,) = [f for f in filtered if f.decision.filter == "seed_prefilter"]
    assert rejected.record.id == "test/3" and rejected.decision.reason == f"rejected seed: {REJECT_REASON}"
    assert rejected.record.details["seed_prefilter"]["usable"] is False
    assert summary.counts["seeds_rejected"] == 1 and summary.counts["seeds_accepted"] == 3
    assert summary.counts["samples_of_rejected_seeds"] == 1
    assert summary.reasons["seed_prefilter: rejected seed"] == 1
    quarantined = list(ds.iter_records("quarantine"))
    assert len(quarantined) == 1 and quarantined[0].stage == "parse"
    assert "I cannot write that conversation." in quarantined[0].raw
    # Every task is accounted for: kept + rejected + quarantined + samples of the rejected seed.
    assert len(kept) + len(decisions) + len(quarantined) + summary.counts["samples_of_rejected_seeds"] == 8
    # 4 seed checks (one per seed, whatever its samples) + 6 syntheses; none for the rejected seed.
    assert summary.llm["calls"] == 10 and summary.llm["completion_tokens"] > 0
    assert Dataset.open(out).complete


def test_policy_is_kept_in_the_prompt_and_as_the_first_turn(tmp_path):
    """The seed's system text (its policy) goes into the synthesis prompt and opens the output as its system turn;
    a configured policy file replaces it, and a tools file (MCP listing format) replaces the seed's tools."""
    policy = "Policy: search only for items the user names; never promise delivery dates."
    seed = tool_trajectory(0)
    seed.steps.insert(0, TextObservation(content=policy, source="environment", name="system"))
    ds = Dataset.create(tmp_path / "seeds")
    with ds.unit("u0") as unit:
        unit.write_many("trajectories", [seed])
    tools_file = tmp_path / "tools.jsonl"
    tools_file.write_text(json.dumps({"name": "search", "description": "Search the catalogue.",
                                      "inputSchema": SEARCH_TOOL.parameters}) + "\n")
    (tmp_path / "policy.md").write_text("Policy from a file: be brief.\n")
    answer = _good("a lamp")
    with FakeServer(rules=[Rule(fn=lambda body: {"reason": "fine", "usable": True}
                                if body["messages"][-1]["content"].startswith("SEED CHECK") else answer)]) as server:
        asyncio.run(generate(load_config(_config(str(ds.path), server.base_url, samples_per_seed=1)), tmp_path / "a"))
        asked = server.asked()
        asyncio.run(generate(load_config(_config(str(ds.path), server.base_url, samples_per_seed=1,
                                                 policy_file=str(tmp_path / "policy.md"), tools_file=str(tools_file))),
                             tmp_path / "b"))
    check, synthesis = asked
    assert check.startswith("SEED CHECK") and policy in check
    assert f"(the conversation's system prompt):\n{policy}" in synthesis
    assert "Example conversation:\nUSER: Find item 0" in synthesis  # the policy is not repeated as a turn

    (out,) = Dataset.open(tmp_path / "a").iter_records()
    first = out.steps[0]
    assert (first.kind, first.source, first.name, first.content) == ("text", "environment", "system", policy)
    assert out.details["policy_source"] == "seed" and out.steps[1].content == "please look up a lamp"
    assert messages(render(out))[0] == {"role": "system", "content": policy}

    broken = tmp_path / "broken.json"
    broken.write_text('[{"name": "search"}, {"description": "no name"}]')
    with pytest.raises(ValueError, match=r"broken.json: entry 1: a tool needs a 'name' string"):
        load_config(_config(str(ds.path), "http://127.0.0.1:9", tools_file=str(broken)))

    (other,) = Dataset.open(tmp_path / "b").iter_records()
    assert other.steps[0].content == "Policy from a file: be brief." and other.details["policy_source"] == "policy_file"
    assert other.details["tools_source"]["kind"] == "file" and other.tools == [SEARCH_TOOL]


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
        config.write_text(yaml.safe_dump(_config(seeds, base_url, prefilter=False)))
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


def _adp_dataset(tmp_path) -> str:
    """Seeds converted from ADP records: they carry no tool schemas (ADP has none)."""
    records = [{"id": f"apigen-{i}", "content": [
        {"class_": "text_observation", "content": f"What did I order? My email is u{i}@example.com.", "name": None,
         "source": "user"},
        {"class_": "api_action", "function": "find_user_id_by_email", "kwargs": {"email": f"u{i}@example.com"},
         "description": "Look the user up."},
        {"class_": "text_observation", "content": f"user_{i}", "name": "find_user_id_by_email", "source": "environment"},
        {"class_": "message_action", "content": "I found your account.", "description": None}], "details": {}}
        for i in range(2)]
    ds = Dataset.create(tmp_path / "adp-seeds", stage="convert:adp")
    with ds.unit("u0") as unit:
        unit.write_many("trajectories", [from_adp(r, "apigen_mt") for r in records])
    return str(ds.path)


def test_simia_sft_from_an_adp_dataset_takes_tools_from_an_environment(tmp_path):
    seeds = _adp_dataset(tmp_path)
    transcript = (
        "USER: what did I order?\n"
        'ASSISTANT: <tool_call>{"name": "find_user_id_by_email", "arguments": {"email": "a@b.c"}}</tool_call>\n'
        "TOOL: user_1\nASSISTANT: done"
    )
    with FakeServer(rules=[Rule(fn=lambda body: {"reason": "fine", "usable": True}
                                if body.get("response_format") else transcript)]) as server:
        # Without tools from an env or a file, seeds without tool schemas cannot be used: each task says why.
        bare = tmp_path / "bare"
        asyncio.run(generate(load_config(_config(seeds, server.base_url, samples_per_seed=1, prefilter=False)), bare))
        cfg = load_config(_config(seeds, server.base_url, env="simulated", samples_per_seed=1,
                                  env_config={"tools": [SEARCH_TOOL.model_dump(), RETAIL_LOOKUP],
                                              "policy": "Verify the user's identity before any lookup."}))
        asyncio.run(generate(cfg, tmp_path / "out"))
        asked = server.asked()
    assert [q.error for q in Dataset.open(bare).iter_records("quarantine")] == [
        "the seed has no tool schemas: give env or tools_file"] * 2
    seed_ids = sorted(t.id for t in Dataset.open(seeds).iter_records())
    ds = Dataset.open(tmp_path / "out")
    kept = list(ds.iter_records())
    assert len(kept) == 1  # the second seed wrote the same transcript: a duplicate
    out = kept[0]
    assert {t.name for t in out.tools} == {"search", "find_user_id_by_email"}  # the env's tools, listed when started
    assert out.details["tools_source"] == {"kind": "env", "env": "simulated", "config": {"tools_sha256": ANY,
                                                                                        "policy_sha256": ANY}}
    # The environment's policy is the output's system turn and was in every prompt.
    assert out.steps[0].content == "Verify the user's identity before any lookup." and out.details["policy_source"] == "env"
    assert all("Verify the user's identity" in q for q in asked if "SEED CHECK" in q or "Variation #" in q)
    assert out.provenance.parent_ids[0] in seed_ids and all(s.startswith("apigen_mt/") for s in seed_ids)
    assert [f.decision.filter for f in ds.iter_records("filtered")] == ["dedup"]


RETAIL_LOOKUP = {"name": "find_user_id_by_email", "description": "Find a user id by email.",
                 "parameters": {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]}}


def test_a_seed_keeps_its_own_policy_and_failed_episodes_are_no_seeds(tmp_path):
    """Simia's policy is the seed's own system prompt: the environment's policy only stands in for seeds without
    one (a seed of another domain keeps its rules). A seed whose episode failed (success false, e.g. a rollout
    kept with keep_failed) shows how not to do the task: it is not used."""
    own = tool_trajectory(0)
    own.steps.insert(0, TextObservation(content="Policy of the seed: never search twice.", source="environment",
                                        name="system"))
    unknown = tool_trajectory(1).model_copy(update={"success": None, "reward": None})
    failed = tool_trajectory(2, success=False)
    ds = Dataset.create(tmp_path / "seeds")
    with ds.unit("u0") as unit:
        unit.write_many("trajectories", [own, unknown, failed])
    def answer(body: dict) -> str | dict:
        prompt = body["messages"][-1]["content"]
        if prompt.startswith("SEED CHECK"):
            return {"reason": "complete", "usable": True}
        return _good(f"thing {prompt.split('Find item ')[1].split(chr(10))[0]}")

    with FakeServer(rules=[Rule(fn=answer)]) as server:
        cfg = load_config(_config(str(ds.path), server.base_url, env="simulated", samples_per_seed=1,
                                  env_config={"tools": [SEARCH_TOOL.model_dump()], "policy": "Policy of the env."}))
        summary = asyncio.run(generate(cfg, tmp_path / "out"))
        synthesis = [q for q in server.asked() if "Variation #" in q]
    assert summary.tasks == 2 and summary.report["seeds whose episode failed (not used)"] == 1
    by_seed = {t.provenance.parent_ids[0]: t for t in Dataset.open(tmp_path / "out").iter_records()}
    assert set(by_seed) == {"test/0", "test/1"}
    assert by_seed["test/0"].steps[0].content == "Policy of the seed: never search twice."
    assert by_seed["test/0"].details["policy_source"] == "seed"
    assert by_seed["test/1"].steps[0].content == "Policy of the env." and by_seed["test/1"].details["policy_source"] == "env"
    assert not any("Find item 2" in q for q in synthesis)
    assert sum("Policy of the env." in q for q in synthesis) == 1
