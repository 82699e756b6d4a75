"""The shared episode loop: an agent policy acts in an environment until the episode ends.

Used by `rollout` and `ui_simulator` (and open to the other methods). All environment calls
go through the async API (`areset` / `astep` / `aevaluate` when the env has it), so the
LLM-simulated environment works like the built-in ones. A trajectory always starts with the
user's request: when the env's first observation is something else (a web page), the task's
instruction is put before it as a user step.

An answer the policy cannot parse is a *failed step*: the environment never sees it; the
trajectory records the raw answer (an agent text step) and an error observation, both with
`train=False` and `label="bad"`, and the agent tries again with that feedback in its history
(which also makes the retry a new cache entry instead of the cached bad answer). After
`max_parse_failures` such steps the episode ends as failed (reward 0). LLM request errors
(`LLMRequestError`) and simulator errors propagate: callers quarantine the task.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from converters.errors import summarize_validation
from envs.base import Environment, Task
from generators.agent import AgentPolicy
from schemas.models import Step, TextObservation

PARSE_ERROR = (
    "Error: your last answer could not be read as an action ({error}). Reply with one short thought and "
    "exactly one tool call, or with your final answer to the user."
)


@dataclass
class Episode:
    """What one episode produced; `reward` is None when the caller asked for no env evaluation."""

    steps: list[Step]
    reward: float | None
    done: bool
    stop_reason: str  # "done" | "max_steps" | "max_parse_failures"
    actions: int = 0
    parse_failures: int = 0
    action_errors: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.stop_reason == "max_parse_failures"


async def evaluate(env: Environment) -> float:
    """The env's outcome reward, awaiting `aevaluate` where the env has one (LLM-judged envs)."""
    aevaluate = getattr(env, "aevaluate", None)
    if aevaluate is not None:
        return float(await aevaluate())
    return float(env.evaluate())


async def play_episode(
    env: Environment,
    policy: AgentPolicy,
    task: Task,
    *,
    max_steps: int,
    max_parse_failures: int = 3,
    guidance: str | None = None,
    score: bool = True,
) -> Episode:
    """Reset `env` to `task` and let `policy` act for up to `max_steps` actions."""
    first = await env.areset(task)
    steps: list[Step] = [first]
    if not (first.kind == "text" and first.source == "user"):
        # Environments that open on a page (web) keep the request out of band; the agent must see
        # it, and a trajectory starts with the user's request.
        steps.insert(0, TextObservation(content=task.instruction, source="user"))
    episode = Episode(steps=steps, reward=None, done=False, stop_reason="max_steps")
    while episode.actions < max_steps:
        proposal = (await policy.propose(steps, guidance=guidance))[0]
        if proposal.action is None:
            episode.parse_failures += 1
            error = proposal.error or "no action"
            steps.append(TextObservation(content=proposal.raw or "", source="agent", train=False, label="bad",
                                         extra={"parse_error": error}))
            steps.append(TextObservation(content=PARSE_ERROR.format(error=error), source="environment",
                                         name="parse_error", train=False))
            if episode.parse_failures >= max_parse_failures:
                episode.stop_reason = "max_parse_failures"
                break
            continue
        episode.actions += 1
        steps.append(proposal.action)
        result = await env.astep(proposal.action)
        steps.append(result.observation)
        if result.info.get("error"):
            episode.action_errors.append(str(result.info["error"]))
        if result.info.get("truncated"):
            episode.info["truncated"] = True
        if result.done:
            episode.done, episode.stop_reason = True, "done"
            break
    if score:
        # An episode that ended on unreadable answers is failed whatever the state shows.
        episode.reward = 0.0 if episode.failed else await evaluate(env)
    return episode


async def close_env(env: Environment) -> None:
    """Close an env, awaiting its async close where it has one (an env's own LLM client)."""
    aclose = getattr(env, "aclose", None)
    if aclose is not None:
        await aclose()
    else:
        env.close()


class TaskFileError(ValueError):
    """A tasks file that cannot be used; the message names the file (and line)."""


def load_tasks_file(path: str | Path, default_env: str) -> list[Task]:
    """Tasks from a JSONL file: each line a Task (or at least `{"instruction": ...}`); ids default to the line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFileError(f"{path}: cannot read tasks file ({exc})") from None
    tasks: list[Task] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskFileError(f"{path}:{n}: not JSON ({exc})") from None
        if not isinstance(row, dict) or not isinstance(row.get("instruction"), str):
            raise TaskFileError(f"{path}:{n}: a task needs an 'instruction' string")
        row.setdefault("id", f"task-{n:04d}")
        row.setdefault("env", default_env)
        try:
            tasks.append(Task.model_validate(row))
        except ValidationError as exc:
            raise TaskFileError(f"{path}:{n}: {summarize_validation(exc)}") from None
    ids = [t.id for t in tasks]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise TaskFileError(f"{path}: duplicate task ids: {', '.join(dup)}")
    return tasks


class EnvMaker:
    """Builds a method's environments from (name, config); the simulated env gets an LLM.

    The simulated env uses the method's own LLM (same cache, same stats) unless its config
    names another (`llm: {...}`); that one is made once, cached beside the method's cache
    (`_env_llm_cache.sqlite` in the output directory) and closed by `aclose()`.
    """

    def __init__(self, name: str, config: dict[str, Any], llm: Any) -> None:
        self.name = name
        self.config = dict(config)
        self.llm = llm
        self._env_llm: Any = None
        self.output: Path | None = None

    def __call__(self) -> Environment:
        from envs.registry import make_env

        config = dict(self.config)
        if self.name == "simulated":
            config["llm"] = self._simulator_llm()
        return make_env(self.name, **config)

    def _simulator_llm(self) -> Any:
        own = self.config.get("llm")
        if own is None:
            return self.llm
        if self._env_llm is None:
            from backends.config import LLMConfig
            from backends.registry import make_llm

            cfg = own if isinstance(own, LLMConfig) else LLMConfig.model_validate(own)
            if cfg.cache_path is None and self.output is not None:
                cfg = cfg.model_copy(update={"cache_path": str(self.output / "_env_llm_cache.sqlite")})
            self._env_llm = make_llm(cfg)
        return self._env_llm

    def describe(self) -> dict[str, Any]:
        """The env name and its JSON-safe config (no LLM objects), for trajectory details."""
        # Bulky inputs (tools are on the trajectory already; policies and seeds can be long) are
        # summarised by a hash instead of repeated in every record.
        bulky = {"llm", "tools", "seeds", "policy", "tasks"}
        config = {k: v for k, v in self.config.items() if k not in bulky}
        for key in sorted((bulky - {"llm"}) & set(self.config)):
            config[f"{key}_sha256"] = hashlib.sha256(json.dumps(self.config[key], default=str, sort_keys=True)
                                                     .encode()).hexdigest()[:16]
        return {"name": self.name, "config": json.loads(json.dumps(config, default=str))}

    async def aclose(self) -> None:
        if self._env_llm is not None:
            llm, self._env_llm = self._env_llm, None
            await llm.aclose()
