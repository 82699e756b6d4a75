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
    generate: dict[str, Any] = Field(default_factory=lambda: {"method": "demonstrations"})
    filter: FilterStage | None = None
    dedup: DedupStage | None = None
    export: ExportStage = Field(default_factory=ExportStage)
    train: TrainConfig | HookTrain = Field(default_factory=TrainConfig)

    @model_validator(mode="after")
    def _generate_is_a_method(self) -> ImproveConfig:
        if not isinstance(self.generate.get("method"), str):
            raise ValueError("generate needs a method (e.g. demonstrations, rollout)")
        if "output" in self.generate or "name" in self.generate:
            raise ValueError("generate: output and name are set by improve; remove them")
        if self.export.format != "trl-sft" and isinstance(self.train, TrainConfig) and self.train.objective not in (
                None, {"trl-dpo": "dpo", "trl-kto": "kto"}[self.export.format]):
            raise ValueError(f"train.objective {self.train.objective} does not fit export {self.export.format}")
        self.eval_config()
        return self

    @property
    def root(self) -> Path:
        return Path(self.output).resolve()

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

    def generate_entry(self) -> dict[str, Any]:
        """The pipeline's generate entry: the method's own keys over the agent config (those the method takes),
        on the source's default split (train, where it has splits)."""
        from generators.registry import get_method

        tasks = self.tasks.model_dump(mode="json", exclude_defaults=True, exclude={"split", "allow_test_split"})
        defaults: dict[str, Any] = {"env": self.env, "env_config": self.env_config, "tasks": tasks,
                                    "user": self.user.model_dump(mode="json", exclude_defaults=True),
                                    "max_steps": self.max_steps, "max_parse_failures": self.max_parse_failures,
                                    "agent_mode": self.agent_mode, "agent_temperature": self.agent_temperature,
                                    "seed": self.seed}
        if self.generate["method"] != "demonstrations":
            defaults["llm"] = self.llm.model_dump(mode="json", exclude_none=True)  # the model improves itself
        fields = get_method(self.generate["method"]).Config.model_fields
        return {"name": "train-data", **{k: v for k, v in defaults.items() if k in fields and v is not None},
                **self.generate}


def load_improve_config(path: str | Path, output: str | None = None) -> ImproveConfig:
    return ImproveConfig.model_validate(read_mapping(path, "improve config", output))
