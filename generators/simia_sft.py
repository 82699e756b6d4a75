"""Simia-SFT: from one seed trajectory, its tools and its domain policy, one model call writes a whole new trajectory.

Per seed, first the paper's **pre-filter**: the judge model reads the seed (with the tools and the
policy) and says whether it is usable: complete, logically consistent, well-formed. A rejected seed
is filtered (`seed_prefilter`, with the judge's reason) and none of its samples is synthesised.

Per (seed, sample), **synthesis**: the model plays every part (user, agent, tools) in a single
transcript, shown the tools, the policy and the seed's conversation. The transcript is parsed
(Hermes-style or JSON tool calls, JSON repaired), every call is checked strictly against the tool
schemas (unknown tool, missing / extra / wrongly typed arguments reject the trajectory with the
reason), hidden reasoning is stripped from visible text, and exact duplicates are dropped (ids are
content hashes).

The output keeps the policy as its first turn, a system step (`TextObservation`, source
"environment", name "system": exporters make it the system message), and declares every agent
turn written by the synthesis (`details["rewrites"]`): no agent request produced them; they are
meant to be trained conditioned on the policy and the conversation before each. It records no
render settings (no request was sent), so exporters give it the full-history layout. The policy comes from the
config (`policy` text or `policy_file`), else each seed's own system text (the paper's policy is the seed's
system prompt: a seed of another domain keeps its rules), else the environment's (`env`: its policy, e.g.
an MCP env config's). A seed whose episode failed (`success` false, e.g. a rollout kept with
`keep_failed`) is not used: it shows how not to do the task; nor is one whose simulated user broke the
episode (`details.user_fidelity.ok` false): its conversation is one no real user has. Both are counted. The tools come from `tools_file` (JSON / JSONL of tool
declarations), else the environment (`env` + `env_config`: an MCP server lists its tools), else the
seed's own tools; converted ADP data has none, so it needs one of the first two. Each output records
where its tools and policy came from (`details.tools_source`, `details.policy_source`) and the
verdicts that kept it (`details.verdicts`: the pre-filter's, the tool-call check's, dedup's).
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any, Iterable, Literal

import orjson
from pydantic import BaseModel, Field, model_validator

from backends.errors import LLMRequestError
from envs.spec import check_env
from envs.tasks import TaskSourceConfig
from envs.toolspec import load_tools_file
from generators.base import GenerationMethod, MethodConfig, Role, RunSummary, TaskResult, TaskSpec
from generators.registry import register_method
from generators.seeds import load_seeds
from generators.transcript import FORMAT_HELP, TranscriptError, parse_transcript, render_transcript, system_text, tools_block
from schemas.models import Rewrite, Tool, Trajectory, system_step
from schemas.store import Dataset
from schemas.toolcalls import call_problem
from schemas.usage import call_totals

SYSTEM = (
    "You generate training data for tool-using AI assistants. Given tools, the policy the assistant "
    "follows and an example conversation, write one NEW realistic conversation in which a user asks for "
    "something different that the same tools can do, the assistant follows the policy and calls the tools "
    "correctly (only the tools listed, with arguments that match their JSON Schemas), plausible tool outputs "
    "follow, and the assistant ends with a helpful answer. Do not write a system turn: the policy is kept "
    "as the new conversation's system prompt."
)
USER = "Tools (JSON, one per line):\n{tools}\n\n{policy}Example conversation:\n{seed}\n\n{format}\n\nVariation #{variation}. Write the new conversation now."
POLICY = "Policy the assistant follows (the conversation's system prompt):\n{policy}\n\n"
PREFILTER_SYSTEM = (
    "You check seed conversations before they serve as examples for synthetic training data of tool-using "
    "assistants. A seed is usable when it is complete (the user's request is handled to the end), logically "
    "consistent (each assistant step follows from the request, the policy and the tool outputs before it; no "
    "contradictions, no invented results), and well-formed (tool calls use only the listed tools, with "
    "arguments that fit them, and obey the policy). Reply with JSON: {\"reason\": \"...\", \"usable\": true|false}."
)
PREFILTER_USER = "SEED CHECK\nTools (JSON, one per line):\n{tools}\n\n{policy}Seed conversation:\n{seed}"


class SeedVerdict(BaseModel):
    """The pre-filter's answer for one seed."""

    reason: str
    usable: bool


class SimiaSFTConfig(MethodConfig):
    method: Literal["simia_sft"] = "simia_sft"
    seeds: list[str] = Field(default_factory=list, description="dataset directories or ADP JSON/JSONL files")
    env: str | None = Field(None, description="take the tools (and policy) from this environment (e.g. an MCP server)")
    env_config: dict[str, Any] = Field(default_factory=dict, description="the environment's settings")
    tools_file: str | None = Field(None, description="take the tools from this JSON/JSONL file of tool declarations")
    policy: str | None = Field(None, description="the domain policy (default: each seed's system text, else the env's)")
    policy_file: str | None = Field(None, description="read the domain policy from this text file")
    prefilter: bool = Field(True, description="the judge checks each seed before synthesis; rejected seeds are filtered")
    samples_per_seed: int = Field(2, ge=1)
    max_seeds: int | None = Field(None, ge=1)
    temperature: float = 0.8
    max_seed_chars: int = Field(6000, description="longer seed transcripts are cut to keep prompts small")
    tasks: TaskSourceConfig | None = Field(None, description="the environment's tasks, for `trajforge envs check "
                                                             "--config` (Simia itself writes from its seeds)")

    @model_validator(mode="after")
    def _one_source_each(self) -> SimiaSFTConfig:
        if self.env and self.tools_file:
            raise ValueError("give the tools by env or by tools_file, not both")
        if self.policy is not None and self.policy_file:
            raise ValueError("give the policy as policy or policy_file, not both")
        if self.policy_file and not Path(self.policy_file).is_file():
            raise ValueError(f"policy_file: {self.policy_file} is not a file")
        if self.tools_file:
            load_tools_file(self.tools_file)  # a broken file is named now, not deep inside a run
        if self.env:
            check_env(self.env, self.env_config)
        return self


def content_id(trajectory_steps: list[Any], tools: list[Tool]) -> str:
    """Exact-duplicate key: the steps without their generated call ids, plus the tool names."""
    steps = [s.model_dump(mode="json", exclude={"tool_call_id"}) for s in trajectory_steps]
    data = orjson.dumps({"steps": steps, "tools": sorted(t.name for t in tools)}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(data).hexdigest()[:20]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _user_broke(seed: Trajectory) -> bool:
    """Whether the seed's user-fidelity check found a broken user turn (`details.user_fidelity.ok` false)."""
    fidelity = seed.details.get("user_fidelity")
    return isinstance(fidelity, dict) and fidelity.get("ok") is False


@register_method
class SimiaSFT(GenerationMethod):
    """Simia-SFT: one model call writes a whole new tool-use trajectory from a pre-filtered seed."""

    name = "simia_sft"
    Config = SimiaSFTConfig
    templates = (SYSTEM, USER, POLICY, FORMAT_HELP, PREFILTER_SYSTEM, PREFILTER_USER)
    config: SimiaSFTConfig
    roles = (Role("seed checker", "pre-filters the seeds (complete, consistent, well-formed)", ("judge",)),)

    def roles_in_use(self) -> list[Role]:
        return list(self.roles) if self.config.prefilter else []

    def __init__(self, config: SimiaSFTConfig, llm: Any):
        super().__init__(config, llm)
        self._seeds: list[Trajectory] | None = None
        self._skipped_seeds = 0
        self._failed_seeds = 0
        self._broken_user_seeds = 0
        self._env_policy: str | None = None
        self._seen: set[str] = set()
        # Tools and policy shared by every seed (from a file, the config or an environment), with their source.
        self._tools: list[Tool] | None = None
        self._tools_source: dict[str, Any] | None = None
        self._policy: str | None = None
        self._policy_source: str | None = None
        self._verdicts: dict[int, asyncio.Future[SeedVerdict | None]] = {}

    def seeds(self) -> list[Trajectory]:
        if self._seeds is None:
            loaded = load_seeds(self.config.seeds)
            usable = [s for s in loaded if s.success is not False]  # a failed episode is no example to follow
            self._failed_seeds = len(loaded) - len(usable)
            # An episode whose simulated user broke (flipped roles, leaked its scenario, invented facts) shows a
            # conversation no real user has: the synthesis would copy it.
            fine = [s for s in usable if not _user_broke(s)]
            self._broken_user_seeds = len(usable) - len(fine)
            usable = fine
            seeds = [s for s in usable if any(step.kind == "api" for step in s.steps)]
            self._skipped_seeds = len(usable) - len(seeds)
            if self.config.max_seeds is not None:
                seeds = seeds[: self.config.max_seeds]
            self._seeds = seeds
        return self._seeds

    async def setup(self) -> None:
        if self._tools_source is not None or self._policy_source is not None:
            return
        if self.config.policy is not None:
            self._policy, self._policy_source = self.config.policy.strip() or None, "config"
        elif self.config.policy_file:
            self._policy, self._policy_source = Path(self.config.policy_file).read_text(encoding="utf-8").strip(), "policy_file"
        if self.config.tools_file:
            path = Path(self.config.tools_file)
            self._tools = load_tools_file(path)
            self._tools_source = {"kind": "file", "path": str(path), "sha256": _sha(path.read_text(encoding="utf-8"))}
        elif self.config.env:
            # A started environment lists its tools (an MCP server answers list_tools); once per run.
            from envs.spec import EnvFactory, EnvSpec

            factory = EnvFactory(EnvSpec(env=self.config.env, env_config=self.config.env_config), self.llm)
            async with factory.make() as env:
                self._tools = env.tools()
                self._env_policy = env.policy or None
            described = factory.describe()
            self._tools_source = {"kind": "env", "env": described["name"], "config": described["config"]}
            await factory.aclose()

    def tools_for(self, seed: Trajectory) -> tuple[list[Tool], dict[str, Any]]:
        """The tools a seed's synthesis uses, and where they come from."""
        if self._tools is not None and self._tools_source is not None:
            return self._tools, self._tools_source
        return seed.tools, {"kind": "seed", "seed": seed.id}

    def policy_for(self, seed: Trajectory) -> tuple[str | None, str | None]:
        """(policy text, its source: config / policy_file / seed / env), or (None, None)."""
        if self._policy_source is not None:
            return self._policy, self._policy_source
        text = system_text(seed.steps)
        if text:
            return text, "seed"
        return (self._env_policy, "env") if self._env_policy else (None, None)

    def tasks(self) -> Iterable[TaskSpec]:
        for index, seed in enumerate(self.seeds()):
            for sample in range(self.config.samples_per_seed):
                yield TaskSpec(id=f"{seed.id}#{sample}", payload={"seed": index, "sample": sample})

    def prepare(self, output: Dataset) -> None:
        # Earlier runs into the same output count for dedup, so a resumed run adds no copy.
        self._seen |= {rid.rsplit("/", 1)[-1] for rid in output.ids()}

    async def run(self, tasks: Iterable[TaskSpec], output: Dataset, *, progress: Any = None) -> RunSummary:
        summary = await super().run(tasks, output, progress=progress)
        if self._skipped_seeds:
            summary.report["seeds without tool calls (not used)"] = self._skipped_seeds
        if self._failed_seeds:
            summary.report["seeds whose episode failed (not used)"] = self._failed_seeds
        if self._broken_user_seeds:
            summary.report["seeds whose simulated user broke the episode (not used)"] = self._broken_user_seeds
        return summary

    # ---- pre-filter -----------------------------------------------------------------------------

    def seed_verdict(self, index: int, prompt: str) -> asyncio.Future[SeedVerdict | None]:
        """The judge's verdict on seed `index`, asked once however many of its samples run at once."""
        future = self._verdicts.get(index)
        if future is None:
            messages = [{"role": "system", "content": PREFILTER_SYSTEM}, {"role": "user", "content": prompt}]
            future = asyncio.ensure_future(self.model_for("seed checker").structured(messages, SeedVerdict,
                                                                                         temperature=0.0))
            self._verdicts[index] = future
        return future

    # ---- one sample -----------------------------------------------------------------------------

    async def run_task(self, task: TaskSpec) -> TaskResult:
        index, sample = task.payload["seed"], task.payload["sample"]
        seed = self.seeds()[index]
        tools, tools_source = self.tools_for(seed)
        result = TaskResult()
        if not tools:
            result.fail(task.id, "simia_sft", "the seed has no tool schemas: give env or tools_file", {"seed": seed.id})
            return result
        policy, policy_source = self.policy_for(seed)
        policy_block = POLICY.format(policy=policy) if policy else ""
        transcript = render_transcript(seed.steps)[: self.config.max_seed_chars]
        verdicts: dict[str, Any] = {}
        if self.config.prefilter:
            prompt = PREFILTER_USER.format(tools=tools_block(tools), policy=policy_block, seed=transcript)
            try:
                verdict = await asyncio.shield(self.seed_verdict(index, prompt))
            except LLMRequestError as exc:
                result.fail(task.id, "llm", str(exc), {"seed": seed.id})
                return result
            if verdict is None:
                result.fail(task.id, "seed_prefilter", "no valid verdict from the judge", {"seed": seed.id})
                return result
            checked = {"usable": verdict.usable, "reason": verdict.reason, "model": self.model_name_for("seed checker")}
            if not verdict.usable:
                if sample == 0:  # the seed is filtered once; its other samples are only counted
                    rejected = seed.model_copy(update={"details": {**seed.details, "seed_prefilter": checked}})
                    result.reject(rejected, "seed_prefilter", f"rejected seed: {verdict.reason}")
                    result.counts["seeds_rejected"] += 1
                else:
                    result.counts["samples_of_rejected_seeds"] += 1
                return result
            result.counts["seeds_accepted"] += int(sample == 0)
            verdicts["seed_prefilter"] = checked
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": USER.format(tools=tools_block(tools), policy=policy_block, seed=transcript,
                                                    format=FORMAT_HELP, variation=sample + 1)},
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
        if policy:
            steps = [system_step(policy), *steps]
        key = content_id(steps, tools)
        # No request of an acting model answered these turns: the synthesis call wrote them all, to be
        # trained conditioned on the policy (the system step) and the conversation before each.
        written = [i for i, s in enumerate(steps) if s.kind in ("api", "code", "message")]
        trajectory = Trajectory(
            id=f"{self.name}/{key}",
            source=self.name,
            steps=steps,
            tools=tools,
            provenance=self.provenance(task.id, parents=[seed.id], seed=sample),
            details={"finish_reason": completion.finish_reason, "usage": call_totals(self.llm.step_usage(completion)),
                     "seed": seed.id, "tools_source": tools_source,
                     "policy_source": policy_source, **({"policy_sha256": _sha(policy)} if policy else {}),
                     "verdicts": dict(verdicts),
                     "rewrites": [Rewrite(steps=written, kind="written",
                                          reason="the synthesised transcript (one model call wrote every turn)")
                                  .model_dump()]},
        )
        kept_by = trajectory.details["verdicts"]
        if completion.finish_reason == "length":
            result.reject(trajectory, "complete_output", "truncated: the model hit its token limit")
            return result
        calls = [s for s in steps if s.kind == "api"]
        for step in calls:
            problem = call_problem(tools, step.function, step.arguments)
            if problem is not None:
                result.reject(trajectory, "tool_call_check", f"{_reason_class(problem)}: {problem}")
                return result
        if not calls:
            result.reject(trajectory, "tool_call_check", "no tool call: the transcript calls no tool")
            return result
        kept_by["tool_call_check"] = {"passed": True, "reason": f"all {len(calls)} tool calls fit their schemas"}
        if key in self._seen:
            result.reject(trajectory, "dedup", f"duplicate of {trajectory.id}")
            return result
        self._seen.add(key)
        kept_by["dedup"] = {"passed": True, "reason": "no earlier output has the same steps"}
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
