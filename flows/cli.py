"""The `trajforge` command line: one sub-command per stage, each a thin wrapper over a library call."""

from __future__ import annotations

import typer

from flows import (cmd_agent_r, cmd_convert, cmd_envs, cmd_eval, cmd_export, cmd_fake_server, cmd_filter,
                   cmd_generate, cmd_improve, cmd_run, cmd_store, cmd_train, cmd_view)

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
app.command("view")(cmd_view.view)
app.command("generate")(cmd_generate.generate)
app.command("methods")(cmd_generate.methods)
app.command("convert", context_settings=cmd_convert.CONTEXT_SETTINGS)(cmd_convert.convert)
app.command("sources")(cmd_convert.sources)
app.command("filter", context_settings=cmd_filter.CONTEXT_SETTINGS)(cmd_filter.filter_cmd)
app.command("dedup", context_settings=cmd_filter.CONTEXT_SETTINGS)(cmd_filter.dedup_cmd)
app.command("mix")(cmd_filter.mix_cmd)
app.command("export")(cmd_export.export)
app.command("card")(cmd_export.card)
app.command("demo")(cmd_run.demo)
app.command("fake-server")(cmd_fake_server.fake_server)
app.command("run")(cmd_run.run)
app.command("serve")(cmd_run.serve)
app.command("agent-r")(cmd_agent_r.agent_r)
app.command("train")(cmd_train.train)
app.command("improve")(cmd_improve.improve)
app.add_typer(cmd_envs.app, name="envs")
app.add_typer(cmd_eval.app, name="eval")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
