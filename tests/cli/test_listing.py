"""Listing commands answer at once: `trajforge --help`, `envs` and `methods` import none of the heavy
libraries, and what they read from the sources matches what the imported code says."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

from typer.testing import CliRunner

from flows import cli
from flows.listing import env_rows, imported_capabilities, method_rows
from generators.registry import all_methods
from tests.conftest import REPO

HEAVY = ("apache_beam", "prefect", "torch", "datasets", "playwright", "mcp", "pyarrow", "duckdb", "aiohttp",
         "llama_cpp", "transformers", "generators.runner", "envs.mcp.env", "envs.browser.env")
PROBE = """
import sys
from typer.testing import CliRunner
from flows.cli import app
result = CliRunner().invoke(app, sys.argv[1:])
assert result.exit_code == 0, result.output
print(",".join(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def test_listing_commands_import_no_heavy_module() -> None:
    for args in (["--help"], ["envs"], ["methods"]):
        done = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *args], cwd=REPO, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "", f"trajforge {' '.join(args)} imported {done.stdout.strip()}"


def test_what_listings_read_from_source_matches_the_code() -> None:
    assert method_rows() == [(name, (cls.__doc__ or "").strip().splitlines()[0]) for name, cls in all_methods().items()]
    for name, restore, user, evaluation in env_rows():
        caps = imported_capabilities(name)
        assert (restore, user, evaluation) == (caps.restore, caps.user, caps.evaluation), name
    for name in cli.COMMANDS:
        command = cli.load(name)
        assert command.name == name
        doc = inspect.getdoc(command.callback) if command.callback is not None and not cli.COMMANDS[name].help else None
        assert cli.summary(name) == (doc.splitlines()[0] if doc else cli.COMMANDS[name].help), name


def test_help_lists_every_command_and_each_runs_its_own_help() -> None:
    runner = CliRunner()
    listed = runner.invoke(cli.app, ["--help"])
    assert listed.exit_code == 0
    for name in cli.COMMANDS:
        assert f" {name} " in listed.output, name
    result = runner.invoke(cli.app, ["export", "--help"])
    assert result.exit_code == 0 and "--format" in result.output
