"""The `trajforge` command line: one sub-command per stage, each a thin wrapper over a library call."""

from __future__ import annotations

import typer

from flows import cmd_store

app = typer.Typer(
    name="trajforge",
    help="Generate, convert, verify and export training data for LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)

# Each command lives in a small module; register it here.
app.command("schema")(cmd_store.schema)
app.command("validate")(cmd_store.validate)
app.command("stats")(cmd_store.stats)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
