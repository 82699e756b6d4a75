"""The YAML config of `trajforge improve` (no Prefect import here).

    output: out/improve
    llm: {backend: transformers, chat_template: qwen2_5_training, max_tokens: 48}   # the model to improve
    env: browser                                    # the agent config, as for `trajforge eval`:
    env_config: {observe: [axtree], actions: [click]}
    tasks: {source: miniwob, options: {tasks: [click-button, click-link], seeds: 10}}
    max_steps: 2
    eval: {samples: 1, concurrency: 4}              # both evals: the test split of `tasks`
    generate: {method: demonstrations,              # on the train split; any method (its own keys)
               tasks: {source: miniwob, options: {tasks: [click-button, click-link], seeds: 40}}}
    filter: {chain: [{name: min_steps, min_steps: 2}]}   # optional, as in `trajforge run`
    dedup: {threshold: 0.9}                         # optional
    export: {format: trl-sft}
    train: {epochs: 2, learning_rate: 1e-4}         # `trajforge train` settings; or {command: "...", timeout_s: ...}

Rounds (self-improvement without an oracle): `rounds: N` runs generate -> keep -> export -> train ->
eval N times, round k generating with round k-1's model (round 1 with the base, or with round 0's):

    rounds: 2
    generate: [{method: rollout, samples_per_task: 6, agent_temperature: 1.0}]   # each round's (default)
    warm_start: {method: demonstrations, tasks: {...}}  # optional round 0: pages other than the measured ones
    train_from: last                                # or base: the base on every round's data so far
    keep: verified                                  # what the world verified (default with rounds), or all

`base` is what training starts from: a Hugging Face model directory or a GGUF file (default: the
llm's `model_path`, else the embedded SmolLM2 GGUF). The evals serve it with the llm's settings;
the trained model is served the same way (transformers backend) unless a training hook reports
a model of its own (an OpenAI-compatible server it started, as JSON or a URL, like Agent-R's hook).
The generation tasks are the train split of `tasks` unless `generate.tasks` says otherwise; they
may share no task with the evals' test tasks (checked before anything runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from backends.config import LLMConfig
from envs.tasks import TaskSourceConfig
from envs.users import UserConfig
from flows.config_file import read_mapping
from flows.pipeline_config import DedupStage, FilterStage
from training.trainer import TrainConfig


class EvalStage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    samples: int = Field(1, ge=1, le=1000, description="episodes per task")
    tasks: int | None = Field(None, ge=1, description="at most this many test tasks")
    split: str | None = Field(None, description="default: test")
    concurrency: int = Field(4, ge=1, description="episodes at once")


class ExportStage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["trl-sft", "trl-dpo", "trl-kto"] = "trl-sft"


class HookTrain(BaseModel):
    """A trainer of the user's own: a command (no shell; placeholders {export}, {base}, {output}, {round_dir})."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1)
    timeout_s: float = Field(24 * 3600, gt=0)
    cwd: str | None = None


# Temperature 1: at 0.7 a warm-started model made the same call on every draw of many tasks (docs/benchmarks.md).
REJECTION_SAMPLING: dict[str, Any] = {"method": "rollout", "samples_per_task": 6, "agent_temperature": 1.0}


class ImproveConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    output: str
    llm: LLMConfig = Field(default_factory=lambda: LLMConfig(backend="transformers"))
    base: str | None = Field(None, description="the model training starts from (default: llm.model_path, else the "
                                               "embedded SmolLM2 GGUF)")
    env: str = "retail"
    env_config: dict[str, Any] = Field(default_factory=dict)
    tasks: TaskSourceConfig = Field(default_factory=TaskSourceConfig)
    user: UserConfig = Field(default_factory=UserConfig)
    max_steps: int = Field(20, ge=1)
    max_parse_failures: int = Field(3, ge=1)
    agent_mode: Literal["tools", "text"] = "tools"
    agent_temperature: float | None = None
    seed: int = 0
    eval: EvalStage = Field(default_factory=EvalStage)
    generate: dict[str, Any] | list[dict[str, Any]] = Field(
        default_factory=lambda: {"method": "demonstrations"},
        description="each round's generation: one method config or several (default with rounds > 1: rejection "
                    "sampling, rollout with 6 samples per task at temperature 1)")
    rounds: int = Field(1, ge=1, le=100, description="generate, keep, export, train, eval this many times")
    warm_start: dict[str, Any] | list[dict[str, Any]] | None = Field(
        None, description="round 0's generation (demonstrations), on tasks other than the measured ones")
    train_from: Literal["last", "base"] = Field(
        "last", description="last: round k trains round k-1's model on round k's data; base: the base on all "
                            "rounds' data so far")
    keep: Literal["verified", "all"] | None = Field(
        None, description="verified: only what the world verified (success); default verified with rounds or a "
                          "warm start, else all (the export decides)")
    filter: FilterStage | None = None
    dedup: DedupStage | None = None
    export: ExportStage = Field(default_factory=ExportStage)
    train: TrainConfig | HookTrain = Field(default_factory=TrainConfig)

    @model_validator(mode="after")
    def _generate_is_a_method(self) -> ImproveConfig:
        if self.in_rounds and "generate" not in self.model_fields_set:
            self.generate = dict(REJECTION_SAMPLING)
        for what, entries in (("generate", self.generate), ("warm_start", self.warm_start)):
            for entry in [] if entries is None else entries if isinstance(entries, list) else [entries]:
                if not isinstance(entry.get("method"), str):
                    raise ValueError(f"{what} needs a method (e.g. demonstrations, rollout)")
                if "output" in entry or "name" in entry:
                    raise ValueError(f"{what}: output and name are set by improve; remove them")
            if isinstance(entries, list) and not entries:
                raise ValueError(f"{what}: give at least one method")
        if self.export.format != "trl-sft" and isinstance(self.train, TrainConfig) and self.train.objective not in (
                None, {"trl-dpo": "dpo", "trl-kto": "kto"}[self.export.format]):
            raise ValueError(f"train.objective {self.train.objective} does not fit export {self.export.format}")
        self.eval_config()
        return self

    @property
    def root(self) -> Path:
        return Path(self.output).resolve()

    @property
    def in_rounds(self) -> bool:
        """Rounds layout (`round-k/`): more than one round, or a warm start; else the single-round layout."""
        return self.rounds > 1 or self.warm_start is not None

    @property
    def keeps(self) -> str:
        return self.keep or ("verified" if self.in_rounds else "all")

    def first_round(self) -> int:
        return 0 if self.warm_start is not None else 1

    def round_generate(self, k: int) -> list[dict[str, Any]]:
        """Round k's method configs (round 0: the warm start)."""
        entries = self.warm_start if k == 0 else self.generate
        assert entries is not None
        return list(entries) if isinstance(entries, list) else [entries]

    def agent(self, llm: LLMConfig) -> dict[str, Any]:
        """The agent config both evals run (an eval config), with `llm` acting."""
        return {"llm": llm.model_dump(mode="json", exclude_none=True), "env": self.env, "env_config": self.env_config,
                "tasks": self.tasks.model_dump(mode="json", exclude_defaults=True),
                "user": self.user.model_dump(mode="json", exclude_defaults=True), "max_steps": self.max_steps,
                "max_parse_failures": self.max_parse_failures, "agent_mode": self.agent_mode,
                "agent_temperature": self.agent_temperature, "seed": self.seed, "samples": self.eval.samples,
                "concurrency": self.eval.concurrency, "unit_tasks": max(1, self.eval.concurrency)}

    def eval_config(self, llm: LLMConfig | None = None) -> Any:
        from evals.run import eval_config

        return eval_config(self.agent(llm or self.llm))

    def generate_entries(self, k: int, llm: LLMConfig | None = None) -> list[dict[str, Any]]:
        """Round k's pipeline generate entries, `llm` acting (default: the llm); one generate dict in the
        single-round layout keeps its name `train-data`, else each entry is named after its method."""
        entries = self.round_generate(k)
        if not self.in_rounds and isinstance(self.generate, dict):
            return [self.generate_entry(entries[0], "train-data", llm)]
        out, seen = [], {}
        for entry in entries:
            method = entry["method"]
            seen[method] = seen.get(method, 0) + 1
            out.append(self.generate_entry(entry, method if seen[method] == 1 else f"{method}-{seen[method]}", llm))
        return out

    def generate_entry(self, entry: dict[str, Any] | None = None, name: str = "train-data",
                       llm: LLMConfig | None = None) -> dict[str, Any]:
        """The pipeline's generate entry: the method's own keys over the agent config (those the method takes),
        on the source's default split (train, where it has splits)."""
        from generators.registry import get_method

        entry = entry if entry is not None else self.round_generate(1)[0]
        tasks = self.tasks.model_dump(mode="json", exclude_defaults=True, exclude={"split", "allow_test_split"})
        defaults: dict[str, Any] = {"env": self.env, "env_config": self.env_config, "tasks": tasks,
                                    "user": self.user.model_dump(mode="json", exclude_defaults=True),
                                    "max_steps": self.max_steps, "max_parse_failures": self.max_parse_failures,
                                    "agent_mode": self.agent_mode, "agent_temperature": self.agent_temperature,
                                    "seed": self.seed}
        if entry["method"] != "demonstrations":  # the model improves itself
            defaults["llm"] = (llm or self.llm).model_dump(mode="json", exclude_none=True)
        fields = get_method(entry["method"]).Config.model_fields
        return {"name": name, **{k: v for k, v in defaults.items() if k in fields and v is not None}, **entry}


def load_improve_config(path: str | Path, output: str | None = None) -> ImproveConfig:
    return ImproveConfig.model_validate(read_mapping(path, "improve config", output))
