"""A rich progress bar behind the small interface the library loops report to."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from flows.console import console


class RichProgress:
    """`start(total, completed)` / `advance(n)`; use as a context manager around the work."""

    def __init__(self, description: str, console: Console = console):
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._description = description
        self._task: Any = None

    def __enter__(self) -> "RichProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.stop()

    def start(self, total: int | None, completed: int = 0) -> None:
        self._task = self._progress.add_task(self._description, total=total, completed=completed)

    def advance(self, n: int = 1) -> None:
        if self._task is not None:
            self._progress.advance(self._task, n)
