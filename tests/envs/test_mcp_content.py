"""MCP results that are not text keep what the server sent: images and blobs as files referenced by
path, resource links with their URI, name and MIME type, embedded text, mixed blocks in order; in the
environment, in the stored records and in what the agent is shown (tests/envs/content_server.py)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from envs.base import Task
from envs.registry import make_env
from flows.cli import app
from schemas.models import ApiAction, ImageObservation, TextObservation
from schemas.store import Dataset
from tests.envs.content_server import BLOB, PNG

SERVER = Path(__file__).resolve().with_name("content_server.py")


def test_images_links_and_embedded_resources_are_kept(tmp_path: Path) -> None:
    async def run() -> list:
        env = make_env("mcp", server={"command": [sys.executable, str(SERVER)]}, output_dir=str(tmp_path))
        try:
            await env.reset(Task(id="reports/1", env="mcp", instruction="Look at the reports."))
            calls = [("snapshot", {}), ("chart", {"metric": "sales"}), ("find_report", {"name": "q3"}),
                     ("read_report", {"name": "q3"})]
            return [(await env.step(ApiAction(function=f, arguments=a, tool_call_id="c"))).observation
                    for f, a in calls]
        finally:
            await env.close()

    snapshot, chart, link, embedded = asyncio.run(run())
    # An image alone is an image observation: a path relative to the output directory, the file holds the pixels.
    assert isinstance(snapshot, ImageObservation) and snapshot.tool_call_id == "c"
    assert not Path(snapshot.image.path).is_absolute() and (tmp_path / snapshot.image.path).read_bytes() == PNG
    assert snapshot.image.path.endswith(".png") and "pixels" not in snapshot.model_dump_json()
    # Text and image: both, in order; the image as the renderer shows image observations.
    assert isinstance(chart, TextObservation) and chart.name == "chart"
    (image,) = [p for p in chart.extra["content"] if p["type"] == "image"]
    assert chart.content == f"Chart of sales:\n[image: {image['path']}]\n(daily values)"
    assert (tmp_path / image["path"]).read_bytes() == PNG and image["path"] != snapshot.image.path
    # A resource link keeps its URI, name and MIME type.
    assert "file:///reports/q3.pdf" in link.content and "q3.pdf" in link.content
    assert link.extra["content"][1] == {"type": "resource_link", "uri": "file:///reports/q3.pdf", "name": "q3.pdf",
                                        "mime_type": "application/pdf", "description": "the quarterly report"}
    # Embedded resources: the text itself; a blob stored as a file, referenced by path.
    assert "Revenue grew 4%." in embedded.content and "file:///reports/q3.txt" in embedded.content
    blob = embedded.extra["content"][1]
    assert blob["uri"] == "file:///reports/q3.bin" and (tmp_path / blob["path"]).read_bytes() == BLOB
    assert blob["path"] in embedded.content


def _agent(body: dict):
    """Looks at the chart, then the dashboard, then the report link, then answers."""
    if not body.get("tools"):
        return None
    calls = sum(1 for m in body["messages"] if m["role"] == "assistant")
    plan = [ToolCallAnswer("chart", {"metric": "sales"}), ToolCallAnswer("snapshot", {}),
            ToolCallAnswer("find_report", {"name": "q3"})]
    return plan[calls] if calls < len(plan) else "Sales are up; the report is q3.pdf."


def test_a_rollout_stores_images_as_files_and_shows_the_agent_their_paths(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "env": "mcp", "instruction": "How are sales?"}) + "\n")
    with FakeServer(rules=[Rule(fn=_agent)]) as server:
        config = {"env": "mcp", "env_config": {"server": {"command": [sys.executable, str(SERVER)]}},
                  "user": {"kind": "none"}, "tasks": {"source": "jsonl", "path": str(tasks)}, "max_steps": 5,
                  "llm": {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "api_key_env": None,
                          "max_retries": 0, "request_timeout_s": 30}}
        (tmp_path / "rollout.yaml").write_text(yaml.safe_dump(config))
        result = CliRunner().invoke(app, ["generate", "--method", "rollout", "--config", str(tmp_path / "rollout.yaml"),
                                          "--output", str(tmp_path / "out")])
        assert result.exit_code == 0, result.output
        seen = [m["content"] for m in server.log[-1]["body"]["messages"] if m["role"] == "tool"]

    (trajectory,) = Dataset.open(tmp_path / "out").iter_records()
    (shot,) = [s for s in trajectory.steps if s.kind == "image"]
    (chart,) = [s for s in trajectory.steps if s.kind == "text" and s.name == "chart"]
    assert (tmp_path / "out" / shot.image.path).read_bytes() == PNG  # the path resolves inside the dataset
    chart_image = chart.extra["content"][1]["path"]
    assert (tmp_path / "out" / chart_image).read_bytes() == PNG
    # What the agent was shown: the caption, the image's path and the rest, in order; the link's URI.
    assert seen[0] == f"Chart of sales:\n[image: {chart_image}]\n(daily values)"
    assert seen[1] == f"[image: {shot.image.path}]"
    assert "file:///reports/q3.pdf" in seen[2] and "application/pdf" in seen[2]
