"""`trajforge fake-server` serves an OpenAI-compatible API that the LLM layer can talk to."""

from __future__ import annotations

import asyncio
import socket
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


def test_bad_ports_and_a_port_in_use_are_one_line():
    from typer.testing import CliRunner

    from flows.cli import app

    def one_line(*args: str) -> str:
        result = CliRunner().invoke(app, ["fake-server", *args])
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        (line,) = result.output.strip().splitlines()
        return line

    assert one_line("--port", "-1") == "error: --port -1: a port is a number from 0 to 65535 (0: any free port)"
    assert "--port 70000: a port is a number from 0 to 65535" in one_line("--port", "70000")  # not 70000 % 65536
    assert "--latency -1.0: must be at least 0" in one_line("--latency", "-1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line("--port", str(port))
    assert line.startswith(f"error: cannot listen on 127.0.0.1:{port} (") and "choose another --port" in line
