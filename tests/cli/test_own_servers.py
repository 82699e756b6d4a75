"""Bring your own MCP server, as a user would: the PyPI reference servers `mcp-server-sqlite` (mcp SDK 1.x)
and `mcp-server-git` (SDK 2.x), each from a venv of its own, on fixtures copied per process or per
episode, through `trajforge envs check` and `trajforge generate`; the fixtures' sources never change."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from flows.cli import app
from schemas.store import Dataset
from tests.conftest import REPO
from tests.server_venvs import server_venv

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("scratch")  # a failing check's folder goes to the test's tmp_path


@pytest.fixture(scope="session")
def sqlite_venv() -> str:
    return str(server_venv("sqlite"))


@pytest.fixture(scope="session")
def git_venv() -> str:
    return str(server_venv("git"))


def tree_digest(root: Path) -> str:
    """Every file under `root` (git's own files included), its path and bytes: changes to any show."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def write(tmp_path: Path, name: str, config: dict[str, Any], tasks: list[dict[str, Any]] | None = None) -> Path:
    if tasks is not None:
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
        config = {**config, "tasks": {"source": "jsonl", "path": str(tmp_path / f"{name}.jsonl")}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# ---- mcp-server-sqlite: SDK 1.x, a database copied into each server process's {tmpdir} -------------


def shop_db(tmp_path: Path) -> Path:
    db = tmp_path / "pristine" / "shop.db"
    db.parent.mkdir()
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, status TEXT)")
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?)",
                         [(1, "ada", "pending"), (2, "bob", "pending"), (3, "cy", "shipped")])
    return db


SHIP = "UPDATE orders SET status = 'shipped' WHERE id = 1"
ADD = "INSERT INTO orders VALUES (4, 'dee', 'pending')"
SQLITE_TASKS = [
    {"id": "ship-1", "instruction": "Mark order 1 as shipped.",
     "goal": {"actions": [{"name": "write_query", "arguments": {"query": SHIP}}], "reward_basis": ["DB"]}},
    {"id": "add-dee", "instruction": "Add a pending order 4 for dee.",
     "goal": {"actions": [{"name": "write_query", "arguments": {"query": ADD}}], "reward_basis": ["DB"]}},
    {"id": "count-pending", "instruction": "How many orders are pending?",
     "goal": {"actions": [{"name": "read_query", "arguments": {
         "query": "SELECT COUNT(*) AS n FROM orders WHERE status = 'pending'"}}],
              "communicate_info": ["2 pending"], "reward_basis": ["DB", "COMMUNICATE"]}},
]


def sqlite_config(venv: str, db: Path, **server: Any) -> dict[str, Any]:
    return {"env": "mcp", "env_config": {
        # No per-episode key and no reset tool: each episode gets a server process of its own, with a fresh copy.
        "server": {"command": ["mcp-server-sqlite", "--db-path", "{tmpdir}/shop.db"], "venv": venv, **server},
        "fixtures": {"files": {"shop.db": str(db)}},
        "state_digest": {"sql": "SELECT * FROM orders ORDER BY id", "database": "{tmpdir}/shop.db"},
        "exclude": ["create_table", "append_insight"],
        "read_only_tools": ["read_query", "list_tables", "describe_table"],
        "policy": "Change only what the user asks for.", "start_timeout_s": 30, "call_timeout_s": 30}}


def test_sqlite_server_of_sdk_1_passes_envs_check_from_its_venv_without_touching_the_fixture(
        tmp_path: Path, sqlite_venv: str) -> None:
    db = shop_db(tmp_path)
    before = db.read_bytes()
    # Each episode starts a server process: two tasks (a write, a read) keep it quick.
    config = write(tmp_path, "sqlite", sqlite_config(sqlite_venv, db), [SQLITE_TASKS[0], SQLITE_TASKS[2]])
    # As a user runs it: a process of its own, its terminal is stderr (the server's log must not land there).
    done = subprocess.run([sys.executable, "-m", "flows.cli", "envs", "check", "--config", str(config), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["healthy"] and report["problems"] == []
    assert report["reference"]["passed"] == 2 and report["do_nothing"]["passed"] == 0
    assert report["tool_errors"] == 0 and report["reference_errors"] == 0
    # The 1.x server rejects the 2026 `server/discover` probe with ~100 lines of log: in its log file, not here.
    assert "server/discover" not in done.stderr and "validation error" not in done.stderr
    assert db.read_bytes() == before


def test_rollout_on_the_sqlite_server_against_the_fake_llm(tmp_path: Path, sqlite_venv: str) -> None:
    db = shop_db(tmp_path)
    before = db.read_bytes()
    plans = {"Mark order 1 as shipped.": [ToolCallAnswer("write_query", {"query": SHIP}), "Order 1 is shipped."],
             "Add a pending order 4 for dee.": [ToolCallAnswer("read_query", {"query": "SELECT * FROM orders"}),
                                                "Done."]}  # looks, changes nothing: fails DB

    def agent(body: dict[str, Any]) -> Any:
        first = next(m["content"] for m in body["messages"] if m["role"] == "user" and m["content"] in plans)
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return plans[first][min(turn, len(plans[first]) - 1)]

    out = tmp_path / "out"
    with FakeServer(rules=[Rule(fn=agent)]) as llm:
        config = sqlite_config(sqlite_venv, db, handshake="legacy")
        config.update(method="rollout", max_steps=4, concurrency=2, keep_failed=True, llm={
            "backend": "openai", "base_url": llm.base_url, "model": "fake", "api_key_env": None, "max_retries": 0})
        path = write(tmp_path, "rollout", config, SQLITE_TASKS[:2])
        result = runner.invoke(app, ["generate", "--method", "rollout", "--config", str(path), "--output", str(out)])
    assert result.exit_code == 0, result.output
    records = {t.details["task"]["id"]: t for t in Dataset.open(out).iter_records()}
    assert records["ship-1"].success and records["ship-1"].details["evaluation"]["details"]["DB"]["passed"]
    assert not records["add-dee"].success
    assert {t.name for t in records["ship-1"].tools} == {"read_query", "write_query", "list_tables", "describe_table"}
    # Each server process logged to a file of the run; with handshake: legacy, none saw a discover probe.
    logs = list((out / "logs" / "mcp").glob("mcp-server-sqlite-*.log"))
    assert logs and not any("server/discover" in p.read_text() for p in logs)
    assert db.read_bytes() == before


def test_a_server_that_cannot_start_is_one_line_with_its_exit_status_and_stderr(tmp_path: Path,
                                                                              sqlite_venv: str) -> None:
    db = shop_db(tmp_path)
    config = write(tmp_path, "broken", sqlite_config(sqlite_venv, db, args=["--no-such-flag"]), SQLITE_TASKS[:1])
    with FakeServer(rules=[Rule(answer="Done.")]) as llm:
        for command in (["envs", "check", "--config", str(config)],
                        ["generate", "--method", "rollout", "--config", str(config), "--output", str(tmp_path / "o")]):
            if command[0] == "generate":
                data = yaml.safe_load(config.read_text())
                data["llm"] = {"backend": "openai", "base_url": llm.base_url, "api_key_env": None, "max_retries": 0}
                config.write_text(yaml.safe_dump(data))
            result = runner.invoke(app, command)
            assert result.exit_code != 0
            text = " ".join(result.output.split())
            assert "cannot start MCP server 'mcp-server-sqlite --db-path {tmpdir}/shop.db --no-such-flag'" in text, text
            assert "exited with status 2" in text and "unrecognized arguments: --no-such-flag" in text
            assert "Traceback" not in text and "ExceptionGroup" not in text and "never retrieved" not in text


HUNG_SERVER = r'''
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "initialize":
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "hung", "version": "0"}}}) + "\n")
    elif "id" in msg and msg.get("method") != "tools/list":
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                                     "error": {"code": -32601, "message": "Method not found"}}) + "\n")
    sys.stdout.flush()  # tools/list is never answered
'''


def test_a_server_whose_list_tools_never_answers_ends_within_the_start_timeout(tmp_path: Path) -> None:
    (tmp_path / "hung.py").write_text(HUNG_SERVER)
    config = write(tmp_path, "hung", {"env": "mcp", "env_config": {
        "server": {"command": ["python", str(tmp_path / "hung.py")]}, "start_timeout_s": 2}},
        [{"id": "t", "instruction": "x", "goal": {"actions": [{"name": "a", "arguments": {}}]}}])
    result = runner.invoke(app, ["envs", "check", "--config", str(config)])
    assert result.exit_code == 1
    assert "did not answer list_tools within 2 s" in " ".join(result.output.split())


# ---- mcp-server-git: SDK 2.x, a repository copied for each episode ----------------------------------


def make_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "pristine" / "repo"
    repo.mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "README.md").write_text("hello\n")
    subprocess.run([*git, "add", "README.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    (repo / "notes.txt").write_text("to do\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)  # staged, not committed
    return repo


GIT_TASKS = [
    {"id": "branch", "instruction": "Create a branch called feature-x.",
     "goal": {"actions": [{"name": "git_create_branch", "arguments": {"branch_name": "feature-x"}}],
              "reward_basis": ["DB"]}},
    {"id": "commit", "instruction": "Commit the staged notes with the message 'add notes'.",
     "goal": {"actions": [{"name": "git_commit", "arguments": {"message": "add notes"}}], "reward_basis": ["DB"]}},
    {"id": "staged", "instruction": "Which file is staged?",
     "goal": {"actions": [{"name": "git_status", "arguments": {}}], "communicate_info": ["notes.txt"],
              "reward_basis": ["DB", "COMMUNICATE"]}},
]
# Branches and commits by tree and message (commit hashes hold the time), outside the agent's tools.
GIT_DIGEST = ['sh', '-c', 'git -C "$0" for-each-ref --format="%(refname)"; git -C "$0" log --all --format="%T %s"',
              '{tmpdir}/{episode}/repo']


def git_config(venv: str, repo: Path, **env_config: Any) -> dict[str, Any]:
    return {"env": "mcp", "env_config": {
        "server": {"command": ["mcp-server-git"], "venv": venv},
        # The repository the agent works on is the episode's own copy: episodes share the server process.
        "hidden_arguments": {"repo_path": "{tmpdir}/{episode}/repo"},
        "fixtures": {"files": {"{episode}/repo": str(repo)}},
        "state_digest": {"command": GIT_DIGEST}, "start_timeout_s": 30, "call_timeout_s": 30, **env_config}}


def test_git_server_passes_envs_check_on_per_episode_copies_and_leaves_the_repository_alone(
        tmp_path: Path, git_venv: str) -> None:
    repo = make_repo(tmp_path)
    before = tree_digest(repo)
    config = write(tmp_path, "git", git_config(git_venv, repo), GIT_TASKS)
    result = runner.invoke(app, ["envs", "check", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["healthy"] and report["reference"]["passed"] == 3 and report["do_nothing"]["passed"] == 0
    assert report["tool_errors"] == 0 and report["reference_errors"] == 0
    assert tree_digest(repo) == before
    assert not list(repo.parent.glob("*/*reference*"))  # per-episode copies live in {tmpdir}, never beside it


def test_envs_check_refuses_a_server_handed_the_users_repository(tmp_path: Path, git_venv: str) -> None:
    repo = make_repo(tmp_path)
    before = tree_digest(repo)
    data = git_config(git_venv, repo, hidden_arguments={"repo_path": str(repo)})
    del data["env_config"]["fixtures"], data["env_config"]["state_digest"]
    config = write(tmp_path, "shared", data, GIT_TASKS)
    refused = runner.invoke(app, ["envs", "check", "--config", str(config)])
    assert refused.exit_code == 2
    text = " ".join(refused.output.split())
    assert f"hidden_arguments: {repo}" in text and "env_config.fixtures" in text and "--allow-shared-state" in text
    assert tree_digest(repo) == before
    # Allowed, it warns and checks (a read-only task, so the repository is left as it was).
    config = write(tmp_path, "shared", data, GIT_TASKS[2:])
    allowed = runner.invoke(app, ["envs", "check", "--config", str(config), "--allow-shared-state", "--json"])
    assert "warning:" in allowed.stderr and str(repo) in " ".join(allowed.stderr.split())
    assert json.loads(allowed.stdout)["reference"]["passed"] == 1
    assert tree_digest(repo) == before


# ---- a server package whose tasks and policy ship inside it, installed only in the server's venv -------

SHOPKIT_SERVER = '''
from mcp.server.mcpserver import MCPServer

server = MCPServer("shopkit", log_level="WARNING")
stores: dict[str, dict[str, str]] = {}


@server.tool()
async def put(key: str, value: str, state_key: str = "default") -> str:
    """Store a value under a key."""
    stores.setdefault(state_key, {})[key] = value
    return f"stored {key}"


if __name__ == "__main__":
    server.run()
'''
SHOPKIT_POLICY = "Shopkit policy: store only what the user asks for."


def shopkit_venv(tmp_path: Path, git_venv: str) -> Path:
    """A venv of the server's own with the package `shopkit` installed (the mcp SDK from the git server's venv)."""
    from tests.server_venvs import _base_python

    venv = tmp_path / "shopkit-venv"
    subprocess.run([_base_python(), "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (borrowed,) = Path(git_venv).glob("lib/python*/site-packages")
    (site / "borrowed.pth").write_text(f"{borrowed}\n")
    package = site / "shopkit"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "server.py").write_text(SHOPKIT_SERVER)
    (package / "policy.md").write_text(SHOPKIT_POLICY + "\n")
    (package / "tasks.jsonl").write_text(json.dumps(
        {"id": "colour", "instruction": "Remember that my favourite colour is blue.",
         "goal": {"actions": [{"name": "put", "arguments": {"key": "colour", "value": "blue"}}],
                  "reward_basis": ["DB"]}}) + "\n")
    return venv


def test_pkg_paths_resolve_in_the_servers_own_venv(tmp_path: Path, git_venv: str) -> None:
    from envs.registry import make_env

    venv = shopkit_venv(tmp_path, git_venv)
    env_config = {"server": {"command": ["python", "-m", "shopkit.server"], "venv": str(venv)},
                  "hidden_arguments": {"state_key": "{episode}"}, "policy": "pkg://shopkit/policy.md"}
    config = write(tmp_path, "shopkit", {"env": "mcp", "env_config": env_config,
                                         "tasks": {"source": "jsonl", "path": "pkg://shopkit/tasks.jsonl"}})
    result = runner.invoke(app, ["envs", "check", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tasks"] == 1 and report["reference"]["passed"] == 1 and report["do_nothing"]["passed"] == 0
    assert make_env("mcp", **env_config).policy == SHOPKIT_POLICY
    # Not installed anywhere: one line naming both places looked at.
    env_config["policy"] = "pkg://nowhere_kit/policy.md"
    (tmp_path / "shopkit.yaml").write_text(yaml.safe_dump({"env": "mcp", "env_config": env_config, "tasks": {
        "source": "jsonl", "path": "pkg://shopkit/tasks.jsonl"}}))
    result = runner.invoke(app, ["envs", "check", "--config", str(config)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"package 'nowhere_kit' is not installed (in {venv}/bin/python nor in trajforge's environment)" in \
        " ".join(result.output.split())
