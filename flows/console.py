"""The shared rich console and how the CLI reports expected errors (one line, no traceback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer
import yaml
from rich.console import Console

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    raise typer.Exit(code)


def read_config(path: Path) -> dict[str, Any]:
    """A YAML config as a mapping, or one line naming the file and the problem."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        fail(f"{path}: cannot read config ({exc})")
    if not isinstance(data, dict):
        fail(f"{path}: a config is a YAML mapping, not {type(data).__name__}")
    return data
