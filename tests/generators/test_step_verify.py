"""step_verify: LLM judge + retail rules label mcts_splice output; agreement; KTO export; the CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from backends.types import ChatRequest
from converters.export import ExportConfig, export
from filters.step_judge import agreement
from generators.mcts_splice import MCTSSplice, MCTSSpliceConfig
from generators.step_verify import StepVerify, StepVerifyConfig
from schemas.store import Dataset
from generators.scripted import ScriptedRetailLLM, cancel_tasks


def make_search_output(path: Path, llm: ScriptedRetailLLM, **cfg) -> Path:
    method = MCTSSplice(MCTSSpliceConfig(tasks={"n": 1}, **cfg), llm)
    asyncio.run(method.run(method.tasks(), Dataset.create(path, stage="generate:mcts_splice")))
    return path


def make_verified_output(root: Path, llm: ScriptedRetailLLM, **search) -> tuple[Path, Path, dict]:
    src = make_search_output(root / "search", llm, **search)
    method = StepVerify(StepVerifyConfig(input=str(src), verifier="both"), llm)
    out = Dataset.create(root / "verified", stage="generate:step_verify")
    summary = asyncio.run(method.run(method.tasks(), out))
    return src, root / "verified", summary.counts


def test_labels_reasons_and_agreement(tmp_path):
    llm = ScriptedRetailLLM(cancel_tasks(1))
    src, out, counts = make_verified_output(tmp_path, llm, search={"iterations": 2})
    before = {t.id: t for t in Dataset.open(src).iter_records()}
    after = {t.id: t for t in Dataset.open(out).iter_records()}
    assert set(after) == set(before)  # same ids, a new dataset
    # The first spliced trajectory in the search's (deterministic) order: the labelled output's order
    # follows task completion, which the rule replays in worker threads make timing-dependent.
    spliced = after[next(i for i, t in before.items() if t.details["role"] == "spliced")]
    labels = [(i, s.label) for i, s in enumerate(spliced.steps) if s.kind in ("api", "message")]
    # [1] the wrong cancel (masked) is bad, the revision [3] stays unlabeled, the rest is good.
    assert labels[0] == (1, "bad") and labels[1] == (3, "unknown")
    assert all(lab == "good" for _, lab in labels[2:])
    assert spliced.steps[1].extra["judge_reason"] and spliced.steps[1].extra["rule_label"] == "bad"
    # They disagree only where the scripted judge calls a reference call good although it errs
    # (the correct cancel after the wrong one): the rules see the error.
    cells = {f"{a}_{b}": counts[f"llm_{a}_rules_{b}"] for a in ("good", "bad") for b in ("good", "bad")}
    assert cells["bad_good"] == 0 and cells["good_bad"] > 0 and cells["bad_bad"] > 0
    stats = agreement(cells)
    assert 0.8 < counts["judge_agreement"] == stats["agreement"] < 1.0 and counts["judge_kappa"] == stats["kappa"] > 0.5
    assert Dataset.open(out).manifest()["step_verify"] == stats
    assert spliced.details["step_verify"]["agreement"] == 1.0


def test_kappa_math():
    assert agreement({"good_good": 5, "bad_bad": 5})["kappa"] == 1.0
    assert agreement({"good_good": 3, "good_bad": 1, "bad_good": 1, "bad_bad": 3}) == {"compared": 8, "agreement": 0.75, "kappa": 0.5}


def test_kto_export_uses_step_labels(tmp_path):
    llm = ScriptedRetailLLM(cancel_tasks(1))
    _, out, _ = make_verified_output(tmp_path, llm, search={"iterations": 2})
    export(out, tmp_path / "kto", ExportConfig(format="trl-kto"))
    import pyarrow.parquet as pq

    rows = pq.read_table(sorted((tmp_path / "kto" / "data").glob("*.parquet"))).to_pylist()
    assert {r["label"] for r in rows} == {True, False}
    # Masked (train = false) steps give no example: the bad cancel inside a spliced path is context only.
    masked = {t.id: t.details["splice"]["masked"] for t in Dataset.open(out).iter_records() if "splice" in t.details}
    assert masked and all(r["step"] not in masked.get(r["id"], []) for r in rows)
    assert any(r["id"] in masked for r in rows)


# ---- the CLI, against the fake OpenAI-compatible server ------------------------------------------------


def _server_rule(llm: ScriptedRetailLLM):
    counter = {"agent": 0}

    def answer(body: dict):
        request = ChatRequest(body["messages"], {}, response_format=body.get("response_format"))
        if body.get("response_format"):
            return llm._judge(request)
        counter["agent"] += 1
        # All n samples of a server answer are alike: vary by request instead. The 2nd request (the first
        # rollout step) is the wrong write, so the first path fails and the next expansion succeeds.
        call = llm._agent(request, 1 if counter["agent"] == 2 else 0)
        if isinstance(call, str):
            return call
        return ToolCallAnswer(call.name, orjson.loads(call.arguments))

    return answer


def test_cli_runs_mcts_splice_then_step_verify(tmp_path):
    from flows.cli import app

    llm = ScriptedRetailLLM(cancel_tasks(1))
    with FakeServer(rules=[Rule(fn=_server_rule(llm))]) as server:
        common = {"concurrency": 1, "llm": {"backend": "openai", "base_url": server.base_url, "model": "fake",
                                             "api_key_env": "TRAJFORGE_TEST_KEY", "max_retries": 1,
                                             "request_timeout_s": 10}}
        (tmp_path / "mcts.yaml").write_text(yaml.safe_dump({**common, "tasks": {"n": 1}, "search": {"iterations": 3}}))
        run = CliRunner().invoke(app, ["generate", "--method", "mcts_splice", "--config", str(tmp_path / "mcts.yaml"),
                                       "--output", str(tmp_path / "search")])
        assert run.exit_code == 0, run.output
        (tmp_path / "verify.yaml").write_text(yaml.safe_dump({**common, "input": str(tmp_path / "search")}))
        run = CliRunner().invoke(app, ["generate", "--method", "step_verify", "--config", str(tmp_path / "verify.yaml"),
                                       "--output", str(tmp_path / "verified")])
        assert run.exit_code == 0, run.output
    search = Dataset.open(tmp_path / "search")
    verified = list(Dataset.open(tmp_path / "verified").iter_records())
    assert search.complete and search.count() > 0 and len(verified) == search.count()
    assert search.count("pairs") == 2  # one trajectory-level and one step-level pair
    assert sum(1 for t in verified if t.details["role"] == "spliced") == 1
    assert any(s.label in ("good", "bad") for t in verified for s in t.steps)
