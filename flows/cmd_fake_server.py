"""`trajforge fake-server`: a local OpenAI-compatible server with scripted latency and faults."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from backends.fake_server import ALL_FAULT_KINDS, FAULT_KINDS, serve_forever
from flows import args
from flows.console import fail


def fake_server(
    host: Annotated[str, typer.Option(help="Address to bind (keep it on loopback).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 8000,
    latency: Annotated[float, typer.Option(help="Seconds before each answer.")] = 0.0,
    capacity: Annotated[Optional[int], typer.Option(help="Concurrent requests before it answers 429.")] = None,
    fault_rate: Annotated[float, typer.Option(help="Fraction of requests that fail (0..1).")] = 0.0,
    faults: Annotated[str, typer.Option(help="Comma-separated fault kinds to draw from (also the answer faults "
                                             "garbage and refused, by name).")] = ",".join(FAULT_KINDS),
    seed: Annotated[int, typer.Option(help="Seed of latency and fault draws.")] = 0,
    stall_s: Annotated[float, typer.Option(help="How long a `stall` fault holds its answer (seconds).", min=0)] = 30.0,
    log_path: Annotated[Optional[str], typer.Option(
        "--log-path", "--log-jsonl", help="Append every request (no credentials) to this JSONL.")] = None,
) -> None:
    """Serve /v1/models and /v1/chat/completions for testing your own jobs against faults."""
    kinds = tuple(f.strip() for f in faults.split(",") if f.strip())
    unknown = [k for k in kinds if k not in ALL_FAULT_KINDS and not (k.isdigit() and 400 <= int(k) <= 599)]
    if unknown:
        fail(f"unknown fault kind(s) {', '.join(unknown)}; kinds are {', '.join(ALL_FAULT_KINDS)} "
             "or an HTTP status 4xx/5xx")
    if not 0.0 <= fault_rate <= 1.0:
        fail(f"--fault-rate must be between 0 and 1, not {fault_rate}")
    args.port(port)
    args.at_least(latency, 0, "--latency", "seconds")
    if capacity is not None:
        args.at_least(capacity, 1, "--capacity", "concurrent requests")
    try:
        serve_forever(host=host, port=port, latency=latency, capacity=capacity, fault_rate=fault_rate,
                      faults=kinds, seed=seed, stall_s=stall_s, log_path=log_path)
    except OSError as exc:  # binding: the port is taken, the address is not this machine's or does not resolve
        fail(f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port or --host")
