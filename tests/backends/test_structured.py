"""structured(): schema sent, JSON repaired, invalid answers retried, json_schema fallback, ledger."""

from __future__ import annotations

import asyncio

import orjson
from pydantic import BaseModel

from backends.fake_server import Fault, Rule


class Weather(BaseModel):
    city: str
    temperature_c: float


GOOD = {"city": "Paris", "temperature_c": 21.5}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def ask(llm, text="weather in Paris?"):
    return llm.structured(user(text), Weather)


def run_one(client, srv, **cfg):
    async def go():
        async with client(srv, **cfg) as llm:
            return await ask(llm), llm

    return asyncio.run(go())


def test_sends_json_schema_and_validates(fake_server, client):
    srv = fake_server(rules=[Rule(answer=GOOD)])
    out, llm = run_one(client, srv)
    assert out == Weather(**GOOD)
    rf = srv.log[0]["body"]["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["strict"] is True
    assert rf["json_schema"]["name"] == "Weather"
    assert rf["json_schema"]["schema"] == Weather.model_json_schema()


def test_recovers_from_fenced_json(fake_server, client):
    srv = fake_server(rules=[Rule(answer="```json\n" + orjson.dumps(GOOD).decode() + "\n```")])
    out, _ = run_one(client, srv)
    assert out == Weather(**GOOD) and len(srv.log) == 1


def test_recovers_from_chatty_json(fake_server, client):
    text = 'Sure! {not json} Here you go: {"city": "Paris", "temperature_c": 21.5, "note": "a {brace}"} Hope it helps.'
    srv = fake_server(rules=[Rule(answer=text)])
    out, _ = run_one(client, srv)
    assert out == Weather(**GOOD) and len(srv.log) == 1


def test_invalid_first_answer_is_retried_with_the_error(fake_server, client):
    srv = fake_server(rules=[Rule(answer={"city": "Paris"}, times=1), Rule(answer=GOOD)])
    out, llm = run_one(client, srv)
    assert out == Weather(**GOOD)
    assert len(srv.log) == 2
    retry_msgs = srv.log[1]["body"]["messages"]
    assert retry_msgs[1] == {"role": "assistant", "content": '{"city":"Paris"}'}
    assert "temperature_c" in retry_msgs[2]["content"] and "invalid" in retry_msgs[2]["content"]


def test_truncated_json_is_retried_as_transport_fault(fake_server, client):
    srv = fake_server(rules=[Rule(answer=Fault("truncated", answer=GOOD), times=1), Rule(answer=GOOD)])
    out, llm = run_one(client, srv)
    assert out == Weather(**GOOD)
    assert [e["outcome"] for e in srv.log] == ["truncated", "ok"]
    # The retry is the same request (not a repair prompt): the cut answer was never accepted.
    assert srv.log[0]["body"] == srv.log[1]["body"]


def test_falls_back_to_json_object_and_remembers(fake_server, client):
    srv = fake_server(reject_json_schema=True, rules=[Rule(answer=GOOD)])

    async def go():
        async with client(srv) as llm:
            a = await ask(llm, "one")
            b = await ask(llm, "two")
            return a, b, llm

    a, b, llm = asyncio.run(go())
    assert a == b == Weather(**GOOD)
    assert [e["outcome"] for e in srv.log] == ["400-json_schema", "ok", "ok"]
    fallback = srv.log[1]["body"]["response_format"]
    assert fallback == {"type": "json_object", "schema": Weather.model_json_schema()}
    assert llm.json_schema_supported is False
    assert llm.stats.failures == 0 and not llm.ledger.records


def test_gives_up_into_ledger_without_crashing(fake_server, client, tmp_path):
    srv = fake_server(rules=[Rule(answer="I cannot answer that.")])
    ledger = tmp_path / "ledger.jsonl"
    out, llm = run_one(client, srv, structured_attempts=3, ledger_path=str(ledger))
    assert out is None
    assert len(srv.log) == 3
    (entry,) = [orjson.loads(line) for line in ledger.read_bytes().splitlines()]
    assert entry["error_type"] == "invalid_structured_output" and entry["attempts"] == 3
    assert llm.stats.failures == 1


def test_transport_failure_returns_none(fake_server, client):
    srv = fake_server(rules=[Rule(answer=Fault("500"))])
    out, llm = run_one(client, srv, max_retries=1)
    assert out is None and len(srv.log) == 2
    assert llm.ledger.records[0]["error_type"] == "server"


def test_cached_structured_rerun_makes_no_calls(fake_server, client, tmp_path):
    srv = fake_server(rules=[Rule(answer={"city": "Paris"}, times=1), Rule(answer=GOOD)])
    cache = str(tmp_path / "c.sqlite")
    assert run_one(client, srv, cache_path=cache)[0] == Weather(**GOOD)
    assert run_one(client, srv, cache_path=cache)[0] == Weather(**GOOD)
    assert len(srv.log) == 2
