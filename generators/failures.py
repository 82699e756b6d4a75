"""Why an episode could not finish, as a quarantine stage and one line: the model, the simulator, the user or the world."""

from __future__ import annotations

from backends.errors import LLMRequestError
from envs.base import EnvError
from envs.simulated.env import SimulationError
from envs.users import UserSimulationError


def episode_failure(exc: BaseException) -> tuple[str, str]:
    """(stage, error) for an exception that ended an episode; anything else is re-raised (a bug)."""
    if isinstance(exc, LLMRequestError):
        return "llm", str(exc)
    if isinstance(exc, SimulationError):
        return "simulator", f"SimulationError: {exc}"
    if isinstance(exc, UserSimulationError):
        return "user", f"UserSimulationError: {exc}"
    if isinstance(exc, EnvError):
        return "env", f"EnvError: {exc}"
    raise exc
