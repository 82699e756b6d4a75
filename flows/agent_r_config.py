"""The YAML config of `trajforge agent-r`: Agent-R's self-training rounds (no Prefect import here).

    output: out/agent-r
    rounds: 3
    models:                              # round k generates with models[k-1] (already served) ...
      - {backend: openai, base_url: http://gpu:8000/v1, model: agent-r-1}
      - ...
    # ... or round 1's model and a hook that trains on a round's data and serves the next model:
    model: {backend: openai, base_url: http://gpu:8000/v1, model: agent-r-1}
    hook: {command: "python train_and_serve.py --data {data} --round {round}", timeout_s: 86400}
    pipeline:                            # what each round runs: a `trajforge run` config without output / llm
      generate: [{name: agent-r, method: mcts_splice, env: retail, tasks: {n: 64}}]
      export: [trl-sft, {format: trl-dpo, dataset: agent-r}]

Round k runs the pipeline into `<output>/round-k/` with the round's model as every generate
entry's `llm`. With a hook, after round k the hook runs (its output in `round-k/hook.log`) and
reports round k+1's model: as JSON written to `$TRAJFORGE_NEXT_MODEL_FILE`, or as the last line of
its output (a JSON object of LLM config fields, or a base URL); the fields it gives replace the
round's model's. Placeholders in the command: {round}, {round_dir}, {data} (the round's generate
directories), {exports}, {next_model_file}; the same as TRAJFORGE_* environment variables, plus
TRAJFORGE_ALL_DATA (every round's generate directories so far) and TRAJFORGE_MODEL (the round's
model config as JSON, holding no secret: keys stay in the environment variables it names).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from backends.config import LLMConfig
from flows.config_file import read_mapping
from flows.pipeline_config import PipelineConfig

NEXT_MODEL_FILE = "next_model.json"


class HookConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1, description="run after each round but the last (no shell; placeholders allowed)")
    timeout_s: float = Field(24 * 3600, gt=0, description="the hook is killed (with its children) after this long")
    cwd: str | None = Field(None, description="working directory of the hook (default: the current one)")


class AgentRConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    output: str
    rounds: int = Field(ge=1, description="self-training rounds (Agent-R iterates a few)")
    models: list[LLMConfig] | None = Field(None, description="the model of each round, in order")
    model: LLMConfig | None = Field(None, description="round 1's model; later rounds' come from the hook")
    hook: HookConfig | None = None
    pipeline: dict[str, Any] = Field(description="the `trajforge run` config each round runs, without output / llm")

    @model_validator(mode="after")
    def _one_way_to_get_models(self) -> AgentRConfig:
        if (self.models is None) == (self.model is None):
            raise ValueError("give either models (one per round) or model (round 1) with a hook")
        if self.models is not None and len(self.models) != self.rounds:
            raise ValueError(f"models lists {len(self.models)} model(s) for {self.rounds} round(s)")
        if self.model is not None and self.rounds > 1 and self.hook is None:
            raise ValueError("with one model and several rounds, a hook must train and serve the next model")
        for key in ("output", "llm"):
            if key in self.pipeline:
                raise ValueError(f"pipeline.{key} is set per round by agent-r; remove it")
        entries = self.pipeline.get("generate") or []
        if not any(isinstance(e, dict) and e.get("method") == "mcts_splice" for e in entries):
            raise ValueError("the pipeline needs a generate entry with method: mcts_splice")
        for e in entries:
            if isinstance(e, dict) and ("llm" in e or e.get("agent", "llm") != "llm"):
                raise ValueError(f"generate entry {e.get('name')!r} brings its own model; each round gives its model "
                                 "to every entry")
        self.round_pipeline(1, self.models[0] if self.models else self.model)  # type: ignore[arg-type]
        return self

    @property
    def root(self) -> Path:
        return Path(self.output).resolve()

    def round_dir(self, k: int) -> Path:
        return self.root / f"round-{k}"

    def round_pipeline(self, k: int, model: LLMConfig) -> PipelineConfig:
        """Round k's pipeline config: the template with the round's output root and model."""
        return PipelineConfig.model_validate({**self.pipeline, "output": str(self.round_dir(k)),
                                              "llm": model.model_dump(mode="json", exclude_none=True)})


def load_agent_r_config(path: str | Path, output: str | None = None) -> AgentRConfig:
    return AgentRConfig.model_validate(read_mapping(path, "agent-r config", output))


def next_model(current: LLMConfig, reported: str) -> LLMConfig:
    """The next round's model from what a hook reported: JSON fields over `current`, or a bare base URL."""
    text = reported.strip()
    if not text:
        raise ValueError("the hook reported no model (write JSON to $TRAJFORGE_NEXT_MODEL_FILE or print it last)")
    if text.startswith("{"):
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the hook's model is not JSON: {exc.msg}") from None
    elif text.startswith(("http://", "https://")):
        fields = {"base_url": text}
    else:
        raise ValueError(f"the hook's last line is neither a JSON object nor a URL: {text[:120]!r}")
    return LLMConfig.model_validate({**current.model_dump(exclude_none=True), **fields})
