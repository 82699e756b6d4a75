"""One episode at a time, for a trainer or evaluator that drives trajforge from outside.

The verifiers adapter (integrations/verifiers) runs in a venv of its own (verifiers pins an older MCP SDK
and OpenAI client than trajforge's), so it reaches trajforge through two commands built on this module:
`trajforge envs tasks` (`config_tasks`: the rows of its dataset) and `trajforge envs episode` (`play`: one
rollout). The config is the rollout config `train --objective grpo` takes (env, env_config, tasks,
max_steps, llm for the sampling settings). An episode is one task of the `rollout` method, played
through the one episode loop, scored by the environment's own evaluation and committed as a trajectory
to a trajforge dataset; its model is the config's, or any OpenAI-compatible endpoint given instead
(the trainer's, which records what the model was asked and answered).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from backends.config import LLMConfig
from generators.base import TaskSpec
from generators.rollout import Rollout, RolloutConfig
from generators.runner import generate


def rollout_config(data: dict[str, Any], **overrides: Any) -> RolloutConfig:
    """`data` as a rollout config; a bad one raises ValueError with one line naming the fields."""
    try:
        return RolloutConfig.model_validate({**data, "method": "rollout", **overrides})
    except ValidationError as exc:
        raise ValueError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}"
                                   for e in exc.errors())) from None


def config_tasks(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The config's tasks in the task source's order: id and instruction of each (a benchmark's test split only
    where the config allows it, as for generation)."""
    method = Rollout(rollout_config(data), llm=None)
    return [{"id": task.id, "instruction": task.instruction} for task in method.env_tasks().values()]


def endpoint_llm(config: RolloutConfig, base_url: str, model: str, api_key_env: str | None) -> LLMConfig:
    """The config's sampling settings over an OpenAI-compatible endpoint, without a response cache: a trainer's
    draws of one prompt must each be the model's own, not the first one replayed."""
    keep = {"temperature", "top_p", "max_tokens", "seed", "request_timeout_s", "max_retries", "backoff_base_s",
            "backoff_max_s", "token_ids"}
    settings = {k: v for k, v in config.llm.model_dump(exclude_unset=True).items() if k in keep}
    return LLMConfig.model_validate({**settings, "backend": "openai", "base_url": base_url, "model": model,
                                     "api_key_env": api_key_env})


async def play(data: dict[str, Any], task_id: str, output: Path, *, sample: int = 0,
               endpoint: tuple[str, str, str | None] | None = None) -> dict[str, Any]:
    """Play task `task_id` of rollout config `data` once (draw `sample`) into dataset `output`.

    `endpoint` (base URL, model, name of the variable holding its key) replaces the config's model.
    Returns the record id and the environment's evaluation (reward, success, reason); an episode that
    made no trajectory (the model, the world or the user failed: it is quarantined in `output`) raises
    ValueError naming the stage and the error."""
    # Draw k of the method: samples_per_task above 1 makes the method seed its draws (sampling seed `seed + k`).
    config = rollout_config(data, samples_per_task=max(2, sample + 1), cache=False, concurrency=1, unit_tasks=1)
    if endpoint is not None:
        config = config.model_copy(update={"llm": endpoint_llm(config, *endpoint)})
    method = Rollout(config, llm=None)
    tasks = method.env_tasks()
    if task_id not in tasks:
        raise ValueError(f"task {task_id!r} is not one of the config's tasks ({len(tasks)} tasks)")
    spec = TaskSpec(id=f"{task_id}#{sample}", instruction=tasks[task_id].instruction,
                    payload={"task": task_id, "sample": sample})
    await generate(config, output, tasks=[spec])
    from schemas.store import Dataset

    dataset = Dataset.open(output)
    for record in dataset.iter_records():
        return {"record": record.id, "task": task_id, "sample": sample, "reward": record.reward,
                "success": record.success, "reason": (record.details.get("evaluation") or {}).get("reason"),
                "dataset": str(output)}
    problems = [f"{row.get('stage')}: {row.get('error')}" for row in dataset.iter_rows("quarantine")]
    raise ValueError(f"task {task_id!r} made no trajectory ({'; '.join(problems) or 'no reason recorded'})")
