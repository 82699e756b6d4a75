"""`trajforge view DIR...`: serve the read-only viewer page over datasets and exports."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows import args
from flows.console import console, err_console, fail
from viewer.reports import find_reports
from viewer.sources import ViewError, discover

LOOPBACK_NAMES = ["127.0.0.1", "::1", "localhost"]


def view(
    paths: Annotated[list[Path], typer.Argument(
        help="Dataset directories, exports, or folders holding them (e.g. a pipeline's output root).")],
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8765,
    host: Annotated[str, typer.Option(
        help="Address to listen on. Anything but loopback exposes the data to whoever can reach this machine.")] = "127.0.0.1",
    tokenizer: Annotated[Path | None, typer.Option(
        help="A tokenizer directory: export previews then show which tokens carry loss.")] = None,
) -> None:
    """Serve a read-only web page over datasets, exports and eval / improve reports: search, filters, trajectories,
    pairs, quarantine, per-task pass rates and failures, before / after training."""
    # The web stack is imported here, so other commands do not pay for it.
    from viewer.server import bind, create_app, is_loopback, resolve_host, serve

    args.port(port)
    try:
        sources = discover(paths)
        reports = find_reports(paths)
        _, address = resolve_host(host, port)
        if tokenizer is not None and not tokenizer.exists():
            raise ViewError(f"--tokenizer {tokenizer}: no such file or directory")
        sock = bind(host, port)
    except ViewError as exc:
        fail(str(exc))
    loopback = is_loopback(address)
    if not loopback:
        err_console.print(f"[bold yellow]warning:[/] listening on {host}, not loopback: anyone who can reach this "
                          "machine can read these datasets", highlight=False)
    # Behind loopback, only loopback Host headers: a web page elsewhere cannot reach it by DNS rebinding.
    allowed = sorted({*LOOPBACK_NAMES, host}) if loopback else None
    app = create_app(sources, tokenizer=tokenizer, allowed_hosts=allowed, reports=reports)
    console.print(f"trajforge view: {len(sources)} source(s), read-only", highlight=False)
    for source in sources:
        console.print(f"  {source.name}  ({source.kind}{', ' + source.format if source.format else ''})", highlight=False)
    for report in reports:
        console.print(f"  {report.name}  ({report.kind} report)", highlight=False)
    bound = sock.getsockname()[1]
    shown = host if ":" not in host else f"[{host}]"
    console.print(f"serving http://{shown}:{bound}/  (Ctrl-C stops it)", highlight=False)
    serve(app, sock)
