"""Per-client counters and the end-of-run summary table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from backends.balancer import EndpointStats


@dataclass(slots=True)
class Stats:
    requests: int = 0  # public chat()/structured() samples asked for
    calls: int = 0  # raw backend calls actually attempted (including retries and failovers)
    cache_hits: int = 0
    retries: int = 0
    failovers: int = 0  # calls resent at once to another endpoint after theirs failed
    failures: int = 0  # requests given up and written to the ledger
    truncated: int = 0  # answers still cut short (finish_reason=length) after the retries, returned as such
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Per endpoint, by URL; only for configs with several endpoints.
    endpoints: dict[str, EndpointStats] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.endpoints:
            del data["endpoints"]
        return data

    def print_summary(self, title: str = "LLM usage", console: Any = None) -> None:
        # rich is imported lazily: summaries print once per run, imports should not cost per job.
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        table = Table(title=title)
        table.add_column("metric")
        table.add_column("value", justify="right")
        for k, v in self.as_dict().items():
            if k != "endpoints":
                table.add_row(k, f"{v:,}")
        console.print(table)
        if self.endpoints:
            console.print(endpoint_table(self.as_dict()["endpoints"]))


ENDPOINT_COLUMNS = ("calls", "ok", "failed", "failed_over", "taken_out", "probes", "state")


def endpoint_table(endpoints: dict[str, dict[str, Any]], title: str = "LLM endpoints") -> Any:
    """Per-endpoint counts (from `Stats.as_dict()["endpoints"]`) as a rich table."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("endpoint")
    for col in ENDPOINT_COLUMNS:
        table.add_column(col.replace("_", " "), justify="right")
    for name, counts in endpoints.items():
        table.add_row(name, *(f"{counts.get(c, 0):,}" if c != "state" else str(counts.get(c, "")) for c in ENDPOINT_COLUMNS))
    return table
