"""trajforge environments as a verifiers (0.4) taskset, id `trajforge-verifiers`.

    vf-eval trajforge-verifiers --env.taskset.config configs/rollout_retail.yaml -m MODEL --client.base-url URL

verifiers finds a taskset by id: this package exports a `Taskset` (the rows: the tasks of a trajforge
rollout config), the `Harness` that plays them (its default) and the `Env` that seats it on the host.
The harness does not run an agent loop of its own: each rollout is one `trajforge envs episode`, the
rollout method through trajforge's one episode loop, with verifiers' interception endpoint as the model,
so verifiers records every model call while trajforge renders the prompts, acts in the world and scores
the episode. The reward verifiers reports is the environment's own evaluation (`env_reward`), and every
rollout is also a trajectory in a trajforge dataset under `rollouts/` (named in `trace.info`).

trajforge runs from its own venv (verifiers pins mcp==2.0.0 and openai<3, trajforge needs newer ones):
`trajforge` names its command (default: `trajforge` on PATH). `load_environment(config=...)` builds the
same env from Python.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from pydantic import field_validator
from verifiers.v1.runtimes import SubprocessConfig
from verifiers.v1.utils.loaders import load_environment as _vf_load_environment

# First: the env config's default seat resolves its harness by importing this module while it loads.
__all__ = ["TrajforgeEnv", "TrajforgeEnvConfig", "TrajforgeHarness", "TrajforgeHarnessConfig", "TrajforgeTask",
           "TrajforgeTaskset", "TrajforgeTasksetConfig", "load_environment"]

TASKSET_ID = "trajforge-verifiers"
KEY_VARIABLE = "TRAJFORGE_VERIFIERS_KEY"  # the interception's bearer token, handed to trajforge by name
LIST_TIMEOUT_S = 600


class TrajforgeTasksetConfig(vf.TasksetConfig):
    config: Path | None = None  # a default: verifiers builds the config before the CLI's values arrive
    """Required: a trajforge rollout config (env, env_config, tasks, max_steps, llm for the sampling settings)."""
    trajforge: str = "trajforge"
    """The trajforge command (a path, or a command line such as `/path/.venv/bin/python -m flows.cli`)."""
    rollouts: Path = Path("outputs/trajforge-rollouts")
    """Where each rollout's trajectory is written: one trajforge dataset per rollout."""

    @field_validator("config")
    @classmethod
    def _config_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value}: no such file (a trajforge rollout config)")
        return value


class TrajforgeData(vf.TaskData):
    config: str
    """The rollout config (absolute path)."""
    trajforge: str
    rollouts: str


class TrajforgeTask(vf.Task[TrajforgeData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def env_reward(self, trace: vf.Trace) -> float:
        """The trajforge environment's evaluation of the episode (goal state, task criteria, page reward...)."""
        return float(_episode(trace)["reward"])

    @vf.metric
    async def env_success(self, trace: vf.Trace) -> float:
        return 1.0 if _episode(trace)["success"] else 0.0


class TrajforgeTaskset(vf.Taskset[TrajforgeTask, TrajforgeTasksetConfig]):
    def load(self) -> Iterator[TrajforgeTask]:
        if self.config.config is None:
            raise ValueError("--env.taskset.config: required, a trajforge rollout config (env, env_config, tasks)")
        config = self.config.config.resolve()
        rollouts = self.config.rollouts.resolve()
        for row in _list_tasks(self.config.trajforge, config):
            data = TrajforgeData(id=row["id"], name=row["id"], prompt=row["instruction"], config=str(config),
                                 trajforge=self.config.trajforge, rollouts=str(rollouts))
            yield TrajforgeTask(data, self.config.task)


class TrajforgeHarnessConfig(vf.HarnessConfig):
    id: str = TASKSET_ID


class TrajforgeHarness(vf.Harness[TrajforgeHarnessConfig]):
    """One rollout = one `trajforge envs episode` against the interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True  # trajforge renders the system prompt (agent instructions + the env's policy)
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False  # a host process: trajforge's own sandboxing applies where a world runs code

    async def launch(self, ctx: Any, trace: vf.Trace, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: vf.TaskData, tool_interception_url: str | None = None,
                     ) -> vf.ProgramResult:
        fields = data.model_dump()
        task_id, output = fields["id"], Path(fields["rollouts"]) / trace.id
        # Draw k of this task in this process: trajforge seeds draw k's sampling with the config's seed + k.
        sample = next(_draws[(fields["config"], task_id)])
        argv = [*shlex.split(fields["trajforge"]), "envs", "episode", "--config", fields["config"], "--task", task_id,
                "--output", str(output), "--sample", str(sample), "--base-url", endpoint, "--model", ctx.model,
                "--api-key-env", KEY_VARIABLE]
        result = await runtime.run_program(argv, {**self.config.resolved_env, KEY_VARIABLE: secret})
        if result.exit_code == 0:
            trace.info["trajforge"] = json.loads(result.stdout.strip().splitlines()[-1])
        return result


class TrajforgeEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(runtime=SubprocessConfig(), harness=TrajforgeHarnessConfig())
    """The one seat, on the host (trajforge starts its worlds itself: servers, browsers, sandboxes)."""


class TrajforgeEnv(vf.Env[TrajforgeEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)


def load_environment(config: str | os.PathLike[str], trajforge: str = "trajforge",
                     rollouts: str | os.PathLike[str] = "outputs/trajforge-rollouts") -> vf.Env:
    """The verifiers env of trajforge rollout config `config` (what `vf-eval trajforge-verifiers` loads)."""
    taskset = {"id": TASKSET_ID, "config": str(config), "trajforge": trajforge, "rollouts": str(rollouts)}
    return _vf_load_environment(TrajforgeEnvConfig.model_validate({"taskset": taskset}))


_draws: defaultdict[tuple[str, str], itertools.count] = defaultdict(itertools.count)


def _episode(trace: vf.Trace) -> dict[str, Any]:
    episode = trace.info.get("trajforge")
    if not isinstance(episode, dict):
        raise vf.TaskError("the rollout has no trajforge episode (its harness did not finish)")
    return episode


def _list_tasks(trajforge: str, config: Path) -> list[dict[str, Any]]:
    argv = [*shlex.split(trajforge), "envs", "tasks", "--config", str(config)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=LIST_TIMEOUT_S)
    except FileNotFoundError:
        raise ValueError(f"--env.taskset.trajforge {trajforge!r}: no such command (trajforge's own venv: "
                         "give the path of its bin/trajforge)") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise ValueError(f"trajforge envs tasks --config {config}: {lines[-1] if lines else f'exit {done.returncode}'}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]

