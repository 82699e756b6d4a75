"""Checks of a generation config before a job starts: each problem is one line, not a failed run.

The environment it names exists and takes the settings given; a tasks file is a bounded regular
file; the LLM endpoint answers (one cheap request, see `backends.openai_backend.endpoint_problem`).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from flows.config_file import MAX_TASKS_FILE_BYTES, ConfigFileError, regular_file

_UNEXPECTED = re.compile(r"unexpected keyword argument '([^']+)'")


def env_problem(name: str, settings: dict[str, Any]) -> str | None:
    """Why `make_env(name, **settings)` would fail on the name or a setting's name (None if it would not)."""
    from envs.registry import env_factory

    try:
        factory = env_factory(name)
    except KeyError as exc:
        return f"env: {exc.args[0]}"
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None  # a factory without a readable signature: it reports for itself
    try:
        signature.bind_partial(**settings)
    except TypeError as exc:
        known = [p.name for p in signature.parameters.values()
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]
        bad = _UNEXPECTED.search(str(exc))
        what = f"no setting {bad.group(1)!r}" if bad else str(exc)
        return f"env_config: environment {name!r} has {what} (its settings: {', '.join(known) or 'none'})"
    return None


def check_generate_config(cfg: Any, where: str) -> None:
    """Raise ConfigFileError (one line, naming `where`) if the job `cfg` describes cannot start."""
    name = getattr(cfg, "env", None)
    if isinstance(name, str) and (problem := env_problem(name, dict(getattr(cfg, "env_config", None) or {}))):
        raise ConfigFileError(f"{where}: {problem}")
    tasks_file = getattr(cfg, "tasks_file", None)
    if tasks_file:
        try:
            regular_file(tasks_file, "tasks file", MAX_TASKS_FILE_BYTES)
        except ConfigFileError as exc:
            raise ConfigFileError(f"{exc} (tasks_file of {where})") from None
    llm = getattr(cfg, "llm", None)
    if llm is not None and llm.backend == "openai":
        from backends.openai_backend import endpoint_problem

        if (problem := endpoint_problem(llm)) is not None:
            raise ConfigFileError(f"{where}: {problem}")
