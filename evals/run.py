"""`trajforge eval`: a model acts on an environment's tasks, k episodes each, through the one episode loop.

The config is an agent config (the keys of `rollout`: llm, env, env_config, tasks, user,
max_steps, agent_mode, agent_temperature, ...), with `samples` episodes per task. The tasks are
the source's test split unless another is asked for (generation reads train); a source without
splits runs every task, and the report says so. Sample k of a task sends seed `seed + k` with
every model request: distinct samples (and cache entries) at a temperature above 0, the same
answer under greedy decoding.

The episodes are a dataset like any other (`trajforge view OUT`): one trajectory per episode
(`eval/<task>#<k>`, its evaluation, steps, wall time); an episode the world or the model server
broke is quarantined, not counted as the agent's failure. Like a generation run, a killed eval
resumes where it stopped (finished units are kept, the request cache answers what was asked).
The report (`evals.report`) is computed from the dataset, so a resumed run reports every episode.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import Field

from envs.base import Task
from envs.spec import EnvFactory
from envs.tasks import NoSplits
from filters.policy_rules import PolicyCheck
from generators._episode import play_episode
from generators.agent import SYSTEM as AGENT_SYSTEM
from generators.agent import TEXT_FORMAT
from generators.base import TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.failures import episode_failure
from generators.runner import generate

TEST = "test"
ALL = "all"  # every task, whatever its split
NO_SPLIT = "none"


class EvalConfig(EnvMethodConfig):
    method: Literal["eval"] = "eval"
    samples: int = Field(1, ge=1, le=1000, description="episodes per task (pass@k and pass^k for k up to this)")
    # An eval scores by the benchmark's own criteria (tau2's); the policy's rule check is for training data.
    policy_check: PolicyCheck | None = Field(None, description="the policy's rule check on each episode (default: off, "
                                                               "the benchmark's own criteria decide)")


def eval_config(data: dict[str, Any]) -> EvalConfig:
    """An eval config from a YAML mapping: an eval config, or a rollout config (its samples_per_task are samples)."""
    data = dict(data)
    method = data.pop("method", None)
    if method == "rollout":
        if "samples_per_task" in data:
            data.setdefault("samples", data.pop("samples_per_task"))
        data.pop("keep_failed", None)
    elif method not in (None, "eval"):
        raise ValueError(f"eval runs an agent on tasks: give an eval or a rollout config, not one of method {method!r}")
    return EvalConfig.model_validate(data)


class Evaluate(EnvMethod):
    """k episodes per task, each recorded with its evaluation and wall time (not a registered method)."""

    name = "eval"
    Config = EvalConfig
    templates = (AGENT_SYSTEM, TEXT_FORMAT)
    config: EvalConfig

    def tasks(self) -> Iterable[TaskSpec]:
        return [TaskSpec(id=f"{task.id}#{k}", instruction=task.instruction, payload={"task": task.id, "sample": k})
                for task in self.env_tasks().values() for k in range(self.config.samples)]

    async def run_task(self, spec: TaskSpec) -> TaskResult:
        task = self.env_tasks()[spec.payload["task"]]
        k = int(spec.payload["sample"])
        result = TaskResult()
        if k > 0:  # a simulated world or user sees the sample too: its answers are cache entries of their own
            task = task.model_copy(update={"params": {**task.params, "sample": k}})
        started = time.perf_counter()
        try:
            async with self.make_env() as env:
                episode = await play_episode(env, self.policy(draw=k), task,
                                             max_steps=self.config.max_steps,
                                             max_parse_failures=self.config.max_parse_failures)
        except Exception as exc:  # noqa: BLE001 - classified and quarantined; the run goes on
            stage, error = episode_failure(exc)
            result.fail(spec.id, stage, error, {"task": task.id, "sample": k})
            return result
        wall = round(time.perf_counter() - started, 3)
        result.trajectories.append(self.trajectory(task, f"#{k}", episode.steps, episode.evaluation, sample=k,
                                                   wall_s=wall, **episode.details()))
        episode.count(result.counts)
        return result


def with_split(config: EvalConfig, split: str | None) -> tuple[EvalConfig, str, list[Task]]:
    """The config reading `split` (default: test), the split it ran, and its tasks.

    A source without splits runs every task when no split was asked for by name (split "none"); a
    split asked for by name that the tasks do not have is refused (ValueError naming the splits there are).
    """
    wanted = split or TEST
    cfg = config.model_copy(update={"tasks": config.tasks.model_copy(update={"split": wanted,
                                                                             "allow_test_split": True})})
    try:
        tasks = EnvFactory(cfg).tasks()
    except NoSplits:
        if split is not None:
            raise
        cfg = config.model_copy(update={"tasks": config.tasks.model_copy(update={"split": None})})
        return cfg, NO_SPLIT, EnvFactory(cfg).tasks()
    splits = sorted({str(t.metadata["split"]) for t in tasks if t.metadata.get("split")})
    if split is not None and split != ALL and split not in splits:
        there = f"splits: {', '.join(splits)}, or all" if splits else "it has no splits: leave --split out, or all"
        raise ValueError(f"no split {split!r} in the tasks of the {config.tasks.source} source ({there})")
    if not splits:
        return cfg, NO_SPLIT, tasks
    return cfg, wanted, tasks


async def run_eval(config: EvalConfig, output: str | Path, *, split: str | None = None, samples: int | None = None,
                   max_tasks: int | None = None, overwrite: bool = False, progress: Any = None) -> dict[str, Any]:
    """Run the eval into `output` (resuming a killed one) and write its report there; returns the report."""
    from evals.report import build_report, write_report

    updates: dict[str, Any] = {}
    if samples is not None:
        updates["samples"] = samples
    if max_tasks is not None:
        updates["tasks"] = config.tasks.model_copy(update={"n": max_tasks})
    config = EvalConfig.model_validate({**config.model_dump(), **updates}) if updates else config
    config, ran_split, tasks = with_split(config, split)
    if not tasks:
        raise ValueError(f"no task to evaluate in split {ran_split!r} of the {config.tasks.source} source")
    started = time.perf_counter()
    summary = await generate(config, output, overwrite=overwrite, progress=progress, method_cls=Evaluate)
    report = build_report(Path(output), config, split=ran_split, run=summary.as_dict(),
                          wall_s=time.perf_counter() - started)
    write_report(Path(output), report)
    return report
