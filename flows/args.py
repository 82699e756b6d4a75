"""Checks of command-line values that their types alone do not bound; each bad value fails in one line."""

from __future__ import annotations

from flows.console import fail

MAX_PORT = 65_535


def port(value: int, option: str = "--port") -> int:
    """A TCP port, 0 (any free one) to 65535: the OS would take 70000 as 70000 mod 65536."""
    if not 0 <= value <= MAX_PORT:
        fail(f"{option} {value}: a port is a number from 0 to {MAX_PORT} (0: any free port)")
    return value


def at_least(value: int | float, low: int | float, option: str, what: str = "") -> int | float:
    """`value` unless it is below `low`."""
    if value < low:
        fail(f"{option} {value}: must be at least {low}{f' ({what})' if what else ''}")
    return value
