"""The `trajforge` command line: one sub-command per stage, each a thin wrapper over a library call.

Commands are loaded when they run: each lives in a small module (`flows/cmd_*.py`) that imports
what it needs (Beam, Arrow, the MCP SDK, Playwright...), and `COMMANDS` names it without importing
it. Listing (`trajforge --help`) reads each command's summary from its source (flows/listing.py),
so it answers at once. A new command is one line in `COMMANDS`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, NamedTuple

import click
import typer
from typer.core import TyperGroup

from flows.listing import function_summary


class Command(NamedTuple):
    target: str  # "module:function" (a command) or "module:app" (a Typer app of sub-commands)
    context_settings: str | None = None  # the module's attribute holding click context settings
    help: str | None = None  # a sub-app's summary (a command's is its docstring's first line)


COMMANDS: dict[str, Command] = {
    "schema": Command("flows.cmd_store:schema"),
    "validate": Command("flows.cmd_store:validate"),
    "stats": Command("flows.cmd_store:stats"),
    "view": Command("flows.cmd_view:view"),
    "generate": Command("flows.cmd_generate:generate"),
    "methods": Command("flows.cmd_methods:methods"),
    "convert": Command("flows.cmd_convert:convert", "CONTEXT_SETTINGS"),
    "sources": Command("flows.cmd_convert:sources"),
    "filter": Command("flows.cmd_filter:filter_cmd", "CONTEXT_SETTINGS"),
    "dedup": Command("flows.cmd_filter:dedup_cmd", "CONTEXT_SETTINGS"),
    "mix": Command("flows.cmd_filter:mix_cmd"),
    "decontaminate": Command("flows.cmd_decontam:decontaminate_cmd", "CONTEXT_SETTINGS"),
    "export": Command("flows.cmd_export:export"),
    "card": Command("flows.cmd_export:card"),
    "demo": Command("flows.cmd_run:demo"),
    "fake-server": Command("flows.cmd_fake_server:fake_server"),
    "run": Command("flows.cmd_run:run"),
    "serve": Command("flows.cmd_run:serve"),
    "agent-r": Command("flows.cmd_agent_r:agent_r"),
    "train": Command("flows.cmd_train:train"),
    "improve": Command("flows.cmd_improve:improve"),
    "eval": Command("flows.cmd_eval:app", help="Measure a model on an environment's tasks; compare two evals."),
    "envs": Command("flows.cmd_envs:app", help="Environments: list them, check one before a run."),
}


def _source(module: str) -> Path:
    return Path(__file__).resolve().parents[1].joinpath(*module.split(".")).with_suffix(".py")


def summary(name: str) -> str:
    """A command's one-line help, read from its module's source."""
    spec = COMMANDS[name]
    module, _, attr = spec.target.partition(":")
    return spec.help or function_summary(_source(module), attr)


def load(name: str) -> click.Command:
    """The click command of `name`, its module imported now."""
    spec = COMMANDS[name]
    module_name, _, attr = spec.target.partition(":")
    module = importlib.import_module(module_name)
    target = getattr(module, attr)
    if isinstance(target, typer.Typer):
        command = typer.main.get_command(target)
    else:
        one = typer.Typer(add_completion=False)
        settings: dict[str, Any] = getattr(module, spec.context_settings) if spec.context_settings else {}
        one.command(name, context_settings=settings)(target)
        command = typer.main.get_command(one)
    command.name = name
    return command


class LazyGroup(TyperGroup):
    """A group whose commands are imported when one runs; listed (help, completion) from their sources."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *(n for n in COMMANDS if n not in self.commands)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        # A stand-in with the summary: enough for help and completion, replaced by the real one to run.
        return click.Command(cmd_name, help=summary(cmd_name), short_help=summary(cmd_name))

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in COMMANDS and args[0] not in self.commands:
            self.commands[args[0]] = load(args[0])
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        from backends.errors import EngineCrashed

        try:
            return super().invoke(ctx)
        except EngineCrashed as exc:  # from any command that ran the embedded model: one line, resumable
            from flows.console import fail

            fail(str(exc))


app = typer.Typer(
    name="trajforge",
    cls=LazyGroup,
    help="Generate, convert, verify and export training data for LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Generate, convert, verify and export training data for LLM agents."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
