"""Content-addressed cache: per-sample entries, single-flight for identical requests, WAL crash safety."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from backends.cache import ResponseCache, request_digest, sample_key
from backends.fake_server import Fault, Rule
from backends.types import Completion, ToolCall, Usage

REPO = Path(__file__).resolve().parents[2]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_key_is_canonical_and_covers_request_fields():
    base = dict(backend="openai", model="m", messages=user("x"), params={"temperature": 0.1, "seed": 1})
    k = sample_key(request_digest(**base), 0)
    reordered = dict(base, params={"seed": 1, "temperature": 0.1})
    assert sample_key(request_digest(**reordered), 0) == k
    assert sample_key(request_digest(**base), 1) != k
    for change in [
        {"model": "m2"},
        {"backend": "vllm"},
        {"messages": user("y")},
        {"params": {"temperature": 0.2, "seed": 1}},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"response_format": {"type": "json_object"}},
    ]:
        assert sample_key(request_digest(**{**base, **change}), 0) != k, change


def test_n_samples_are_separate_entries(fake_server, client, tmp_path):
    srv = fake_server()
    cache = str(tmp_path / "c.sqlite")

    async def go(n):
        async with client(srv, cache_path=cache) as llm:
            return await llm.chat(user("sample me"), n=n), llm.stats

    two, _ = asyncio.run(go(2))
    four, stats = asyncio.run(go(4))
    assert [c.text for c in four[:2]] == [c.text for c in two]
    assert [c.cached for c in four] == [True, True, False, False]
    assert [e["body"].get("n", 1) for e in srv.log] == [2, 2], "n=4 after n=2 asks only for the 2 missing samples"
    assert stats.cache_hits == 2
    asyncio.run(go(4))
    assert len(srv.log) == 2


def test_concurrent_identical_requests_share_one_call(fake_server, client, tmp_path):
    srv = fake_server(latency=0.05)

    async def go():
        async with client(srv, cache_path=str(tmp_path / "c.sqlite"), max_concurrency=8) as llm:
            outs = await asyncio.gather(*(llm.chat(user("same")) for _ in range(50)))
            return outs, llm.stats

    outs, stats = asyncio.run(go())
    assert len(srv.log) == 1
    assert {o[0].text for o in outs} == {"echo[0]: same"}
    assert stats.cache_hits == 49 and stats.calls == 1


def test_failures_are_not_cached(fake_server, client, tmp_path):
    srv = fake_server(rules=[Rule(answer=Fault("404"), times=1)])
    cache = str(tmp_path / "c.sqlite")

    async def go():
        async with client(srv, cache_path=cache) as llm:
            try:
                return await llm.chat(user("q"))
            except Exception as exc:
                return exc

    assert isinstance(asyncio.run(go()), Exception)
    assert asyncio.run(go())[0].text == "echo[0]: q"
    assert len(srv.log) == 2


def test_tool_calls_roundtrip(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    comp = Completion("", [ToolCall("call_1", "f", '{"a":1}')], "tool_calls", Usage(3, 4))
    asyncio.run(cache.commit([("k", comp)]))
    got = cache.get("k")
    assert got is not None and got.tool_calls == comp.tool_calls and got.usage == comp.usage and got.cached
    assert cache.get("missing") is None


def test_commits_of_one_loop_turn_share_a_transaction(tmp_path):
    transactions = []

    class Counting(ResponseCache):
        def _flush(self) -> None:
            if self._pending:
                transactions.append(len(self._pending))
            super()._flush()

    cache = Counting(tmp_path / "c.sqlite")

    async def job() -> None:
        await asyncio.gather(*(cache.commit([(f"k{i}", Completion(f"answer {i}"))]) for i in range(50)))
        # A caller cancelled while its transaction is pending does not take the answer with it.
        waiter = asyncio.ensure_future(cache.commit([("late", Completion("kept"))]))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0)

    asyncio.run(job())
    assert transactions == [50, 1]
    assert cache.get("k49").text == "answer 49" and cache.get("late").text == "kept"
    cache.close()
    assert len(ResponseCache(tmp_path / "c.sqlite")) == 51


def test_wal_survives_sigkill(tmp_path):
    """A writer killed mid-stream leaves a consistent DB holding every committed entry."""
    db = tmp_path / "c.sqlite"
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from backends.cache import ResponseCache
        from backends.types import Completion
        c = ResponseCache({str(db)!r})

        async def main():
            for i in range(500):
                await c.commit([(f"k{{i}}", Completion(f"answer {{i}}"))])
                if i == 299:
                    print("committed", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and "committed" in proc.stdout
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 300
    con.close()
    cache = ResponseCache(db)
    assert cache.get("k299").text == "answer 299"
    assert len(cache) == 300


@pytest.mark.parametrize("backend", ["fake"])
def test_rerun_of_finished_job_makes_no_calls(tmp_path, backend):
    from backends import LLMConfig, make_llm

    cfg = LLMConfig(backend=backend, cache_path=str(tmp_path / "c.sqlite"))

    async def job():
        async with make_llm(cfg) as llm:
            await asyncio.gather(*(llm.chat(user(f"q{i}")) for i in range(20)))
            return len(llm.requests)

    assert asyncio.run(job()) == 20
    assert asyncio.run(job()) == 0
    assert os.path.exists(tmp_path / "c.sqlite")
