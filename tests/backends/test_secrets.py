"""The API key never reaches logs, the cache file, the ledger, exceptions, or the server log."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from backends import LLMConfig, LLMRequestError
from backends.fake_server import Fault, Rule

KEY = "sk-test-0123456789abcdefSECRET"


class Thing(BaseModel):
    name: str


def files_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())


@pytest.mark.parametrize("transport", ["http", "openai"])
def test_key_never_leaks(fake_server, client, tmp_path, monkeypatch, caplog, transport):
    monkeypatch.setenv("TRAJFORGE_TEST_KEY", KEY)
    # A hosted API echoes the key in its 401 body; the server also fails one request with it.
    srv = fake_server(
        rules=[
            Rule(match="deny", answer=Fault("401", message=f"Incorrect API key provided: {KEY}")),
            Rule(match="flaky", answer=Fault("500", message=f"upstream said Bearer {KEY}"), times=2),
            Rule(match="thing", answer={"name": "ok"}),
        ]
    )
    caplog.set_level(logging.DEBUG)

    async def go():
        async with client(
            srv, transport=transport, api_key_env="TRAJFORGE_TEST_KEY", max_retries=1,
            cache_path=str(tmp_path / "cache.sqlite"), ledger_path=str(tmp_path / "ledger.jsonl"),
        ) as llm:
            ok = await llm.chat([{"role": "user", "content": "hello"}])
            thing = await llm.structured([{"role": "user", "content": "thing"}], Thing)
            errors = []
            for text in ("deny", "flaky"):
                with pytest.raises(LLMRequestError) as info:
                    await llm.chat([{"role": "user", "content": text}])
                errors.append(info.value)
            llm.print_summary()
            return ok, thing, errors, llm

    ok, thing, errors, llm = asyncio.run(go())
    assert ok[0].text and thing == Thing(name="ok")
    assert len(errors) == 2 and "***" in str(errors[0])
    for err in errors:
        assert KEY not in str(err) and KEY not in repr(err.args)
    assert KEY not in caplog.text
    assert KEY.encode() not in files_bytes(tmp_path)  # cache DB (+WAL) and ledger
    assert KEY not in str(llm.ledger.records)
    assert KEY not in str(srv.log) and "Bearer" not in str(srv.log)
    assert all(e["has_auth"] for e in srv.log), "the key was sent to the server, just never recorded"
    assert KEY not in repr(llm.config)
    assert len(llm.ledger.records) == 2


def test_key_in_config_is_rejected_without_echo():
    with pytest.raises(ValidationError) as info:
        LLMConfig.from_yaml({"backend": "openai", "api_key": KEY})
    assert KEY not in str(info.value)
