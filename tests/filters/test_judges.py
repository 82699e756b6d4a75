"""LLM judges against the fake OpenAI-compatible server: verdicts stored, drops, malformed answers."""

from __future__ import annotations

import asyncio
import logging

import pytest

from filters.base import JudgeFailed, build_filter
from filters.chain import Chain
from tests.factories import tool_trajectory
from tests.filters.conftest import llm_config


async def _decide(spec, record):
    f = build_filter(spec)
    try:
        return await f.decide(record)
    finally:
        await f.aclose()


def test_quality_judge_scores_and_drops(judge_server):
    spec = {"name": "quality_judge", "min_score": 3, "llm": llm_config(judge_server)}
    good = asyncio.run(_decide(spec, tool_trajectory(0)))
    assert good.keep and good.score == 4
    assert good.record.details["judge"]["quality"] == {"score": 4, "reason": "clear and correct", "model": "fake-model",
                                                       "same_model_as_generator": False, "reads": "world"}
    bad = asyncio.run(_decide(spec, tool_trajectory(1)))
    assert not bad.keep and bad.reason == "quality 2 < 3" and bad.score == 2
    assert bad.record.details["judge"]["quality"]["reason"] == "sloppy"


def test_outcome_judge_sets_success(judge_server):
    spec = {"name": "outcome_judge", "llm": llm_config(judge_server)}
    ok = asyncio.run(_decide(spec, tool_trajectory(0, success=False)))
    assert ok.keep and ok.record.success is True
    assert ok.record.details["judge"]["outcome"]["thoughts"] == "answered"
    failed = asyncio.run(_decide(spec, tool_trajectory(2)))
    assert not failed.keep and failed.reason == "judged unsuccessful" and failed.record.success is False
    kept = asyncio.run(_decide({**spec, "drop_failed": False}, tool_trajectory(2)))
    assert kept.keep and kept.record.success is False


def test_malformed_answer_quarantines_or_flags(judge_server):
    spec = {"name": "quality_judge", "llm": llm_config(judge_server)}
    with pytest.raises(JudgeFailed, match="quality_judge: no valid answer from the LLM"):
        asyncio.run(_decide(spec, tool_trajectory(3)))
    flagged = asyncio.run(_decide({**spec, "on_failure": "keep"}, tool_trajectory(3)))
    assert flagged.keep
    assert flagged.record.details["judge"]["quality"]["error"] == "quality_judge: no valid answer from the LLM"


def test_chain_batch_mixes_rules_and_judges(judge_server):
    chain = Chain([{"name": "well_formed"}, {"name": "quality_judge", "llm": llm_config(judge_server)}],
                  concurrency=4)

    async def go():
        try:
            return await chain.run_batch([tool_trajectory(i) for i in range(6)])
        finally:
            await chain.aclose()

    outs = asyncio.run(go())
    assert [o.status for o in outs] == ["kept", "filtered", "kept", "quarantined", "kept", "kept"]
    assert outs[3].stage == "judge" and outs[1].filter == "quality_judge"


def test_judges_read_what_the_world_showed_and_say_whether_they_judge_their_own_model(judge_server, caplog):
    """The agent's thoughts ("I should search.", "Found it.") are its own account: a judge reads the calls, the tool
    results and the answer only, unless self_report; a judge that is the generating model is recorded and warned."""
    mine = tool_trajectory(0)
    mine.provenance = mine.provenance.model_copy(update={"model": "openai:fake-model"})
    other = tool_trajectory(4)
    f = build_filter({"name": "outcome_judge", "llm": llm_config(judge_server)})

    async def both():
        try:
            return [await f.decide(r) for r in (mine, tool_trajectory(5, success=True), other)]
        finally:
            await f.aclose()

    before = len(judge_server.log)
    with caplog.at_level(logging.WARNING, "trajforge.filters"):
        own, own_again, theirs = asyncio.run(both())
        mine.provenance = mine.provenance.model_copy(update={"model": "vllm:fake-model"})  # same weights elsewhere
        again = asyncio.run(_decide({"name": "outcome_judge", "llm": llm_config(judge_server)}, mine))
    assert own.record.details["judge"]["outcome"]["same_model_as_generator"] is True
    assert again.record.details["judge"]["outcome"]["same_model_as_generator"] is True
    assert theirs.record.details["judge"]["outcome"]["same_model_as_generator"] is False
    warned = [r for r in caplog.records if "generated the records it judges" in r.getMessage()]
    assert len(warned) == 2  # once per judge, however many of its own records it reads
    prompts = [str(e["body"]["messages"]) for e in judge_server.log[before:] if "body" in e]
    assert prompts and all("Find item" in p for p in prompts)
    assert not any("I should search." in p or "Found it." in p for p in prompts)
    assert all("Item 0 is in stock." in p for p in prompts[:1])  # the answer to the user is the outcome's
    assert own.record.details["judge"]["outcome"]["reads"] == "world"
    before = len(judge_server.log)
    told = asyncio.run(_decide({"name": "outcome_judge", "llm": llm_config(judge_server), "self_report": True},
                               tool_trajectory(6)))
    assert told.record.details["judge"]["outcome"]["reads"] == "world+self_report"
    assert "I should search." in str([e["body"] for e in judge_server.log[before:] if "body" in e])
