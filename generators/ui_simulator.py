"""UI-Simulator / UI-Simulator-Grow: the teacher explores a (simulated) site; its wrapped explorations are the data.

One method task per round (`rounds`; id `round-NNNN`), on real pages in the browser
(`env: browser`), in the `web` shop, or in the simulated web env (`env: simulated`,
`env_config: {mode: web, policy: <site description>}`, optionally seeded with real pages:
`real_states`). Two loops (`loop`, recorded in `details.loop`):

- `wrap` (default, the paper's): step 1 with the teacher, then the **trajectory wrapper** (the
  relabeller role) writes the task the exploration's steps accomplish, a thought per action and the
  final answer (`{instruction, thoughts, answer}`); the record is the agent's system prompt, that
  request, the pages and the teacher's actions with the written thoughts, then the answer, every
  action declared written. With `judge_wrapped` the judge checks it from the pages (step 4).
- `propose` (PAE-style): steps 1-6 below.

1. **explore** — reset the env on a page to explore from (`start_urls` in turn; else the task
   source's tasks; else the env's generator) and take `walk_steps` exploring actions: the teacher
   explores with step-wise task control (`explore: teacher`, `generators.explorer`: it writes a
   guide, acts under it, and writes the next guide when one is done), or a seeded random walk
   (`explore: random`, `generators.page_walk`: no model call), collecting the pages and the
   actions that led to them. In a real
   world (anything but the simulated env) the pages of the walk and of every rollout are
   recorded to the state store `real_states` (JSONL under the output directory), which seeds the
   simulated web env later (`env_config.real_states`; `envs/simulated/real_states.py`).
2. **propose** — the model sees the pages (url, how each was reached, accessibility tree) and the
   agent's actions and proposes `tasks_per_round` tasks (structured: `{instruction,
   expected_outcome}`); no valid answer quarantines the round (stage "propose").
3. **rollout** — the agent (`AgentPolicy`) attempts each task up to `attempts` times
   (attempt k is the agent's draw k: its own sampling seed and cache entry); a task is **dropped**
   after `max_failures` failed attempts (counted in `dropped_tasks` and per failure reason).
4. **judge** — the judge model judges each attempt (structured `{reasoning, success}`) against the
   instruction and the expected outcome, reading every action (not the agent's thoughts, unless
   `judge.self_report`) with the page it led to and, with `judge.vision`, the pages' screenshots.
   Failed attempts are filtered by "completion" with the reason ("unsuccessful: ...", "no verdict:
   ...", "max_parse_failures: ...") unless `keep_failed`.
5. **rewrite** — retrospective relabeling: the relabeller rewrites the instruction to match what
   the trajectory actually did and each action's thought to reason toward it (structured
   `{instruction, thoughts}`, one thought per action, as the paper's trajectory wrapper); the
   first user step gets the rewritten instruction, each action the rewritten thought (the agent's
   own in `extra["original_thought"]`), `details` keeps the original instruction, and
   `details["rewrites"]` declares every action written (its thought is the relabeller's).
6. **grow** (`grow: true`, UI-Simulator-Grow) — after the rounds, the tasks of the last generation
   are ranked by the *student's* teacher-forcing loss on their kept trajectories (`student.llm`: the
   model being trained, served behind the OpenAI-compatible API with vLLM's `prompt_logprobs`, or
   the embedded llama.cpp model; `generators.student`); the tasks whose loss lies between the
   `band_low` and `band_high` percentiles (25th-75th by default: neither already learned nor
   noise) get `variants_per_task` variants (structured: harder / easier), which go through 3-6
   too, as method tasks `<task id>/grow`, up to `grow_rounds` generations. Without a student
   model, or when its server cannot score, tasks are chosen by the teacher's success rate over
   `attempts` (>= 4) inside `[band_low, band_high]`, with a warning and the counts
   `grow_fallback` / `grow_selected_by_success_rate`. Variants record their parent task id in
   `provenance.parent_ids` and the selection (how, the parent's loss or rate, the band, why) in
   `details["grow"]`.

The reward is the judge's verdict (1.0 / 0.0); the env's own goal check does not apply to
proposed tasks (they have no goal).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterable, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, Field, create_model, model_validator

from backends.base import LLM
from backends.errors import LLMRequestError
from backends.scoring import ScoringError, ScoringUnsupported
from envs.base import Environment, Task
from envs.pages import describe_action, page_elements
from envs.simulated.env import SimulationError
from envs.simulated.real_states import StateStore, states_from_steps
from envs.tasks import MAX_TASKS
from filters.step_judge import cut_head, numbered_path, screenshots
from filters.world_view import ACTION_KINDS, SELF_REPORT, WORLD, judged_steps
from filters.vision import PageImages
from generators import explorer
from generators._episode import Episode, opened, play_episode
from generators.base import Role, RoleModel, RunSummary, TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.page_walk import random_action
from generators.registry import register_method
from generators.student import trajectory_loss
from generators.transcript import tools_block
from schemas.models import Rewrite as StepRewrite
from schemas.models import MessageAction, Step, TextObservation, Trajectory, WebObservation
from schemas.store import Dataset

log = logging.getLogger("trajforge.generators")

PROPOSE_SYSTEM = (
    "You write tasks for training web agents. From the pages of a web site that an explorer saw, propose "
    "realistic, diverse tasks a user could ask an agent to do on this site with the given actions; each "
    "must be feasible from what the pages show and have a checkable outcome. Answer with a JSON object "
    '{"tasks": [{"instruction": str, "expected_outcome": str}]}.'
)
PROPOSE_USER = "PROPOSE TASKS (round {round}): write {n} tasks.\nAgent actions (JSON, one per line):\n{tools}\n\nPages seen:\n{pages}"
JUDGE_SYSTEM = (
    "You judge whether a web agent completed a task. You see the task, its expected outcome and the "
    "transcript: every agent action (numbered) with the page it led to (URL, screenshot path, accessibility "
    "tree; the screenshots themselves, in order, when attached). Judge by what the pages show: what the agent "
    "says it did counts only where the pages confirm it. Answer with a JSON object "
    '{"reasoning": str, "success": bool}: success only if the transcript shows the expected outcome reached.'
)
JUDGE_USER = "JUDGE TASK COMPLETION\nTask: {instruction}\nExpected outcome: {expected}\n\nTranscript:\n{transcript}"
REWRITE_SYSTEM = (
    "You relabel agent trajectories. Rewrite the task instruction so that it asks for exactly what the "
    "agent actually did and achieved in the transcript (keep the user's voice, be specific, do not mention "
    "the agent), and rewrite the thought of every numbered agent step, in order, so that it reasons toward "
    "that instruction: keep what the step saw on the page and the action it took, drop what spoke of another "
    'task. Answer with a JSON object {"instruction": str, "thoughts": [str, ...]}, one thought per agent step.'
)
REWRITE_USER = "REWRITE INSTRUCTION\nOriginal task: {instruction}\nAgent steps: {n}\n\nTranscript:\n{transcript}"
WRAP_SYSTEM = (
    "You are the trajectory wrapper of a web-agent data pipeline. A teacher explored a web site step by step, "
    "steered by guides (short tasks for the next few steps); you see the guides and its numbered steps, each "
    "with the page it led to. Write the task a user would ask an agent for that exactly these steps accomplish "
    "(the user's voice, one or two sentences, with the concrete values the steps used; do not mention guides, "
    "exploring or the agent), for every numbered step, in order, the thought an agent doing that task would "
    "have before it (what the page shows and why this action moves the task on), and the agent's final answer "
    "to the user (what was done, or the information asked for, as the pages show it). Answer with a JSON object "
    '{"instruction": str, "thoughts": [str, ...], "answer": str}, one thought per numbered step.'
)
WRAP_USER = "WRAP TRAJECTORY\nGuides:\n{guides}\nAgent steps: {n}\n\nTranscript:\n{transcript}"
PROPOSE_EXPLORED = "\n\nWhat the explorer did (guide: its steps):\n{guides}"
VARIANT_SYSTEM = (
    "You grow a curriculum of web tasks. Given a task the agent solves only sometimes, write variants on the "
    "same site: some harder (more constraints or steps), some easier (fewer). Answer with a JSON object "
    '{"variants": [{"instruction": str, "expected_outcome": str, "direction": "harder" | "easier"}]}.'
)
VARIANT_USER = (
    "GROW TASK VARIANTS: write {n} variants.\nTask: {instruction}\nExpected outcome: {expected}\n"
    "Agent success: {successes} of {attempts} attempts."
)
EXPLORE = "Explore the site."


class ProposedTask(BaseModel):
    instruction: str
    expected_outcome: str


class Proposals(BaseModel):
    tasks: list[ProposedTask]


class Verdict(BaseModel):
    reasoning: str
    success: bool


class Rewrite(BaseModel):
    instruction: str
    thoughts: list[str]


class Wrapped(Rewrite):
    """The trajectory wrapper's answer: the relabeller's, and the agent's final answer to the user."""

    answer: str


RewriteT = TypeVar("RewriteT", bound=Rewrite)


def one_thought_each(answer: type[RewriteT], n: int) -> type[RewriteT]:
    """`answer` (the relabeller's or the wrapper's) for a trajectory of `n` actions: exactly one thought per action."""
    return create_model(answer.__name__, __base__=answer,  # type: ignore[call-overload, no-any-return]
                        thoughts=(list[str], Field(min_length=n, max_length=n)))


class Variant(BaseModel):
    instruction: str
    expected_outcome: str
    direction: Literal["harder", "easier"]


class Variants(BaseModel):
    variants: list[Variant]


class UISimulatorConfig(EnvMethodConfig):
    method: Literal["ui_simulator"] = "ui_simulator"
    requires: ClassVar[frozenset[str]] = frozenset({"pages"})
    env: str = Field("web", description="web, or simulated with env_config.mode = web")
    loop: Literal["wrap", "propose"] = Field(
        "wrap", description="wrap: the paper's loop: the teacher explores with step-wise task control and the "
                            "trajectory wrapper turns each exploration into a training trajectory; propose: a "
                            "PAE-style loop: tasks proposed from the exploration, attempted by the agent, judged, "
                            "relabelled")
    judge_wrapped: bool = Field(True, description="wrap: the judge checks each wrapped trajectory against its "
                                                  "instruction (from the pages); failed ones are filtered")
    rounds: int = Field(2, ge=1, le=MAX_TASKS, description="proposal rounds (the method's tasks)")
    tasks_per_round: int = Field(3, ge=1, le=MAX_TASKS, description="tasks proposed per round")
    walk_steps: int = Field(2, ge=0, description="exploring actions (clicks, typing, choices) before proposing")
    explore: Literal["teacher", "random"] = Field(
        "teacher", description="teacher: the teacher model explores with step-wise task control (UI-Simulator); "
                               "random: a seeded random walk (no model call)")
    start_urls: list[str] = Field(default_factory=list, description="pages to explore from, one per round in turn "
                                  "(browser: absolute or relative to env_config.site_dir / base_url; default there: "
                                  "the site's root); else the task source's tasks, else the env's task generator")
    real_states: str | None = Field("real_states.jsonl", description="where the pages of a real world (not the "
                                    "simulated one) are recorded, for seeding the simulated web env (a JSONL path, "
                                    "relative to the output directory); null: not recorded")
    attempts: int = Field(2, ge=1, description="rollouts per proposed task")
    max_failures: int = Field(2, ge=1, description="failed attempts after which a task is dropped (not with grow: "
                                                  "growth measures each task over all its attempts)")
    max_steps: int = Field(12, ge=1)
    max_parse_failures: int = Field(2, ge=1)
    rewrite: bool = Field(True, description="relabel kept trajectories with what they actually did")
    keep_failed: bool = False
    grow: bool = False
    teacher: RoleModel = Field(default_factory=RoleModel, description="the model that explores, proposes tasks, "
                               "relabels and writes variants; default: the judge model")
    student: RoleModel = Field(default_factory=RoleModel, description="the model being trained, scored by its "
                               "teacher-forcing loss (prompt logprobs); unset: tasks are chosen by success rate")
    band_low: float = Field(0.25, ge=0, le=1, description="lower percentile of student loss (else: success rate)")
    band_high: float = Field(0.75, ge=0, le=1, description="upper percentile of student loss (else: success rate)")
    variants_per_task: int = Field(2, ge=1)
    grow_rounds: int = Field(1, ge=1, description="generations of variants")
    max_page_chars: int = Field(3000, ge=200, description="per page shown to the proposer")
    max_transcript_chars: int = Field(8000, ge=500, description="of a trajectory the judge and the relabeller read "
                                                                 "(its end)")
    max_step_page_chars: int = Field(1500, ge=100, description="of each page's text in that trajectory")
    max_judge_images: int = Field(8, ge=1, description="screenshots shown to a judge that takes images (judge.vision)")

    @model_validator(mode="after")
    def _band(self) -> UISimulatorConfig:
        observed = self.env_config.get("observe")
        if self.env == "browser" and observed is not None and "axtree" not in observed:
            raise ValueError("ui_simulator explores and proposes from the pages' accessibility trees: keep axtree in "
                             "env_config.observe")
        if self.env == "browser" and not self.start_urls and self.tasks.source == "env":
            if not (self.env_config.get("site_dir") or self.env_config.get("base_url")):
                raise ValueError("ui_simulator on the browser explores from start_urls (absolute URLs, or paths on "
                                 "env_config.site_dir / base_url) or from the tasks of a task source (tasks: {source: "
                                 "sites | miniwob, ...}); give one of them")
            self.start_urls = ["/"]
        if self.band_low > self.band_high:
            raise ValueError("band_low must be <= band_high")
        if self.loop == "wrap" and (self.explore != "teacher" or self.walk_steps < 1):
            raise ValueError("loop: wrap makes its trajectories from the teacher's exploration: it needs explore: "
                             "teacher and walk_steps >= 1 (or loop: propose)")
        if self.loop == "wrap" and self.grow and self.student.llm is None:
            raise ValueError("grow with loop: wrap ranks the wrapped tasks by the student's loss (one trajectory each: "
                             "no success rate to rank by); configure the student (student.llm)")
        if self.grow and self.student.llm is None and self.attempts < 4:
            raise ValueError(f"grow without a student model (student.llm) chooses tasks by success rate, which needs "
                             f"attempts >= 4 (got {self.attempts}); configure the student or raise attempts")
        return self


@dataclass
class _Node:
    """A task to attempt: proposed (depth 0) or a variant of a parent task."""

    task: Task
    expected: str
    depth: int = 0
    parent: str | None = None
    direction: str | None = None
    successes: int = 0
    tried: int = 0
    failures: list[str] = field(default_factory=list)
    grow: dict[str, Any] | None = None  # how a variant's parent was selected


@dataclass
class _Grown:
    """What the output holds about one task of a generation: enough to select it and grow it."""

    node: _Node
    round: int
    walk: list[str | None]
    kept: list[Trajectory] = field(default_factory=list)


@register_method
class UISimulator(EnvMethod):
    """UI-Simulator(-Grow): explore, propose tasks, roll out, judge, relabel, grow variants in the difficulty band."""

    name = "ui_simulator"
    Config = UISimulatorConfig
    templates = (PROPOSE_SYSTEM, PROPOSE_USER, PROPOSE_EXPLORED, JUDGE_SYSTEM, JUDGE_USER, REWRITE_SYSTEM, REWRITE_USER,
                 VARIANT_SYSTEM, VARIANT_USER, WRAP_SYSTEM, WRAP_USER, *explorer.TEMPLATES)
    config: UISimulatorConfig
    uses_task_source = False
    roles = (Role("explorer", "explores the site with step-wise task control", ("teacher", "judge")),
             Role("proposer", "proposes tasks from the explored pages", ("teacher", "judge")),
             Role("judge", "grades each attempt", ("judge",)),
             Role("relabeller", "rewrites a kept attempt's instruction to what it did (loop: wrap: wraps each "
                                "exploration into a trajectory)", ("teacher", "judge")),
             Role("variant writer", "writes harder and easier variants of the selected tasks", ("teacher", "judge")))

    def roles_in_use(self) -> list[Role]:
        wrap = self.config.loop == "wrap"
        used = {"relabeller": self.config.rewrite or wrap, "variant writer": self.config.grow,
                "explorer": self.config.explore == "teacher" and self.config.walk_steps > 0,
                "proposer": not wrap, "judge": not wrap or self.config.judge_wrapped or self.config.grow}
        return [r for r in super().roles_in_use() if used.get(r.name, True)]

    def __init__(self, config: UISimulatorConfig, llm: Any):
        super().__init__(config, llm)
        self.student: LLM | None = None
        self._warned_fallback = False
        self.states: StateStore | None = None
        self.images = PageImages(None, config.judge.vision)
        self._starts: list[Task] | None = None

    def tasks(self) -> Iterable[TaskSpec]:
        for r in range(self.config.rounds):
            yield TaskSpec(id=f"round-{r:04d}", payload={"round": r})

    async def run(self, tasks: Iterable[TaskSpec], output: Dataset, *, progress: Any = None) -> RunSummary:
        """The proposal rounds, then (grow) one run per generation over the selected tasks' variants."""
        summary = await super().run(tasks, output, progress=progress)
        self.student = self.field_models.get("student")
        for depth in range(1, self.config.grow_rounds + 1 if self.config.grow else 1):
            chosen = await self.select_for_growth(grown_tasks(output, depth - 1), summary)
            specs = [TaskSpec(id=f"{g.node.task.id}/grow", payload={"grow": decision, **_node_payload(g)})
                     for g, decision in chosen]
            if not specs:
                break
            summary = summary.merge(await super().run(specs, output, progress=progress))
        return summary

    # ---- the round ----------------------------------------------------------------------------

    async def run_task(self, spec: TaskSpec) -> TaskResult:
        result = TaskResult()
        try:
            if "grow" in spec.payload:
                await self._grow_task(spec, result)
            elif self.config.loop == "wrap":
                await self._wrap_round(spec, int(spec.payload["round"]), result)
            else:
                await self._round(spec, int(spec.payload["round"]), result)
        except LLMRequestError as exc:
            result.fail(spec.id, "llm", str(exc), spec.payload)
        except SimulationError as exc:
            result.fail(spec.id, "simulator", f"SimulationError: {exc}", spec.payload)
        return result

    def prepare(self, output: Dataset) -> None:
        super().prepare(output)
        self.images = PageImages(Path(output.path), self.config.judge.vision)  # screenshots sit beside the shards
        # A real world's pages are recorded (a simulated one's are the model's own writing).
        real = not getattr(self.envs.cls, "needs_llm", False)
        self.states = StateStore(Path(output.path) / self.config.real_states) if real and self.config.real_states else None

    async def setup(self) -> None:
        await super().setup()
        if self._starts is None:  # read once, before the rounds: a bad task file stops the run, not each round
            self._starts = self.envs.tasks() if not self.config.start_urls and self.config.tasks.source != "env" else []

    def _explore_from(self, env: Environment, r: int) -> Task:
        """The task round `r` explores from (for its start page and params, e.g. the catalog seed): a start
        URL, else a task of the configured task source, else one of the env's generator."""
        cfg = self.config
        if cfg.start_urls:
            base = Task(id="explore", env=env.name, instruction=EXPLORE,
                        params={"start_url": cfg.start_urls[r % len(cfg.start_urls)]})
        elif self._starts:
            base = self._starts[r % len(self._starts)]
        else:
            try:
                base = env.generate_tasks(1, seed=cfg.seed + r)[0]
            except NotImplementedError:
                base = Task(id="explore", env=env.name, instruction=EXPLORE)
        return base.model_copy(update={"id": f"round-{r:04d}/explore", "instruction": EXPLORE, "goal": {},
                                       "metadata": {}})

    def _record(self, steps: list[Step], source: str, task_id: str, result: TaskResult) -> None:
        """Add the real pages of `steps` to the state store (a real world only)."""
        if self.states is not None:
            states = states_from_steps(steps, source=source, env=self.config.env, task_id=task_id)
            result.counts["real_states"] += self.states.append(states)

    async def _round(self, spec: TaskSpec, r: int, result: TaskResult) -> None:
        tools = self.tools
        explored: explorer.Exploration | None = None
        async with self.make_env() as env:
            base = self._explore_from(env, r)
            opening = await env.reset(base)
            if self.config.explore == "teacher" and self.config.walk_steps:
                explored = await explorer.explore(env, self.model_for("explorer"), tools, opening,
                                                  self.config.walk_steps, self.config.max_page_chars, result.counts)
                walked, pages, how = explored.steps, explored.pages, explored.how
            else:
                walked, pages, how = await self._random_walk(env, opening, r)
        self._record(walked, "walk", base.id, result)
        result.counts["explored_pages"] += len(pages)
        shown = "\n\n".join(_page_block(i, p, done, self.config.max_page_chars)
                            for i, (p, done) in enumerate(zip(pages, how), 1))
        if explored is not None and explored.guides:
            shown += PROPOSE_EXPLORED.format(guides="\n".join(
                f"- {g['guide']}: {'; '.join(g['steps']) or '(no step taken)'}" for g in explored.guides))
        proposals = await self.model_for("proposer").structured(
            [{"role": "system", "content": PROPOSE_SYSTEM},
             {"role": "user", "content": PROPOSE_USER.format(round=r, n=self.config.tasks_per_round,
                                                             tools=tools_block(tools), pages=shown)}], Proposals)
        if proposals is None or not proposals.tasks:
            result.fail(spec.id, "propose", "no valid task proposals", {"round": r, "pages": len(pages)})
            return
        result.counts["proposed_tasks"] += min(len(proposals.tasks), self.config.tasks_per_round)
        params = dict(base.params)
        if self.config.env == "simulated" and pages:
            # Every task of the round opens on the page that was explored (no new start page per task).
            params["start_page"] = {"url": pages[0].url or "", "axtree": pages[0].axtree or ""}
        walk = [p.url for p in pages]
        for j, p in enumerate(proposals.tasks[: self.config.tasks_per_round]):
            task = base.model_copy(update={"id": f"{spec.id}/t{j}", "instruction": p.instruction, "params": params,
                                           "metadata": {"expected_outcome": p.expected_outcome}})
            await self._attempts(_Node(task, p.expected_outcome), tools, r, walk, result,
                                 explored.as_dict() if explored is not None else {"mode": "random"})

    async def _wrap_round(self, spec: TaskSpec, r: int, result: TaskResult) -> None:
        """The paper's loop: the teacher explores the world with step-wise task control; the trajectory wrapper
        writes the task those steps accomplish, a thought per step and the final answer; that is the trajectory."""
        cfg = self.config
        tools = self.tools
        async with self.make_env() as env:
            base = self._explore_from(env, r)
            opening = await env.reset(base)
            explored = await explorer.explore(env, self.model_for("explorer"), tools, opening, cfg.walk_steps,
                                              cfg.max_page_chars, result.counts)
        self._record(explored.steps, "walk", base.id, result)
        result.counts["explored_pages"] += len(explored.pages)
        params = dict(base.params)
        if cfg.env == "simulated" and explored.pages:
            params["start_page"] = {"url": explored.pages[0].url or "", "axtree": explored.pages[0].axtree or ""}
        task = base.model_copy(update={"id": f"{spec.id}/wrap", "params": params})
        steps = _with_call_ids(opened(self.policy(), explored.steps))
        node = _Node(task, "")
        trajectory = self._wrapped_trajectory(node, steps, tools, r, [p.url for p in explored.pages], explored)
        actions = [i for i, s in enumerate(steps) if s.kind in ACTION_KINDS]
        if not actions:
            result.reject(trajectory, "exploration", "no action: the teacher's exploration took no step")
            return
        guides = "\n".join(f"- {g['guide']}" for g in explored.guides) or "(none)"
        answer = await self.model_for("relabeller").structured(
            [{"role": "system", "content": WRAP_SYSTEM},
             {"role": "user", "content": WRAP_USER.format(guides=guides, n=len(actions),
                                                          transcript=self._transcript(steps))}],
            one_thought_each(Wrapped, len(actions)))
        if answer is None or not answer.instruction.strip():
            result.reject(trajectory, "wrap", "no wrap: no valid answer from the trajectory wrapper")
            return
        instruction = answer.instruction.strip()
        first = next(s for s in steps if isinstance(s, TextObservation) and s.source == "user")
        first.content = instruction
        for i, thought in zip(actions, answer.thoughts):
            steps[i] = steps[i].model_copy(update={"thought": thought.strip() or None,
                                                   "extra": {**steps[i].extra, "original_thought": steps[i].thought}})
        steps.append(MessageAction(content=answer.answer.strip() or "Done."))
        actions.append(len(steps) - 1)
        node.task = task.model_copy(update={"instruction": instruction})
        node.expected = answer.answer.strip()
        trajectory = self._wrapped_trajectory(node, steps, tools, r, [p.url for p in explored.pages], explored)
        trajectory.details["rewrites"] = [StepRewrite(
            steps=actions, kind="written",
            reason="the teacher's exploration under its guides, wrapped: the user's request, every thought and the "
                   "final answer are the trajectory wrapper's, the actions the teacher's (no request of the agent "
                   "produced them)").model_dump()]
        result.counts["wrapped"] += 1
        if cfg.judge_wrapped:
            verdict = await self._judge_steps(instruction, "the pages show the request carried out; the final "
                                              "answer agrees with them", steps, result)
            if verdict is not None:
                trajectory.details["judge"] = {**verdict.model_dump(), "model": self.judge_name,
                                               "reads": trajectory.details["judge_reads"]}
            if verdict is None or not verdict.success:
                reason = "no verdict: no valid judge answer" if verdict is None else f"unsuccessful: {verdict.reasoning}"
                result.counts[f"failed:{reason.split(':')[0]}"] += 1
                if not cfg.keep_failed:
                    result.reject(trajectory, "completion", reason)
                    return
                result.trajectories.append(trajectory)
                return
        trajectory.reward, trajectory.success = 1.0, True
        trajectory.details["success_source"] = "judge" if cfg.judge_wrapped else "wrapper"
        result.counts["successes"] += 1
        result.trajectories.append(trajectory)

    def _wrapped_trajectory(self, node: _Node, steps: list[Step], tools: list[Any], r: int, walk: list[str | None],
                            explored: explorer.Exploration) -> Trajectory:
        """A wrapped exploration as a record (the fields Grow reads back as a proposed task's, attempt 0)."""
        return Trajectory(
            id=f"{self.name}/{node.task.id}#0",
            source=self.name,
            steps=steps,
            tools=tools,
            reward=0.0,
            success=False,
            provenance=self.provenance(node.task.id, seed=0).model_copy(update={"source_id": node.task.id}),
            details={
                "env": self.envs.describe(),
                "loop": "wrap",
                "round": r,
                "walk": walk,
                "explore": explored.as_dict(),
                "task": {"id": node.task.id, "expected_outcome": node.expected, "depth": 0, "parent": None,
                         "direction": None},
                "env_task": node.task.model_dump(mode="json"),
                "wrapped_instruction": node.task.instruction if node.expected else None,
                "attempt": 0,
                "actions": sum(1 for s in steps if s.kind in ACTION_KINDS),
                "judge_reads": WORLD if not self.config.judge.self_report else SELF_REPORT,
                "render": self.render_settings().model_dump(),
            },
        )

    async def _random_walk(self, env: Environment, opening: list[Step],
                           r: int) -> tuple[list[Step], list[WebObservation], list[str]]:
        """`walk_steps` seeded random exploring actions (`generators.page_walk`): the steps, the pages, how each was
        reached."""
        walked: list[Step] = list(opening)  # the pages and the actions that led to them
        pages: list[WebObservation] = [s for s in opening if isinstance(s, WebObservation)]
        how: list[str] = [""] * len(pages)
        rng = random.Random(f"ui-simulator-walk-{self.config.seed}-{r}")
        tried: set[tuple[str, ...]] = set()
        for _ in range(self.config.walk_steps):
            action = random_action(pages[-1], self.tools, rng, tried) if pages else None
            if action is None:
                break
            step = await env.step(action)
            if step.info.get("error") or not isinstance(step.observation, WebObservation):
                continue
            how.append(describe_action(action, page_elements(pages[-1].axtree)))
            walked += [action, step.observation]
            pages.append(step.observation)
            if step.done:
                break
        return walked, pages, how

    # ---- one task: attempts, judge, rewrite -----------------------------------------------------

    async def _attempts(self, node: _Node, tools: list[Any], r: int, walk: list[str | None], result: TaskResult,
                        explored: dict[str, Any] | None = None) -> None:
        cfg = self.config
        for a in range(cfg.attempts):
            task = node.task
            if a > 0 and cfg.env == "simulated":
                task = task.model_copy(update={"params": {**task.params, "sample": a}})
            async with self.make_env() as env:
                # Attempt a is draw a (its own sampling seed, so its own cache entry): nothing in the prompt the
                # record keeps and exports train on says which attempt it was.
                episode = await play_episode(env, self.policy(draw=a), task, max_steps=cfg.max_steps,
                                             evaluate=False, max_parse_failures=cfg.max_parse_failures)
            self._record(episode.steps, "rollout", task.id, result)
            node.tried += 1
            result.counts["attempts"] += 1
            result.counts["parse_failures"] += episode.parse_failures
            trajectory = self._trajectory(node, a, episode, tools, r, walk)
            if explored is not None:
                trajectory.details["explore"] = explored
            failed = episode.stop_reason == "max_parse_failures"
            verdict = None if failed else await self._judge(node, episode, result)
            if verdict is not None:
                trajectory.details["judge"] = verdict.model_dump()
            if verdict is not None and verdict.success:
                node.successes += 1
                result.counts["successes"] += 1
                trajectory.reward, trajectory.success = 1.0, True
                await self._relabel(trajectory, result)
                result.trajectories.append(trajectory)
                continue
            if failed:
                reason = f"max_parse_failures: {episode.parse_failures} unreadable answers"
            elif verdict is None:
                reason = "no verdict: no valid judge answer"
            else:
                reason = f"unsuccessful: {verdict.reasoning}"
            node.failures.append(reason.split(":")[0])
            result.counts[f"failed:{node.failures[-1]}"] += 1
            if cfg.keep_failed:
                await self._relabel(trajectory, result)
                result.trajectories.append(trajectory)
            else:
                result.reject(trajectory, "completion", reason)
            if len(node.failures) >= cfg.max_failures and not cfg.grow:
                # Grow measures every task over all its attempts (its success rate, its kept trajectories):
                # a task cut short at max_failures could only ever be selected with fewer failures than that.
                result.counts["dropped_tasks"] += 1
                break

    def _transcript(self, steps: list[Step]) -> str:
        """A trajectory as the judge and the relabeller read it: its numbered steps with the pages they led to."""
        return cut_head(numbered_path(steps, self.config.max_step_page_chars), self.config.max_transcript_chars)

    async def _judge(self, node: _Node, episode: Episode, result: TaskResult) -> Verdict | None:
        return await self._judge_steps(node.task.instruction, node.expected, episode.steps, result)

    async def _judge_steps(self, instruction: str, expected: str, steps: list[Step],
                           result: TaskResult) -> Verdict | None:
        """The judge's verdict from what the world showed (the pages, the actions; the agent's thoughts only with
        `judge.self_report`)."""
        seen, _ = judged_steps(steps, self.config.judge.self_report)
        prompt = JUDGE_USER.format(instruction=instruction, expected=expected, transcript=self._transcript(seen))
        return await self.images.ask(self.judge_llm, JUDGE_SYSTEM, prompt,
                                     screenshots(steps, self.config.max_judge_images), Verdict, result.counts)

    async def _relabel(self, trajectory: Trajectory, result: TaskResult) -> None:
        if not self.config.rewrite:
            return
        original = trajectory.details["original_instruction"]
        actions = [i for i, s in enumerate(trajectory.steps) if s.kind in ("api", "code", "message")]
        answer = await self.model_for("relabeller").structured(
            [{"role": "system", "content": REWRITE_SYSTEM},
             {"role": "user", "content": REWRITE_USER.format(instruction=original, n=len(actions),
                                                             transcript=self._transcript(trajectory.steps))}],
            one_thought_each(Rewrite, len(actions)))
        if answer is None or not answer.instruction.strip():
            # Relabelled only as a whole: an instruction without thoughts to match would contradict its steps.
            result.counts["rewrite_failed"] += 1
            return
        first = next(s for s in trajectory.steps if isinstance(s, TextObservation) and s.source == "user")
        first.content = answer.instruction.strip()
        trajectory.details["rewritten_instruction"] = first.content
        # As UI-Simulator's trajectory wrapper, every step's reasoning is rewritten for the new instruction (the
        # thoughts the agent wrote spoke of the original task); what the agent wrote is kept in the step's extra.
        for i, thought in zip(actions, answer.thoughts):
            step = trajectory.steps[i]
            trajectory.steps[i] = step.model_copy(update={"thought": thought.strip() or None,
                                                          "extra": {**step.extra, "original_thought": step.thought}})
        trajectory.details["rewrites"] = [StepRewrite(
            steps=actions, kind="written",
            reason=f"the user's request (step {trajectory.steps.index(first)}) was relabelled after the episode and "
                   "each action's thought rewritten for it (the actions are the agent's; it answered "
                   "details.original_instruction)").model_dump()]
        result.counts["rewritten"] += 1

    def _trajectory(self, node: _Node, a: int, episode: Episode, tools: list[Any], r: int,
                    walk: list[str | None]) -> Trajectory:
        parents = [node.parent] if node.parent else []
        return Trajectory(
            id=f"{self.name}/{node.task.id}#{a}",
            source=self.name,
            steps=episode.steps,
            tools=tools,
            reward=0.0,
            success=False,
            provenance=self.provenance(node.task.id, parents=parents, seed=a).model_copy(
                update={"source_id": node.task.id}),
            details={
                "env": self.envs.describe(),
                "round": r,
                "walk": walk,
                "task": {"id": node.task.id, "expected_outcome": node.expected, "depth": node.depth,
                         "parent": node.parent, "direction": node.direction},
                "env_task": node.task.model_dump(mode="json"),
                **({"grow": node.grow} if node.grow is not None else {}),
                "original_instruction": node.task.instruction,
                "loop": "propose" if node.grow is None else "grow",
                "judge_reads": WORLD if not self.config.judge.self_report else SELF_REPORT,
                "attempt": a,
                "stop_reason": episode.stop_reason,
                "actions": episode.actions,
                "parse_failures": episode.parse_failures,
                "action_errors": episode.action_errors,
                "render": self.render_settings().model_dump(),
            },
        )

    # ---- grow ---------------------------------------------------------------------------------

    async def select_for_growth(self, pool: list[_Grown], summary: RunSummary) -> list[tuple[_Grown, dict[str, Any]]]:
        """The tasks to grow, each with why: by the student's loss band, else (warned, counted) by success rate."""
        cfg = self.config
        live = pool  # with grow every task had all its attempts (max_failures drops none)
        if self.student is None:
            why = "no student model is configured (student.llm)"
        else:
            try:
                return await self._select_by_loss(live, summary)
            except ScoringUnsupported as exc:
                why = f"the student model cannot score: {exc}"
        if not self._warned_fallback:
            self._warned_fallback = True
            log.warning("%s: Grow chooses tasks by the teacher's success rate over %d attempts instead of the "
                        "student's loss, because %s", self.name, cfg.attempts, why)
        summary.counts["grow_fallback"] += 1
        chosen = []
        for g in live:
            rate = g.node.successes / g.node.tried if g.node.tried else 0.0
            if cfg.band_low <= rate <= cfg.band_high:
                chosen.append((g, {"selected_by": "success_rate", "success_rate": rate, "band": [cfg.band_low, cfg.band_high],
                                   "reason": f"{g.node.successes} of {g.node.tried} attempts succeeded ({why})"}))
            else:
                summary.counts["outside_band"] += 1
        summary.counts["grow_selected_by_success_rate"] += len(chosen)
        return chosen

    async def _select_by_loss(self, pool: list[_Grown], summary: RunSummary) -> list[tuple[_Grown, dict[str, Any]]]:
        """UI-Simulator-Grow: tasks whose mean student loss over their kept trajectories lies in the percentile band."""
        assert self.student is not None
        student = self.student
        scored = [g for g in pool if g.kept]
        summary.counts["grow_unscored_no_trajectory"] += len(pool) - len(scored)

        unsupported: list[ScoringUnsupported] = []

        async def loss(traj: Trajectory) -> float | None:
            try:
                return (await trajectory_loss(student, traj)).mean_nll
            except ScoringError as exc:
                log.info("%s: trajectory %s not scored: %s", self.name, traj.id, exc)
            except ScoringUnsupported as exc:
                unsupported.append(exc)
            return None

        # Every trajectory at once: the student's server answers them concurrently, through its limiter.
        flat = await asyncio.gather(*(loss(t) for g in scored for t in g.kept))
        if unsupported:
            raise unsupported[0]
        losses: dict[str, float] = {}
        start = 0
        for g in scored:
            values = [v for v in flat[start:start + len(g.kept)] if v is not None]
            start += len(g.kept)
            summary.counts["grow_scored_trajectories"] += len(values)
            summary.counts["grow_unscorable_trajectories"] += len(g.kept) - len(values)
            if values:
                losses[g.node.task.id] = sum(values) / len(values)
        if not losses:
            return []
        lo, hi = (float(x) for x in np.percentile(list(losses.values()), [self.config.band_low * 100,
                                                                           self.config.band_high * 100]))
        chosen = []
        for g in scored:
            value = losses.get(g.node.task.id)
            if value is None:
                continue
            if lo <= value <= hi:
                chosen.append((g, {"selected_by": "student_loss", "student_loss": value, "band": [lo, hi],
                                   "reason": f"student loss {value:.4f} within the {self.config.band_low:.0%}-"
                                             f"{self.config.band_high:.0%} percentile band [{lo:.4f}, {hi:.4f}] of "
                                             f"{len(losses)} tasks"}))
            else:
                summary.counts["outside_band"] += 1
        summary.counts["grow_selected_by_student_loss"] += len(chosen)
        return chosen

    async def _grow_task(self, spec: TaskSpec, result: TaskResult) -> None:
        """Variants of one selected task, each attempted, judged and relabeled like a proposed task."""
        p = spec.payload
        parent = _Node(Task.model_validate(p["task"]), p["expected"], depth=p["depth"], successes=p["successes"],
                       tried=p["tried"])
        for node in await self._variants(parent, p["grow"], result):
            await self._attempts(node, self.tools, p["round"], p["walk"], result)

    async def _variants(self, node: _Node, decision: dict[str, Any], result: TaskResult) -> list[_Node]:
        cfg = self.config
        answer = await self.model_for("variant writer").structured(
            [{"role": "system", "content": VARIANT_SYSTEM},
             {"role": "user", "content": VARIANT_USER.format(n=cfg.variants_per_task, instruction=node.task.instruction,
                                                             expected=node.expected, successes=node.successes,
                                                             attempts=node.tried)}], Variants)
        if answer is None:
            result.counts["grow_failed"] += 1
            return []
        variants = answer.variants[: cfg.variants_per_task]
        result.counts["variants"] += len(variants)
        return [
            _Node(node.task.model_copy(update={"id": f"{node.task.id}/v{m}", "instruction": v.instruction,
                                               "metadata": {"expected_outcome": v.expected_outcome,
                                                            "direction": v.direction}}),
                  v.expected_outcome, depth=node.depth + 1, parent=node.task.id, direction=v.direction,
                  grow={"parent": node.task.id, **decision})
            for m, v in enumerate(variants)
        ]


def _with_call_ids(steps: list[Step]) -> list[Step]:
    """Positional tool call ids (`call_<index>`) on the api actions and the observations that answer them."""
    out: list[Step] = []
    for i, step in enumerate(steps):
        if step.kind == "api":
            step = step.model_copy(update={"tool_call_id": f"call_{i}"})
        elif step.kind not in ACTION_KINDS and out and out[-1].kind == "api":
            step = step.model_copy(update={"tool_call_id": out[-1].tool_call_id})
        out.append(step)
    return out


def _page_block(i: int, page: WebObservation, reached_by: str, max_chars: int) -> str:
    """A page for the proposer: `Page i: <url>`, how the walk reached it, its accessibility tree (cut)."""
    how = f"(reached by: {reached_by})\n" if reached_by else ""
    return f"Page {i}: {page.url or ''}\n{how}{(page.axtree or page.html or '')[:max_chars]}"


def grown_tasks(output: Dataset, depth: int) -> list[_Grown]:
    """The tasks of generation `depth` in `output` (kept and filtered attempts), in task id order."""
    by_task: dict[str, _Grown] = {}
    attempts: dict[str, list[Trajectory]] = defaultdict(list)
    for traj in [*output.iter_records(), *(f.record for f in output.iter_records("filtered"))]:
        info = traj.details.get("task")
        if isinstance(info, dict) and info.get("depth") == depth and "env_task" in traj.details:
            attempts[info["id"]].append(traj)
    for task_id in sorted(attempts):
        trajs = sorted(attempts[task_id], key=lambda t: t.details["attempt"])
        first = trajs[0]
        info = first.details["task"]
        node = _Node(Task.model_validate(first.details["env_task"]), info["expected_outcome"], depth=depth,
                     parent=info.get("parent"), direction=info.get("direction"))
        for t in trajs:
            node.tried += 1
            if t.success:
                node.successes += 1
            else:
                node.failures.append("failed")
        by_task[task_id] = _Grown(node, int(first.details["round"]), list(first.details["walk"]),
                                  [t for t in trajs if t.success])
    return list(by_task.values())


def _node_payload(g: _Grown) -> dict[str, Any]:
    n = g.node
    return {"task": n.task.model_dump(mode="json"), "expected": n.expected, "depth": n.depth,
            "successes": n.successes, "tried": n.tried, "round": g.round, "walk": g.walk}
