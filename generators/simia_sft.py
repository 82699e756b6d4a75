"""Simia-SFT: from one seed trajectory and a tool list, one model call writes a whole new trajectory.

The model plays every part (user, agent, tools) in a single transcript. The transcript is
parsed (Hermes-style or JSON tool calls, JSON repaired), every call is checked strictly
against the tool schemas (unknown tool, missing / extra / wrongly typed arguments reject
the trajectory with the reason), hidden reasoning is stripped from visible text, and exact
duplicates are dropped (ids are content hashes).
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Literal

import orjson
from pydantic import Field

from backends.errors import LLMRequestError
from generators.base import GenerationMethod, MethodConfig, TaskResult, TaskSpec
from generators.registry import register_method
from generators.seeds import load_seeds
from generators.transcript import FORMAT_HELP, TranscriptError, parse_transcript, render_transcript, tools_block
from schemas.models import Tool, Trajectory
from schemas.store import Dataset
from schemas.toolcalls import call_problem

SYSTEM = (
    "You generate training data for tool-using AI assistants. Given tools and an example "
    "conversation, write one NEW realistic conversation in which a user asks for something "
    "different that the same tools can do, the assistant calls the tools correctly (only the "
    "tools listed, with arguments that match their JSON Schemas), plausible tool outputs follow, "
    "and the assistant ends with a helpful answer."
)
USER = "Tools (JSON, one per line):\n{tools}\n\nExample conversation:\n{seed}\n\n{format}\n\nVariation #{variation}. Write the new conversation now."


class SimiaSFTConfig(MethodConfig):
    method: Literal["simia_sft"] = "simia_sft"
    seeds: list[str] = Field(default_factory=list, description="dataset directories or ADP JSON/JSONL files")
    env: str | None = Field(None, description="take the tools from this environment (e.g. an MCP server)")
    env_config: dict[str, Any] = Field(default_factory=dict, description="the environment's settings")
    samples_per_seed: int = Field(2, ge=1)
    max_seeds: int | None = Field(None, ge=1)
    temperature: float = 0.8
    max_seed_chars: int = Field(6000, description="longer seed transcripts are cut to keep prompts small")


def content_id(trajectory_steps: list[Any], tools: list[Tool]) -> str:
    """Exact-duplicate key: the steps without their generated call ids, plus the tool names."""
    steps = [s.model_dump(mode="json", exclude={"tool_call_id"}) for s in trajectory_steps]
    data = orjson.dumps({"steps": steps, "tools": sorted(t.name for t in tools)}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(data).hexdigest()[:20]


@register_method
class SimiaSFT(GenerationMethod):
    """Simia-SFT: one model call writes a whole new tool-use trajectory from a seed."""

    name = "simia_sft"
    Config = SimiaSFTConfig
    templates = (SYSTEM, USER, FORMAT_HELP)
    config: SimiaSFTConfig

    def __init__(self, config: SimiaSFTConfig, llm: Any):
        super().__init__(config, llm)
        self._seeds: list[Trajectory] | None = None
        self._seen: set[str] = set()
        self._env_tools: list[Tool] | None = None

    def seeds(self) -> list[Trajectory]:
        if self._seeds is None:
            seeds = [s for s in load_seeds(self.config.seeds) if any(step.kind == "api" for step in s.steps)]
            if self.config.max_seeds is not None:
                seeds = seeds[: self.config.max_seeds]
            self._seeds = seeds
        return self._seeds

    async def setup(self) -> None:
        if self.config.env and self._env_tools is None:
            # A started environment lists its tools (an MCP server answers list_tools); once per run.
            from envs.spec import EnvFactory, EnvSpec

            async with EnvFactory(EnvSpec(env=self.config.env, env_config=self.config.env_config), self.llm).make() as env:
                self._env_tools = env.tools()

    def tools_for(self, seed: Trajectory) -> list[Tool]:
        if not self.config.env:
            return seed.tools
        assert self._env_tools is not None, "setup() reads the environment's tools before tasks run"
        return self._env_tools

    def tasks(self) -> Iterable[TaskSpec]:
        for index, seed in enumerate(self.seeds()):
            for sample in range(self.config.samples_per_seed):
                yield TaskSpec(id=f"{seed.id}#{sample}", payload={"seed": index, "sample": sample})

    def prepare(self, output: Dataset) -> None:
        # Earlier runs into the same output count for dedup, so a resumed run adds no copy.
        self._seen |= {rid.rsplit("/", 1)[-1] for rid in output.ids()}

    async def run_task(self, task: TaskSpec) -> TaskResult:
        seed = self.seeds()[task.payload["seed"]]
        tools = self.tools_for(seed)
        result = TaskResult()
        if not tools:
            result.fail(task.id, "simia_sft", "seed has no tool schemas and no env gives them", {"seed": seed.id})
            return result
        transcript = render_transcript(seed.steps)[: self.config.max_seed_chars]
        messages = [
            {"role": "system", "content": SYSTEM},
            {
                "role": "user",
                "content": USER.format(
                    tools=tools_block(tools), seed=transcript, format=FORMAT_HELP, variation=task.payload["sample"] + 1
                ),
            },
        ]
        try:
            completion = (await self.llm.chat(messages, temperature=self.config.temperature))[0]
        except LLMRequestError as exc:
            result.fail(task.id, "llm", str(exc), {"seed": seed.id})
            return result
        raw = completion.text
        try:
            steps = parse_transcript(raw)
        except TranscriptError as exc:
            result.fail(task.id, "parse", f"TranscriptError: {exc}", raw)
            return result
        key = content_id(steps, tools)
        trajectory = Trajectory(
            id=f"{self.name}/{key}",
            source=self.name,
            steps=steps,
            tools=tools,
            provenance=self.provenance(task.id, parents=[seed.id], seed=task.payload["sample"]),
            details={"finish_reason": completion.finish_reason},
        )
        if completion.finish_reason == "length":
            result.reject(trajectory, "complete_output", "truncated: the model hit its token limit")
            return result
        for step in steps:
            if step.kind == "api":
                problem = call_problem(tools, step.function, step.arguments)
                if problem is not None:
                    result.reject(trajectory, "tool_call_check", f"{_reason_class(problem)}: {problem}")
                    return result
        if not any(s.kind == "api" for s in steps):
            result.reject(trajectory, "tool_call_check", "no tool call: the transcript calls no tool")
            return result
        if key in self._seen:
            result.reject(trajectory, "dedup", f"duplicate of {trajectory.id}")
            return result
        self._seen.add(key)
        result.trajectories.append(trajectory)
        return result


def _reason_class(problem: str) -> str:
    """A stable class for counting reasons: 'unknown tool', 'missing argument', ..."""
    for prefix, label in (
        ("unknown tool", "unknown tool"),
        ("missing required", "missing argument"),
        ("unexpected argument", "extra argument"),
    ):
        if problem.startswith(prefix):
            return label
    return "wrong type" if "must be of type" in problem else "invalid arguments"
