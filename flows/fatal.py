"""Errors no retry can fix, inside Prefect: not retried, and logged in one line rather than with a traceback.

An engine that crashed (`EngineCrashed`) has already been restarted once by its backend; a Prefect retry of the stage
would only crash it again, and the tracebacks Prefect logs for a failed task and flow would bury the one line the
CLI prints (`flows/cli.py`). Finished units are kept either way; a re-run resumes.
"""

from __future__ import annotations

import logging
from typing import Any

from backends.errors import EngineCrashed

FATAL = (EngineCrashed,)


def retry_unless_fatal(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's `retry_condition_fn`: retry a failed stage unless a fatal error failed it."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - an unreadable state: retry as Prefect would
        return True
    return not isinstance(exc, FATAL)


class _OneLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], FATAL):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_fatal_tracebacks() -> None:
    """Drop the traceback from Prefect's task and flow run logs of a fatal error (idempotent)."""
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OneLine) for f in logger.filters):
            logger.addFilter(_OneLine())
