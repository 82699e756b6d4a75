"""`trajforge fake-server` serves an OpenAI-compatible API that the LLM layer can talk to."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from backends.config import LLMConfig
from backends.registry import make_llm
from tests.conftest import REPO


def test_fake_server_command_answers_chat_completions(tmp_path):
    log = tmp_path / "requests.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "fake-server", "--port", "0", "--log-path", str(log)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("fake-server listening on "), line
        base_url = line.split()[-1]

        async def ask() -> str:
            async with make_llm(LLMConfig(backend="openai", base_url=base_url, api_key_env=None)) as llm:
                return (await llm.chat([{"role": "user", "content": "ping"}]))[0].text

        answer = asyncio.run(ask())
        assert "ping" in answer  # the default answer echoes the last user message
    finally:
        proc.kill()
        proc.wait()
    assert "ping" in log.read_text()
