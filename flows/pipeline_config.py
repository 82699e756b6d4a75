"""The one YAML config of `trajforge run` / the Prefect pipeline flow (no Prefect import here).

    output: out/pipeline             # root; stage outputs go to <output>/<stage>/<name>
    llm: {backend: llamacpp}         # default LLM for generate entries that name none
    convert:  [{name: adp, source: adp, inputs: [samples/adp/agenttuning_os/sample_std.json]}]
    generate: [{name: rollout, method: rollout, env: retail, tasks: {n: 2}}]
    decontaminate: {references: [bench.jsonl]}     # default: on when a task source has a test split
    filter:   {chain: [{name: ...}]}               # optional, applied to every dataset
    dedup:    {threshold: 0.8}                     # optional, applied to every dataset
    mix:      {weights: {adp: 1.0}, temperature: 1.0, seed: 0}   # optional: one mixed dataset
    export:   [trl-sft, trl-kto, {format: trl-dpo, dataset: mcts}] # per dataset (or of the mix)

An export entry that names a `dataset` (a convert/generate name) exports that entry's own output:
filter, dedup and mix carry trajectories only, so preference pairs are exported from where
they were generated.

Relative paths are resolved against the current directory; inputs may be globs.
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flows.config_file import read_mapping

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _check_name(v: str) -> str:
    if not _NAME.match(v):
        raise ValueError(f"name {v!r} must be letters, digits, '_', '.', '-'")
    return v


class ConvertEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    source: str
    inputs: list[str] = Field(min_length=1)
    chunk_size: int | None = None

    _name = field_validator("name")(_check_name)

    def resolved_inputs(self) -> list[str]:
        out: list[str] = []
        for spec in self.inputs:
            if any(c in spec for c in "*?[") and "://" not in spec and not spec.startswith("hf:"):
                hits = sorted(glob.glob(spec))
                if not hits:
                    raise ValueError(f"convert {self.name}: {spec!r} matches no file")
                out.extend(str(Path(h).resolve()) for h in hits)
            elif Path(spec).exists():
                out.append(str(Path(spec).resolve()))
            else:
                out.append(spec)
        return out


class GenerateEntry(BaseModel):
    """`name` plus a generation method config (as in `trajforge generate --config`)."""

    model_config = ConfigDict(extra="allow")
    name: str
    method: str
    # scripted: the deterministic retail agent of generators/scripted.py plays the model (search
    # methods over retail tasks), so a demo gets solved paths, hence preference pairs, without a big model.
    agent: Literal["llm", "scripted"] = "llm"

    _name = field_validator("name")(_check_name)

    def method_config(self, default_llm: dict[str, Any] | None) -> dict[str, Any]:
        data = self.model_dump(exclude={"name", "agent"})
        if self.agent == "scripted":
            data["llm"] = {"backend": "fake", "model": "scripted"}
        elif "llm" not in data and default_llm is not None:
            data["llm"] = dict(default_llm)
        return data


class FilterStage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    chain: list[dict[str, Any]] = Field(min_length=1)


class DecontamStage(BaseModel):
    """Drop records that overlap benchmark test data (pipelines/decontam.py), before any other filter.

    `enabled: auto` runs it when there is test data to check against: the test split of a task
    source the run generates from (tau2, miniwob, jsonl with `metadata.split: test`), or a
    `references` file."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool | Literal["auto"] = "auto"
    references: list[str] = Field(default_factory=list, description="JSONL files of benchmark test items")
    task_sources: bool = Field(True, description="check against the test splits of the run's task sources")
    ngram: int = Field(13, ge=1)
    threshold: float = Field(0.8, gt=0, le=1)
    num_perm: int = Field(128, ge=8)
    min_ngrams: int = Field(1, ge=1)


class DedupStage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    threshold: float = 0.8
    num_perm: int = 128
    exact_only: bool = False
    prefer_reward: bool = False


class MixStage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "mix"
    weights: dict[str, float] = Field(default_factory=dict)
    temperature: float = 1.0
    seed: int = 0
    total: int | None = None


class ExportEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str
    dataset: str | None = None  # a convert/generate name: export its own output; None: every current dataset


class Timeouts(BaseModel):
    """Per-task timeouts in seconds (Prefect task timeout_seconds)."""

    model_config = ConfigDict(extra="forbid")
    convert: float = 3600
    generate: float = 6 * 3600
    filter: float = 3600
    dedup: float = 3600
    mix: float = 3600
    export: float = 3600
    decontaminate: float = 3600


class PipelineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output: str
    llm: dict[str, Any] | None = None
    convert: list[ConvertEntry] = Field(default_factory=list)
    generate: list[GenerateEntry] = Field(default_factory=list)
    decontaminate: DecontamStage = Field(default_factory=DecontamStage)
    filter: FilterStage | None = None
    dedup: DedupStage | None = None
    mix: MixStage | None = None
    export: list[str | ExportEntry] = Field(default_factory=list)
    retries: int = Field(default=1, ge=0, le=5)
    timeouts: Timeouts = Field(default_factory=Timeouts)

    @field_validator("decontaminate", mode="before")
    @classmethod
    def _decontaminate_switch(cls, v: Any) -> Any:
        return {"enabled": v} if isinstance(v, bool) else v  # `decontaminate: false` turns it off

    @model_validator(mode="after")
    def _unique_names(self) -> "PipelineConfig":
        names = [e.name for e in self.convert] + [e.name for e in self.generate]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"convert/generate names must be unique; repeated: {sorted(dup)}")
        if not names:
            raise ValueError("the config has no convert or generate entry")
        unknown = {e.dataset for e in self.exports() if e.dataset is not None} - set(names)
        if unknown:
            raise ValueError(f"export names unknown datasets {sorted(unknown)}; datasets are {names}")
        return self

    def exports(self) -> list[ExportEntry]:
        return [ExportEntry(format=e) if isinstance(e, str) else e for e in self.export]

    @property
    def root(self) -> Path:
        return Path(self.output).resolve()

    def stage_dir(self, stage: str, name: str) -> Path:
        return self.root / stage / name


def load_pipeline_config(path: str | Path, output: str | None = None) -> PipelineConfig:
    """The config at `path`; `output` replaces its output root."""
    return PipelineConfig.model_validate(read_mapping(path, "pipeline config", output))


def stage_key(*parts: Any) -> str:
    """A stable hash of a stage's config and its upstream stage keys."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
