"""`trajforge methods`: the generation methods, listed from their source (nothing heavy is imported)."""

from __future__ import annotations


def methods() -> None:
    """List the generation methods."""
    from rich.table import Table

    from flows.console import console
    from flows.listing import method_rows

    table = Table(title="generation methods")
    table.add_column("method")
    table.add_column("what it does")
    for name, summary in method_rows():
        table.add_row(name, summary)
    console.print(table)
