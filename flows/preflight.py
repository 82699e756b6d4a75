"""Checks of a generation config before a job starts: each problem is one line, not a failed run.

The environment and its settings are checked when the config loads (`envs.spec.EnvSpec`); here the
task source is read (a file that cannot be used is named before the output is made), and the LLM
endpoint must answer one cheap request (see `backends.openai_backend.endpoint_problem`).
"""

from __future__ import annotations

from typing import Any

from flows.config_file import ConfigFileError


def check_generate_config(cfg: Any, where: str) -> None:
    """Raise ConfigFileError (one line, naming `where`) if the job `cfg` describes cannot start."""
    from envs.spec import EnvFactory, EnvSpec
    from envs.tasks import TaskFileError
    from generators.env_method import EnvMethod
    from generators.registry import get_method

    method = get_method(cfg.method)
    if isinstance(cfg, EnvSpec) and issubclass(method, EnvMethod) and method.uses_task_source:
        try:
            EnvFactory(cfg).tasks()
        except (TaskFileError, NotImplementedError) as exc:
            raise ConfigFileError(f"{exc} (tasks of {where})") from None
    llm = getattr(cfg, "llm", None)
    if llm is not None and llm.backend == "openai":
        from backends.openai_backend import endpoint_problem

        if (problem := endpoint_problem(llm)) is not None:
            raise ConfigFileError(f"{where}: {problem}")
