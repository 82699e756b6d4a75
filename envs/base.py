"""The one environment interface every generation method drives: Task, StepResult, Snapshot, Environment."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from schemas.models import Action, ApiAction, CodeAction, MessageAction, Observation, TextObservation, Tool


class Task(BaseModel):
    """One episode's specification: what the user wants and how success is judged.

    `params` configures the world (e.g. its seed); `goal` is what the environment's
    checker compares against; `metadata` holds hidden info (e.g. what a simulated user knows).
    """

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    env: str = Field(min_length=1)
    instruction: str
    params: dict[str, Any] = Field(default_factory=dict)
    goal: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)


@dataclass
class StepResult:
    """What one action produced: the next observation, a reward, whether the episode ended, extras.

    `info["error"]` is set when the action was refused (unknown tool, bad arguments, a
    business rule); the state is then unchanged.
    """

    observation: Observation
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.info is None:
            self.info = {}


@dataclass(frozen=True)
class Snapshot:
    """An opaque, immutable copy of an environment's full state (world + episode).

    Restoring from the same snapshot any number of times gives the same state, so search
    methods (MCTS) can branch from it.
    """

    env: str
    payload: Any


class Environment(ABC):
    """A world an agent acts in. It does not know who acts in it (a model, a script, a replay)."""

    name: ClassVar[str] = "abstract"

    @abstractmethod
    def tools(self) -> list[Tool]:
        """The tools the environment exposes, each with a JSON Schema of its parameters."""

    @abstractmethod
    def reset(self, task: Task) -> Observation:
        """Start an episode of `task`; returns the first observation (usually the user's request)."""

    @abstractmethod
    def step(self, action: Action) -> StepResult:
        """Apply one agent action."""

    @abstractmethod
    def snapshot(self) -> Snapshot:
        """An independent copy of the whole state."""

    @abstractmethod
    def restore(self, snapshot: Snapshot) -> None:
        """Return to the state captured by `snapshot` (which stays reusable)."""

    @abstractmethod
    def evaluate(self) -> float:
        """The outcome reward of the current state for the current task (1.0 = success)."""

    def goal_reached(self) -> bool:
        return self.evaluate() >= 1.0

    def generate_tasks(self, n: int, seed: int = 0) -> list[Task]:
        """Deterministic tasks for this environment; environments without a generator raise."""
        raise NotImplementedError(f"{self.name} has no task generator")

    # Async wrappers: built-in environments are synchronous; an LLM-simulated environment
    # overrides these to await its model calls, and drivers always await them.
    async def areset(self, task: Task) -> Observation:
        return self.reset(task)

    async def astep(self, action: Action) -> StepResult:
        return self.step(action)

    def close(self) -> None:
        """Release resources (connections, files)."""

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_task(self, task: Task) -> None:
        if task.env != self.name:
            raise ValueError(f"task {task.id} is for {task.env!r}, not {self.name!r}")

    def _check_snapshot(self, snapshot: Snapshot) -> None:
        if not isinstance(snapshot, Snapshot) or snapshot.env != self.name:
            raise ValueError(f"snapshot of {getattr(snapshot, 'env', snapshot)!r} cannot restore a {self.name} environment")


def error_observation(message: str, *, name: str | None = None, tool_call_id: str | None = None) -> TextObservation:
    """The observation for a refused action: an environment text starting with 'Error:'."""
    return TextObservation(content=f"Error: {message}", source="environment", name=name, tool_call_id=tool_call_id)


def action_kind(action: object) -> str:
    """A short label for an action, for error messages about unsupported kinds."""
    if isinstance(action, ApiAction):
        return "api"
    if isinstance(action, CodeAction):
        return "code"
    if isinstance(action, MessageAction):
        return "message"
    return type(action).__name__
