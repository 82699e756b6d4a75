"""Progress of long work behind the small interface the library loops report to.

On a terminal: a rich progress bar. Elsewhere (a log file, a pipe, CI) a bar is invisible until
the end, so plain lines are printed instead: one at the start, then whenever another tenth of the
work is done or `LINE_EVERY_S` passed, and one at the end.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from flows.console import console

LINE_EVERY_S = 30.0


class RichProgress:
    """`start(total, completed)` / `advance(n)`; use as a context manager around the work."""

    def __init__(self, description: str, console: Console = console, line_every_s: float = LINE_EVERY_S):
        self._console = console
        self._description = description
        self._lines = not console.is_terminal
        self._line_every_s = line_every_s
        self._progress = None if self._lines else Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._task: Any = None
        self._total: int | None = None
        self._done = 0
        self._started = self._last_line = time.monotonic()
        self._last_tenth = -1

    def __enter__(self) -> "RichProgress":
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
        elif self._total is not None:
            self._line(final=True)

    def start(self, total: int | None, completed: int = 0) -> None:
        self._total, self._done = total, completed
        self._started = time.monotonic()
        if self._progress is not None:
            self._task = self._progress.add_task(self._description, total=total, completed=completed)
        else:
            self._line()

    def advance(self, n: int = 1) -> None:
        self._done += n
        if self._progress is not None:
            if self._task is not None:
                self._progress.advance(self._task, n)
            return
        if self._total is not None and self._done >= self._total:
            return  # the closing line says it
        tenth = int(10 * self._done / self._total) if self._total else -1
        if tenth > self._last_tenth or time.monotonic() - self._last_line >= self._line_every_s:
            self._line()

    def _line(self, final: bool = False) -> None:
        now = time.monotonic()
        self._last_line = now
        if self._total:
            self._last_tenth = int(10 * self._done / self._total)
        share = f" ({100 * self._done / self._total:.0f}%)" if self._total else ""
        count = f"{self._done}/{self._total}" if self._total is not None else str(self._done)
        self._console.print(f"{self._description}: {count}{share}, {now - self._started:.0f} s"
                            + (" - done" if final else ""), highlight=False, markup=False, soft_wrap=True)
