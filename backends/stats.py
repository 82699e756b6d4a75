"""Per-client counters and the end-of-run summary table."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(slots=True)
class Stats:
    requests: int = 0  # public chat()/structured() samples asked for
    calls: int = 0  # raw backend calls actually attempted (including retries)
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0  # requests given up and written to the ledger
    truncated: int = 0  # answers still cut short (finish_reason=length) after the retries, returned as such
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def print_summary(self, title: str = "LLM usage", console: Any = None) -> None:
        # rich is imported lazily: summaries print once per run, imports should not cost per job.
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        table.add_column("metric")
        table.add_column("value", justify="right")
        for k, v in self.as_dict().items():
            table.add_row(k, f"{v:,}")
        (console or Console()).print(table)
