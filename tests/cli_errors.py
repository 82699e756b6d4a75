"""What a refused CLI command looks like: exit 1, one `error:` line, no traceback."""

from __future__ import annotations

from typing import Any


def one_error_line(result: Any, *needles: str) -> str:
    """Exit 1 with exactly one `error:` line (no traceback) that contains every needle; the line."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output, result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    for needle in needles:
        assert needle in line, (needle, line)
    return line
