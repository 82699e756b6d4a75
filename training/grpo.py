"""`trajforge train --objective grpo --config ENV_CONFIG`: TRL's GRPOTrainer on a trajforge environment.

ENV_CONFIG is a rollout config (`env`, `env_config`, `tasks`, `max_steps`, `llm` for the sampling
settings): its tasks are the prompts (one dataset row per task id; a task source refuses a
benchmark's test split). TRL's `rollout_func` plays each completion as one episode of the `rollout`
method, through the one episode loop (`play_episode`), with the agent backed by the model being
trained (`LiveLLM`: the transformers backend over the trainer's live weights, which records every
call's token ids and logprobs). Each rollout is committed as a trajectory to OUT/rollouts (a
trajforge dataset: view, eval, export it like any other), and the reward is the environment's own
evaluation of the episode (`Trajectory.reward`).

Tokens: the completion is the episode's first model call; later calls whose prompt extends the
previous prompt and answer are appended, the environment's tokens between them masked
(`env_mask` 0). A later call whose prompt does not extend it (the history window cut it) ends the
completion there: what follows is not trained. An episode that produced no trajectory (quarantined)
or no model call gets an end-of-turn completion and reward None (TRL leaves it out of the group baseline).

Groups: `generations` completions per task (each its own seeded draw), sampled at the config's
`agent_temperature` or `llm.temperature`, which TRL also divides the logits by when it scores
them, so the policy it trains is the one that sampled; greedy decoding would make every completion
of a group alike (no advantage, nothing learnt), so a temperature above 0 is required.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

from backends.transformers_backend import PrefixCache, TransformersLLM, load_model
from generators.base import TaskResult, TaskSpec
from generators.rollout import Rollout, RolloutConfig
from schemas.models import Trajectory
from schemas.outdir import ForeignDirError, check_output_dir
from schemas.store import Dataset

CARD = "train.json"
ROLLOUTS = "rollouts"


class LiveLLM(TransformersLLM):
    """The transformers backend over the model a trainer is updating (`TransformersLLM(config, (model, tokenizer))`)."""

    def weights_changed(self) -> None:
        """The kept attention cache was computed with the old weights."""
        self._prefix = PrefixCache()


class _Collecting(Rollout):
    """The rollout method, keeping each task's result for the trainer as well as committing it."""

    results: dict[str, TaskResult]

    async def run_task(self, spec: TaskSpec) -> TaskResult:
        result = await super().run_task(spec)
        self.results[spec.id] = result
        return result


def completion_tokens(trajectory: Trajectory | None) -> tuple[list[int], list[int], list[float], list[int]] | None:
    """(prompt ids, completion ids, logprobs, env mask) of an episode's model calls, or None without any."""
    calls = [s.usage.tokens for s in trajectory.steps if s.usage is not None and s.usage.tokens is not None] \
        if trajectory is not None else []
    if not calls:
        return None
    first = calls[0]
    prompt, completion = list(first.prompt_ids), list(first.completion_ids)
    logprobs = list(first.logprobs or [0.0] * len(completion))
    mask = [1] * len(completion)
    for call in calls[1:]:
        seen = prompt + completion
        if call.prompt_ids[:len(seen)] != seen:
            break  # the history window cut the prompt: not one token sequence any more
        env = call.prompt_ids[len(seen):]
        completion += env + list(call.completion_ids)
        logprobs += [0.0] * len(env) + list(call.logprobs or [0.0] * len(call.completion_ids))
        mask += [0] * len(env) + [1] * len(call.completion_ids)
    return prompt, completion, logprobs, mask


def env_reward(prompts: list[Any], completions: list[Any], env_reward: list[float | None], **_: Any) -> list[float | None]:
    """The environment's evaluation of each episode (handed over by the rollout function)."""
    return list(env_reward)


def rollout_config(config: dict[str, Any]) -> RolloutConfig:
    """The rollout config GRPO plays; a bad one raises ValueError with one line naming the fields.

    Every GRPO completion is its own draw k of the rollout method (record id `<task>#<k>`, sampling
    seed `seed + k`): `samples_per_task` above 1 is what makes the method seed its draws."""
    from pydantic import ValidationError

    try:
        return RolloutConfig.model_validate({**config, "method": "rollout", "samples_per_task": 2})
    except ValidationError as exc:
        raise ValueError("config: " + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                                for e in exc.errors())) from None


def check_groups(rollout_cfg: RolloutConfig, cfg: Any, generations: int) -> None:
    """Refuse, in one line, settings under which GRPO's groups cannot form or cannot differ."""
    if generations < 2:
        raise ValueError(f"--generations {generations}: a group needs at least 2 completions to compare")
    per_step = cfg.batch_size * cfg.gradient_accumulation_steps
    if per_step % generations:
        raise ValueError(f"--batch-size {cfg.batch_size} (x {cfg.gradient_accumulation_steps} accumulation) is not a "
                         f"multiple of --generations {generations}: a step holds whole groups")
    temperature = sampling_temperature(rollout_cfg)
    if not temperature or temperature <= 0:
        raise ValueError(f"the sampling temperature (agent_temperature or llm.temperature) is {temperature}: GRPO "
                         "needs sampling (a temperature above 0), else every completion of a group is the same")


def sampling_temperature(rollout_cfg: RolloutConfig) -> float | None:
    """The temperature the agent samples at: `agent_temperature` where set, else the llm's."""
    if rollout_cfg.agent_temperature is not None:
        return rollout_cfg.agent_temperature
    return rollout_cfg.llm.temperature


def build_grpo(config: dict[str, Any], base: str, output: Path, cfg: Any, *, model: Any = None,
               tokenizer: Any = None, num_generations: int = 2) -> Any:
    """A GRPOTrainer whose rollouts are episodes of `config` (a rollout config) committed to OUT/rollouts."""
    import datasets
    import torch
    import trl

    rollout_cfg = rollout_config(config)
    check_groups(rollout_cfg, cfg, num_generations)
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if model is None or tokenizer is None:
        model, tokenizer = load_model(base, device=device, train=True)
    # The config's sampling settings (temperature, max_tokens), over the live model; no response cache: the weights move.
    llm_cfg = rollout_cfg.llm.model_copy(update={"backend": "transformers", "model_path": base, "token_ids": "on",
                                                 "cache_path": None})
    llm = LiveLLM(llm_cfg, (model, tokenizer))
    method = _Collecting(rollout_cfg, llm)
    method.results = {}
    task_ids = sorted(method.env_tasks())
    if not task_ids:
        raise ValueError("the config's task source gave no tasks")
    store = Dataset.create(output / ROLLOUTS, stage="train:grpo", config_hash=rollout_cfg.output_hash())
    draws = itertools.count()
    end = llm._stop_ids[0]

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, Any]:
        llm.weights_changed()
        specs = [TaskSpec(id=f"{tid}#{k}", instruction=method.env_tasks()[tid].instruction,
                          payload={"task": tid, "sample": k}) for tid, k in zip(prompts, draws)]
        asyncio.run(method.run(specs, store))
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                     "env_reward": []}
        for spec in specs:
            result = method.results.pop(spec.id, None)
            trajectory = result.trajectories[0] if result is not None and result.trajectories else None
            tokens = completion_tokens(trajectory)
            if tokens is None:
                tokens, reward = ([end], [end], [0.0], [1]), None
            else:
                reward = trajectory.reward
            for key, value in zip(("prompt_ids", "completion_ids", "logprobs", "env_mask"), tokens):
                out[key].append(value)
            out["env_reward"].append(reward)
        return out

    args = trl.GRPOConfig(
        output_dir=str(output / "checkpoints"), num_generations=num_generations,
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        max_steps=cfg.max_steps or -1, num_train_epochs=cfg.epochs, learning_rate=cfg.lr(), seed=cfg.seed,
        # A step is a batch of episodes: every step's reward is logged.
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=device == "cpu",
        dataloader_num_workers=0, beta=0.0, temperature=sampling_temperature(rollout_cfg),
        **({} if cfg.gradient_checkpointing is None else {"gradient_checkpointing": cfg.gradient_checkpointing}))
    data = datasets.Dataset.from_dict({"prompt": task_ids})
    return trl.GRPOTrainer(model=model, reward_funcs=[env_reward], args=args, train_dataset=data,
                           processing_class=tokenizer, rollout_func=rollout_func), store


# What TRL logs per step that says how the groups went: the reward's spread, and the share of groups
# whose completions all got the same reward (they have no advantage: nothing is learnt from them).
STEP_LOG = ("reward", "reward_std", "frac_reward_zero_std", "loss", "entropy", "completions/mean_length")


def train_grpo(config: dict[str, Any], base: str, output: str | Path, cfg: Any, *,
               generations: int = 2) -> dict[str, Any]:
    """GRPO on `config`'s environment; the checkpoint in `output`, its rollouts in `output`/rollouts."""
    output = Path(output)
    check_groups(rollout_config(config), cfg, generations)  # refused before anything is written or loaded
    if not Path(base).exists():
        raise ValueError(f"base {base}: no such file or directory")
    try:
        check_output_dir(output, CARD, "a trajforge train output")
    except ForeignDirError as exc:
        raise ValueError(str(exc)) from None
    if (output / CARD).is_file():
        raise ValueError(f"{output}: a GRPO run does not resume; give a new output directory")
    output.mkdir(parents=True, exist_ok=True)
    (output / CARD).write_text(json.dumps({"status": "training"}) + "\n", encoding="utf-8")
    started = time.time()
    trainer, store = build_grpo(config, base, output, cfg, num_generations=generations)
    result = trainer.train()
    trainer.model.save_pretrained(str(output))
    trainer.processing_class.save_pretrained(str(output))
    store.mark_complete(dict(store.unit_counts()))
    if not store.unit_counts().get("trajectories"):
        raise ValueError(f"no rollout made a trajectory: every episode failed (the reasons: {output / ROLLOUTS} quarantine)")
    logged = [e for e in trainer.state.log_history if "reward" in e]
    card = {"objective": "grpo", "output": str(output.resolve()), "base": str(base), "env": config.get("env"),
            "rollouts": ROLLOUTS, "steps": trainer.state.global_step, "train_loss": result.training_loss,
            "rewards": [e["reward"] for e in logged],
            "step_log": [{"step": e.get("step"), **{k: e[k] for k in STEP_LOG if k in e}} for e in logged],
            "grpo": {k: getattr(trainer.args, k) for k in ("num_generations", "temperature", "beta", "loss_type",
                                                            "scale_rewards", "learning_rate")},
            "settings": cfg.model_dump(mode="json"), "seconds": round(time.time() - started, 1),
            "rows": len(trainer.train_dataset), "export": {"records": store.unit_counts().get("trajectories", 0)}}
    (output / CARD).write_text(json.dumps(card, indent=1, default=str) + "\n", encoding="utf-8")
    return card
