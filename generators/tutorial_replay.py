"""Tutorial-guided replay (AgentTrek): filter tutorial texts, turn each into a task, replay it, judge it.

Per tutorial (one task per tutorial, task id = tutorial id):

1. **prefilter** — a cheap keyword test per platform (config `keywords`); a text with no
   keyword of any enabled platform is filtered as "prefilter: no keyword".
2. **classifier** — the LLM answers `{is_tutorial, platform, reason}`; a text that is not a
   tutorial, or is about a platform that is not enabled, is filtered with the model's reason.
3. **spec** — the LLM turns the tutorial into `{platform, goal, prerequisites, steps,
   expected_outcome}`.
4. **task mapping** — the spec needs a concrete instance in the environment. We never invent
   world data: the environment's own task generator (`env.generate_tasks(candidate_tasks,
   seed)`) gives candidate tasks, each with a `metadata["kind"]` (retail: cancel, return,
   exchange, modify_items, modify_address, user_address, order_total; web: purchase, answer,
   cart). The spec's text is
   scored against per-kind keywords (config `kind_keywords`; the goal counts three times the
   rest); the best-scoring kind wins, and one of its candidates is picked deterministically
   (by a hash of the tutorial id). Environments without keywords fall back to word overlap
   between the spec and each candidate's instruction. No match -> filtered "no matching task".
5. **replay** — the agent (`AgentPolicy`) acts in the environment with the tutorial's spec in
   its system prompt (`guidance`), one action at a time, until the episode ends or
   `max_steps`.
6. **judge** — the LLM answers `{thoughts, success}` over the spec, the task and the
   transcript. No valid verdict (3 malformed answers) -> the trajectory is filtered by
   "judge" with the reason "no verdict".

Outcome: every kept trajectory stores the environment's reward (`reward`) and the judge's
verdict (`details["judge"]`). `success` follows config `success_from`: "env" (default) — the
environment's goal check wins when the mapped task has one (all generated tasks do), the
judge decides otherwise; "judge" — the judge always decides. Whether the two agree is kept
in `details["judge"]["agrees_with_env"]`. Unsuccessful replays are filtered ("outcome:
unsuccessful") unless `keep_failed`.

The trajectory's steps are the episode only (the user's request, the agent's actions and the
observations); the tutorial and spec that guided the agent live in `details`, because a model
trained on the data will not see a tutorial.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import BaseModel, Field, model_validator

from backends.errors import LLMRequestError
from envs.base import Environment, Task
from generators._episode import Episode, play_episode
from generators.agent import AgentPolicy
from generators.base import MAX_TASKS, GenerationMethod, MethodConfig, TaskResult, TaskSpec
from generators.registry import register_method
from generators.transcript import render_transcript
from schemas.models import Step, TextObservation, Tool, Trajectory

REPO = Path(__file__).resolve().parents[1]

CLASSIFY_SYSTEM = (
    "You sort web texts for an agent-training pipeline. Decide whether the text is a step-by-step "
    "tutorial (a how-to a person or agent could follow) and which platform it is about: 'retail' "
    "(customer service for an online shop's orders: cancel, return, exchange, change address, order "
    "status), 'web' (using a web shop in a browser: search, product pages, cart, checkout) or 'other'. "
    "Answer with a JSON object {\"is_tutorial\": bool, \"platform\": \"retail\"|\"web\"|\"other\", \"reason\": str}."
)
CLASSIFY_USER = "CLASSIFY THIS TEXT\nTitle: {title}\n\n{text}"
SPEC_SYSTEM = (
    "You turn a tutorial into a task specification an agent can carry out in the '{platform}' "
    "environment, whose tools are listed below. Answer with a JSON object {{\"platform\": str, "
    "\"goal\": str, \"prerequisites\": [str], \"steps\": [str], \"expected_outcome\": str}}; steps are "
    "short imperative sentences that name the tools to use.\n\nTools:\n{tools}"
)
SPEC_USER = "WRITE THE TASK SPEC\nTitle: {title}\n\n{text}"
GUIDANCE = (
    "A tutorial describes how to do this kind of task. Follow it step by step.\n"
    "Goal: {goal}\nPrerequisites:\n{prerequisites}\nSteps:\n{steps}\nExpected outcome: {expected_outcome}"
)
JUDGE_SYSTEM = (
    "You judge whether an agent accomplished a task. You see the task, the tutorial spec it followed "
    "and the transcript of what it did (tool calls and their results). Answer with a JSON object "
    "{\"thoughts\": str, \"success\": bool}: success is true only if the transcript shows the task done."
)
JUDGE_USER = (
    "JUDGE THIS REPLAY\nTask: {instruction}\nGoal: {goal}\nExpected outcome: {expected_outcome}\n\n"
    "Transcript:\n{transcript}"
)

DEFAULT_KEYWORDS: dict[str, list[str]] = {
    "retail": ["order", "cancel", "refund", "return", "exchange", "shipping address", "payment method", "customer"],
    "web": ["web shop", "webshop", "website", "browser", "add to cart", "cart", "checkout", "click"],
}
# Per environment: task kind -> phrases that point to it (matched in the spec's lowercased text).
DEFAULT_KIND_KEYWORDS: dict[str, dict[str, list[str]]] = {
    "retail": {
        "cancel": ["cancel"],
        "return": ["return"],
        "exchange": ["exchange"],
        "modify_items": ["swap", "modify the items", "modify pending order items", "change the item", "change an item"],
        "modify_address": ["shipping address", "modify the pending order's address", "order address"],
        "user_address": ["default address", "home address", "profile address", "moved"],
        "order_total": ["status and total", "total of", "how much", "status and the total"],
    },
    "web": {
        "purchase": ["buy", "purchase", "checkout", "check out", "place the order"],
        "answer": ["price of", "find the price", "tell me what it costs"],
        "cart": ["add to cart", "add to my cart", "do not check out"],
    },
}


class TutorialReplayConfig(MethodConfig):
    """Tutorials are mapped onto the task kinds of the built-in retail and web task generators."""

    method: Literal["tutorial_replay"] = "tutorial_replay"
    tutorials: list[str] = Field(default_factory=lambda: ["samples/tutorials"],
                                 description="JSONL files of {id, title, text}, Markdown files, or folders of them")
    platforms: list[str] = Field(default_factory=lambda: ["retail", "web"], description="environments replays may use")
    keywords: dict[str, list[str]] = Field(default_factory=lambda: {k: list(v) for k, v in DEFAULT_KEYWORDS.items()})
    kind_keywords: dict[str, dict[str, list[str]]] = Field(
        default_factory=lambda: {e: {k: list(v) for k, v in kinds.items()} for e, kinds in DEFAULT_KIND_KEYWORDS.items()})
    max_tutorials: int | None = Field(None, ge=1)
    max_tutorial_chars: int = Field(4000, ge=200, description="longer tutorial texts are cut")
    candidate_tasks: int = Field(28, ge=1, le=MAX_TASKS, description="env tasks generated to map specs onto")
    world_seed: int = 0
    replays: int = Field(1, ge=1, description="replays (trajectories) per kept tutorial")
    max_steps: int = Field(20, ge=1)
    agent_mode: Literal["tools", "text"] = "tools"
    agent_temperature: float | None = None
    success_from: Literal["env", "judge"] = "env"
    keep_failed: bool = False
    max_transcript_chars: int = Field(8000, ge=500)

    @model_validator(mode="after")
    def _mappable_platforms(self) -> TutorialReplayConfig:
        unknown = [p for p in self.platforms if p not in DEFAULT_KIND_KEYWORDS]
        if unknown:
            raise ValueError(f"tutorial_replay maps tutorials onto the task kinds of the "
                             f"{' and '.join(DEFAULT_KIND_KEYWORDS)} task generators; {', '.join(unknown)} has none")
        return self


class Classification(BaseModel):
    is_tutorial: bool
    platform: Literal["retail", "web", "other"]
    reason: str


class TaskSpecification(BaseModel):
    platform: str
    goal: str
    prerequisites: list[str] = Field(default_factory=list)
    steps: list[str]
    expected_outcome: str


class JudgeVerdict(BaseModel):
    thoughts: str
    success: bool


# ---- tutorials -----------------------------------------------------------------------------------

def _resolve(path: str) -> Path:
    p = Path(path)
    if not p.is_absolute() and not p.exists() and (REPO / p).exists():
        return REPO / p  # the shipped samples, when run from elsewhere
    return p


def _markdown(path: Path) -> dict[str, str]:
    text = path.read_text(encoding="utf-8")
    heading = re.search(r"^#\s+(.+)$", text, re.MULTILINE)
    return {"id": path.stem, "title": heading.group(1).strip() if heading else path.stem, "text": text}


def load_tutorials(sources: Iterable[str]) -> list[dict[str, str]]:
    """Tutorials as {id, title, text}, in a stable order; duplicate ids are an error."""
    out: list[dict[str, str]] = []
    for source in sources:
        path = _resolve(source)
        files = sorted(path.iterdir()) if path.is_dir() else [path]
        for f in files:
            if f.name.lower() == "readme.md" or f.is_dir():
                continue
            if f.suffix in (".md", ".markdown", ".txt"):
                out.append(_markdown(f))
            elif f.suffix == ".jsonl":
                for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                    if not line.strip():
                        continue
                    row = json.loads(line)
                    if not isinstance(row, dict) or not row.get("id") or not isinstance(row.get("text"), str):
                        raise ValueError(f"{f}:{n}: a tutorial needs an 'id' and a 'text'")
                    out.append({"id": str(row["id"]), "title": str(row.get("title") or row["id"]), "text": row["text"]})
            elif path.is_file():
                raise ValueError(f"{f}: tutorials are .jsonl or Markdown files")
    ids = [t["id"] for t in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"duplicate tutorial ids: {', '.join(dup)}")
    return out


def _calls(steps: list[Step]) -> list[dict[str, Any]]:
    return [{"function": s.function, "arguments": s.arguments} for s in steps if s.kind == "api"]


def _pick(key: str, n: int) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % n


_WORD = re.compile(r"[a-z]{4,}")


@register_method
class TutorialReplay(GenerationMethod):
    """AgentTrek: tutorials -> filtered -> task specs -> replayed in an environment -> judged."""

    name = "tutorial_replay"
    Config = TutorialReplayConfig
    templates = (CLASSIFY_SYSTEM, CLASSIFY_USER, SPEC_SYSTEM, SPEC_USER, GUIDANCE, JUDGE_SYSTEM, JUDGE_USER)
    config: TutorialReplayConfig

    def __init__(self, config: TutorialReplayConfig, llm: Any):
        super().__init__(config, llm)
        self._candidates: dict[str, list[Task]] = {}
        self._tools: dict[str, list[Tool]] = {}

    def tasks(self) -> Iterable[TaskSpec]:
        tutorials = load_tutorials(self.config.tutorials)
        if self.config.max_tutorials is not None:
            tutorials = tutorials[: self.config.max_tutorials]
        for t in tutorials:
            yield TaskSpec(id=t["id"], instruction=t["title"], payload={"title": t["title"], "text": t["text"]})

    # ---- helpers ------------------------------------------------------------------------------

    def _env(self, platform: str) -> Environment:
        from envs.registry import make_env

        return make_env(platform, seed=self.config.world_seed)

    def _candidates_for(self, platform: str) -> list[Task]:
        if platform not in self._candidates:
            env = self._env(platform)
            self._tools[platform] = env.tools()
            self._candidates[platform] = env.generate_tasks(self.config.candidate_tasks, seed=self.config.seed)
        return self._candidates[platform]

    def _stub(self, task: TaskSpec, **details: Any) -> Trajectory:
        """A record for a tutorial dropped before any replay, so nothing vanishes."""
        return Trajectory(
            id=f"{self.name}/{task.id}",
            source=self.name,
            steps=[TextObservation(content=task.payload["text"][: self.config.max_tutorial_chars], source="user")],
            provenance=self._provenance(task.id),
            details={"tutorial": {"id": task.id, "title": task.payload["title"]}, **details},
        )

    def _provenance(self, task_id: str, seed: int | None = None) -> Any:
        return self.provenance(task_id, seed=seed).model_copy(update={"source_id": task_id})

    def prefilter(self, text: str) -> list[str]:
        """Enabled platforms whose keywords appear in `text`."""
        low = text.lower()
        return [p for p in self.config.platforms if any(k.lower() in low for k in self.config.keywords.get(p, []))]

    def map_task(self, platform: str, spec: TaskSpecification, key: str) -> tuple[Task | None, str]:
        """A concrete env task for `spec` (see the module doc), and how it was chosen."""
        candidates = self._candidates_for(platform)
        goal = spec.goal.lower()
        rest = " ".join([*spec.prerequisites, *spec.steps, spec.expected_outcome]).lower()
        kinds = self.config.kind_keywords.get(platform)
        if kinds:
            scores = {kind: sum(3 * goal.count(w.lower()) + rest.count(w.lower()) for w in words)
                      for kind, words in kinds.items()}
            best = max(scores.values(), default=0)
            if best <= 0:
                return None, "no task kind keyword in the spec"
            kind = next(k for k, s in scores.items() if s == best)
            pool = [t for t in candidates if t.metadata.get("kind") == kind]
            if not pool:
                return None, f"the {platform} task generator gave no task of kind {kind!r}"
            return pool[_pick(key, len(pool))], f"kind {kind!r} (keyword score {best})"
        words = set(_WORD.findall(f"{goal} {goal} {rest}"))
        scored = [(len(words & set(_WORD.findall(f"{t.instruction} {t.metadata.get('kind', '')}".lower()))), i)
                  for i, t in enumerate(candidates)]
        best = max((s for s, _ in scored), default=0)
        if best <= 0:
            return None, "no candidate task shares a word with the spec"
        pool = [candidates[i] for s, i in scored if s == best]
        return pool[_pick(key, len(pool))], f"word overlap {best}"

    # ---- the pipeline -------------------------------------------------------------------------

    async def run_task(self, task: TaskSpec) -> TaskResult:
        result = TaskResult()
        title, text = task.payload["title"], task.payload["text"][: self.config.max_tutorial_chars]
        matched = self.prefilter(f"{title}\n{text}")
        if not matched:
            result.reject(self._stub(task), "prefilter",
                          f"no keyword: none of the keywords of {', '.join(self.config.platforms)} appears")
            return result
        try:
            return await self._after_prefilter(task, title, text, matched, result)
        except LLMRequestError as exc:
            result.fail(task.id, "llm", str(exc), {"tutorial": task.id})
            return result

    async def _after_prefilter(self, task: TaskSpec, title: str, text: str, matched: list[str],
                               result: TaskResult) -> TaskResult:
        verdict = await self.llm.structured(
            [{"role": "system", "content": CLASSIFY_SYSTEM},
             {"role": "user", "content": CLASSIFY_USER.format(title=title, text=text)}], Classification)
        if verdict is None:
            result.reject(self._stub(task, prefilter=matched), "classifier", "no verdict: no valid classifier answer")
            return result
        cls = verdict.model_dump()
        if not verdict.is_tutorial:
            result.reject(self._stub(task, prefilter=matched, classifier=cls), "classifier", f"not a tutorial: {verdict.reason}")
            return result
        platform = verdict.platform
        if platform not in self.config.platforms:
            result.reject(self._stub(task, prefilter=matched, classifier=cls), "classifier",
                          f"platform {platform} not enabled: {verdict.reason}")
            return result

        candidates = self._candidates_for(platform)
        tools = self._tools[platform]
        spec = await self.llm.structured(
            [{"role": "system", "content": SPEC_SYSTEM.format(
                platform=platform, tools="\n".join(f"- {t.name}: {t.description}" for t in tools))},
             {"role": "user", "content": SPEC_USER.format(title=title, text=text)}], TaskSpecification)
        if spec is None:
            result.reject(self._stub(task, prefilter=matched, classifier=cls), "spec", "no spec: no valid task spec answer")
            return result
        env_task, how = self.map_task(platform, spec, task.id)
        base = {"prefilter": matched, "classifier": cls, "spec": spec.model_dump()}
        if env_task is None:
            result.reject(self._stub(task, **base), "task_mapping", f"no matching task: {how}")
            return result
        base["env_task"] = {"id": env_task.id, "env": platform, "kind": env_task.metadata.get("kind"),
                            "instruction": env_task.instruction, "mapped_by": how,
                            "candidates": len(candidates)}

        policy = AgentPolicy(self.llm, tools, mode=self.config.agent_mode, temperature=self.config.agent_temperature)
        guidance = GUIDANCE.format(
            goal=spec.goal, prerequisites="\n".join(f"- {p}" for p in spec.prerequisites) or "- none",
            steps="\n".join(f"{i}. {s}" for i, s in enumerate(spec.steps, 1)), expected_outcome=spec.expected_outcome)
        for k in range(self.config.replays):
            # A replay index beyond the first varies the prompt, so cached samples are not repeated.
            g = guidance if k == 0 else f"{guidance}\n(Attempt {k + 1}.)"
            async with self._env(platform) as env:
                episode = await play_episode(env, policy, env_task, max_steps=self.config.max_steps, guidance=g,
                                             max_parse_failures=1)
            await self._judge_and_keep(task, k, platform, tools, env_task, spec, episode, base, result)
        return result

    async def _judge_and_keep(self, task: TaskSpec, k: int, platform: str, tools: list[Tool], env_task: Task,
                              spec: TaskSpecification, episode: Episode, base: dict[str, Any], result: TaskResult) -> None:
        env_verifiable = bool(env_task.goal)
        trajectory = Trajectory(
            id=f"{self.name}/{task.id}#{k}",
            source=self.name,
            steps=episode.steps,
            tools=tools,
            reward=episode.reward,
            provenance=self._provenance(task.id, seed=k),
            details={
                "tutorial": {"id": task.id, "title": task.payload["title"]}, **base,
                "env_reward": episode.reward, "env_verifiable": env_verifiable, "episode_done": episode.done,
                "stop_reason": episode.stop_reason, "action_errors": episode.action_errors, "calls": _calls(episode.steps),
            },
        )
        transcript = render_transcript(episode.steps)
        if len(transcript) > self.config.max_transcript_chars:
            transcript = "[...]\n" + transcript[-self.config.max_transcript_chars:]
        verdict = await self.judge_llm.structured(
            [{"role": "system", "content": JUDGE_SYSTEM},
             {"role": "user", "content": JUDGE_USER.format(instruction=env_task.instruction, goal=spec.goal,
                                                           expected_outcome=spec.expected_outcome, transcript=transcript)}],
            JudgeVerdict)
        if verdict is None:
            trajectory.details["judge"] = None
            result.reject(trajectory, "judge", f"no verdict: the judge gave no valid answer "
                                               f"in {self.llm.config.structured_attempts} attempts")
            return
        env_success = episode.reward >= 1.0
        use_env = self.config.success_from == "env" and env_verifiable
        trajectory.success = env_success if use_env else verdict.success
        trajectory.details["judge"] = {**verdict.model_dump(), "agrees_with_env": verdict.success == env_success}
        trajectory.details["success_source"] = "env" if use_env else "judge"
        result.counts[f"replay_{'success' if trajectory.success else 'failure'}"] += 1
        if not trajectory.success and not self.config.keep_failed:
            result.reject(trajectory, "outcome", f"unsuccessful: success from {trajectory.details['success_source']} "
                                                 f"(env reward {episode.reward:g}, judge {verdict.success})")
            return
        result.trajectories.append(trajectory)
