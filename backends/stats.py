"""Per-client counters and the end-of-run summary table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from backends.balancer import EndpointStats


# How a run's cost was known: the basis printed beside it.
COST_PRICED = "price per million tokens (llm.price)"
COST_LOCAL = "local model"
COST_UNKNOWN = "unknown: no llm.price for this remote model"


@dataclass(slots=True)
class Stats:
    requests: int = 0  # public chat()/structured() samples asked for
    calls: int = 0  # raw backend calls actually attempted (including retries and failovers)
    cache_hits: int = 0  # samples served from the response cache (cost nothing this run)
    retries: int = 0
    failovers: int = 0  # calls resent at once to another endpoint after theirs failed
    failures: int = 0  # requests given up and written to the ledger
    # Answers handed back unusable after the retries (once each, fresh or from the cache): cut short
    # (finish_reason=length), or otherwise unusable (unparseable tool call, refused).
    truncated: int = 0
    unusable: int = 0
    # Tokens of every answer the backends returned this run, retried attempts included (what was paid for).
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0  # seconds the model took to answer, over every attempt
    # Per endpoint, by URL; only for configs with several endpoints.
    endpoints: dict[str, EndpointStats] = field(default_factory=dict)
    # How tokens turn into money: (prompt, completion) USD per million tokens, or None; local engines.
    price: tuple[float, float] | None = None
    local: bool = False

    def cost_usd(self) -> float | None:
        """The run's cost: priced tokens, 0.0 for a local model, None (unknown) for an unpriced remote one."""
        if self.price is not None:
            return (self.prompt_tokens * self.price[0] + self.completion_tokens * self.price[1]) / 1e6
        return 0.0 if self.local else None

    def cost_basis(self) -> str:
        return COST_PRICED if self.price is not None else COST_LOCAL if self.local else COST_UNKNOWN

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["price"], data["local"]
        data["latency_s"] = round(self.latency_s, 3)
        data["cost_usd"] = self.cost_usd()
        data["cost"] = self.cost_basis()
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
            if k not in ("endpoints", "cost", "cost_usd"):
                table.add_row(k, f"{v:,}")
        table.add_row("cost", format_cost(self.cost_usd(), self.cost_basis()))
        console.print(table)
        if self.endpoints:
            console.print(endpoint_table(self.as_dict()["endpoints"]))


def format_cost(cost: float | None, basis: str) -> str:
    """A cost for a summary line: dollars and how they are known, or why they are not."""
    if cost is None:
        return basis
    return f"${cost:,.4f} ({basis})"


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
