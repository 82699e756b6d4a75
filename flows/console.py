"""The shared rich console and how the CLI reports expected errors (one line, no traceback)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def beam_errors_reported_once() -> Iterator[None]:
    """Silence Beam's own error logs while a command runs a pipeline: a failed bundle is logged
    with its traceback by several of Beam's loggers, then raised; the command reports it in one line."""
    beam = logging.getLogger("apache_beam")
    level = beam.level
    beam.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        beam.setLevel(level)


def read_config_mapping(path: Path) -> dict[str, Any]:
    """A YAML config file as a mapping (bounded in size, depth and aliases), or one line naming the problem."""
    from flows.config_file import ConfigFileError, read_mapping

    try:
        return read_mapping(path, "config")
    except ConfigFileError as exc:
        fail(str(exc))
